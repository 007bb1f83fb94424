//! The conformance runner: a directory laid out like Karmada's third-party customizations
//! (`<group>/<version>/<kind>/customizations.yaml` with `testdata/*.yaml` beside it), every test
//! case run against every customization document of its kind.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lifeboat_interpreter::{
    AggregatedStatusItem, Interpreter, Operation, ResourceInterpreterCustomization, Runtime,
};
use serde_json::Value;

use super::compare::{compact, compare};
use super::rule::{self, RuleArgs};

/// One failing case.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// `[<customization>/<operation>]:<name>`, or a file for load errors.
    pub case: String,
    pub file: PathBuf,
    pub reason: String,
}

/// The outcome of a directory.
#[derive(Debug, Default)]
pub struct Report {
    pub passed: usize,
    pub failures: Vec<Failure>,
}

const CUSTOMIZATIONS_FILE: &str = "customizations.yaml";

fn is_yaml(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}

/// Every file below `dir`, sorted, optionally skipping `testdata` folders.
fn walk(dir: &Path, skip_testdata: bool, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            if skip_testdata && entry.file_name() == "testdata" {
                continue;
            }
            walk(&path, skip_testdata, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// Looks a key up case-insensitively, as Go's JSON decoding of the test struct does.
fn get<'a>(doc: &'a serde_json::Map<String, Value>, key: &str) -> Option<&'a Value> {
    doc.get(key)
        .or_else(|| {
            doc.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| v)
        })
        .filter(|v| !v.is_null())
}

/// A plain Kubernetes object in `testdata` (older Karmada trees keep input fixtures there): not a
/// test case, so it is neither run nor counted.
fn is_fixture(doc: &Value) -> bool {
    doc.as_object().is_some_and(|map| {
        get(map, "operation").is_none()
            && map.contains_key("apiVersion")
            && map.contains_key("kind")
    })
}

/// A test case document.
struct Case {
    name: String,
    operation: String,
    args: RuleArgs,
    output: serde_json::Map<String, Value>,
}

fn object_arg(doc: &serde_json::Map<String, Value>, key: &str) -> Result<Option<Value>, String> {
    match get(doc, key) {
        None => Ok(None),
        Some(Value::Object(map)) => {
            if !matches!(map.get("kind"), Some(Value::String(k)) if !k.is_empty()) {
                return Err(format!("{key}: Object 'Kind' is missing"));
            }
            Ok(Some(Value::Object(map.clone())))
        }
        Some(other) => Err(format!("{key} must be an object, got {}", compact(other))),
    }
}

fn parse_case(doc: &Value) -> Result<Case, String> {
    let doc = doc
        .as_object()
        .ok_or_else(|| format!("a test case must be a mapping, got {}", compact(doc)))?;
    let text = |key: &str| match get(doc, key) {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!("{key} must be a string, got {}", compact(other))),
    };
    let status_items = match get(doc, "statusItems") {
        None => None,
        Some(items) => Some(
            serde_json::from_value::<Vec<AggregatedStatusItem>>(items.clone())
                .map_err(|e| format!("statusItems: {e}"))?,
        ),
    };
    let replicas = match get(doc, "inputReplicas") {
        None => 0,
        Some(v) => v
            .as_i64()
            .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
            .ok_or_else(|| format!("inputReplicas must be an integer, got {v}"))?,
    };
    let output = match get(doc, "output") {
        None => serde_json::Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(other) => return Err(format!("output must be a mapping, got {}", compact(other))),
    };
    Ok(Case {
        name: text("name")?,
        operation: text("operation")?,
        args: RuleArgs {
            desired: object_arg(doc, "desiredObj")?,
            observed: object_arg(doc, "observedObj")?,
            status_items,
            replicas,
        },
        output,
    })
}

/// A case document and the file it came from (or why it could not be read).
type LoadedCase = (PathBuf, Result<Case, String>);

/// Parses every case document of the `testdata` folder beside a customization.
fn load_cases(testdata: &Path, report_file: &Path) -> (Vec<LoadedCase>, Option<Failure>) {
    let mut files = Vec::new();
    if testdata.is_dir()
        && let Err(e) = walk(testdata, false, &mut files)
    {
        return (
            Vec::new(),
            Some(Failure {
                case: testdata.display().to_string(),
                file: report_file.to_path_buf(),
                reason: format!("cannot read test data: {e}"),
            }),
        );
    }
    let mut cases = Vec::new();
    for file in files.into_iter().filter(|f| is_yaml(f)) {
        let text = match std::fs::read_to_string(&file) {
            Ok(text) => text,
            Err(e) => {
                cases.push((file, Err(format!("cannot read: {e}"))));
                continue;
            }
        };
        match lifeboat_interpreter::yaml::parse_documents(&text) {
            Ok(docs) => {
                for doc in docs.iter().filter(|d| !is_fixture(d)) {
                    cases.push((file.clone(), parse_case(doc)));
                }
            }
            Err(e) => cases.push((file, Err(format!("cannot parse YAML: {e}")))),
        }
    }
    (cases, None)
}

/// Checks that `<group>/<version>/<kind>` folders match the target (`core` stands for the
/// core group, apiVersion `v1`).
fn check_layout(
    root: &Path,
    file: &Path,
    customization: &ResourceInterpreterCustomization,
) -> Result<(), String> {
    let Ok(relative) = file.strip_prefix(root) else {
        return Ok(());
    };
    let parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.len() != 4 {
        // Not the three-level layout (e.g. DIR is a kind folder itself): nothing to check.
        return Ok(());
    }
    let (group, version, kind) = (&parts[0], &parts[1], &parts[2]);
    let api_version = if group == "core" {
        version.clone()
    } else {
        format!("{group}/{version}")
    };
    let target = &customization.spec.target;
    if target.api_version != api_version {
        return Err(format!(
            "target apiVersion {} does not match the folder {group}/{version}",
            target.api_version
        ));
    }
    if &target.kind != kind {
        return Err(format!(
            "target kind {} does not match the folder {kind}",
            target.kind
        ));
    }
    Ok(())
}

/// How a case's `output` is checked against the results of its operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Expectations {
    /// Karmada's rule: a result without an expected value is not checked.
    #[default]
    Karmada,
    /// Every result must have an expected value (`requires: null` for no requirements), so a
    /// wrong result cannot pass unnoticed. Lifeboat's built-in cases use this.
    Strict,
}

/// Runs every case below `root`.
pub fn run_dir(
    root: &Path,
    runtime: &Arc<Runtime>,
    expectations: Expectations,
) -> Result<Report, String> {
    let mut files = Vec::new();
    walk(root, true, &mut files).map_err(|e| format!("cannot read {}: {e}", root.display()))?;
    let customization_files: Vec<PathBuf> = files
        .into_iter()
        .filter(|f| f.file_name().is_some_and(|n| n == CUSTOMIZATIONS_FILE))
        .collect();
    if customization_files.is_empty() {
        return Err(format!(
            "no {CUSTOMIZATIONS_FILE} found below {}",
            root.display()
        ));
    }
    let mut report = Report::default();
    for file in customization_files {
        run_kind(root, &file, runtime, expectations, &mut report);
    }
    Ok(report)
}

fn run_kind(
    root: &Path,
    file: &Path,
    runtime: &Arc<Runtime>,
    expectations: Expectations,
    report: &mut Report,
) {
    let fail_file = |report: &mut Report, reason: String| {
        report.failures.push(Failure {
            case: file.display().to_string(),
            file: file.to_path_buf(),
            reason,
        });
    };
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) => return fail_file(report, format!("cannot read: {e}")),
    };
    let customizations = match ResourceInterpreterCustomization::parse_documents(&text) {
        Ok(c) => c,
        Err(e) => return fail_file(report, e.to_string()),
    };
    let mut interpreter = Interpreter::new(runtime.clone());
    for customization in &customizations {
        if let Err(reason) = check_layout(root, file, customization) {
            return fail_file(report, reason);
        }
        if let Err(e) = interpreter.add(customization) {
            return fail_file(report, e.to_string());
        }
    }
    let testdata = file
        .parent()
        .map(|p| p.join("testdata"))
        .unwrap_or_default();
    let (cases, error) = load_cases(&testdata, file);
    if let Some(failure) = error {
        report.failures.push(failure);
        return;
    }
    for customization in &customizations {
        for (case_file, case) in &cases {
            let (label, outcome) = match case {
                Ok(case) => (
                    format!(
                        "[{}/{}]:{}",
                        customization.metadata.name, case.operation, case.name
                    ),
                    run_case(&interpreter, case, expectations),
                ),
                Err(reason) => (
                    format!("[{}]:<unreadable case>", customization.metadata.name),
                    Err(reason.clone()),
                ),
            };
            match outcome {
                Ok(()) => report.passed += 1,
                Err(reason) => report.failures.push(Failure {
                    case: label,
                    file: case_file.clone(),
                    reason,
                }),
            }
        }
    }
}

fn run_case(
    interpreter: &Interpreter,
    case: &Case,
    expectations: Expectations,
) -> Result<(), String> {
    let operation = Operation::from_name(&case.operation).ok_or_else(|| {
        format!(
            "operation {:?} is not supported; use one of: {}",
            case.operation,
            Operation::ALL.map(|o| o.name()).join(", ")
        )
    })?;
    let results = rule::run(interpreter, operation, &case.args)?;
    let mut checked = Vec::new();
    for (key, actual) in &results {
        match case.output.get(*key) {
            Some(expected) => {
                compare(expected, actual).map_err(|e| format!("{key}: {e}"))?;
                checked.push(*key);
            }
            // Karmada only logs a result without an expectation.
            None if expectations == Expectations::Karmada => {}
            None => {
                return Err(format!(
                    "output has no {key:?}: every result of {operation} needs an expected value \
                     (`{key}: null` when there is none)"
                ));
            }
        }
    }
    for key in case.output.keys() {
        if !checked.contains(&key.as_str()) {
            return Err(format!(
                "output key {key:?} is not a result of {operation} (results: {})",
                results
                    .iter()
                    .map(|(k, _)| *k)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    Ok(())
}
