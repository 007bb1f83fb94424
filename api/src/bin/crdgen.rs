//! Writes the generated CRDs to `crds/`, or with `--check` fails when the committed files are
//! stale. Run from anywhere inside the repository: paths are resolved from this crate's manifest.

use std::path::PathBuf;
use std::process::ExitCode;

use lifeboat_api::appwrapper::crd;

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
    let generated = match crd::crd_yaml() {
        Ok(yaml) => yaml,
        Err(err) => {
            eprintln!("crdgen: cannot serialise the AppWrapper CRD: {err}");
            return ExitCode::FAILURE;
        }
    };
    if print {
        print!("{generated}");
        return ExitCode::SUCCESS;
    }
    let file = repo_root.join(crd::CRD_FILE);
    if check {
        return match std::fs::read_to_string(&file) {
            Ok(committed) if committed == generated => ExitCode::SUCCESS,
            Ok(_) => {
                eprintln!(
                    "crdgen: {} is stale: it differs from the CRD generated from the Rust types; \
                     run `cargo run -q -p lifeboat-api --bin crdgen` and commit the result",
                    crd::CRD_FILE
                );
                ExitCode::FAILURE
            }
            Err(err) => {
                eprintln!(
                    "crdgen: cannot read {}: {err}; run `cargo run -q -p lifeboat-api --bin crdgen` \
                     and commit the result",
                    crd::CRD_FILE
                );
                ExitCode::FAILURE
            }
        };
    }
    if let Err(err) = std::fs::write(&file, &generated) {
        eprintln!("crdgen: cannot write {}: {err}", file.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {}", crd::CRD_FILE);
    ExitCode::SUCCESS
}
