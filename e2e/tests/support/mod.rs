//! Helpers of the agent's e2e tests: an in-process agent per member cluster (restartable), and
//! AppWrapper builders and waits.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use lifeboat_agent::agent::{self, AgentOptions};
use lifeboat_agent::config::OperatorConfig;
use lifeboat_agent::uplink::{FencingChoice, HubOptions, HubTiming, SecretRef};
use lifeboat_api::appwrapper::{AppWrapper, AppWrapperPhase, AppWrapperTransition};
use lifeboat_e2e::harness::{TestContext, TestError};
use lifeboat_e2e::{Fleet, wait};
use serde_json::{Value, json};

pub mod hub;
pub mod scenario;

pub const T: Duration = Duration::from_secs(90);

/// An agent running in this process for one member cluster.
pub struct AgentHandle {
    agent: agent::SpawnedAgent,
    pub metrics: SocketAddr,
}

/// One restartable agent slot per cluster.
type Slot = Arc<tokio::sync::Mutex<Option<AgentHandle>>>;

static AGENTS: Mutex<Option<HashMap<String, Slot>>> = Mutex::new(None);

fn slot(cluster: &str) -> Slot {
    let mut agents = AGENTS.lock().unwrap_or_else(|e| e.into_inner());
    agents
        .get_or_insert_with(HashMap::new)
        .entry(cluster.to_string())
        .or_default()
        .clone()
}

async fn start(fleet: &Fleet, cluster: &str) -> Result<AgentHandle, TestError> {
    let (agent, metrics) = spawn_agent(fleet, cluster, 16, None).await?;
    Ok(AgentHandle { agent, metrics })
}

/// An agent of `cluster` in this process (in hub mode when `hub` is given); its metrics address.
pub async fn spawn_agent(
    fleet: &Fleet,
    cluster: &str,
    concurrency: u16,
    hub: Option<HubOptions>,
) -> Result<(agent::SpawnedAgent, SocketAddr), TestError> {
    let metrics: SocketAddr = ([127, 0, 0, 1], lifeboat_e2e::ports::free_port()?).into();
    let options = AgentOptions {
        kubeconfig: Some(fleet.kubeconfig(cluster)?),
        config: OperatorConfig::default(),
        cluster: cluster.to_string(),
        metrics_bind: Some(metrics),
        concurrency,
        install_crd: true,
        webhook: None,
        leader_election: None,
        hub,
    };
    let agent = agent::spawn(options, prometheus::Registry::new()).await?;
    Ok((agent, metrics))
}

/// Where a hub-mode e2e agent keeps its cluster credential in its member.
pub const CREDENTIAL_NAMESPACE: &str = "lifeboat-system";
pub const CREDENTIAL_NAME: &str = "lifeboat-hub-credential";

/// Hub-mode options of an e2e agent: the hub's CA in `dir/hub-ca.pem`, the bootstrap token in
/// `dir/bootstrap-token`, the credential in [`CREDENTIAL_NAMESPACE`]/[`CREDENTIAL_NAME`], timings
/// short enough for tests.
pub fn hub_mode(
    urls: Vec<String>,
    dir: &std::path::Path,
    region: &str,
    identity: &str,
) -> HubOptions {
    HubOptions {
        urls,
        ca_file: Some(dir.join("hub-ca.pem")),
        bootstrap_token_file: dir.join("bootstrap-token"),
        fencing_period: Duration::from_secs(60),
        provider: Some("kwok".into()),
        region: Some(region.into()),
        zone: None,
        credential_secret: SecretRef {
            namespace: CREDENTIAL_NAMESPACE.into(),
            name: CREDENTIAL_NAME.into(),
        },
        fencing: FencingChoice::On {
            server: None,
            ca_file: None,
        },
        identity: Some(identity.into()),
        timing: HubTiming {
            request_timeout: Duration::from_secs(5),
            max_backoff: Duration::from_secs(2),
            discovery_every: Duration::from_secs(2),
            ..Default::default()
        },
    }
}

/// Makes sure the in-process agent of `cluster` runs; returns its metrics address.
pub async fn agent(ctx: &TestContext, cluster: &str) -> Result<SocketAddr, TestError> {
    let slot = slot(cluster);
    let mut guard = slot.lock().await;
    if guard.is_none() {
        *guard = Some(start(&ctx.fleet, cluster).await?);
    }
    Ok(guard
        .as_ref()
        .map(|a| a.metrics)
        .unwrap_or(([127, 0, 0, 1], 0).into()))
}

/// Stops the agent of `cluster` (waiting for it to finish) and starts a fresh one.
pub async fn restart_agent(ctx: &TestContext, cluster: &str) -> Result<(), TestError> {
    let slot = slot(cluster);
    let mut guard = slot.lock().await;
    if let Some(old) = guard.take() {
        old.agent.stop().await?;
    }
    *guard = Some(start(&ctx.fleet, cluster).await?);
    Ok(())
}

/// The shared AppWrapper samples: `$LIFEBOAT_SHARED_DIR/testdata/appwrapper-samples`, else the
/// `shared` folder beside the repository (`make` sets the variable).
pub fn appwrapper_samples_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(
        std::env::var("LIFEBOAT_SHARED_DIR")
            .unwrap_or_else(|_| format!("{}/../../shared", env!("CARGO_MANIFEST_DIR"))),
    )
    .join("testdata/appwrapper-samples")
}

/// A Job component.
pub fn job(name: &str, command: &str, parallelism: i32, gpus: i32) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {"parallelism": parallelism, "completions": parallelism, "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "busybox", "command": ["sh", "-c", command],
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string(), "cpu": "100m"}}}]}}}
    })
}

/// A Deployment component.
pub fn deployment(name: &str, replicas: i32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{
                "name": "main", "image": "busybox", "command": ["sh", "-c", "sleep infinity"],
                "resources": {"requests": {"cpu": "100m"}}}]}}}
    })
}

/// An AppWrapper with the given components and fault-tolerance annotations.
pub fn appwrapper(
    name: &str,
    annotations: &[(&str, &str)],
    components: Vec<Value>,
) -> Result<AppWrapper, TestError> {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| {
            let key = if k.contains('/') {
                k.to_string()
            } else {
                format!("workload.codeflare.dev.appwrapper/{k}")
            };
            (key, json!(v))
        })
        .collect();
    let components: Vec<Value> = components
        .into_iter()
        .map(|t| json!({"template": t}))
        .collect();
    Ok(serde_json::from_value(json!({
        "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"components": components}
    }))?)
}

pub async fn create(
    ctx: &TestContext,
    cluster: &str,
    aw: &AppWrapper,
) -> Result<Api<AppWrapper>, TestError> {
    agent(ctx, cluster).await?;
    let ns = ctx.namespace(cluster).await?;
    let api: Api<AppWrapper> = Api::namespaced(ctx.client(cluster).await?, &ns);
    api.create(&PostParams::default(), aw).await?;
    Ok(api)
}

pub fn phase(aw: &AppWrapper) -> AppWrapperPhase {
    aw.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

pub fn condition(aw: &AppWrapper, type_: &str) -> Option<(String, String, String)> {
    aw.status
        .as_ref()?
        .condition(type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Waits until `check` holds for the AppWrapper; returns it.
pub async fn until(
    api: &Api<AppWrapper>,
    name: &str,
    what: &str,
    timeout: Duration,
    check: impl Fn(&AppWrapper) -> bool,
) -> Result<AppWrapper, TestError> {
    Ok(wait::until(what, timeout, || async {
        let aw = api.get(name).await.map_err(|e| e.to_string())?;
        if check(&aw) {
            Ok(aw)
        } else {
            let status = aw.status.clone().unwrap_or_default();
            let unhealthy = status
                .condition("Unhealthy")
                .map(|c| c.message.clone())
                .unwrap_or_default();
            let pods_ready = status
                .condition("PodsReady")
                .map(|c| c.status.clone())
                .unwrap_or_default();
            let reasons: Vec<&str> = status
                .transitions
                .iter()
                .map(|t| t.reason.as_str())
                .collect();
            Err(format!(
                "phase {:?}, resettingCount {}, unhealthy {unhealthy:?}, PodsReady {pods_ready:?}, \
                 transitions {reasons:?}",
                status.phase, status.retries
            ))
        }
    })
    .await?)
}

pub async fn until_phase(
    api: &Api<AppWrapper>,
    name: &str,
    phase_: AppWrapperPhase,
) -> Result<AppWrapper, TestError> {
    until(api, name, &format!("{name} {phase_}"), T, |aw| {
        phase(aw) == phase_
    })
    .await
}

/// Waits until the AppWrapper has entered `phase_`, even if it has left it again by the time it
/// is read (a Resetting with a 1 s pause and nothing to delete is easily missed between two
/// reads of a loaded apiserver); returns the last transition into that phase.
pub async fn until_entered(
    api: &Api<AppWrapper>,
    name: &str,
    phase_: AppWrapperPhase,
) -> Result<AppWrapperTransition, TestError> {
    let aw = until(api, name, &format!("{name} entered {phase_}"), T, |aw| {
        aw.status
            .as_ref()
            .is_some_and(|s| s.transitions.iter().any(|t| t.phase == phase_))
    })
    .await?;
    aw.status
        .and_then(|s| s.transitions.into_iter().rev().find(|t| t.phase == phase_))
        .ok_or_else(|| format!("{name}: no transition into {phase_}").into())
}

/// Running with PodsReady True.
pub async fn until_ready(api: &Api<AppWrapper>, name: &str) -> Result<AppWrapper, TestError> {
    until(
        api,
        name,
        &format!("{name} Running and PodsReady"),
        T,
        |aw| {
            phase(aw) == AppWrapperPhase::Running
                && condition(aw, "PodsReady").is_some_and(|c| c.0 == "True")
        },
    )
    .await
}

/// Asserts the phase stays the same for `duration`.
pub async fn consistently(
    api: &Api<AppWrapper>,
    name: &str,
    phase_: AppWrapperPhase,
    duration: Duration,
) -> Result<(), TestError> {
    let deadline = tokio::time::Instant::now() + duration;
    while tokio::time::Instant::now() < deadline {
        let aw = api.get(name).await?;
        if phase(&aw) != phase_ {
            return Err(format!("{name} left {phase_}: now {:?}", phase(&aw)).into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

pub async fn pods_of(ctx: &TestContext, cluster: &str, aw: &str) -> Result<Vec<Pod>, TestError> {
    let pods: Api<Pod> = Api::namespaced(ctx.client(cluster).await?, &ctx.namespace);
    Ok(pods
        .list(&ListParams::default().labels(&format!("workload.codeflare.dev/appwrapper={aw}")))
        .await?
        .items)
}

pub async fn set_suspend(
    api: &Api<AppWrapper>,
    name: &str,
    suspend: bool,
) -> Result<(), TestError> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"suspend": suspend}})),
    )
    .await?;
    Ok(())
}

/// Labels nodes so that tests can pin their pods to a pool of their own.
pub async fn label_nodes(
    ctx: &TestContext,
    cluster: &str,
    nodes: &[String],
    key: &str,
    value: &str,
) -> Result<(), TestError> {
    set_node_label(ctx, cluster, nodes, key, Some(value)).await
}

/// Sets (`Some`) or removes (`None`) label `key` on `nodes` of `cluster`.
pub async fn set_node_label(
    ctx: &TestContext,
    cluster: &str,
    nodes: &[String],
    key: &str,
    value: Option<&str>,
) -> Result<(), TestError> {
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(ctx.client(cluster).await?);
    for node in nodes {
        api.patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {key: value}}})),
        )
        .await?;
    }
    Ok(())
}

/// `GET /metrics` of an agent or hub, as text.
pub async fn metrics_text(addr: SocketAddr) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: lifeboat\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .await
        .map_err(|e| e.to_string())?;
    Ok(text)
}

/// The value of one series in a `/metrics` text: `name` with its labels as printed
/// (`lifeboat_hub_in_place_resets_total{reason="failure"}`).
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
