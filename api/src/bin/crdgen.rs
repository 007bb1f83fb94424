//! Writes the generated CRDs to `crds/`, or with `--check` fails when a committed file is
//! stale. Run from anywhere inside the repository: paths are resolved from this crate's manifest.

use std::path::PathBuf;
use std::process::ExitCode;

use lifeboat_api::crds;

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
        let file = repo_root.join(generated.file);
        if check {
            match std::fs::read_to_string(&file) {
                Ok(committed) if committed == yaml => {}
                Ok(_) => {
                    eprintln!(
                        "crdgen: {} is stale: it differs from the CRD generated from {}; \
                         run `cargo run -q -p lifeboat-api --bin crdgen` and commit the result",
                        generated.file, generated.source
                    );
                    failed = true;
                }
                Err(err) => {
                    eprintln!(
                        "crdgen: cannot read {}: {err}; run `cargo run -q -p lifeboat-api --bin crdgen` \
                         and commit the result",
                        generated.file
                    );
                    failed = true;
                }
            }
            continue;
        }
        if let Err(err) = std::fs::write(&file, &yaml) {
            eprintln!("crdgen: cannot write {}: {err}", file.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", generated.file);
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
