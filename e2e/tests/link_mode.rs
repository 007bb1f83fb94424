//! The link mode of the shipped binaries against the image they ship in. The `Containerfile`
//! runs `lifeboat-hub` and `lifeboat-agent` on gcr.io/distroless/cc-debian12: glibc 2.36 and
//! libgcc_s, nothing else, no shell. Each binary must start with `--help` in an empty
//! environment, and every shared library it needs (ELF `DT_NEEDED`) must be one distroless/cc
//! provides: a dependency that starts linking OpenSSL or a system SQLite fails here, naming the
//! binary and the library, not at the image's first start.
//!
//! Which binaries: those in `lifeboat_bin_dir()`, the dev-profile ones that `make test` builds
//! for the e2e suites (`make lifeboat-bins`), or `LIFEBOAT_BIN_DIR`: `make image-check`, the last
//! step of `make test`, builds the release ones as the Containerfile does and points it at
//! them. Symbol versions are not checked: they depend on the glibc of the machine that builds,
//! and the image builds on rust:1.95-bookworm, whose glibc is the runtime's.

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
