//! The Helm charts (charts/) against the fleet's real apiservers and the real binaries: the CRD
//! copies equal `crds/`, `helm lint --strict`, every rendering accepted by a server-side dry run,
//! install / upgrade / uninstall, the hub and the agent started with exactly the arguments and
//! environment their rendered Deployments give them, under the ServiceAccount and roles of their
//! charts (the agent joins the hub and runs a placed AppWrapper; a read outside the roles is
//! denied), every metric the dashboard and the alert rules name exported by them, and the alert
//! rules through `promtool check rules` and their unit tests (`promtool test rules`).
//!
//! Helm, promtool and the upstream CRDs of the optional kinds come from `make tools`
//! (e2e/tools/build.sh). The fleet runs no Prometheus Operator and no cert-manager, but their
//! real CRDs (ServiceMonitor, PrometheusRule; Certificate, Issuer, at the versions pinned in
//! e2e/tools/versions.env) are installed first, so the apiserver validates those objects against
//! the projects' own schemas in the dry runs and installs.
//!
//! Cluster use: the hub chart on the hub, the agent chart on member-1 (dry runs, installs), the
//! rendered agent in hub mode on member-1 and the rendered standalone agent (with its webhook)
//! on member-2.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{Api, DynamicObject, PostParams};
use kube::config::Kubeconfig;
use lifeboat_api::cluster::Cluster;
use lifeboat_e2e::fleet::lifeboat::{
    appwrapper_resource, cluster_ready, hub_ca_in, lifeboat_bin_dir, place_training,
    until_appwrapper_running,
};
use lifeboat_e2e::fleet::workspace_root;
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestError, TestResult};
use lifeboat_e2e::{kubectl, ports, wait};
use serde_json::Value;

const T: Duration = Duration::from_secs(90);
const CHARTS: [Chart; 2] = [Chart::Hub, Chart::Agent];
/// The values files the charts are tested with besides their defaults.
const ALL_OPTIONAL: &str = "ci/all-optional-values.yaml";
/// The hub chart's unit tests of its alert rules (`promtool test rules`).
const RULES_TEST: &str = "ci/rules-test.yaml";

fn main() -> ExitCode {
    harness::run(
        "charts",
        |c| c.members = 2,
        vec![
            E2eTest::new("chart_crds_are_the_repos_crds_byte_for_byte", crd_copies),
            E2eTest::new("charts_pass_helm_lint_strict", lint),
            E2eTest::new("every_rendering_passes_a_server_side_dry_run", dry_run),
            E2eTest::new(
                "charts_install_upgrade_and_uninstall",
                install_upgrade_uninstall,
            ),
            E2eTest::new(
                "rendered_hub_and_agent_run_join_and_export_the_dashboard_and_rule_metrics",
                rendered_hub_and_agent,
            ),
            E2eTest::new(
                "rendered_standalone_agent_with_its_webhook_starts",
                rendered_standalone_agent,
            ),
            E2eTest::new("dashboard_uses_a_datasource_variable", dashboard_datasource),
            E2eTest::new(
                "alert_rules_pass_promtool_check_and_their_unit_tests",
                alert_rules,
            ),
        ],
    )
}

#[derive(Clone, Copy, Debug)]
enum Chart {
    Hub,
    Agent,
}

impl Chart {
    fn dir(self) -> PathBuf {
        workspace_root().join("charts").join(self.name())
    }
    fn name(self) -> &'static str {
        match self {
            Chart::Hub => "lifeboat-hub",
            Chart::Agent => "lifeboat-agent",
        }
    }
    /// The fleet cluster the chart is installed in.
    fn cluster(self) -> &'static str {
        match self {
            Chart::Hub => "hub",
            Chart::Agent => "member-1",
        }
    }
}

/// The directory `make tools` puts `tool` in (e2e/tools/build.sh --print-dir).
fn tool_dir(tool: &str) -> Result<PathBuf, TestError> {
    let out = std::process::Command::new("bash")
        .arg(workspace_root().join("e2e/tools/build.sh"))
        .args(["--print-dir", tool])
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "e2e/tools/build.sh --print-dir {tool}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// A tool `make tools` builds (e2e/tools/build.sh), or the binary the environment variable
/// `env` names.
fn tool_bin(tool: &str, env: &str) -> Result<PathBuf, TestError> {
    if let Ok(path) = std::env::var(env)
        && !path.is_empty()
    {
        return Ok(PathBuf::from(path));
    }
    let bin = tool_dir(tool)?.join(tool);
    if !bin.is_file() {
        return Err(format!("{} is missing: run `make tools`", bin.display()).into());
    }
    Ok(bin)
}

/// The files of the upstream Prometheus Operator and cert-manager CRDs `make tools` copies
/// (e2e/tools/build.sh chart-crds), from the directory `LIFEBOAT_CHART_CRDS` names if set.
fn chart_crd_files() -> Result<Vec<String>, TestError> {
    let dir = match std::env::var("LIFEBOAT_CHART_CRDS") {
        Ok(path) if !path.is_empty() => PathBuf::from(path),
        _ => tool_dir("chart-crds")?,
    };
    CHART_CRD_FILES
        .iter()
        .map(|name| {
            let file = dir.join(name);
            if file.is_file() {
                Ok(file.display().to_string())
            } else {
                Err(format!("{} is missing: run `make tools`", file.display()).into())
            }
        })
        .collect()
}

/// The upstream CRDs the charts' optional objects need, as e2e/tools/build.sh names them.
const CHART_CRD_FILES: [&str; 4] = [
    "monitoring.coreos.com_servicemonitors.yaml",
    "monitoring.coreos.com_prometheusrules.yaml",
    "cert-manager.io_certificates.yaml",
    "cert-manager.io_issuers.yaml",
];

fn helm_bin() -> Result<PathBuf, TestError> {
    tool_bin("helm", "LIFEBOAT_HELM")
}

/// Runs a tool with `args` (120 s at most); its output, or an error with its stdout and stderr.
async fn run_tool(
    mut command: tokio::process::Command,
    tool: &str,
    args: &[&str],
) -> Result<std::process::Output, TestError> {
    let output = command
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), output)
        .await
        .map_err(|_| format!("{tool} {args:?} did not finish in 120 s"))??;
    if !output.status.success() {
        return Err(format!(
            "{tool} {args:?} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(output)
}

/// Runs helm with its state inside the fleet's state dir; stdout on success.
async fn helm(ctx: &TestContext, args: &[&str]) -> Result<String, TestError> {
    let home = ctx.fleet.state_dir().join("helm");
    let mut command = tokio::process::Command::new(helm_bin()?);
    command
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    let output = run_tool(command, "helm", args).await?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `helm template` of `chart` as release `release` in `namespace`, with the values file (relative
/// to the chart) and `--set` pairs given.
async fn render(
    ctx: &TestContext,
    chart: Chart,
    release: &str,
    namespace: &str,
    values: Option<&str>,
    set: &[String],
    extra: &[&str],
) -> Result<String, TestError> {
    let dir = chart.dir();
    let mut args: Vec<String> = vec![
        "template".into(),
        release.into(),
        dir.display().to_string(),
        "--namespace".into(),
        namespace.into(),
    ];
    if let Some(file) = values {
        args.push("--values".into());
        args.push(dir.join(file).display().to_string());
    }
    for s in set {
        args.push("--set".into());
        args.push(s.clone());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    helm(ctx, &args).await
}

async fn kubectl_ok(
    ctx: &TestContext,
    cluster: &str,
    args: &[&str],
    stdin: Option<String>,
) -> Result<String, TestError> {
    let kubeconfig = ctx.fleet.kubeconfig(cluster)?;
    kubectl::run(&kubeconfig, None, args, stdin)
        .await?
        .map_err(|stderr| format!("kubectl {args:?} on {cluster}: {stderr}").into())
}

/// The Prometheus Operator's and cert-manager's own CRDs of the kinds the charts render
/// optionally, in `cluster`.
async fn install_upstream_crds(ctx: &TestContext, cluster: &str) -> TestResult {
    let files = chart_crd_files()?;
    let mut apply = vec!["apply", "--server-side"];
    let mut wait = vec!["wait", "--for=condition=Established", "--timeout=60s"];
    for file in &files {
        apply.extend(["-f", file.as_str()]);
        wait.extend(["-f", file.as_str()]);
    }
    kubectl_ok(ctx, cluster, &apply, None).await?;
    kubectl_ok(ctx, cluster, &wait, None).await?;
    Ok(())
}

async fn crd_copies(_ctx: Arc<TestContext>) -> TestResult {
    let root = workspace_root();
    let copies = root.join("charts/lifeboat-hub/crds");
    let mut names: Vec<String> = std::fs::read_dir(&copies)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.sort();
    assert_eq!(
        names,
        [
            "cluster.lifeboat.dev_clusters.yaml",
            "config.lifeboat.dev_resourceinterpretercustomizations.yaml",
            "policy.lifeboat.dev_clusterpropagationpolicies.yaml",
            "policy.lifeboat.dev_propagationpolicies.yaml",
            "work.lifeboat.dev_resourcebindings.yaml",
            "workload.codeflare.dev_appwrappers.yaml",
        ],
        "the hub chart's CRDs"
    );
    for name in &names {
        let copy = std::fs::read(copies.join(name))?;
        let original = std::fs::read(root.join("crds").join(name))?;
        if copy != original {
            return Err(format!(
                "charts/lifeboat-hub/crds/{name} differs from crds/{name}: run `cargo run -q -p lifeboat-api --bin crdgen`"
            )
            .into());
        }
    }
    // The agent installs the AppWrapper CRD itself (installCRD); its chart ships none.
    assert!(!Chart::Agent.dir().join("crds").exists());
    Ok(())
}

async fn lint(ctx: Arc<TestContext>) -> TestResult {
    for chart in CHARTS {
        let dir = chart.dir().display().to_string();
        helm(&ctx, &["lint", "--strict", &dir]).await?;
        let values = chart.dir().join(ALL_OPTIONAL).display().to_string();
        helm(&ctx, &["lint", "--strict", &dir, "--values", &values]).await?;
    }
    // A value the schema refuses fails the lint.
    let dir = Chart::Hub.dir().display().to_string();
    let refused = helm(
        &ctx,
        &["lint", "--strict", &dir, "--set", "ledger.type=mysql"],
    )
    .await;
    assert!(refused.is_err(), "ledger.type=mysql passed the schema");
    Ok(())
}

async fn dry_run(ctx: Arc<TestContext>) -> TestResult {
    for chart in CHARTS {
        let cluster = chart.cluster();
        let ns = ctx.namespace(cluster).await?;
        install_upstream_crds(&ctx, cluster).await?;
        for values in [None, Some(ALL_OPTIONAL)] {
            let rendering =
                render(&ctx, chart, "dry", &ns, values, &[], &["--include-crds"]).await?;
            let out = kubectl_ok(
                &ctx,
                cluster,
                &["apply", "--dry-run=server", "-f", "-"],
                Some(rendering.clone()),
            )
            .await
            .map_err(|e| format!("{} with {values:?}: {e}", chart.name()))?;
            // Every object of the rendering was sent (kubectl prints one line per object).
            let objects = rendering.matches("\nkind: ").count()
                + usize::from(rendering.starts_with("kind: "));
            let applied = out
                .lines()
                .filter(|l| l.contains("(server dry run)"))
                .count();
            assert_eq!(applied, objects, "{} {values:?}: {out}", chart.name());
        }
    }
    // The installed schemas are the projects' own, not schemaless: an object each of them
    // refuses is refused, naming the field.
    let cluster = Chart::Hub.cluster();
    let ns = ctx.namespace(cluster).await?;
    for (object, field) in REFUSED_OPTIONAL_OBJECTS {
        let refused = kubectl_ok(
            &ctx,
            cluster,
            &["apply", "--dry-run=server", "-n", &ns, "-f", "-"],
            Some(object.to_string()),
        )
        .await;
        match refused {
            Ok(out) => return Err(format!("accepted: {out}\n{object}").into()),
            Err(e) => assert!(e.to_string().contains(field), "{field} not in: {e}"),
        }
    }
    Ok(())
}

/// One object per optional kind that its upstream CRD's schema (or strict field validation
/// against it) refuses, and the field the refusal names.
const REFUSED_OPTIONAL_OBJECTS: [(&str, &str); 4] = [
    (
        "apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: port-as-number}
spec:
  selector: {}
  endpoints: [{port: 8080}]
",
        "spec.endpoints[0].port",
    ),
    (
        "apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: rule-without-expr}
spec:
  groups: [{name: lifeboat, rules: [{alert: NoExpr}]}]
",
        "spec.groups[0].rules[0].expr",
    ),
    (
        "apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: without-secret-name}
spec:
  issuerRef: {name: lifeboat}
",
        "spec.secretName",
    ),
    (
        "apiVersion: cert-manager.io/v1
kind: Issuer
metadata: {name: unknown-field}
spec:
  selfSigned: {}
  selfSignedd: {}
",
        "spec.selfSignedd",
    ),
];

async fn install_upgrade_uninstall(ctx: Arc<TestContext>) -> TestResult {
    for chart in CHARTS {
        let cluster = chart.cluster();
        let ns = ctx.namespace(cluster).await?;
        install_upstream_crds(&ctx, cluster).await?;
        let kubeconfig = ctx.fleet.kubeconfig(cluster)?.display().to_string();
        let dir = chart.dir().display().to_string();
        let release = "inst";
        let common = ["--kubeconfig", &kubeconfig, "--namespace", &ns];
        let run = |extra: Vec<&str>| {
            let mut args: Vec<&str> = extra;
            args.extend(common);
            let ctx = ctx.clone();
            let args: Vec<String> = args.into_iter().map(String::from).collect();
            async move {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                helm(&ctx, &args).await
            }
        };
        let values = chart.dir().join(ALL_OPTIONAL).display().to_string();
        run(vec!["install", release, &dir]).await?;
        let deployments: Api<Deployment> = Api::namespaced(ctx.client(cluster).await?, &ns);
        let name = format!("{release}-{}", chart.name());
        let installed = deployments.get(&name).await?;
        assert_eq!(installed.spec.and_then(|s| s.replicas), Some(2));
        run(vec!["upgrade", release, &dir, "--values", &values]).await?;
        let status = run(vec!["status", release]).await?;
        assert!(status.contains("REVISION: 2"), "{status}");
        run(vec!["uninstall", release, "--wait", "--timeout", "60s"]).await?;
        assert!(
            deployments.get_opt(&name).await?.is_none(),
            "{name} left after uninstall"
        );
    }
    Ok(())
}

/// How a container of a rendered Deployment runs as a local process: its arguments and
/// environment with every volume's mount path replaced by a local directory holding what the
/// kubelet would put there (Secret keys as files, empty dirs).
struct Container {
    args: Vec<String>,
    env: Vec<(String, String)>,
    _dirs: Vec<tempdir::Dir>,
}

mod tempdir {
    use std::path::{Path, PathBuf};

    /// A directory removed when dropped.
    pub struct Dir(PathBuf);
    impl Dir {
        pub fn new(parent: &Path, name: &str) -> std::io::Result<Dir> {
            let path = parent.join(format!("{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path)?;
            Ok(Dir(path))
        }
        pub fn path(&self) -> &Path {
            &self.0
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The Deployment of a rendering, read as the kubelet would run its first container.
async fn container_of(
    ctx: &TestContext,
    rendering: &str,
    cluster: &str,
    namespace: &str,
    pod_name: &str,
) -> Result<Container, TestError> {
    let deployment: Value = serde_saphyr::from_str(rendering)?;
    assert_eq!(deployment["kind"], "Deployment", "{rendering}");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let secrets: Api<Secret> = Api::namespaced(ctx.client(cluster).await?, namespace);
    let scratch = ctx.fleet.state_dir().join("chart-volumes");
    std::fs::create_dir_all(&scratch)?;
    let mut mounts: Vec<(String, String)> = Vec::new();
    let mut dirs = Vec::new();
    for mount in container["volumeMounts"].as_array().into_iter().flatten() {
        let (name, path) = (
            mount["name"].as_str().unwrap_or_default(),
            mount["mountPath"].as_str().unwrap_or_default(),
        );
        let volume = pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == name)
            .ok_or_else(|| format!("volume {name} is mounted but not declared"))?;
        let dir = tempdir::Dir::new(&scratch, &format!("{pod_name}-{name}"))?;
        if let Some(secret) = volume["secret"]["secretName"].as_str() {
            let data = secrets.get(secret).await?.data.unwrap_or_default();
            for (key, ByteString(bytes)) in data {
                std::fs::write(dir.path().join(key), bytes)?;
            }
        }
        mounts.push((path.to_string(), dir.path().display().to_string()));
        dirs.push(dir);
    }
    let local = |text: &str| -> String {
        mounts
            .iter()
            .find(|(path, _)| text.contains(path.as_str()))
            .map(|(path, dir)| text.replace(path.as_str(), dir))
            .unwrap_or_else(|| text.to_string())
    };
    let args = container["args"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| a.as_str().map(local).ok_or("a non-string arg"))
        .collect::<Result<Vec<_>, _>>()?;
    let mut env = Vec::new();
    for var in container["env"].as_array().into_iter().flatten() {
        let name = var["name"]
            .as_str()
            .ok_or("env without a name")?
            .to_string();
        let value = if let Some(v) = var["value"].as_str() {
            local(v)
        } else if var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name" {
            pod_name.to_string()
        } else if let Some(key) = var["valueFrom"]["secretKeyRef"]["key"].as_str() {
            let secret = var["valueFrom"]["secretKeyRef"]["name"]
                .as_str()
                .unwrap_or_default();
            let data = secrets.get(secret).await?.data.unwrap_or_default();
            let bytes = data
                .get(key)
                .ok_or_else(|| format!("{secret} has no {key}"))?;
            String::from_utf8(bytes.0.clone())?
        } else {
            return Err(format!("env {name}: a source this test does not provide: {var}").into());
        };
        env.push((name, value));
    }
    Ok(Container {
        args,
        env,
        _dirs: dirs,
    })
}

/// Starts `binary` as the container would run, authenticated by `kubeconfig` (in the tests below
/// a token of the chart's ServiceAccount, as the pod's in-cluster config would be), its output in
/// the fleet's state dir.
fn start(
    ctx: &TestContext,
    binary: &str,
    container: &Container,
    cluster: &str,
    kubeconfig: &Path,
) -> Result<tokio::process::Child, TestError> {
    let log = ctx
        .fleet
        .state_dir()
        .join(format!("chart-{binary}-{cluster}.log"));
    let out = std::fs::File::create(&log)?;
    let err = out.try_clone()?;
    let child = tokio::process::Command::new(lifeboat_bin_dir()?.join(binary))
        .args(&container.args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("KUBECONFIG", kubeconfig)
        .envs(container.env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            format!("starting {binary} (cargo build -p lifeboat-hub -p lifeboat-agent): {e}")
        })?;
    Ok(child)
}

/// Applies the ServiceAccount and RBAC of `chart` (release `release` in `namespace`) to `cluster`
/// and returns a kubeconfig authenticating as that ServiceAccount (a TokenRequest token), so a
/// binary runs with exactly the chart's permissions.
async fn chart_service_account(
    ctx: &TestContext,
    chart: Chart,
    release: &str,
    namespace: &str,
    cluster: &str,
) -> Result<PathBuf, TestError> {
    let rbac = render(
        ctx,
        chart,
        release,
        namespace,
        None,
        &[],
        &[
            "--show-only",
            "templates/serviceaccount.yaml",
            "--show-only",
            "templates/rbac.yaml",
        ],
    )
    .await?;
    kubectl_ok(ctx, cluster, &["apply", "-f", "-"], Some(rbac)).await?;
    let account = format!("{release}-{}", chart.name());
    let admin = ctx.client(cluster).await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin, namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = accounts
        .create_token_request(&account, &PostParams::default(), &request)
        .await?
        .status
        .and_then(|s| s.token)
        .ok_or("a TokenRequest without a token")?;
    let admin_config = Kubeconfig::read_from(ctx.fleet.kubeconfig(cluster)?)?;
    let server = admin_config
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .ok_or("the fleet's kubeconfig has no cluster")?;
    let path = ctx
        .fleet
        .state_dir()
        .join(format!("chart-{account}-{cluster}.kubeconfig"));
    lifeboat_e2e::kubeconfig::write_token(
        &path,
        cluster,
        &server.server.unwrap_or_default(),
        Path::new(&server.certificate_authority.unwrap_or_default()),
        (&account, &token),
        namespace,
    )?;
    Ok(path)
}

/// Err naming the first request the apiserver refused (403) in a process log.
fn forbidden_in(log: &Path) -> TestResult {
    let text = std::fs::read_to_string(log)?;
    match text
        .lines()
        .find(|l| l.contains("Forbidden") || l.contains("forbidden"))
    {
        Some(line) => Err(format!("{} was refused a request: {line}", log.display()).into()),
        None => Ok(()),
    }
}

/// GET http://127.0.0.1:PORT/PATH while `child` runs: the body once it answers 200.
async fn get_ok(
    child: &mut tokio::process::Child,
    port: u16,
    path: &str,
    log: &Path,
) -> Result<String, TestError> {
    let url = format!("http://127.0.0.1:{port}{path}");
    let what = format!("{url} answering 200");
    let started = tokio::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("the process exited ({status}) before {what}:\n{text}").into());
        }
        if let Ok(Ok(Ok(body))) =
            tokio::time::timeout(Duration::from_secs(5), lifeboat_e2e::http::get(port, path)).await
        {
            return Ok(body);
        }
        if started.elapsed() > T {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("no {what} within {T:?}:\n{text}").into());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Metric names with at least one sample in a Prometheus text exposition.
fn sampled_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// The Lifeboat metric names a PromQL text names (`lifeboat_*`, `appwrapper_*`).
fn named_metrics(promql: &str) -> BTreeSet<String> {
    promql
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("lifeboat_") || w.starts_with("appwrapper_"))
        .map(str::to_string)
        .collect()
}

fn dashboard() -> Result<Value, TestError> {
    let path = Chart::Hub.dir().join("dashboards/lifeboat.json");
    Ok(serde_json::from_str(&std::fs::read_to_string(path)?)?)
}

fn dashboard_exprs(dashboard: &Value) -> Vec<String> {
    dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect()
}

async fn dashboard_datasource(_ctx: Arc<TestContext>) -> TestResult {
    let dashboard = dashboard()?;
    // Grafana 11.x writes 39 to 41 (12.x: 41); older ones are migrated on load.
    let schema = dashboard["schemaVersion"]
        .as_u64()
        .ok_or("no schemaVersion")?;
    assert!((39..=42).contains(&schema), "schemaVersion {schema}");
    let variables = dashboard["templating"]["list"]
        .as_array()
        .ok_or("no templating")?;
    let datasource = variables
        .iter()
        .find(|v| v["type"] == "datasource" && v["query"] == "prometheus")
        .ok_or("no Prometheus datasource variable")?;
    let variable = format!("${{{}}}", datasource["name"].as_str().unwrap_or_default());
    let panels = dashboard["panels"].as_array().ok_or("no panels")?;
    assert!(!panels.is_empty());
    for panel in panels {
        let targets = panel["targets"]
            .as_array()
            .ok_or("a panel without targets")?;
        for holder in std::iter::once(panel).chain(targets.iter()) {
            assert_eq!(
                holder["datasource"]["uid"].as_str(),
                Some(variable.as_str()),
                "panel {}: a hard-coded or missing datasource",
                panel["title"]
            );
        }
    }
    assert!(!dashboard_exprs(&dashboard).is_empty());
    Ok(())
}

/// The hub chart's PrometheusRule rendered with the default values (thresholds included).
async fn prometheus_rule(ctx: &TestContext) -> Result<Value, TestError> {
    let rendering = render(
        ctx,
        Chart::Hub,
        "rules",
        "default",
        None,
        &["metrics.prometheusRule.enabled=true".into()],
        &["--show-only", "templates/prometheusrule.yaml"],
    )
    .await?;
    Ok(serde_saphyr::from_str(&rendering)?)
}

fn rules(prometheus_rule: &Value) -> impl Iterator<Item = &Value> {
    prometheus_rule["spec"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
}

/// The expressions of the rendered PrometheusRule.
async fn rule_exprs(ctx: &TestContext) -> Result<Vec<String>, TestError> {
    let rule = prometheus_rule(ctx).await?;
    let exprs: Vec<String> = rules(&rule)
        .filter_map(|r| r["expr"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        exprs.len(),
        7,
        "the six alerts of issue 10 and the fence wait of issue 18"
    );
    Ok(exprs)
}

/// Runs promtool in `dir`; its stdout and stderr (where it reports).
async fn promtool(dir: &Path, args: &[&str]) -> Result<String, TestError> {
    let mut command = tokio::process::Command::new(tool_bin("promtool", "LIFEBOAT_PROMTOOL")?);
    command.current_dir(dir);
    let output = run_tool(command, "promtool", args).await?;
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}

/// The PrometheusRule's `spec` is a plain Prometheus rules file: `promtool check rules` on it,
/// then the unit tests of every alert in ci/rules-test.yaml (`promtool test rules`).
async fn alert_rules(ctx: Arc<TestContext>) -> TestResult {
    let rule = prometheus_rule(&ctx).await?;
    let alerts: Vec<&str> = rules(&rule).filter_map(|r| r["alert"].as_str()).collect();
    assert_eq!(
        alerts,
        [
            "LifeboatAgentDisconnected",
            "LifeboatClusterNotReady",
            "LifeboatFailoverWaitingForFence",
            "LifeboatFailoversHigh",
            "LifeboatWorkloadsFailed",
            "LifeboatLedgerWriteErrors",
            "LifeboatNoLeader",
        ]
    );
    let dir = ctx.fleet.state_dir().join("promtool");
    std::fs::create_dir_all(&dir)?;
    // JSON is YAML: promtool reads it as a rules file.
    std::fs::write(
        dir.join("lifeboat-rules.yaml"),
        serde_json::to_string_pretty(&rule["spec"])?,
    )?;
    let tests = std::fs::read_to_string(Chart::Hub.dir().join(RULES_TEST))?;
    std::fs::write(dir.join("rules-test.yaml"), &tests)?;
    let checked = promtool(&dir, &["check", "rules", "lifeboat-rules.yaml"]).await?;
    assert!(checked.contains("SUCCESS: 7 rules found"), "{checked}");
    let tested = promtool(&dir, &["test", "rules", "rules-test.yaml"]).await?;
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Every alert has a case where it fires and one where it does not.
    for alert in alerts {
        let name = format!("alertname: {alert}");
        let cases: Vec<&str> = tests
            .split("- eval_time:")
            .filter(|case| case.contains(&name))
            .collect();
        assert!(
            cases.iter().any(|c| c.contains("exp_alerts: []"))
                && cases.iter().any(|c| c.contains("exp_labels:")),
            "{RULES_TEST}: {alert} needs a firing and a silent case"
        );
    }
    Ok(())
}

async fn rendered_hub_and_agent(ctx: Arc<TestContext>) -> TestResult {
    let member = "member-1";
    let ns = ctx.namespace("hub").await?;
    ctx.namespace(member).await?;
    let hub = ctx.client("hub").await?;
    // The chart's CRDs, as helm installs them (the hub runs with --no-install-crds).
    let crds = Chart::Hub.dir().join("crds").display().to_string();
    kubectl_ok(&ctx, "hub", &["apply", "--server-side", "-f", &crds], None).await?;
    kubectl_ok(
        &ctx,
        "hub",
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "-f",
            &crds,
        ],
        None,
    )
    .await?;

    // The hub, as its Deployment runs it (SQLite ledger on its volume, the default), without its
    // customization webhook: the fleet's apiservers cannot call a webhook Service, and only the
    // Deployment is applied here, not the registration the chart creates for the hub to patch.
    let [hub_metrics, agent_api, agent_metrics]: [u16; 3] = ports::free_ports(3)?
        .try_into()
        .map_err(|_| "three ports")?;
    let rendering = render(
        &ctx,
        Chart::Hub,
        "lb",
        &ns,
        None,
        &[
            format!("metrics.port={hub_metrics}"),
            format!("agentApi.port={agent_api}"),
            "webhook.enabled=false".into(),
            "agentApi.extraNames={127.0.0.1}".into(),
        ],
        &["--show-only", "templates/deployment.yaml"],
    )
    .await?;
    let hub_container = container_of(&ctx, &rendering, "hub", &ns, "lb-lifeboat-hub-0").await?;
    let hub_account = chart_service_account(&ctx, Chart::Hub, "lb", &ns, "hub").await?;
    let mut hub_process = start(&ctx, "lifeboat-hub", &hub_container, "hub", &hub_account)?;
    let hub_log = ctx.fleet.state_dir().join("chart-lifeboat-hub-hub.log");
    get_ok(&mut hub_process, hub_metrics, "/healthz", &hub_log).await?;
    get_ok(&mut hub_process, hub_metrics, "/readyz", &hub_log).await?;

    // `lifeboatctl join` mints the bootstrap token and prints the agent chart's values.
    hub_ca_in(&hub, &ns, "lb-lifeboat-hub-ca", T).await?;
    let cluster_name = "charts-joined";
    let ca_out = ctx.fleet.state_dir().join("chart-hub-ca.crt");
    let join = tokio::process::Command::new(lifeboat_bin_dir()?.join("lifeboatctl"))
        .args([
            "join",
            cluster_name,
            "--namespace",
            &ns,
            "--ca-secret",
            "lb-lifeboat-hub-ca",
        ])
        .arg(format!("--hub-url=https://127.0.0.1:{agent_api}"))
        .arg("--ca-out")
        .arg(&ca_out)
        .env("KUBECONFIG", ctx.fleet.kubeconfig("hub")?)
        .output()
        .await?;
    let printed = String::from_utf8_lossy(&join.stdout).into_owned();
    assert!(
        join.status.success() && printed.starts_with("helm install "),
        "lifeboatctl join: {printed}{}",
        String::from_utf8_lossy(&join.stderr)
    );
    // The values of the printed command, then this test's own: free ports, no webhook (member-2
    // runs the agent with its webhook: the fleet's apiservers cannot call a webhook Service).
    let words: Vec<&str> = printed.split_whitespace().collect();
    let mut values: Vec<String> = Vec::new();
    for pair in words.windows(2) {
        if pair[0] == "--set" || pair[0] == "--set-file" {
            values.extend([pair[0].to_string(), pair[1].to_string()]);
        }
    }
    assert!(
        values
            .iter()
            .any(|v| v.starts_with("hub.bootstrapToken.value=")),
        "{printed}"
    );
    values.extend(
        [
            format!("metrics.port={agent_metrics}"),
            "webhook.enabled=false".to_string(),
        ]
        .into_iter()
        .flat_map(|v| ["--set".to_string(), v]),
    );
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    // The chart's Secrets (token and CA from the values), applied as helm would.
    let mut show_secrets = values.clone();
    show_secrets.extend(["--show-only", "templates/secret.yaml"]);
    let secrets = render(&ctx, Chart::Agent, "lb", &ns, None, &[], &show_secrets).await?;
    kubectl_ok(&ctx, member, &["apply", "-f", "-"], Some(secrets)).await?;
    let mut show_deployment = values.clone();
    show_deployment.extend(["--show-only", "templates/deployment.yaml"]);
    let rendering = render(&ctx, Chart::Agent, "lb", &ns, None, &[], &show_deployment).await?;
    let agent_container =
        container_of(&ctx, &rendering, member, &ns, "lb-lifeboat-agent-0").await?;
    let agent_account = chart_service_account(&ctx, Chart::Agent, "lb", &ns, member).await?;
    let mut agent_process = start(
        &ctx,
        "lifeboat-agent",
        &agent_container,
        member,
        &agent_account,
    )?;
    let agent_log = ctx
        .fleet
        .state_dir()
        .join(format!("chart-lifeboat-agent-{member}.log"));
    get_ok(&mut agent_process, agent_metrics, "/healthz", &agent_log).await?;
    let clusters: Api<Cluster> = Api::all(hub.clone());
    wait::until(&format!("Cluster {cluster_name} Ready"), T, || async {
        let cluster = clusters
            .get_opt(cluster_name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("not registered yet")?;
        match cluster_ready(&cluster) {
            Some((status, _)) if status == "True" => Ok(()),
            other => Err(format!("Ready {other:?}")),
        }
    })
    .await?;

    // A placed AppWrapper runs in the member: bindings, scheduling, work, status, ledger and
    // AppWrapper phases all have samples.
    let name = "charted";
    place_training(&hub, &ns, name, cluster_name).await?;
    let appwrappers = appwrapper_resource();
    let in_member: Api<DynamicObject> =
        Api::namespaced_with(ctx.client(member).await?, &ns, &appwrappers);
    until_appwrapper_running(&in_member, name, member, T).await?;

    // Every metric the dashboard and the alert rules name is exported by the running hub or
    // agent (a renamed metric fails here).
    let mut wanted = BTreeSet::new();
    for expr in dashboard_exprs(&dashboard()?)
        .iter()
        .chain(rule_exprs(&ctx).await?.iter())
    {
        wanted.extend(named_metrics(expr));
    }
    // The extraction found the names (the dashboard and rules name 14 as of this writing).
    assert!(
        wanted.contains("lifeboat_hub_failovers_total")
            && wanted.contains("lifeboat_agent_hub_connected")
            && wanted.contains("lifeboat_hub_cluster_gpus")
            && wanted.contains("lifeboat_hub_cluster_nodes"),
        "{wanted:?}"
    );
    let missing = wait::until("every named metric exported", T, || async {
        let mut exported = BTreeSet::new();
        for port in [hub_metrics, agent_metrics] {
            let body = lifeboat_e2e::http::get(port, "/metrics")
                .await
                .map_err(|e| e.to_string())?
                .map_err(|status| format!("/metrics: {status}"))?;
            exported.extend(sampled_names(&body));
        }
        let missing: Vec<&String> = wanted.difference(&exported).collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("not exported: {missing:?}"))
        }
    })
    .await;
    let fleet = fleet_gauges_follow_the_cluster_status(&clusters, cluster_name, hub_metrics).await;
    let _ = agent_process.kill().await;
    let _ = hub_process.kill().await;
    missing?;
    fleet?;

    // The roles are enough: no request of either process was refused.
    forbidden_in(&hub_log)?;
    forbidden_in(&agent_log)?;
    // Nothing beyond the roles: neither reads Secrets outside its namespace.
    for (cluster, account) in [("hub", &hub_account), (member, &agent_account)] {
        let client = lifeboat_e2e::kubeconfig::client(account).await?;
        let elsewhere: Api<Secret> = Api::namespaced(client, "kube-system");
        match elsewhere.list(&Default::default()).await {
            Err(kube::Error::Api(s)) if s.code == 403 => {}
            other => {
                return Err(format!(
                    "{cluster}: listing Secrets in kube-system as {} gave {other:?}, not 403",
                    account.display()
                )
                .into());
            }
        }
    }
    Ok(())
}

/// The value of the sample `name{labels}` in a Prometheus text exposition (labels as the
/// exposition writes them: sorted by name).
fn sample(exposition: &str, name: &str, labels: &[(&str, &str)]) -> Option<i64> {
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    let series = format!("{name}{{{}}} ", labels.join(","));
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as i64)
}

/// The hub's fleet gauges of the joined cluster are what its Cluster status says (the agent's
/// inventory of member-1's kwok GPU nodes), read here from the hub's apiserver, zeros included.
async fn fleet_gauges_follow_the_cluster_status(
    clusters: &Api<Cluster>,
    cluster: &str,
    hub_metrics: u16,
) -> TestResult {
    let whole = |quantity: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        quantity.map_or(Ok(0), |q| {
            q.0.parse::<i64>()
                .map_err(|_| format!("kwok GPUs are whole: {q:?}"))
        })
    };
    wait::until(
        &format!("fleet gauges of {cluster} = its status"),
        T,
        || async {
            let status = clusters
                .get(cluster)
                .await
                .map_err(|e| e.to_string())?
                .status
                .ok_or("no status")?;
            let resources = status.resource_summary.ok_or("no resource summary yet")?;
            let health = status.node_health.ok_or("no node health yet")?;
            let gpu = lifeboat_api::cluster::GPU_RESOURCE;
            let expected = [
                (
                    "lifeboat_hub_cluster_gpus",
                    "state",
                    "allocatable",
                    whole(resources.allocatable.get(gpu))?,
                ),
                (
                    "lifeboat_hub_cluster_gpus",
                    "state",
                    "allocated",
                    whole(resources.allocated.get(gpu))?,
                ),
                (
                    "lifeboat_hub_cluster_nodes",
                    "condition",
                    "not_ready",
                    i64::from(health.not_ready),
                ),
                (
                    "lifeboat_hub_cluster_nodes",
                    "condition",
                    "autopilot_flagged",
                    i64::from(health.autopilot_flagged),
                ),
                (
                    "lifeboat_hub_cluster_nodes",
                    "condition",
                    "spot_reclaiming",
                    i64::from(health.spot_reclaiming),
                ),
            ];
            // member-1 has GPU nodes and the placed AppWrapper's pod holds some: not a zero check.
            if expected[0].3 == 0 || expected[1].3 == 0 {
                return Err(format!(
                    "the status shows no GPUs allocatable or allocated: {resources:?}"
                ));
            }
            let body = lifeboat_e2e::http::get(hub_metrics, "/metrics")
                .await
                .map_err(|e| e.to_string())?
                .map_err(|status| format!("/metrics: {status}"))?;
            for (name, label, value, want) in expected {
                let got = sample(&body, name, &[("cluster", cluster), (label, value)]);
                if got != Some(want) {
                    return Err(format!(
                        "{name}{{{label}={value}}} is {got:?}, the status says {want}"
                    ));
                }
            }
            Ok(())
        },
    )
    .await?;
    Ok(())
}

async fn rendered_standalone_agent(ctx: Arc<TestContext>) -> TestResult {
    let member = "member-2";
    let ns = ctx.namespace(member).await?;
    let [metrics, webhook]: [u16; 2] = ports::free_ports(2)?.try_into().map_err(|_| "two ports")?;
    // The default values: standalone, webhook on with the certificate the agent issues.
    let rendering = render(
        &ctx,
        Chart::Agent,
        "solo",
        &ns,
        None,
        &[
            format!("metrics.port={metrics}"),
            format!("webhook.port={webhook}"),
        ],
        &["--show-only", "templates/deployment.yaml"],
    )
    .await?;
    let container = container_of(&ctx, &rendering, member, &ns, "solo-lifeboat-agent-0").await?;
    assert!(
        container
            .args
            .iter()
            .any(|a| a.starts_with("--webhook-service=")),
        "{:?}",
        container.args
    );
    let account = chart_service_account(&ctx, Chart::Agent, "solo", &ns, member).await?;
    let mut process = start(&ctx, "lifeboat-agent", &container, member, &account)?;
    let log = ctx
        .fleet
        .state_dir()
        .join(format!("chart-lifeboat-agent-{member}.log"));
    // The flags were accepted and the agent serves (the metrics server starts before the
    // webhook registers, which cannot complete: the fleet's apiserver does not reach Services).
    let served = get_ok(&mut process, metrics, "/healthz", &log).await;
    // The CA the agent issued its serving certificate from, in the Secret the chart names.
    let issued = wait::until("the webhook CA Secret", T, || async {
        let secrets: Api<Secret> =
            Api::namespaced(ctx.client(member).await.map_err(|e| e.to_string())?, &ns);
        match secrets.get_opt("solo-lifeboat-agent-webhook-ca").await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err("not created yet".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    let _ = process.kill().await;
    forbidden_in(&log)?;
    // Its webhook configurations point at a Service nobody serves here: remove them.
    for (kind, name) in [
        (
            "mutatingwebhookconfiguration",
            "lifeboat-appwrapper-mutating",
        ),
        (
            "validatingwebhookconfiguration",
            "lifeboat-appwrapper-validating",
        ),
    ] {
        kubectl_ok(
            &ctx,
            member,
            &["delete", kind, name, "--ignore-not-found"],
            None,
        )
        .await?;
    }
    served?;
    issued?;
    Ok(())
}
