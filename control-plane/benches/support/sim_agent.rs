//! What the hub benches share: the real hub in this process (`lifeboat_hub::process::run`) against
//! the fleet's hub apiserver, and simulated agents that speak the real agent protocol over
//! HTTPS: each registers with a bootstrap token, sends heartbeats with a GPU inventory (nodes of
//! 8 H100s) at the interval the hub asks for, holds its work stream open (counting the Upserts;
//! given a channel, also keeping what it holds and handing each Upsert to the bench with the
//! instant it arrived), and sends status reports when the bench asks.
//!
//! Included with `#[path]` by `hub_e2e.rs` and `failover.rs`, next to `tests/support` as
//! `support`.

// Each bench uses a part of it.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use futures::{StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use lifeboat_api::cluster::{
    ApiEnablement, ApiResourceRef, Cluster, HUB_SYSTEM_NAMESPACE, NodeGroup, NodeSummary,
    ResourceSummary,
};
use lifeboat_api::protocol::{
    self, Inventory, ObservedObject, RegisterResponse, StatusReport, StatusResponse, WorkEvent,
    WorkKey, WorkStatus,
};
use lifeboat_e2e::fleet::{Fleet, workspace_root};
use lifeboat_hub::agentapi::AgentApiConfig;
use lifeboat_hub::clusters::health::ClusterHealthConfig;
use lifeboat_hub::process::{AgentApiTls, HubOptions};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::support;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub const CA_SECRET: &str = "lifeboat-hub-ca";
const BOOTSTRAP_SECRET: &str = "hub-e2e-bench-bootstrap";
const BOOTSTRAP_TOKEN: &str = "hub-e2e-bench-bootstrap-0123456789abcdef0123456789";
/// GPU nodes each simulated cluster reports (8 GPUs each).
pub const GPU_NODES: i32 = 128;
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(300);

pub fn appwrapper_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "workload.codeflare.dev",
        "v1beta2",
        "AppWrapper",
    ))
}

pub fn policy_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "policy.lifeboat.dev",
        "v1alpha1",
        "PropagationPolicy",
    ))
}

/// What a GPU cluster's agent reports: 128 nodes of 8 H100s, 2 on spot, AppWrappers served.
pub fn inventory() -> Inventory {
    let quantity = |s: &str| k8s_openapi::apimachinery::pkg::api::resource::Quantity(s.into());
    let per_node: BTreeMap<String, _> = [
        ("cpu", "96"),
        ("memory", "1500Gi"),
        ("nvidia.com/gpu", "8"),
        ("pods", "110"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), quantity(v)))
    .collect();
    let total = |n: i32| -> BTreeMap<String, _> {
        [
            ("cpu", format!("{}", 96 * n)),
            ("memory", format!("{}Gi", 1500 * n)),
            ("nvidia.com/gpu", format!("{}", 8 * n)),
            ("pods", format!("{}", 110 * n)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), quantity(&v)))
        .collect()
    };
    let group = |count: i32, capacity: &str| NodeGroup {
        count,
        free: per_node.clone(),
        capacity_type: Some(capacity.into()),
        labels: [("nvidia.com/gpu.product".to_string(), "H100".to_string())].into(),
    };
    Inventory {
        kubernetes_version: Some("v1.36.3".into()),
        api_enablements: vec![
            ApiEnablement {
                group_version: "workload.codeflare.dev/v1beta2".into(),
                resources: vec![ApiResourceRef {
                    name: "appwrappers".into(),
                    kind: "AppWrapper".into(),
                }],
            },
            ApiEnablement {
                group_version: "batch/v1".into(),
                resources: vec![ApiResourceRef {
                    name: "jobs".into(),
                    kind: "Job".into(),
                }],
            },
        ],
        node_summary: NodeSummary {
            total_num: GPU_NODES,
            ready_num: GPU_NODES,
        },
        resource_summary: ResourceSummary {
            allocatable: total(GPU_NODES),
            allocated: BTreeMap::new(),
        },
        node_groups: vec![group(GPU_NODES - 2, "on-demand"), group(2, "spot")],
        node_health: Default::default(),
    }
}

/// A small training job: one pod asking for one GPU.
pub fn appwrapper(namespace: &str, name: &str) -> Result<DynamicObject, serde_json::Error> {
    serde_json::from_value(json!({
        "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"components": [{"template": {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": format!("{name}-job")},
            "spec": {"template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "train", "image": "busybox", "command": ["sleep", "3600"],
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                                  "limits": {"nvidia.com/gpu": "1"}}}]
            }}}
        }}]}
    }))
}

/// An AppWrapper as a member's agent observes it: Running with its pods ready, or (`failure`)
/// Failed with the agent's Unhealthy condition, whose message carries the failure class.
pub fn observed_appwrapper(key: &WorkKey, failure: Option<&str>) -> serde_json::Value {
    let name = key.name.strip_suffix("-appwrapper").unwrap_or(&key.name);
    let (phase, unhealthy) = match failure {
        None => (
            "Running",
            json!({"type": "Unhealthy", "status": "False", "reason": "FoundNoFailedPods", "message": "", "lastTransitionTime": "2026-05-01T12:00:30Z"}),
        ),
        Some(message) => (
            "Failed",
            json!({"type": "Unhealthy", "status": "True", "reason": "FoundFailedPods", "message": message, "lastTransitionTime": "2026-05-01T12:10:00Z"}),
        ),
    };
    json!({
        "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
        "metadata": {"name": name, "namespace": key.namespace, "generation": 1,
                     "labels": {"lifeboat.dev/binding": key.name}},
        "status": {
            "phase": phase,
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "AppWrapperRunnable", "message": "", "lastTransitionTime": "2026-05-01T12:00:00Z"},
                {"type": "ResourcesDeployed", "status": "True", "reason": "AppWrapperRunnable", "message": "", "lastTransitionTime": "2026-05-01T12:00:01Z"},
                {"type": "PodsReady", "status": if failure.is_none() { "True" } else { "False" }, "reason": "AppWrapperRunnable", "message": "", "lastTransitionTime": "2026-05-01T12:00:30Z"},
                unhealthy
            ]
        }
    })
}

/// The agent API's URL and an HTTPS client trusting the hub's CA.
pub struct AgentEndpoint {
    client: support::HttpsClient,
    url: String,
}

impl AgentEndpoint {
    async fn post(
        &self,
        path: &str,
        token: &str,
        body: Vec<u8>,
    ) -> Result<(http::StatusCode, Vec<u8>), BoxError> {
        let request = http::Request::post(format!("{}{path}", self.url))
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .body(Body::from(body))?;
        let response = self.client.request(request).await?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes().to_vec();
        Ok((status, bytes))
    }
}

/// One Upsert as it came off a cluster's work stream.
#[derive(Debug)]
pub struct Handed {
    pub cluster: String,
    pub key: WorkKey,
    pub at: Instant,
}

/// A simulated agent: the work its stream handed it, and its heartbeats and stream as tasks.
pub struct SimulatedAgent {
    pub cluster: String,
    /// Upserts received since the last stream Reset.
    pub upserts: Arc<AtomicU64>,
    /// The work the cluster holds (binding UID and revision by key), kept only for an agent
    /// started with a `handed` channel (the hub's memory bench counts only).
    pub works: Arc<Mutex<HashMap<WorkKey, Held>>>,
    /// When the last heartbeat the hub accepted was sent.
    pub last_heartbeat_sent: Arc<Mutex<Option<Instant>>>,
    endpoint: Arc<AgentEndpoint>,
    token: String,
    tasks: Vec<JoinHandle<()>>,
}

impl SimulatedAgent {
    /// Sends one status report; an answer other than 200 is an error.
    pub async fn report(&self, items: Vec<WorkStatus>) -> Result<StatusResponse, BoxError> {
        let body = serde_json::to_vec(&StatusReport { items, full: false })?;
        let (status, body) = self
            .endpoint
            .post(&protocol::status_path(&self.cluster), &self.token, body)
            .await?;
        if status != http::StatusCode::OK {
            return Err(format!(
                "status report of {}: {status} {}",
                self.cluster,
                String::from_utf8_lossy(&body)
            )
            .into());
        }
        Ok(serde_json::from_slice(&body)?)
    }

    /// The status of the work `key` this cluster holds, observed now: Running, or Failed with
    /// `failure` as the Unhealthy condition's message. `None` when the cluster does not hold it.
    pub fn status_of(&self, key: &WorkKey, failure: Option<&str>) -> Option<WorkStatus> {
        let works = self.works.lock().unwrap_or_else(|e| e.into_inner());
        let work = works.get(key)?;
        Some(WorkStatus {
            key: key.clone(),
            binding_uid: work.binding_uid.clone(),
            revision: work.revision,
            applied: true,
            applied_message: None,
            observed: ObservedObject::from_value(&observed_appwrapper(key, failure)).ok(),
            observed_at: Time(k8s_openapi::jiff::Timestamp::now()),
            reset_generation: None,
            fenced: false,
            gone: false,
        })
    }

    /// The agent goes away: no more heartbeats, its work stream closed.
    pub fn stop(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Registers `cluster`, keeps its heartbeats going and reads its work stream; with `handed`,
/// each Upsert also goes there and the agent keeps what it holds (to report its status).
pub async fn start_agent(
    endpoint: Arc<AgentEndpoint>,
    cluster: String,
    handed: Option<mpsc::UnboundedSender<Handed>>,
) -> Result<SimulatedAgent, BoxError> {
    let mut request = support::register_request(&cluster);
    request.region = Some(format!("region-{}", cluster.len() % 4));
    let (status, body) = endpoint
        .post(
            &protocol::register_path(),
            BOOTSTRAP_TOKEN,
            serde_json::to_vec(&request)?,
        )
        .await?;
    if status != http::StatusCode::OK {
        return Err(format!(
            "registering {cluster}: {status} {}",
            String::from_utf8_lossy(&body)
        )
        .into());
    }
    let registered: RegisterResponse = serde_json::from_slice(&body)?;
    let token = registered.token;
    let interval = Duration::from_secs(registered.heartbeat_interval_seconds.max(1) as u64);
    let heartbeat = serde_json::to_vec(&protocol::HeartbeatRequest {
        identity: format!("agent-{cluster}"),
        inventory: Some(inventory()),
        ..Default::default()
    })?;
    let last_heartbeat_sent = Arc::new(Mutex::new(None));
    let heartbeats = {
        let (endpoint, cluster, token) = (endpoint.clone(), cluster.clone(), token.clone());
        let last = last_heartbeat_sent.clone();
        tokio::spawn(async move {
            loop {
                let sent = Instant::now();
                match endpoint
                    .post(
                        &protocol::heartbeat_path(&cluster),
                        &token,
                        heartbeat.clone(),
                    )
                    .await
                {
                    Ok((status, _)) if status.is_success() => {
                        *last.lock().unwrap_or_else(|e| e.into_inner()) = Some(sent);
                    }
                    Ok((status, body)) => eprintln!(
                        "heartbeat of {cluster}: {status} {}",
                        String::from_utf8_lossy(&body)
                    ),
                    Err(error) => eprintln!("heartbeat of {cluster}: {error}"),
                }
                tokio::time::sleep(interval).await;
            }
        })
    };
    let upserts = Arc::new(AtomicU64::new(0));
    let works = Arc::new(Mutex::new(HashMap::new()));
    let stream = {
        let held = Stream {
            cluster: cluster.clone(),
            upserts: upserts.clone(),
            works: works.clone(),
            handed,
        };
        let (endpoint, token) = (endpoint.clone(), token.clone());
        tokio::spawn(async move {
            // The hub opens work streams once its first pass is done: retry until then.
            loop {
                if let Err(error) = drain_work(&endpoint, &token, &held).await {
                    log_stream_error(&held.cluster, &error);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    Ok(SimulatedAgent {
        cluster,
        upserts,
        works,
        last_heartbeat_sent,
        endpoint,
        token,
        tasks: vec![heartbeats, stream],
    })
}

/// Starts an agent per name (8 registering at once) and waits until every one is Ready.
pub async fn start_agents(
    hub: &kube::Client,
    endpoint: &Arc<AgentEndpoint>,
    names: &[String],
    handed: Option<&mpsc::UnboundedSender<Handed>>,
) -> Result<Vec<SimulatedAgent>, BoxError> {
    let agents = futures::stream::iter(names.to_vec())
        .map(|name| start_agent(endpoint.clone(), name, handed.cloned()))
        .buffer_unordered(8)
        .try_collect::<Vec<_>>()
        .await?;
    until_clusters_ready(hub, names, "every simulated cluster Ready").await?;
    Ok(agents)
}

/// Waits until every Cluster named in `names` is Ready on the hub.
async fn until_clusters_ready(
    hub: &kube::Client,
    names: &[String],
    what: &str,
) -> Result<(), BoxError> {
    let clusters: Api<Cluster> = Api::all(hub.clone());
    until(what, || async {
        let list = clusters
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let ready = list
            .items
            .iter()
            .filter(|c| is_ready(c) && names.contains(&c.metadata.name.clone().unwrap_or_default()))
            .count();
        if ready == names.len() {
            Ok(())
        } else {
            Err(format!("{ready} of {} Ready", names.len()))
        }
    })
    .await
}

/// One work item a cluster holds.
pub struct Held {
    pub binding_uid: String,
    pub revision: i64,
}

/// What one agent's stream updates.
struct Stream {
    cluster: String,
    upserts: Arc<AtomicU64>,
    works: Arc<Mutex<HashMap<WorkKey, Held>>>,
    handed: Option<mpsc::UnboundedSender<Handed>>,
}

fn log_stream_error(cluster: &str, error: &BoxError) {
    let text = error.to_string();
    // 503 before the hub's first pass is expected; anything else is worth seeing.
    if !text.contains("503") {
        eprintln!("work stream of {cluster}: {text}");
    }
}

/// Reads one work stream to its end, keeping the work handed over.
async fn drain_work(endpoint: &AgentEndpoint, token: &str, held: &Stream) -> Result<(), BoxError> {
    let request = http::Request::get(format!(
        "{}{}",
        endpoint.url,
        protocol::work_path(&held.cluster)
    ))
    .header("authorization", format!("Bearer {token}"))
    .body(Body::empty())?;
    let response = endpoint.client.request(request).await?;
    if !response.status().is_success() {
        return Err(format!("{}", response.status()).into());
    }
    let mut body = response.into_body();
    let mut buffer: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            buffer.extend_from_slice(&data);
        }
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            match serde_json::from_slice::<WorkEvent>(&line[..end])? {
                WorkEvent::Upsert { work } => {
                    let at = Instant::now();
                    held.upserts.fetch_add(1, Ordering::Relaxed);
                    if let Some(handed) = &held.handed {
                        let _ = handed.send(Handed {
                            cluster: held.cluster.clone(),
                            key: work.key.clone(),
                            at,
                        });
                        held.works.lock().unwrap_or_else(|e| e.into_inner()).insert(
                            work.key,
                            Held {
                                binding_uid: work.binding_uid,
                                revision: work.revision,
                            },
                        );
                    }
                }
                WorkEvent::Delete { key, .. } => {
                    held.works
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&key);
                }
                WorkEvent::Reset { .. } => held.upserts.store(0, Ordering::Relaxed),
                _ => {}
            }
        }
    }
    Ok(())
}

/// The hub in this process, with the binary's defaults changed by `configure`, its SQLite ledger
/// under `target/{dir}`; returns the agent API's URL and the hub's metrics registry.
pub async fn start_hub(
    fleet: &Fleet,
    dir: &str,
    configure: impl FnOnce(&mut HubOptions),
) -> Result<(String, prometheus::Registry), BoxError> {
    let api_port = lifeboat_e2e::ports::free_port()?;
    let dir = workspace_root().join("target").join(dir);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let mut options = HubOptions {
        kubeconfig: Some(fleet.kubeconfig("hub")?),
        install_crds: true,
        metrics_bind: None,
        agent_api_bind: SocketAddr::from(([127, 0, 0, 1], api_port)),
        agent_api_tls: AgentApiTls::CaSecret {
            secret: CA_SECRET.into(),
            names: vec!["127.0.0.1".into()],
        },
        agent_api: AgentApiConfig::default(),
        cluster_health: ClusterHealthConfig::default(),
        leader_election: None,
        // The binary's defaults.
        binder_workers: 32,
        status_writers: 32,
        scheduler: Default::default(),
        cluster_eviction_rate: lifeboat_hub::binding::binder::DEFAULT_CLUSTER_EVICTION_RATE,
        database_url: format!("sqlite://{}", dir.join("ledger.db").display()),
        recovery_timeout: lifeboat_hub::process::DEFAULT_RECOVERY_TIMEOUT,
        webhook: None,
    };
    configure(&mut options);
    let registry = prometheus::Registry::new();
    let hub_registry = registry.clone();
    tokio::spawn(async move {
        if let Err(error) =
            lifeboat_hub::process::run(options, hub_registry, std::future::pending()).await
        {
            eprintln!("hub stopped: {error}");
        }
    });
    Ok((format!("https://127.0.0.1:{api_port}"), registry))
}

/// The AppWrapper CRD on the hub (the hub keeps AppWrappers as templates).
pub async fn ensure_appwrapper_crd(hub: &kube::Client) -> Result<(), BoxError> {
    lifeboat_runtime::crd::ensure(
        hub,
        &lifeboat_api::crds::appwrapper().crd,
        "hub-e2e-bench",
        lifeboat_runtime::crd::ESTABLISHED_TIMEOUT,
    )
    .await?;
    Ok(())
}

/// Polls `check` (setup only; the timed parts watch) until it answers `Ok`.
pub async fn until<T, F, Fut>(what: &str, mut check: F) -> Result<T, BoxError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + SETUP_TIMEOUT;
    loop {
        match check().await {
            Ok(v) => return Ok(v),
            Err(why) if Instant::now() > deadline => {
                return Err(format!("{what}: {why}").into());
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The bootstrap token, and a client trusting the hub's CA once the hub made it.
pub async fn bootstrap(hub: &kube::Client, url: &str) -> Result<Arc<AgentEndpoint>, BoxError> {
    let ca = lifeboat_e2e::fleet::lifeboat::hub_ca(hub, CA_SECRET, SETUP_TIMEOUT).await?;
    match support::bootstrap_token(
        hub,
        HUB_SYSTEM_NAMESPACE,
        BOOTSTRAP_SECRET,
        BOOTSTRAP_TOKEN,
        None,
        None,
    )
    .await
    {
        Ok(()) => {}
        Err(e) if e.to_string().contains("already exists") => {}
        Err(e) => return Err(e.to_string().into()),
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&ca) {
        roots.add(cert?)?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(AgentEndpoint {
        client: support::https_client(tls),
        url: url.to_string(),
    }))
}

pub fn is_ready(cluster: &Cluster) -> bool {
    cluster.ready_status() == Some("True")
}

/// A real agent (`lifeboat_agent`, in this process) in hub mode for each of the fleet's
/// `members`, registered with the same bootstrap token as the simulated ones; returns once every
/// member's Cluster is Ready on the hub. Its hub CA and token files go under `dir`.
pub async fn start_real_agents(
    fleet: &Fleet,
    hub: &kube::Client,
    url: &str,
    members: &[String],
    dir: &str,
) -> Result<Vec<lifeboat_agent::agent::SpawnedAgent>, BoxError> {
    use lifeboat_agent::agent::{self, AgentOptions};
    use lifeboat_agent::uplink::{HubOptions as AgentHubOptions, HubTiming, SecretRef};
    let dir = workspace_root().join("target").join(dir);
    std::fs::create_dir_all(&dir)?;
    let ca = lifeboat_e2e::fleet::lifeboat::hub_ca(hub, CA_SECRET, SETUP_TIMEOUT).await?;
    std::fs::write(dir.join("hub-ca.pem"), &ca)?;
    std::fs::write(dir.join("bootstrap-token"), BOOTSTRAP_TOKEN)?;
    let mut agents = Vec::new();
    for member in members {
        let options = AgentOptions {
            kubeconfig: Some(fleet.kubeconfig(member)?),
            config: Default::default(),
            cluster: member.clone(),
            metrics_bind: None,
            concurrency: 4,
            install_crd: true,
            webhook: None,
            leader_election: None,
            hub: Some(AgentHubOptions {
                urls: vec![url.to_string()],
                ca_file: Some(dir.join("hub-ca.pem")),
                bootstrap_token_file: dir.join("bootstrap-token"),
                fencing_period: Duration::from_secs(60),
                provider: Some("kwok".into()),
                region: Some("us-east-1".into()),
                zone: None,
                credential_secret: SecretRef {
                    namespace: "lifeboat-system".into(),
                    name: "lifeboat-hub-credential".into(),
                },
                fencing: lifeboat_agent::uplink::FencingChoice::On {
                    server: None,
                    ca_file: None,
                },
                identity: Some(format!("{member}-agent")),
                timing: HubTiming::default(),
            }),
        };
        agents.push(agent::spawn(options, prometheus::Registry::new()).await?);
    }
    until_clusters_ready(hub, members, "every real member Ready on the hub").await?;
    Ok(agents)
}
