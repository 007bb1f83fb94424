//! The hub end to end on a local fleet: templates applied to the hub apiserver until every
//! ResourceBinding is `Scheduled=True`, and the hub's memory per binding.
//!
//! The real hub runs in this process (`lifeboat_hub::hub::run`, the binary's defaults: 32 binder
//! workers unless `--binder-workers N`, 8 status writers, a SQLite ledger under `target/`) against the fleet's hub
//! apiserver. The clusters are simulated agents that speak the real agent protocol over HTTPS:
//! each registers with a bootstrap token, sends heartbeats with a GPU inventory (nodes of 8
//! H100s) at the interval the hub asks for, and holds its work stream open, counting the work it
//! is handed. No member runs a real agent (the fleet's one member only satisfies the fleet's
//! minimum): the figure is the hub's, from the first create to the last binding scheduled.
//!
//! Templates are AppWrappers (one Job component, one pod asking for 1 GPU), selected by one
//! PropagationPolicy per run; a gang workload goes whole to one cluster, which the bench checks
//! on every binding. Creates run 16 at a time, as fast as the apiserver takes them; completion
//! is seen through a watch of the bindings (no polling).
//!
//!   cargo bench -p lifeboat-hub --bench hub_e2e -- --runs 3 [--templates 1000] [--clusters 100]
//!   cargo bench -p lifeboat-hub --bench hub_e2e -- --memory [--templates 10000] [--clusters 10]
//!
//! `--memory`: one run in a fresh process; the process's VmRSS (hub and simulated agents) once
//! the clusters are Ready and idle, and again once every binding is scheduled and its work has
//! reached its cluster's stream; the difference per binding.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use futures::{StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::runtime::watcher;
use lifeboat_api::binding::ResourceBinding;
use lifeboat_api::cluster::{
    ApiEnablement, ApiResourceRef, Cluster, HUB_SYSTEM_NAMESPACE, NodeGroup, NodeSummary,
    ResourceSummary,
};
use lifeboat_api::protocol::{self, Inventory, RegisterResponse, WorkEvent};
use lifeboat_e2e::fleet::{Fleet, workspace_root};
use lifeboat_hub::agentapi::AgentApiConfig;
use lifeboat_hub::clusters::ClusterHealthConfig;
use lifeboat_hub::hub::{AgentApiTls, HubOptions};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::json;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const CA_SECRET: &str = "lifeboat-hub-ca";
const BOOTSTRAP_SECRET: &str = "hub-e2e-bench-bootstrap";
const BOOTSTRAP_TOKEN: &str = "hub-e2e-bench-bootstrap-0123456789abcdef0123456789";
/// Creates in flight at once.
const CREATE_CONCURRENCY: usize = 16;
/// GPU nodes each simulated cluster reports (8 GPUs each).
const GPU_NODES: i32 = 128;
const SETUP_TIMEOUT: Duration = Duration::from_secs(300);

struct Args {
    runs: usize,
    templates: usize,
    clusters: usize,
    memory: bool,
    binder_workers: usize,
}

fn args() -> Result<Args, String> {
    let mut parsed = Args {
        runs: 3,
        templates: 0,
        clusters: 0,
        memory: false,
        // The binary's default.
        binder_workers: 32,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .and_then(|v| v.parse::<usize>().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match arg.as_str() {
            "--runs" => parsed.runs = value("--runs")?,
            "--templates" => parsed.templates = value("--templates")?,
            "--clusters" => parsed.clusters = value("--clusters")?,
            "--memory" => parsed.memory = true,
            "--binder-workers" => parsed.binder_workers = value("--binder-workers")?,
            // cargo bench passes --bench; libtest-style filters are ignored.
            _ => {}
        }
    }
    let (templates, clusters) = if parsed.memory {
        (10_000, 10)
    } else {
        (1_000, 100)
    };
    if parsed.templates == 0 {
        parsed.templates = templates;
    }
    if parsed.clusters == 0 {
        parsed.clusters = clusters;
    }
    if parsed.memory {
        parsed.runs = 1;
    }
    if parsed.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    Ok(parsed)
}

fn appwrapper_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "workload.codeflare.dev",
        "v1beta2",
        "AppWrapper",
    ))
}

fn policy_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "policy.lifeboat.dev",
        "v1alpha1",
        "PropagationPolicy",
    ))
}

/// The process's resident set (VmRSS), in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// What a GPU cluster's agent reports: 128 nodes of 8 H100s, 2 on spot, AppWrappers served.
fn inventory() -> Inventory {
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
fn appwrapper(namespace: &str, name: &str) -> Result<DynamicObject, serde_json::Error> {
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

/// A simulated agent: its HTTPS client, token, and the work its stream handed it.
struct SimulatedAgent {
    upserts: Arc<AtomicU64>,
}

struct AgentEndpoint {
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

/// Registers `cluster`, keeps its heartbeats going and drains its work stream.
async fn start_agent(
    endpoint: Arc<AgentEndpoint>,
    cluster: String,
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
    {
        let (endpoint, cluster, token) = (endpoint.clone(), cluster.clone(), token.clone());
        tokio::spawn(async move {
            loop {
                match endpoint
                    .post(
                        &protocol::heartbeat_path(&cluster),
                        &token,
                        heartbeat.clone(),
                    )
                    .await
                {
                    Ok((status, _)) if status.is_success() => {}
                    Ok((status, body)) => eprintln!(
                        "heartbeat of {cluster}: {status} {}",
                        String::from_utf8_lossy(&body)
                    ),
                    Err(error) => eprintln!("heartbeat of {cluster}: {error}"),
                }
                tokio::time::sleep(interval).await;
            }
        });
    }
    let upserts = Arc::new(AtomicU64::new(0));
    {
        let counter = upserts.clone();
        tokio::spawn(async move {
            // The hub opens work streams once its first pass is done: retry until then.
            loop {
                if let Err(error) = drain_work(&endpoint, &cluster, &token, &counter).await {
                    log_stream_error(&cluster, &error);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }
    Ok(SimulatedAgent { upserts })
}

fn log_stream_error(cluster: &str, error: &BoxError) {
    let text = error.to_string();
    // 503 before the hub's first pass is expected; anything else is worth seeing.
    if !text.contains("503") {
        eprintln!("work stream of {cluster}: {text}");
    }
}

/// Reads one work stream to its end, counting the work handed over.
async fn drain_work(
    endpoint: &AgentEndpoint,
    cluster: &str,
    token: &str,
    upserts: &AtomicU64,
) -> Result<(), BoxError> {
    let request = http::Request::get(format!("{}{}", endpoint.url, protocol::work_path(cluster)))
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
                WorkEvent::Upsert { .. } => {
                    upserts.fetch_add(1, Ordering::Relaxed);
                }
                WorkEvent::Reset { .. } => upserts.store(0, Ordering::Relaxed),
                _ => {}
            }
        }
    }
    Ok(())
}

/// The hub in this process; returns the agent API's URL.
async fn start_hub(
    fleet: &Fleet,
    binder_workers: usize,
) -> Result<(String, prometheus::Registry), BoxError> {
    let api_port = lifeboat_e2e::ports::free_port()?;
    let dir = workspace_root().join("target/hub-e2e-bench");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let options = HubOptions {
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
        binder_workers,
        // The binary's default.
        status_writers: 8,
        scheduler: Default::default(),
        cluster_eviction_rate: lifeboat_hub::binder::DEFAULT_CLUSTER_EVICTION_RATE,
        database_url: format!("sqlite://{}", dir.join("ledger.db").display()),
        recovery_timeout: lifeboat_hub::hub::DEFAULT_RECOVERY_TIMEOUT,
    };
    let registry = prometheus::Registry::new();
    let hub_registry = registry.clone();
    tokio::spawn(async move {
        if let Err(error) =
            lifeboat_hub::hub::run(options, hub_registry, std::future::pending()).await
        {
            eprintln!("hub stopped: {error}");
        }
    });
    Ok((format!("https://127.0.0.1:{api_port}"), registry))
}

/// Polls `check` (setup only; the timed part watches) until it answers `Ok`.
async fn until<T, F, Fut>(what: &str, mut check: F) -> Result<T, BoxError>
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
async fn bootstrap(hub: &kube::Client, url: &str) -> Result<Arc<AgentEndpoint>, BoxError> {
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

fn is_ready(cluster: &Cluster) -> bool {
    cluster.ready_status() == Some("True")
}

fn scheduled(binding: &ResourceBinding) -> bool {
    binding.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Scheduled" && c.status == "True")
    })
}

struct RunFigures {
    creates_per_second: f64,
    bindings_per_second: f64,
}

/// One run: a namespace, a policy, `templates` AppWrappers; timed from the first create to the
/// last binding Scheduled=True.
async fn run_once(
    hub: &kube::Client,
    run: usize,
    templates: usize,
    clusters: usize,
) -> Result<RunFigures, BoxError> {
    let namespace = format!("hub-e2e-{run}");
    support::ensure_namespace(hub, &namespace).await?;
    let policies: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &namespace, &policy_resource());
    let policy: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "policy.lifeboat.dev/v1alpha1", "kind": "PropagationPolicy",
        "metadata": {"name": "gpu-training", "namespace": namespace},
        "spec": {
            "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper"}]
        }
    }))?;
    policies
        .patch(
            "gpu-training",
            &PatchParams::apply("hub-e2e-bench").force(),
            &Patch::Apply(&policy),
        )
        .await?;
    // The hub re-binds every template when a policy changes: let it see this one first.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The watch starts before the first create, so no binding is missed.
    let bindings: Api<ResourceBinding> = Api::namespaced(hub.clone(), &namespace);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<Result<Instant, String>>();
    let watch = tokio::spawn(async move {
        let mut done = HashSet::new();
        let mut stream = std::pin::pin!(watcher(bindings, watcher::Config::default()));
        let result = loop {
            match stream.try_next().await {
                Ok(Some(watcher::Event::Apply(b) | watcher::Event::InitApply(b)))
                    if scheduled(&b) =>
                {
                    if b.spec.clusters.len() != 1 {
                        break Err(format!(
                            "binding {:?} placed on {} clusters, a gang goes to one",
                            b.metadata.name,
                            b.spec.clusters.len()
                        ));
                    }
                    done.insert(b.metadata.name.clone().unwrap_or_default());
                    if done.len() == templates {
                        break Ok(Instant::now());
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => break Err("the watch ended".to_string()),
                Err(e) => eprintln!("binding watch: {e}; retrying"),
            }
        };
        let _ = done_tx.send(result);
    });
    // Let the watch's initial list complete.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let appwrappers: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &namespace, &appwrapper_resource());
    let objects = (0..templates)
        .map(|i| appwrapper(&namespace, &format!("train-{i:05}")))
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    futures::stream::iter(objects)
        .map(|object| {
            let api = appwrappers.clone();
            async move { api.create(&PostParams::default(), &object).await }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    let created = started.elapsed().as_secs_f64();
    let finished = tokio::time::timeout(SETUP_TIMEOUT, done_rx)
        .await
        .map_err(|_| format!("not every binding Scheduled within {SETUP_TIMEOUT:?}"))??
        .map_err(|e| -> BoxError { e.into() })?;
    watch.abort();
    let seconds = finished.duration_since(started).as_secs_f64();
    let figures = RunFigures {
        creates_per_second: templates as f64 / created,
        bindings_per_second: templates as f64 / seconds,
    };
    println!(
        "run {run}: {templates} AppWrappers created in {created:.2} s ({:.0}/s); all {templates} bindings Scheduled=True {seconds:.2} s after the first create = {:.0} bindings/s ({clusters} clusters)",
        figures.creates_per_second, figures.bindings_per_second
    );
    Ok(figures)
}

async fn bench(fleet: &Fleet, args: &Args) -> Result<(), BoxError> {
    let client = fleet.client("hub").await?;
    // The hub keeps AppWrappers as templates: their CRD must be served there.
    lifeboat_runtime::crd::ensure(
        &client,
        &lifeboat_api::crds::appwrapper().crd,
        "hub-e2e-bench",
        lifeboat_runtime::crd::ESTABLISHED_TIMEOUT,
    )
    .await?;
    let (url, registry) = start_hub(fleet, args.binder_workers).await?;
    let endpoint = bootstrap(&client, &url).await?;

    let setup = Instant::now();
    let names: Vec<String> = (0..args.clusters).map(|c| format!("gpu-{c:03}")).collect();
    let agents = futures::stream::iter(names.clone())
        .map(|name| start_agent(endpoint.clone(), name))
        .buffer_unordered(8)
        .try_collect::<Vec<_>>()
        .await?;
    let clusters: Api<Cluster> = Api::all(client.clone());
    until("every simulated cluster Ready", || async {
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
    .await?;
    println!(
        "hub in process on {url} ({} binder workers); {} simulated clusters registered, heartbeating with {GPU_NODES} GPU nodes each and Ready in {:.1} s",
        args.binder_workers,
        args.clusters,
        setup.elapsed().as_secs_f64()
    );
    let upserts = || -> u64 {
        agents
            .iter()
            .map(|a| a.upserts.load(Ordering::Relaxed))
            .sum()
    };

    if args.memory {
        // Idle: the clusters are Ready, the hub's first pass is done.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let before = rss_kib();
        run_once(&client, 0, args.templates, args.clusters).await?;
        until("every work item on its cluster's stream", || async {
            let n = upserts();
            if n as usize >= args.templates {
                Ok(())
            } else {
                Err(format!("{n} of {}", args.templates))
            }
        })
        .await?;
        // Let the template status writes and the ledger settle.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let after = rss_kib();
        println!(
            "memory: VmRSS {:.1} MiB with {} Ready clusters and no bindings, {:.1} MiB with {} bindings scheduled and dispatched = {:.1} KiB per binding (hub and simulated agents in one process)",
            before as f64 / 1024.0,
            args.clusters,
            after as f64 / 1024.0,
            args.templates,
            after.saturating_sub(before) as f64 / args.templates as f64
        );
        return Ok(());
    }

    let mut bindings = Vec::new();
    let mut creates = Vec::new();
    for run in 1..=args.runs {
        let before = upserts();
        let figures = run_once(&client, run, args.templates, args.clusters).await?;
        until("every work item on its cluster's stream", || async {
            let n = upserts() - before;
            if n as usize >= args.templates {
                Ok(())
            } else {
                Err(format!("{n} of {}", args.templates))
            }
        })
        .await?;
        bindings.push(figures.bindings_per_second);
        creates.push(figures.creates_per_second);
    }
    bindings.sort_by(|a, b| a.total_cmp(b));
    creates.sort_by(|a, b| a.total_cmp(b));
    let binder_runs = support::metric(&registry, "lifeboat_hub_binder_reconciles_total", &[]);
    println!(
        "templates to bindings Scheduled=True: median {:.0} bindings/s ({:.0} to {:.0}, {} runs of {} AppWrappers, {} clusters); creates median {:.0}/s; target >= 200 bindings/s (Karmada about 22/s){}",
        bindings[bindings.len() / 2],
        bindings[0],
        bindings[bindings.len() - 1],
        bindings.len(),
        args.templates,
        args.clusters,
        creates[creates.len() / 2],
        if binder_runs > 0.0 {
            format!("; {binder_runs:.0} binder reconciles")
        } else {
            String::new()
        }
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // No member runs an agent: the fleet has one member only because a fleet needs one.
    support::on_fleet("hub-e2e-bench", |fleet| async move {
        bench(&fleet, &args).await
    })
}
