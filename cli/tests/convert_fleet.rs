//! `lifeboatctl convert` on every legacy AppWrapper in the shared test data: the output is
//! accepted unchanged by a real kube-apiserver and runs on the fleet under the Lifeboat agent.

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use lifeboat_agent::agent::{self, AgentOptions};
use lifeboat_agent::config::OperatorConfig;
use lifeboat_api::appwrapper::{AppWrapper, AppWrapperPhase};
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestError, TestResult};
use lifeboat_e2e::wait;

const CLUSTER: &str = "member-1";

fn main() -> ExitCode {
    harness::run(
        "convert-legacy",
        |c| c.members = 1,
        vec![
            E2eTest::new(
                "legacy_appwrappers_convert_apply_and_run",
                convert_apply_run,
            ),
            E2eTest::new(
                "legacy_appwrapper_without_pod_specs_is_rejected",
                empty_rejected,
            ),
        ],
    )
}

fn legacy_dir() -> PathBuf {
    let shared = std::env::var("LIFEBOAT_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    shared.join("testdata/mcad-legacy")
}

struct Converted {
    yaml: String,
    warnings: String,
}

fn convert(file: &PathBuf) -> Result<Result<Converted, String>, TestError> {
    let out = Command::new(env!("CARGO_BIN_EXE_lifeboatctl"))
        .args(["convert", "-f"])
        .arg(file)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(Ok(Converted {
            yaml: String::from_utf8(out.stdout)?,
            warnings: stderr,
        }))
    } else {
        Ok(Err(stderr))
    }
}

fn kubectl_create(ctx: &TestContext, yaml: &str, namespace: &str) -> Result<(), TestError> {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(ctx.fleet.kubeconfig(CLUSTER)?)
        .args(["create", "-n", namespace, "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(yaml.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(format!(
            "kubectl create rejected it: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(())
}

async fn ensure_namespace(ctx: &TestContext, name: &str) -> TestResult {
    let api: Api<Namespace> = Api::all(ctx.client(CLUSTER).await?);
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The PodGroup kind of the scheduler-plugins project, which one legacy sample wraps.
async fn install_podgroup_crd(ctx: &TestContext) -> TestResult {
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client(CLUSTER).await?);
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        // Groups under k8s.io need the API-approval annotation (upstream's CRD carries a link).
        "metadata": {"name": "podgroups.scheduling.sigs.k8s.io",
            "annotations": {"api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/scheduler-plugins/pull/50"}},
        "spec": {"group": "scheduling.sigs.k8s.io", "scope": "Namespaced",
            "names": {"kind": "PodGroup", "plural": "podgroups", "singular": "podgroup"},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))?;
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) | Err(kube::Error::Api(_)) => {}
        Err(e) => return Err(e.into()),
    }
    wait::until(
        "PodGroup CRD established",
        Duration::from_secs(60),
        || async {
            let crd = crds
                .get("podgroups.scheduling.sigs.k8s.io")
                .await
                .map_err(|e| e.to_string())?;
            let ok = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if ok {
                Ok(())
            } else {
                Err("not established".into())
            }
        },
    )
    .await?;
    Ok(())
}

async fn convert_apply_run(ctx: Arc<TestContext>) -> TestResult {
    let kubeconfig = ctx.fleet.kubeconfig(CLUSTER)?;
    let agent = agent::spawn(
        AgentOptions {
            kubeconfig: Some(kubeconfig),
            config: OperatorConfig::default(),
            cluster: CLUSTER.into(),
            metrics_bind: None,
            concurrency: 8,
            install_crd: true,
            webhook: None,
            leader_election: None,
            hub: None,
        },
        prometheus::Registry::new(),
    )
    .await?;
    install_podgroup_crd(&ctx).await?;
    let default_ns = ctx.namespace(CLUSTER).await?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(legacy_dir())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let mut ran = 0;
    for file in &files {
        let converted = match convert(file)? {
            Ok(c) => c,
            // Legacy files that cannot become a valid v1beta2 AppWrapper are covered below.
            Err(stderr) => {
                assert!(stderr.contains("error:"), "{}: {stderr}", file.display());
                continue;
            }
        };
        assert!(
            !converted.yaml.contains("appwrapper.mcad.ibm.com"),
            "{}: placeholder label left",
            file.display()
        );
        let docs: Vec<AppWrapper> = serde_saphyr::from_multiple(&converted.yaml)?;
        assert!(!docs.is_empty());
        for aw in &docs {
            let namespace = aw
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| default_ns.clone());
            ensure_namespace(&ctx, &namespace).await?;
        }
        // Applied unchanged, document namespaces included.
        let target_ns = docs[0]
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| default_ns.clone());
        kubectl_create(&ctx, &converted.yaml, &target_ns)
            .map_err(|e| format!("{}: {e}\nwarnings:\n{}", file.display(), converted.warnings))?;
        for aw in &docs {
            let namespace = aw
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| default_ns.clone());
            let name = aw.metadata.name.clone().unwrap_or_default();
            let api: Api<AppWrapper> = Api::namespaced(ctx.client(CLUSTER).await?, &namespace);
            wait::until(
                &format!("{name} from {} runs", file.display()),
                Duration::from_secs(90),
                || async {
                    let aw = api.get(&name).await.map_err(|e| e.to_string())?;
                    match aw.status.as_ref().map(|s| s.phase) {
                        Some(AppWrapperPhase::Running) | Some(AppWrapperPhase::Succeeded) => Ok(()),
                        other => Err(format!(
                            "phase {other:?}, conditions {:?}",
                            aw.status.map(|s| s.conditions)
                        )),
                    }
                },
            )
            .await?;
            ran += 1;
        }
    }
    assert!(ran >= 6, "only {ran} converted AppWrappers ran");
    agent.stop().await?;
    Ok(())
}

async fn empty_rejected(_ctx: Arc<TestContext>) -> TestResult {
    let file = legacy_dir().join("kuttl-01-install.yaml");
    match convert(&file)? {
        Ok(_) => Err("an AppWrapper without pod specs must not convert".into()),
        Err(stderr) => {
            assert!(stderr.contains("spec.resources.GenericItems"), "{stderr}");
            Ok(())
        }
    }
}
