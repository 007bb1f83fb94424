//! The harness of the e2e test binaries: one fleet per test binary, shared by its tests, each test
//! in namespaces of its own. The fleet is torn down after the last test; when a test failed its
//! state dir (component logs) is kept and its path printed.
//!
//! A test binary sets `harness = false` in Cargo.toml and calls [`run`] from `main`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};

use crate::fleet::{Fleet, FleetConfig};
use crate::wait;

pub type TestError = Box<dyn std::error::Error + Send + Sync>;
pub type TestResult = std::result::Result<(), TestError>;
type TestFuture = Pin<Box<dyn Future<Output = TestResult> + Send>>;
type TestFn = Box<dyn Fn(Arc<TestContext>) -> TestFuture + Send + Sync>;

/// One e2e test.
pub struct E2eTest {
    name: String,
    run: TestFn,
}

impl E2eTest {
    pub fn new<F, Fut>(name: &str, f: F) -> Self
    where
        F: Fn(Arc<TestContext>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = TestResult> + Send + 'static,
    {
        Self {
            name: name.to_string(),
            run: Box::new(move |ctx| Box::pin(f(ctx))),
        }
    }
}

/// What a test gets: the shared fleet and its own namespace name.
pub struct TestContext {
    pub fleet: Arc<Fleet>,
    /// The test's namespace; created on demand per cluster by [`TestContext::namespace`].
    pub namespace: String,
    created: Mutex<HashMap<String, bool>>,
}

impl TestContext {
    /// A context on a fleet started outside [`run`] (bench binaries, which cargo runs with
    /// `--bench` and so cannot use the test harness), with `namespace` as its namespace.
    pub fn new(fleet: Arc<Fleet>, namespace: &str) -> TestContext {
        TestContext {
            fleet,
            namespace: namespace.to_string(),
            created: Mutex::new(HashMap::new()),
        }
    }

    /// An admin client for a cluster of the fleet.
    pub async fn client(&self, cluster: &str) -> Result<kube::Client, TestError> {
        Ok(self.fleet.client(cluster).await?)
    }

    /// The first member cluster's name.
    pub fn first_member(&self) -> String {
        self.fleet
            .member_names()
            .into_iter()
            .next()
            .unwrap_or_else(|| "member-1".into())
    }

    /// Creates the test's namespace in `cluster` (once) and waits for its default service
    /// account, so pods can be created in it at once. Returns the namespace name.
    pub async fn namespace(&self, cluster: &str) -> Result<String, TestError> {
        if self.created_lock().get(cluster).copied().unwrap_or(false) {
            return Ok(self.namespace.clone());
        }
        let client = self.client(cluster).await?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(self.namespace.clone()),
                labels: Some([("fleet.lifeboat.dev/e2e".to_string(), "true".to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match namespaces.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        let accounts: Api<ServiceAccount> = Api::namespaced(client, &self.namespace);
        wait::until(
            "default service account",
            Duration::from_secs(60),
            || async {
                match accounts.get_opt("default").await {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => Err("not created yet".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await?;
        self.created_lock().insert(cluster.to_string(), true);
        Ok(self.namespace.clone())
    }

    fn created_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, bool>> {
        self.created.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A namespace name for a test: its name made DNS-safe, plus a short suffix.
pub fn namespace_for(test: &str, index: usize) -> String {
    let mut name: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    name.truncate(50);
    let name = name.trim_matches('-');
    format!("e2e-{name}-{index}")
}

/// Runs a suite of tests on one shared fleet. `configure` adjusts the fleet before it starts.
pub fn run(suite: &str, configure: impl FnOnce(&mut FleetConfig), tests: Vec<E2eTest>) -> ExitCode {
    // e2e tests mostly wait on the cluster: run more of them at once than there are cores.
    run_with_threads(suite, configure, tests, 8)
}

/// [`run`] for tests that break the shared fleet (kill its processes): one at a time, in the
/// order given.
pub fn run_serial(
    suite: &str,
    configure: impl FnOnce(&mut FleetConfig),
    tests: Vec<E2eTest>,
) -> ExitCode {
    run_with_threads(suite, configure, tests, 1)
}

fn run_with_threads(
    suite: &str,
    configure: impl FnOnce(&mut FleetConfig),
    tests: Vec<E2eTest>,
    threads: usize,
) -> ExitCode {
    let mut args = libtest_mimic::Arguments::from_args();
    if args.test_threads.is_none() {
        args.test_threads = Some(threads);
    }
    // Logs of the fleet and of whatever the tests run in-process go to a file beside the
    // fleet's state dir, so test output stays readable; its path is printed on failure.
    let log_path = crate::fleet::workspace_root()
        .join("target")
        .join("e2e-fleets")
        .join(format!("{suite}.log"));
    if let Some(dir) = log_path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Ok(file) = std::fs::File::create(&log_path) {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "info,kube_client=warn,kube_runtime=warn".into()),
            )
            .with_ansi(false)
            .with_writer(Mutex::new(file))
            .try_init();
    }
    let selected = tests
        .iter()
        .filter(|t| {
            args.filter.as_ref().is_none_or(|f| {
                if args.exact {
                    t.name == *f
                } else {
                    t.name.contains(f.as_str())
                }
            })
        })
        .count();
    // Listing, or nothing selected: no fleet needed.
    if args.list || selected == 0 {
        let trials = tests
            .into_iter()
            .map(|t| libtest_mimic::Trial::test(t.name, || Ok(())))
            .collect();
        return libtest_mimic::run(&args, trials).exit_code();
    }

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Arc::new(rt),
        Err(e) => {
            eprintln!("cannot start a tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut config = FleetConfig::new(
        crate::fleet::workspace_root()
            .join("target")
            .join("e2e-fleets")
            .join(suite),
    );
    configure(&mut config);
    eprintln!(
        "starting fleet for {suite}: hub + {} members in {}",
        config.members,
        config.state_dir.display()
    );
    let fleet = match runtime.block_on(Fleet::up(config)) {
        Ok(f) => Arc::new(f),
        Err(e) => {
            eprintln!("fleet failed to start: {e}");
            return ExitCode::FAILURE;
        }
    };

    let trials = tests
        .into_iter()
        .enumerate()
        .map(|(i, test)| {
            let fleet = fleet.clone();
            let runtime = runtime.clone();
            let namespace = namespace_for(&test.name, i);
            let run = test.run;
            libtest_mimic::Trial::test(test.name, move || {
                let ctx = Arc::new(TestContext {
                    fleet,
                    namespace,
                    created: Mutex::new(HashMap::new()),
                });
                runtime
                    .block_on(run(ctx))
                    .map_err(|e| libtest_mimic::Failed::from(format!("{e}")))
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    if conclusion.has_failed() {
        fleet.keep_state_dir(true);
        eprintln!("logs of the test process: {}", log_path.display());
    }
    fleet.teardown();
    conclusion.exit_code()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_dns_safe_and_unique_per_index() {
        assert_eq!(
            namespace_for("Job completes, GPUs", 3),
            "e2e-job-completes--gpus-3"
        );
        assert_ne!(namespace_for("a", 1), namespace_for("a", 2));
        let long = namespace_for(&"x".repeat(200), 1);
        assert!(long.len() <= 63);
    }
}
