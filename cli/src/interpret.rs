//! `lifeboatctl interpret`: run Lua resource interpreters offline.
//!
//! - `lifeboatctl interpret test DIR [--repeat N]`: conformance run over a Karmada-style
//!   customization folder (N times, on new Lua states each time).
//! - `lifeboatctl interpret --operation OP --customization FILE --observed-file F | --desired-file F
//!   [--status-file F] [--replicas N]`: one operation on files, result printed as YAML.

mod compare;
mod conformance;
mod rule;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Subcommand;
use conformance::Expectations;
use lifeboat_interpreter::{AggregatedStatusItem, Interpreter, Operation, Runtime, RuntimeConfig};
use serde_json::Value;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct InterpretArgs {
    #[command(subcommand)]
    command: Option<InterpretCommand>,
    #[command(flatten)]
    single: SingleArgs,
}

#[derive(Subcommand)]
enum InterpretCommand {
    /// Run every test case of a customization folder (Karmada's third-party layout:
    /// <group>/<version>/<kind>/customizations.yaml and testdata/*.yaml). Prints one line per
    /// failing case and "N passed, M failed"; exits 1 when a case fails.
    Test {
        /// The folder to run.
        dir: PathBuf,
        /// Run the whole folder this many times, each run on new Lua states (a result must not
        /// depend on the state: iteration order, hash seeds). Counts add up over the runs.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        repeat: u32,
        /// Every result of an operation needs an expected value in the case's output (write
        /// `requires: null` for no replica requirements). Without it, Karmada's rule: results
        /// without an expected value are not checked.
        #[arg(long)]
        strict: bool,
    },
}

#[derive(clap::Args)]
struct SingleArgs {
    /// Operation to run: Retain, InterpretReplica, InterpretComponent, ReviseReplica,
    /// InterpretStatus, AggregateStatus, InterpretHealth, InterpretDependency (any case).
    #[arg(long)]
    operation: Option<String>,
    /// File with the ResourceInterpreterCustomization(s).
    #[arg(long)]
    customization: Option<PathBuf>,
    /// The member-cluster object (YAML or JSON).
    #[arg(long = "observed-file")]
    observed_file: Option<PathBuf>,
    /// The resource template (YAML or JSON).
    #[arg(long = "desired-file")]
    desired_file: Option<PathBuf>,
    /// AggregateStatus items: a YAML list of {clusterName, status, applied, health}.
    #[arg(long = "status-file")]
    status_file: Option<PathBuf>,
    /// Replicas for ReviseReplica.
    #[arg(long, alias = "desired-replica")]
    replicas: Option<i64>,
}

pub fn run(args: InterpretArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        Some(InterpretCommand::Test {
            dir,
            repeat,
            strict,
        }) => run_tests(
            &dir,
            repeat,
            if strict {
                Expectations::Strict
            } else {
                Expectations::Karmada
            },
        ),
        None => run_single(args.single),
    }
}

fn run_tests(dir: &Path, repeat: u32, expectations: Expectations) -> anyhow::Result<ExitCode> {
    let mut passed = 0;
    let mut failed = 0;
    for run in 1..=repeat {
        // A new runtime per run: new Lua states, each with its own string-hash seed.
        let runtime = Arc::new(Runtime::new(RuntimeConfig::default()));
        let report =
            conformance::run_dir(dir, &runtime, expectations).map_err(anyhow::Error::msg)?;
        let prefix = if repeat > 1 {
            format!("run {run}/{repeat}: ")
        } else {
            String::new()
        };
        for failure in &report.failures {
            println!(
                "{prefix}FAIL {} {}: {}",
                failure.file.display(),
                failure.case,
                failure.reason
            );
        }
        passed += report.passed;
        failed += report.failures.len();
    }
    if repeat > 1 {
        println!("{passed} passed, {failed} failed ({repeat} runs)");
    } else {
        println!("{passed} passed, {failed} failed");
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn read_documents(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    lifeboat_interpreter::yaml::parse_documents(&text)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("cannot parse {}", path.display()))
}

fn read_object(path: &Path) -> anyhow::Result<Value> {
    let mut docs = read_documents(path)?;
    if docs.len() != 1 {
        bail!(
            "{} must hold exactly one object, found {}",
            path.display(),
            docs.len()
        );
    }
    let object = docs.remove(0);
    if !object.is_object() {
        bail!("{} does not hold an object", path.display());
    }
    Ok(object)
}

fn read_status_items(path: &Path) -> anyhow::Result<Vec<AggregatedStatusItem>> {
    let docs = read_documents(path)?;
    let items: Vec<Value> = match docs.as_slice() {
        [Value::Array(items)] => items.clone(),
        _ => docs,
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            serde_json::from_value(item)
                .with_context(|| format!("{}: status item {i}", path.display()))
        })
        .collect()
}

fn run_single(args: SingleArgs) -> anyhow::Result<ExitCode> {
    let Some(operation_name) = args.operation else {
        bail!("give --operation (or use `interpret test DIR`)");
    };
    let operation = Operation::from_name(&operation_name).with_context(|| {
        format!(
            "unknown operation {operation_name:?}; use one of: {}",
            Operation::ALL.map(|o| o.name()).join(", ")
        )
    })?;
    let Some(customization) = args.customization else {
        bail!("give --customization FILE");
    };
    let text = std::fs::read_to_string(&customization)
        .with_context(|| format!("cannot read {}", customization.display()))?;
    let mut interpreter = Interpreter::new(Arc::new(Runtime::new(RuntimeConfig::default())));
    interpreter
        .add_yaml(&text)
        .with_context(|| format!("cannot load {}", customization.display()))?;

    let rule_args = rule::RuleArgs {
        desired: args.desired_file.as_deref().map(read_object).transpose()?,
        observed: args.observed_file.as_deref().map(read_object).transpose()?,
        status_items: args
            .status_file
            .as_deref()
            .map(read_status_items)
            .transpose()?,
        replicas: args.replicas.unwrap_or(0),
    };
    let results = rule::run(&interpreter, operation, &rule_args).map_err(anyhow::Error::msg)?;
    let mut output = serde_json::Map::new();
    for (key, actual) in results {
        output.insert(key.to_string(), actual.to_json());
    }
    let yaml = serde_saphyr::to_string(&Value::Object(output))
        .context("cannot print the result as YAML")?;
    print!("{yaml}");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared folder: LIFEBOAT_SHARED_DIR, else ../shared beside the repository.
    fn shared_dir() -> PathBuf {
        match std::env::var_os("LIFEBOAT_SHARED_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"),
        }
    }

    fn repo_root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    fn assert_all_pass(dir: &Path, expectations: Expectations) -> usize {
        let runtime = Arc::new(Runtime::new(RuntimeConfig::default()));
        let report = conformance::run_dir(dir, &runtime, expectations).unwrap();
        let failures: Vec<String> = report
            .failures
            .iter()
            .map(|f| format!("{} {}: {}", f.file.display(), f.case, f.reason))
            .collect();
        assert!(
            failures.is_empty(),
            "{} failures:\n{}",
            failures.len(),
            failures.join("\n")
        );
        report.passed
    }

    #[test]
    fn karmada_third_party_cases_all_pass() {
        let dir = shared_dir().join("testdata/karmada-interpreter");
        assert!(
            dir.is_dir(),
            "{} not found: set LIFEBOAT_SHARED_DIR",
            dir.display()
        );
        assert_eq!(assert_all_pass(&dir, Expectations::Karmada), 372);
    }

    #[test]
    fn builtin_interpreter_cases_all_pass_with_every_result_expected() {
        // Ten kinds, at least five cases per operation each.
        assert_eq!(
            assert_all_pass(
                &repo_root().join("interpreter-scripts"),
                Expectations::Strict
            ),
            335
        );
    }

    /// A one-kind folder with a GetReplicas script and `cases` as its replica test data.
    fn replica_folder(name: &str, script: &str, cases: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lifeboat-{name}-{}", std::process::id()));
        let kind = dir.join("example.com/v1/Widget");
        std::fs::create_dir_all(kind.join("testdata")).unwrap();
        std::fs::write(
            kind.join("customizations.yaml"),
            format!("apiVersion: config.lifeboat.dev/v1alpha1\nkind: ResourceInterpreterCustomization\nmetadata:\n  name: widget\nspec:\n  target:\n    apiVersion: example.com/v1\n    kind: Widget\n  customizations:\n    replicaResource:\n      luaScript: |\n        {script}\n"),
        )
        .unwrap();
        std::fs::write(kind.join("testdata/interpretreplica-test.yaml"), cases).unwrap();
        dir
    }

    #[test]
    fn no_requirements_is_an_explicit_expectation_in_strict_mode() {
        let object = "desiredObj:\n  apiVersion: example.com/v1\n  kind: Widget\n";
        let cases = format!(
            "name: explicit\noperation: InterpretReplica\n{object}output:\n  replica: 2\n  requires: null\n---\nname: omitted\noperation: InterpretReplica\n{object}output:\n  replica: 2\n"
        );
        let runtime = Arc::new(Runtime::new(RuntimeConfig::default()));
        let failures = |dir: &Path, expectations| {
            let report = conformance::run_dir(dir, &runtime, expectations).unwrap();
            report
                .failures
                .into_iter()
                .map(|f| format!("{}: {}", f.case, f.reason))
                .collect::<Vec<_>>()
        };
        // A script without requirements: `requires: null` holds; the omitted key passes under
        // Karmada's rule only.
        let none = replica_folder("none", "function GetReplicas(o) return 2 end", &cases);
        assert!(failures(&none, Expectations::Karmada).is_empty());
        let strict = failures(&none, Expectations::Strict);
        assert_eq!(strict.len(), 1, "{strict:?}");
        assert!(
            strict[0].contains(":omitted") && strict[0].contains("`requires: null`"),
            "{strict:?}"
        );
        std::fs::remove_dir_all(&none).unwrap();
        // A wrong script that returns requirements fails `requires: null` under both rules.
        let wrong = replica_folder(
            "wrong",
            "function GetReplicas(o) return 2, {resourceRequest = {cpu = '1'}} end",
            &cases,
        );
        for expectations in [Expectations::Karmada, Expectations::Strict] {
            let found = failures(&wrong, expectations);
            assert!(
                found
                    .iter()
                    .any(|f| f.contains(":explicit") && f.contains("requires: expected null")),
                "{found:?}"
            );
        }
        std::fs::remove_dir_all(&wrong).unwrap();
    }

    #[test]
    fn runner_reports_wrong_expectations_and_unknown_operations() {
        let dir = std::env::temp_dir().join(format!("lifeboat-runner-{}", std::process::id()));
        let kind = dir.join("example.com/v1/Widget");
        std::fs::create_dir_all(kind.join("testdata")).unwrap();
        std::fs::write(
            kind.join("customizations.yaml"),
            "apiVersion: config.karmada.io/v1alpha1\nkind: ResourceInterpreterCustomization\nmetadata:\n  name: widget\nspec:\n  target:\n    apiVersion: example.com/v1\n    kind: Widget\n  customizations:\n    healthInterpretation:\n      luaScript: |\n        function InterpretHealth(o) return o.status.ready end\n",
        )
        .unwrap();
        let object = "observedObj:\n  apiVersion: example.com/v1\n  kind: Widget\n  status:\n    ready: true\n";
        std::fs::write(
            kind.join("testdata/health-test.yaml"),
            format!(
                "name: right\noperation: interprethealth\n{object}output:\n  healthy: true\n---\nname: wrong\noperation: InterpretHealth\n{object}output:\n  healthy: false\n---\nname: unknown op\noperation: Prune\n{object}output: {{}}\n---\nname: extra key\noperation: InterpretHealth\n{object}output:\n  replica: 1\n"
            ),
        )
        .unwrap();
        // An input fixture (a plain object, as older Karmada trees keep) is neither run nor counted.
        std::fs::write(
            kind.join("testdata/observed-widget.yaml"),
            "apiVersion: example.com/v1\nkind: Widget\nstatus:\n  ready: false\n",
        )
        .unwrap();
        let runtime = Arc::new(Runtime::new(RuntimeConfig::default()));
        let report = conformance::run_dir(&dir, &runtime, Expectations::Karmada).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(report.passed, 1);
        let cases: Vec<&str> = report.failures.iter().map(|f| f.case.as_str()).collect();
        assert_eq!(
            cases,
            [
                "[widget/InterpretHealth]:wrong",
                "[widget/Prune]:unknown op",
                "[widget/InterpretHealth]:extra key"
            ]
        );
        assert!(
            report.failures[0]
                .reason
                .contains("expected false, got true")
        );
    }
}
