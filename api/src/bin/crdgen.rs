//! Writes the generated CRDs to `crds/` and their copies to the hub chart's `crds/` (the chart
//! installs every one of them), or with `--check` fails when a committed file is stale. Run from
//! anywhere inside the repository: paths are resolved from this crate's manifest.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use lifeboat_api::crds;

/// Where the hub chart keeps its copies, relative to the repository root.
const HUB_CHART_CRDS: &str = "charts/lifeboat-hub/crds";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (check, print) = match args.as_slice() {
        [] => (false, false),
        [flag] if flag == "--check" => (true, false),
        [flag] if flag == "--print" => (false, true),
        _ => {
            eprintln!("usage: crdgen [--check | --print]");
            return ExitCode::from(2);
        }
    };
    let repo_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut failed = false;
    for generated in crds::all() {
        let yaml = match generated.yaml() {
            Ok(yaml) => yaml,
            Err(err) => {
                eprintln!("crdgen: cannot serialise {}: {err}", generated.file);
                return ExitCode::FAILURE;
            }
        };
        if print {
            println!("{yaml}---");
            continue;
        }
        let name = Path::new(generated.file)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for relative in [
            generated.file.to_string(),
            format!("{HUB_CHART_CRDS}/{name}"),
        ] {
            let file = repo_root.join(&relative);
            if check {
                if let Err(why) = up_to_date(&file, &yaml) {
                    eprintln!(
                        "crdgen: {relative} {why} (generated from {}); run \
                         `cargo run -q -p lifeboat-api --bin crdgen` and commit the result",
                        generated.source
                    );
                    failed = true;
                }
                continue;
            }
            if let Err(err) = std::fs::write(&file, &yaml) {
                eprintln!("crdgen: cannot write {}: {err}", file.display());
                return ExitCode::FAILURE;
            }
            println!("wrote {relative}");
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Whether the committed `file` is `yaml`; if not, why.
fn up_to_date(file: &Path, yaml: &str) -> Result<(), String> {
    match std::fs::read_to_string(file) {
        Ok(committed) if committed == yaml => Ok(()),
        Ok(_) => Err("is stale: it differs from the generated CRD".into()),
        Err(err) => Err(format!("cannot be read: {err}")),
    }
}
