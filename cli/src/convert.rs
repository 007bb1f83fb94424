//! `lifeboatctl convert`: legacy AppWrappers to workload.codeflare.dev/v1beta2.
//!
//! Prints the converted AppWrappers as YAML on stdout (documents separated by `---`) and one
//! line per dropped or re-interpreted setting on stderr. If any document cannot be converted,
//! nothing is printed on stdout (so a pipe into `kubectl apply` applies all or nothing), every
//! problem is printed on stderr and the exit code is 1.

use std::io::Read;
use std::process::ExitCode;

use anyhow::Context;
use lifeboat_api::legacy;

#[derive(clap::Args)]
pub struct ConvertArgs {
    /// The legacy AppWrapper YAML file (`-` for stdin).
    #[arg(short = 'f', long = "filename")]
    pub file: String,
}

pub fn run(args: ConvertArgs) -> anyhow::Result<ExitCode> {
    let text = if args.file == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read stdin")?;
        text
    } else {
        std::fs::read_to_string(&args.file).with_context(|| format!("cannot read {}", args.file))?
    };
    let report = convert_text(&text)
        .with_context(|| format!("{}: not valid YAML", display_name(&args.file)))?;
    for line in &report.stderr {
        eprintln!("{line}");
    }
    if report.failed {
        return Ok(ExitCode::from(1));
    }
    print!("{}", report.stdout);
    Ok(ExitCode::SUCCESS)
}

fn display_name(file: &str) -> &str {
    if file == "-" { "stdin" } else { file }
}

/// What `convert` prints, computed without IO.
#[derive(Debug, PartialEq)]
pub(crate) struct Report {
    pub stdout: String,
    pub stderr: Vec<String>,
    pub failed: bool,
}

pub(crate) fn convert_text(text: &str) -> anyhow::Result<Report> {
    let docs = legacy::parse_documents(text)?;
    if docs.is_empty() {
        anyhow::bail!("no YAML documents");
    }
    let mut outputs = Vec::new();
    let mut stderr = Vec::new();
    let mut failed = false;
    for (index, doc) in docs.iter().enumerate() {
        let label = document_label(index, doc);
        match legacy::convert(doc) {
            Ok(conversion) => {
                for warning in &conversion.warnings {
                    stderr.push(format!("warning: {label}: {warning}"));
                }
                outputs.push(
                    serde_saphyr::to_string(&conversion.appwrapper)
                        .with_context(|| format!("{label}: cannot serialise the result"))?,
                );
            }
            Err(err) => {
                failed = true;
                for problem in err.0 {
                    stderr.push(format!("error: {label}: {problem}"));
                }
            }
        }
    }
    let stdout = if failed {
        String::new()
    } else {
        outputs
            .iter()
            .map(|doc| doc.trim_end().to_string())
            .collect::<Vec<_>>()
            .join("\n---\n")
            + "\n"
    };
    Ok(Report {
        stdout,
        stderr,
        failed,
    })
}

/// `AppWrapper ns/name (document N)` for messages.
fn document_label(index: usize, doc: &serde_json::Value) -> String {
    let meta = |k: &str| {
        doc.get("metadata")
            .and_then(|m| m.get(k))
            .and_then(|v| v.as_str())
    };
    let number = index + 1;
    match (meta("namespace"), meta("name")) {
        (Some(ns), Some(name)) => format!("AppWrapper {ns}/{name} (document {number})"),
        (None, Some(name)) => format!("AppWrapper {name} (document {number})"),
        _ => format!("document {number}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lifeboat_api::appwrapper::AppWrapper;

    fn shared_dir() -> std::path::PathBuf {
        match std::env::var_os("LIFEBOAT_SHARED_DIR") {
            Some(dir) => dir.into(),
            None => std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"),
        }
    }

    fn legacy_file(name: &str) -> String {
        let path = shared_dir().join("testdata/mcad-legacy").join(name);
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; set LIFEBOAT_SHARED_DIR", path.display()))
    }

    #[test]
    fn multi_document_output_and_warnings() {
        let report = convert_text(&legacy_file("kuttl-04-install.yaml")).unwrap();
        assert!(!report.failed);
        let docs: Vec<AppWrapper> = serde_saphyr::from_multiple(&report.stdout).unwrap();
        let names: Vec<_> = docs
            .iter()
            .map(|d| d.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["aw-04", "aw-041"]);
        assert_eq!(report.stdout.matches("\n---\n").count(), 1);
        assert!(
            report
                .stdout
                .starts_with("apiVersion: workload.codeflare.dev/v1beta2\n")
        );
        assert_eq!(report.stderr.len(), 3, "{:?}", report.stderr);
        assert!(report.stderr[0].starts_with(
            "warning: AppWrapper start-up-02/aw-04 (document 1): \
             spec.resources.GenericItems[0].custompodresources[0].requests[nvidia.com/gpu]: "
        ));
        assert!(report.stderr.iter().all(|l| !l.contains('\n')));
    }

    #[test]
    fn a_bad_document_prints_nothing_and_names_the_field() {
        let text = format!(
            "{}\n---\n{}",
            legacy_file("kuttl-02-install.yaml"),
            legacy_file("kuttl-01-install.yaml")
        );
        let report = convert_text(&text).unwrap();
        assert!(report.failed);
        assert_eq!(report.stdout, "");
        assert_eq!(report.stderr.len(), 1);
        assert!(
            report.stderr[0].starts_with(
                "error: AppWrapper start-up-02/aw-01 (document 2): spec.resources.GenericItems: "
            ),
            "{}",
            report.stderr[0]
        );
    }

    #[test]
    fn invalid_yaml_is_an_error() {
        assert!(convert_text("apiVersion: [unclosed\n").is_err());
        assert!(convert_text("").is_err());
    }
}
