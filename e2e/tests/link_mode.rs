//! The link mode of the shipped binaries against the image they ship in. The `Containerfile`
//! runs `lifeboat-hub` and `lifeboat-agent` on gcr.io/distroless/cc-debian12: glibc 2.36 and
//! libgcc_s, nothing else, no shell. Each binary must start with `--help` in an empty
//! environment, and every shared library it needs (ELF `DT_NEEDED`) must be one distroless/cc
//! provides: a dependency that starts linking OpenSSL or a system SQLite fails here, naming the
//! binary and the library, not at the image's first start.
//!
//! Which binaries: those in `lifeboat_bin_dir()`, the dev-profile ones that `make test` builds
//! for the e2e suites (`make lifeboat-bins`), or `LIFEBOAT_BIN_DIR`: `make image-check` builds
//! the release ones as the Containerfile does and points it at them. `make test` checks the dev
//! binaries only (a cold release build is about 9 minutes of CI), and checks here that nothing
//! makes the release binaries link differently: the release profile changes only code generation
//! and debug info, and no Cargo config, build flag or Containerfile environment changes the
//! linker or the target. Symbol versions are not checked: they depend on the glibc of the machine
//! that builds, and the image builds on rust:1.95-bookworm, whose glibc is the runtime's.

use std::path::Path;
use std::process::Command;

use lifeboat_e2e::fleet::lifeboat::lifeboat_bin_dir;
use object::elf::{DT_NEEDED, FileHeader64};
use object::read::elf::{FileHeader, ProgramHeader};
use object::{Endianness, elf::PT_INTERP};

/// The binaries the images ship (the Containerfile's `hub` and `agent` targets).
const SHIPPED: [&str; 2] = ["lifeboat-hub", "lifeboat-agent"];

/// The shared libraries of distroless/cc-debian12 (libc6 and libgcc-s1), by soname.
const DISTROLESS_CC: [&str; 8] = [
    "libc.so.6",
    "libm.so.6",
    "libgcc_s.so.1",
    "ld-linux-x86-64.so.2",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "libutil.so.1",
];

/// The dynamic loader distroless/cc provides, where a dynamically linked binary asks for it.
const INTERPRETER: &str = "/lib64/ld-linux-x86-64.so.2";

/// How an ELF file is linked: its program interpreter (`None`: static) and the sonames it needs.
#[derive(Debug, PartialEq, Eq)]
struct Linking {
    interpreter: Option<String>,
    needed: Vec<String>,
}

fn linking(data: &[u8]) -> Result<Linking, object::read::Error> {
    let header = FileHeader64::<Endianness>::parse(data)?;
    let endian = header.endian()?;
    let mut interpreter = None;
    for segment in header.program_headers(endian, data)? {
        if segment.p_type(endian) == PT_INTERP
            && let Some(path) = segment.interpreter(endian, data)?
        {
            interpreter = Some(String::from_utf8_lossy(path).into_owned());
        }
    }
    let sections = header.sections(endian, data)?;
    let dynamic = sections.dynamic_table(endian, data)?;
    let mut needed = Vec::new();
    for entry in dynamic.iter().filter(|d| d.tag == DT_NEEDED) {
        needed.push(String::from_utf8_lossy(dynamic.string(entry)?).into_owned());
    }
    Ok(Linking {
        interpreter,
        needed,
    })
}

/// What `binary`'s linking asks for that distroless/cc does not have.
fn outside_distroless_cc(binary: &str, linking: &Linking) -> Vec<String> {
    let mut problems: Vec<String> = linking
        .needed
        .iter()
        .filter(|soname| !DISTROLESS_CC.contains(&soname.as_str()))
        .map(|soname| format!("{binary} needs {soname}, which distroless/cc does not provide"))
        .collect();
    if let Some(interpreter) = &linking.interpreter
        && interpreter != INTERPRETER
    {
        problems.push(format!(
            "{binary} asks for the loader {interpreter}; distroless/cc has {INTERPRETER}"
        ));
    }
    problems
}

fn shipped_binary(name: &str) -> std::path::PathBuf {
    let dir = lifeboat_bin_dir().expect("the directory of the Lifeboat binaries");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build it first (`make lifeboat-bins`, or set LIFEBOAT_BIN_DIR)",
        path.display()
    );
    path
}

#[test]
fn shipped_binaries_need_only_what_distroless_cc_provides() {
    let mut problems = Vec::new();
    for name in SHIPPED {
        let path = shipped_binary(name);
        let data = std::fs::read(&path).expect("read the binary");
        let linking = linking(&data)
            .unwrap_or_else(|e| panic!("{}: not an x86-64 ELF file: {e}", path.display()));
        eprintln!("{}: {linking:?}", path.display());
        problems.extend(outside_distroless_cc(name, &linking));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn shipped_binaries_start_with_help_in_an_empty_environment() {
    for name in SHIPPED {
        let path = shipped_binary(name);
        let output = Command::new(&path)
            .arg("--help")
            .env_clear()
            .current_dir(Path::new("/"))
            .output()
            .unwrap_or_else(|e| panic!("{name}: could not start {}: {e}", path.display()));
        assert!(
            output.status.success() && String::from_utf8_lossy(&output.stdout).contains("Usage:"),
            "{name} --help in an empty environment: {}\nstdout: {}\nstderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// The keys a Cargo profile may set without changing how its binaries link (their loader and
/// their shared libraries): optimisation, debug info, checks and code-generation units.
const LINK_NEUTRAL_PROFILE_KEYS: [&str; 9] = [
    "opt-level",
    "debug",
    "debug-assertions",
    "overflow-checks",
    "codegen-units",
    "incremental",
    "strip",
    "split-debuginfo",
    "lto",
];

/// The keys set in `[profile.<name>]` and its sub-tables (`[profile.<name>.package."*"]`, ...)
/// of a Cargo manifest, with the table each is in. Only the plain `key = value` lines of those
/// tables: the workspace manifest writes profiles no other way.
fn profile_keys(manifest: &str, profile: &str) -> Vec<(String, String)> {
    let header = format!("[profile.{profile}");
    let mut table: Option<String> = None;
    let mut keys = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            table = (line == format!("{header}]") || line.starts_with(&format!("{header}.")))
                .then(|| line.to_string());
        } else if let Some(table) = &table
            && let Some((key, _)) = line.split_once('=')
            && !line.starts_with('#')
        {
            keys.push((table.clone(), key.trim().to_string()));
        }
    }
    keys
}

/// What in the workspace could make the release binaries link unlike the dev ones that
/// `make test` checks: a release-profile key outside [`LINK_NEUTRAL_PROFILE_KEYS`], a Cargo
/// config (rustflags, linker, target), or the Containerfile's build setting flags or a target.
fn release_link_differences(
    manifest: &str,
    containerfile: &str,
    cargo_configs: &[String],
) -> Vec<String> {
    let mut problems: Vec<String> = profile_keys(manifest, "release")
        .into_iter()
        .filter(|(_, key)| !LINK_NEUTRAL_PROFILE_KEYS.contains(&key.as_str()))
        .map(|(table, key)| {
            format!(
                "Cargo.toml {table} sets `{key}`, which may change how the release binaries link"
            )
        })
        .collect();
    problems.extend(cargo_configs.iter().map(|path| {
        format!("{path} exists: a Cargo config can set rustflags, the linker or the target for the release build")
    }));
    for line in containerfile
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
    {
        for setting in ["RUSTFLAGS", "CARGO_", "--target", "--config"] {
            if line.contains(setting) {
                problems.push(format!(
                    "Containerfile sets `{setting}` for its build: {}",
                    line.trim()
                ));
            }
        }
    }
    problems
}

#[test]
fn the_release_binaries_link_as_the_checked_dev_binaries_do() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest =
        std::fs::read_to_string(root.join("Cargo.toml")).expect("the workspace manifest");
    let containerfile =
        std::fs::read_to_string(root.join("Containerfile")).expect("the Containerfile");
    let cargo_configs: Vec<String> = [".cargo/config.toml", ".cargo/config"]
        .into_iter()
        .filter(|path| root.join(path).exists())
        .map(String::from)
        .collect();
    // The check reads what it checks: the release profile is there and sets something.
    assert!(
        !profile_keys(&manifest, "release").is_empty(),
        "no [profile.release] keys found in the workspace manifest"
    );
    let problems = release_link_differences(&manifest, &containerfile, &cargo_configs);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_release_setting_that_may_change_linking_is_named() {
    let manifest = "[profile.dev]\npanic = \"abort\"\n\n[profile.release]\ndebug = \"line-tables-only\"\n# panic = \"abort\"\npanic = \"abort\"\n\n[profile.release.package.\"*\"]\nopt-level = 3\n\n[profile.release.build-override]\nrustflags = [\"-C\", \"target-feature=+crt-static\"]\n\n[workspace]\npanic = 1\n";
    let containerfile = "# podman build --target hub\nRUN RUSTFLAGS='-C target-feature=+crt-static' cargo build --release\n";
    assert_eq!(
        release_link_differences(manifest, containerfile, &[".cargo/config.toml".to_string()]),
        [
            "Cargo.toml [profile.release] sets `panic`, which may change how the release binaries link",
            "Cargo.toml [profile.release.build-override] sets `rustflags`, which may change how the release binaries link",
            ".cargo/config.toml exists: a Cargo config can set rustflags, the linker or the target for the release build",
            "Containerfile sets `RUSTFLAGS` for its build: RUN RUSTFLAGS='-C target-feature=+crt-static' cargo build --release",
        ]
    );
}

#[test]
fn a_library_or_loader_outside_distroless_cc_is_named() {
    // The check itself on what a binary linking OpenSSL and musl's loader would show.
    let linking = Linking {
        interpreter: Some("/lib/ld-musl-x86_64.so.1".into()),
        needed: vec![
            "libgcc_s.so.1".into(),
            "libssl.so.3".into(),
            "libc.so.6".into(),
        ],
    };
    assert_eq!(
        outside_distroless_cc("lifeboat-hub", &linking),
        [
            "lifeboat-hub needs libssl.so.3, which distroless/cc does not provide",
            "lifeboat-hub asks for the loader /lib/ld-musl-x86_64.so.1; distroless/cc has \
             /lib64/ld-linux-x86-64.so.2",
        ]
    );
    // A static binary needs nothing.
    let statically = Linking {
        interpreter: None,
        needed: vec![],
    };
    assert!(outside_distroless_cc("lifeboat-agent", &statically).is_empty());
}

#[test]
fn the_elf_reader_finds_the_loader_and_libraries_of_this_test_binary() {
    // This test binary is linked like the shipped ones (same target and linker): the reader
    // must find glibc and the loader in it, or an empty result would pass the check above.
    let me = std::env::current_exe().expect("the test binary");
    let data = std::fs::read(&me).expect("read the test binary");
    let linking = linking(&data).expect("an ELF file");
    assert_eq!(linking.interpreter.as_deref(), Some(INTERPRETER));
    assert!(
        linking.needed.iter().any(|s| s == "libc.so.6"),
        "{linking:?}"
    );
}
