//! Hub mode on the local fleet: the agent of a real member cluster against a small test hub
//! that speaks `lifeboat_api::protocol` over HTTPS and serves the hub's own `WorkStore`
//! (`lifeboat_hub::work::store`), until the hub's agent API is merged and replaces it.
//!
//! One scenario, in order, on member-1 (4 kwok nodes × 8 GPUs): register through a standby's
//! redirect → heartbeats with the inventory → works applied → status reported → a work deleted
//! → the stream resumed from its cursor → a crash and restart against a new hub epoch that
//! omits one work (adopted, not recreated; the omitted one deleted; the credential reused) →
//! a revoked credential (registers again) → the hub deletes the cluster (work removed).

#[path = "../../e2e/tests/support/mod.rs"]
mod support;

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use lifeboat_agent::agent;
use lifeboat_agent::uplink::HubOptions;
use lifeboat_api::protocol::{
    API_PREFIX, Cursor, ErrorResponse, HeartbeatRequest, HeartbeatResponse, LEADER_HEADER,
    RegisterRequest, RegisterResponse, StatusReport, StatusResponse, Work, WorkEvent, WorkKey,
    WorkStatus,
};
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestError, TestResult};
use lifeboat_e2e::{nodes, wait};
use lifeboat_hub::work::store::WorkStore;
use serde_json::{Value, json};
use support::{T, metric, metrics_text};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

const BOOTSTRAP: &str = "bootstrap-s3cret";
const SECRET_NAMESPACE: &str = support::CREDENTIAL_NAMESPACE;
const SECRET_NAME: &str = support::CREDENTIAL_NAME;

fn main() -> ExitCode {
    harness::run(
        "agent-hub",
        |c| {
            c.members = 1;
            c.nodes_per_member = 4;
            c.gpus_per_node = 8;
        },
        vec![E2eTest::new("hub_mode_end_to_end", hub_mode_end_to_end)],
    )
}

// ---------------------------------------------------------------------------------------------
// The test hub: the hub's side of the protocol, small and faithful to api/src/protocol.rs.

#[derive(Default)]
struct Log {
    registrations: Vec<RegisterRequest>,
    /// Token used, request.
    heartbeats: Vec<(String, HeartbeatRequest)>,
    /// `since` of each work stream opened.
    streams: Vec<Option<String>>,
    reports: Vec<StatusReport>,
    latest: HashMap<WorkKey, WorkStatus>,
    /// Reports whose `observedAt` did not increase for their work.
    replays: Vec<String>,
}

struct TestHub {
    store: Mutex<Arc<WorkStore>>,
    /// Issued cluster tokens → cluster.
    tokens: Mutex<HashMap<String, String>>,
    issued: AtomicUsize,
    log: Mutex<Log>,
    /// Bumped to end every open work stream.
    close: watch::Sender<u64>,
    /// Answer heartbeats with `stop` (the Cluster was deleted).
    stop: AtomicBool,
}

impl TestHub {
    fn new(epoch: &str) -> Arc<Self> {
        Arc::new(Self {
            store: Mutex::new(Arc::new(WorkStore::new(epoch))),
            tokens: Mutex::default(),
            issued: AtomicUsize::new(0),
            log: Mutex::default(),
            close: watch::channel(0).0,
            stop: AtomicBool::new(false),
        })
    }

    fn store(&self) -> Arc<WorkStore> {
        self.store.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A hub restart: a new leader term (epoch) whose store holds `works`; open streams end.
    fn restart(&self, epoch: &str, cluster: &str, works: Vec<Work>) {
        let store = Arc::new(WorkStore::new(epoch));
        for work in works {
            store.upsert(cluster, work);
        }
        store.mark_ready();
        *self.store.lock().unwrap_or_else(|e| e.into_inner()) = store;
        self.close_streams();
    }

    fn close_streams(&self) {
        self.close.send_modify(|n| *n += 1);
    }

    fn log<T>(&self, f: impl FnOnce(&mut Log) -> T) -> T {
        f(&mut self.log.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn tokens(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cluster token of `cluster`, checked as the hub does: 401 unknown, 403 another
    /// cluster's.
    fn authorize(&self, headers: &HeaderMap, cluster: &str) -> Result<String, Refusal> {
        let token = bearer(headers).ok_or((StatusCode::UNAUTHORIZED, "no token".to_string()))?;
        match self.tokens().get(&token) {
            None => Err((
                StatusCode::UNAUTHORIZED,
                "unknown or revoked token".to_string(),
            )),
            Some(owner) if owner != cluster => Err((
                StatusCode::FORBIDDEN,
                format!("the token is cluster {owner}'s"),
            )),
            Some(_) => Ok(token),
        }
    }
}

/// Why the test hub refuses a call: the status code and the message.
type Refusal = (StatusCode, String);

fn bearer(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::to_string)
}

fn error(code: StatusCode, message: &str) -> Response {
    let reason = match code {
        StatusCode::UNAUTHORIZED => "Unauthorized",
        StatusCode::FORBIDDEN => "Forbidden",
        StatusCode::SERVICE_UNAVAILABLE => "NotLeader",
        _ => "BadRequest",
    };
    (
        code,
        axum::Json(ErrorResponse {
            code: code.as_u16(),
            reason: reason.into(),
            message: message.into(),
        }),
    )
        .into_response()
}

async fn register(
    State(hub): State<Arc<TestHub>>,
    headers: HeaderMap,
    axum::Json(request): axum::Json<RegisterRequest>,
) -> Response {
    if bearer(&headers).as_deref() != Some(BOOTSTRAP) {
        return error(StatusCode::UNAUTHORIZED, "not the bootstrap token");
    }
    let n = hub.issued.fetch_add(1, Ordering::SeqCst) + 1;
    let token = format!("cluster-token-{n}");
    hub.tokens()
        .insert(token.clone(), request.cluster_name.clone());
    let response = RegisterResponse {
        cluster_name: request.cluster_name.clone(),
        token,
        lease_duration_seconds: 6,
        heartbeat_interval_seconds: 1,
        fencing_period_seconds: request.fencing_period_seconds,
    };
    hub.log(|l| l.registrations.push(request));
    axum::Json(response).into_response()
}

async fn heartbeat(
    State(hub): State<Arc<TestHub>>,
    Path(cluster): Path<String>,
    headers: HeaderMap,
    axum::Json(request): axum::Json<HeartbeatRequest>,
) -> Response {
    let token = match hub.authorize(&headers, &cluster) {
        Ok(t) => t,
        Err((code, message)) => return error(code, &message),
    };
    hub.log(|l| l.heartbeats.push((token, request)));
    axum::Json(HeartbeatResponse {
        lease_duration_seconds: 6,
        stop: hub.stop.load(Ordering::SeqCst),
        fencing_credential_digest: None,
    })
    .into_response()
}

async fn status(
    State(hub): State<Arc<TestHub>>,
    Path(cluster): Path<String>,
    headers: HeaderMap,
    axum::Json(report): axum::Json<StatusReport>,
) -> Response {
    if let Err((code, message)) = hub.authorize(&headers, &cluster) {
        return error(code, &message);
    }
    let store = hub.store();
    let mut response = StatusResponse::default();
    hub.log(|l| {
        for item in &report.items {
            if let Some(last) = l.latest.get(&item.key)
                && item.observed_at.0 <= last.observed_at.0
            {
                l.replays.push(format!(
                    "{} at {} after {}",
                    item.key, item.observed_at.0, last.observed_at.0
                ));
            }
            if store.get(&cluster, &item.key).is_some() {
                response.accepted += 1;
            } else {
                response
                    .rejected
                    .push(lifeboat_api::protocol::RejectedItem {
                        key: item.key.clone(),
                        reason: "not assigned".into(),
                    });
            }
            l.latest.insert(item.key.clone(), item.clone());
        }
        l.reports.push(report);
    });
    axum::Json(response).into_response()
}

fn line(event: &WorkEvent) -> Result<Bytes, Infallible> {
    let mut text = serde_json::to_string(event).unwrap_or_default();
    text.push('\n');
    Ok(Bytes::from(text))
}

async fn work(
    State(hub): State<Arc<TestHub>>,
    Path(cluster): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if let Err((code, message)) = hub.authorize(&headers, &cluster) {
        return error(code, &message);
    }
    let since = query.get("since").cloned();
    hub.log(|l| l.streams.push(since.clone()));
    let cursor = since.as_deref().and_then(Cursor::parse);
    let store = hub.store();
    let mut closed = hub.close.subscribe();
    closed.borrow_and_update();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(256);
    tokio::spawn(async move {
        store.wait_ready().await;
        let epoch = store.epoch().to_string();
        let mut revisions = store.subscribe(&cluster);
        revisions.borrow_and_update();
        let changes = store.changes_since(&cluster, cursor.as_ref());
        let mut at = changes.revision;
        let mut lines = Vec::new();
        if changes.reset {
            lines.push(WorkEvent::Reset {
                epoch: epoch.clone(),
                revision: at,
            });
        }
        lines.extend(changes.events);
        lines.push(WorkEvent::Synced {
            epoch: epoch.clone(),
            revision: at,
        });
        for event in &lines {
            if tx.send(line(event)).await.is_err() {
                return;
            }
        }
        loop {
            let events = tokio::select! {
                _ = closed.changed() => return,
                changed = revisions.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let changes = store.changes_since(&cluster, Some(&Cursor { epoch: epoch.clone(), revision: at }));
                    at = changes.revision;
                    let mut events = changes.events;
                    events.push(WorkEvent::Synced { epoch: epoch.clone(), revision: at });
                    events
                }
                () = tokio::time::sleep(Duration::from_secs(2)) => vec![WorkEvent::Bookmark],
            };
            for event in &events {
                if tx.send(line(event)).await.is_err() {
                    return;
                }
            }
        }
    });
    let body =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "response"))
}

fn hub_router(hub: Arc<TestHub>) -> Router {
    Router::new()
        .route(&format!("{API_PREFIX}/register"), post(register))
        .route(
            &format!("{API_PREFIX}/clusters/{{cluster}}/heartbeat"),
            post(heartbeat),
        )
        .route(
            &format!("{API_PREFIX}/clusters/{{cluster}}/status"),
            post(status),
        )
        .route(
            &format!("{API_PREFIX}/clusters/{{cluster}}/work"),
            get(work),
        )
        .with_state(hub)
}

/// A standby hub: every call gets 503 naming the leader.
fn standby_router(leader: String, hits: Arc<AtomicUsize>) -> Router {
    Router::new().fallback(move || {
        let leader = leader.clone();
        hits.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut response = error(StatusCode::SERVICE_UNAVAILABLE, "this hub is a standby");
            let headers = response.headers_mut();
            if let Ok(value) = leader.parse() {
                headers.insert(LEADER_HEADER, value);
            }
            headers.insert(
                header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
            response
        }
    })
}

// ---------------------------------------------------------------------------------------------
// TLS for the test hub: a CA (given to the agent as --hub-ca-file) and a serving certificate
// for 127.0.0.1.

fn certificates() -> Result<(String, Arc<rustls::ServerConfig>), TestError> {
    let validity = || lifeboat_tls::Validity::starting_now(Duration::from_secs(3600));
    let ca = lifeboat_tls::CertificateAuthority::generate("test-hub-ca", validity())?;
    let serving = ca.serving_certificate(
        "127.0.0.1",
        &["127.0.0.1".to_string(), "localhost".to_string()],
        validity(),
    )?;
    let config =
        lifeboat_tls::ReloadingResolver::new(serving)?.server_config(vec![b"http/1.1".to_vec()])?;
    Ok((ca.cert_pem().to_string(), config))
}

struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, peer)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(stream).await {
                return (tls, peer);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// Serves `router` over TLS on a free port; returns its URL.
async fn serve(router: Router, tls: Arc<rustls::ServerConfig>) -> Result<String, TestError> {
    let tcp = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("https://{}", tcp.local_addr()?);
    let listener = TlsListener {
        tcp,
        acceptor: TlsAcceptor::from(tls),
    };
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(url)
}

// ---------------------------------------------------------------------------------------------
// The scenario.

fn key(namespace: &str, name: &str) -> WorkKey {
    WorkKey {
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// A work as the hub's dispatch makes it: the template with the binding's labels.
fn work_of(namespace: &str, binding: &str, mut manifest: Value) -> Work {
    manifest["metadata"]["namespace"] = json!(namespace);
    manifest["metadata"]["labels"]["work.lifeboat.dev/binding-namespace"] = json!(namespace);
    manifest["metadata"]["labels"]["work.lifeboat.dev/binding-name"] = json!(binding);
    manifest["metadata"]["annotations"]["work.lifeboat.dev/binding-uid"] =
        json!(format!("uid-{binding}"));
    Work {
        key: key(namespace, binding),
        binding_uid: format!("uid-{binding}"),
        revision: 0,
        manifest,
        purge_mode: None,
        reset: None,
    }
}

fn hub_options(urls: Vec<String>, dir: &std::path::Path) -> HubOptions {
    let mut options = support::hub_mode(urls, dir, "us-east-1", "hub-e2e-agent");
    options.timing.stream_idle_timeout = Duration::from_secs(30);
    options
}

async fn start_agent(
    ctx: &TestContext,
    member: &str,
    hub: HubOptions,
) -> Result<(agent::SpawnedAgent, SocketAddr), TestError> {
    support::spawn_agent(&ctx.fleet, member, 4, Some(hub)).await
}

async fn wait_for<R>(what: &str, check: impl Fn() -> Result<R, String>) -> Result<R, TestError> {
    Ok(wait::until(what, T, || {
        let result = check();
        async move { result }
    })
    .await?)
}

fn appwrapper_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "workload.codeflare.dev",
        "v1beta2",
        "AppWrapper",
    ))
}

async fn hub_mode_end_to_end(ctx: Arc<TestContext>) -> TestResult {
    let member = ctx.first_member();
    let client = ctx.client(&member).await?;
    let ns = ctx.namespace(&member).await?;
    // The works' namespace does not exist in the member yet: the agent creates it.
    let work_ns = format!("{ns}-work");

    // A pod already holding GPUs of node 0 (on-demand): 3 for its init container, 2 for its
    // container: the scheduler counts max(3, 2) = 3, so the node has 5 free.
    let holder_node = nodes::node_name(&member, 0);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let holder: Pod = serde_json::from_value(json!({
        "metadata": {"name": "gpu-holder"},
        "spec": {"nodeName": holder_node,
            "initContainers": [{"name": "init", "image": "busybox",
                "resources": {"limits": {"nvidia.com/gpu": "3"}, "requests": {"nvidia.com/gpu": "3"}}}],
            "containers": [{"name": "main", "image": "busybox",
                "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "2", "cpu": "1"}}}]}
    }))?;
    pods.create(&PostParams::default(), &holder).await?;

    // The hubs: the leader, and a standby the agent is pointed at.
    let dir = lifeboat_e2e::fleet::workspace_root()
        .join("target")
        .join("e2e-fleets")
        .join(format!("agent-hub-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (ca_pem, tls) = certificates()?;
    std::fs::write(dir.join("hub-ca.pem"), ca_pem)?;
    std::fs::write(dir.join("bootstrap-token"), format!("{BOOTSTRAP}\n"))?;
    let hub = TestHub::new("e1");
    hub.store().mark_ready();
    let leader_url = serve(hub_router(hub.clone()), tls.clone()).await?;
    let standby_hits = Arc::new(AtomicUsize::new(0));
    let standby_url = serve(
        standby_router(leader_url.clone(), standby_hits.clone()),
        tls,
    )
    .await?;
    let options = hub_options(vec![standby_url.clone()], &dir);

    // 1. Registration, through the standby's redirect to the leader.
    let (agent, metrics) = start_agent(&ctx, &member, options.clone()).await?;
    let registration = wait_for("registration at the leader", || {
        hub.log(|l| l.registrations.first().cloned())
            .ok_or_else(|| {
                format!(
                    "{} calls at the standby",
                    standby_hits.load(Ordering::SeqCst)
                )
            })
    })
    .await?;
    assert!(
        standby_hits.load(Ordering::SeqCst) >= 1,
        "the standby was asked first"
    );
    assert_eq!(registration.cluster_name, member);
    assert_eq!(registration.identity, "hub-e2e-agent");
    assert_eq!(registration.protocol_version, "v1");
    assert_eq!(registration.fencing_period_seconds, 60);
    assert_eq!(
        (
            registration.provider.as_deref(),
            registration.region.as_deref(),
            registration.zone.as_deref()
        ),
        (Some("kwok"), Some("us-east-1"), None)
    );
    // The credential is kept in the member.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SECRET_NAMESPACE);
    let first_token = wait::until("the credential Secret", T, || async {
        let secret = secrets
            .get_opt(SECRET_NAME)
            .await
            .map_err(|e| e.to_string())?;
        let token = secret
            .and_then(|s| s.data)
            .and_then(|d| d.get("token").cloned())
            .ok_or("no Secret yet")?;
        Ok::<_, String>(String::from_utf8_lossy(&token.0).into_owned())
    })
    .await?;
    assert_eq!(first_token, "cluster-token-1");

    // 2. Heartbeats carry the inventory: 4 nodes × 8 GPUs, the holder's 3 GPUs on node 0.
    let inventory = wait_for("a heartbeat with the holder pod in the inventory", || {
        hub.log(|l| {
            l.heartbeats
                .iter()
                .rev()
                .filter_map(|(_, h)| h.inventory.clone())
                .find(|i| {
                    // The agent installs the AppWrapper CRD as it starts: the first discovery
                    // may precede it, the next (every 2 s here) shows it.
                    let appwrappers = i.api_enablements.iter().any(|e| {
                        e.group_version == "workload.codeflare.dev/v1beta2"
                            && e.resources.iter().any(|r| r.name == "appwrappers")
                    });
                    appwrappers
                        && i.resource_summary
                            .allocated
                            .get("nvidia.com/gpu")
                            .is_some_and(|q| q.0 == "3")
                })
        })
        .ok_or_else(|| "not yet".to_string())
    })
    .await?;
    assert_eq!(
        (
            inventory.node_summary.total_num,
            inventory.node_summary.ready_num
        ),
        (4, 4)
    );
    assert_eq!(
        inventory.resource_summary.allocatable["nvidia.com/gpu"].0,
        "32"
    );
    let groups: BTreeSet<(String, String, String, i32)> = inventory
        .node_groups
        .iter()
        .map(|g| {
            (
                g.capacity_type.clone().unwrap_or_default(),
                g.free["nvidia.com/gpu"].0.clone(),
                g.free["cpu"].0.clone(),
                g.count,
            )
        })
        .collect();
    assert_eq!(
        groups,
        BTreeSet::from([
            ("on-demand".into(), "5".into(), "95".into(), 1),
            ("on-demand".into(), "8".into(), "96".into(), 1),
            ("spot".into(), "8".into(), "96".into(), 2),
        ]),
        "node groups: {:?}",
        inventory.node_groups
    );
    for group in &inventory.node_groups {
        assert_eq!(group.labels["topology.kubernetes.io/zone"], "us-east-1a");
        assert_eq!(
            group.labels["nvidia.com/gpu.product"],
            "NVIDIA-H100-80GB-HBM3"
        );
    }
    assert_eq!(inventory.node_health.not_ready, 0);
    assert!(
        inventory
            .kubernetes_version
            .as_deref()
            .is_some_and(|v| v.starts_with("v1.36")),
        "{:?}",
        inventory.kubernetes_version
    );
    let enabled = |gv: &str, resource: &str| {
        inventory
            .api_enablements
            .iter()
            .any(|e| e.group_version == gv && e.resources.iter().any(|r| r.name == resource))
    };
    assert!(enabled("apps/v1", "deployments"));
    assert!(enabled("workload.codeflare.dev/v1beta2", "appwrappers"));
    // The hub has the heartbeat before the agent has read the answer that marks it connected.
    wait::until("lifeboat_agent_hub_connected 1", T, || async {
        let text = metrics_text(metrics).await?;
        match metric(&text, "lifeboat_agent_hub_connected") {
            Some(1.0) => Ok(()),
            other => Err(format!("lifeboat_agent_hub_connected {other:?}")),
        }
    })
    .await?;

    // 3. Works are applied by server-side apply, labelled, in a namespace created for them.
    let deployment = work_of(&work_ns, "web-deployment", support::deployment("web", 1));
    let aw = serde_json::to_value(support::appwrapper(
        "train",
        &[],
        vec![support::job("train-job", "sleep 3600", 1, 1)],
    )?)?;
    let appwrapper = work_of(&work_ns, "train-appwrapper", aw);
    let config_map = work_of(
        &work_ns,
        "settings-configmap",
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
               "data": {"lr": "0.001"}}),
    );
    let store = hub.store();
    for w in [&deployment, &appwrapper, &config_map] {
        store.upsert(&member, w.clone());
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &work_ns);
    let appwrappers: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &work_ns, &appwrapper_resource());
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &work_ns);
    let web = wait::until("the Deployment applied", T, || async {
        deployments
            .get_opt("web")
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "not yet".to_string())
    })
    .await?;
    let labels = web.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["work.lifeboat.dev/binding-namespace"], work_ns);
    assert_eq!(labels["work.lifeboat.dev/binding-name"], "web-deployment");
    let managers: Vec<(String, String)> = web
        .metadata
        .managed_fields
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|m| {
            (
                m.manager.unwrap_or_default(),
                m.operation.unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        managers.contains(&("lifeboat".to_string(), "Apply".to_string())),
        "{managers:?}"
    );
    let train = wait::until("the AppWrapper applied", T, || async {
        appwrappers
            .get_opt("train")
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "not yet".to_string())
    })
    .await?;
    assert_eq!(
        train.metadata.labels.clone().unwrap_or_default()["work.lifeboat.dev/binding-name"],
        "train-appwrapper"
    );
    let namespace = Api::<Namespace>::all(client.clone()).get(&work_ns).await?;
    assert_eq!(
        namespace.metadata.labels.unwrap_or_default()["app.kubernetes.io/created-by"],
        "lifeboat-agent"
    );

    // 4. Status reaches the hub: the Deployment ready, the AppWrapper Running (the agent's own
    // controller runs it), the ConfigMap without its data.
    let web_uid = web.metadata.uid.clone().unwrap_or_default();
    wait_for("the Deployment's status at the hub", || {
        hub.log(|l| {
            let s = l.latest.get(&deployment.key).ok_or("no report")?;
            let observed = s
                .observed
                .as_ref()
                .ok_or("not observed")?
                .to_value()
                .map_err(|e| e.to_string())?;
            if !s.applied || observed["status"]["readyReplicas"] != json!(1) {
                return Err(format!(
                    "applied {}, status {}",
                    s.applied, observed["status"]
                ));
            }
            if observed["metadata"]["uid"] != json!(web_uid)
                || observed
                    .get("metadata")
                    .and_then(|m| m.get("managedFields"))
                    .is_some()
            {
                return Err(format!("metadata {}", observed["metadata"]));
            }
            Ok(())
        })
    })
    .await?;
    wait_for("the AppWrapper Running at the hub", || {
        hub.log(|l| {
            let s = l.latest.get(&appwrapper.key).ok_or("no report")?;
            let phase = s
                .observed
                .as_ref()
                .and_then(|o| o.to_value().ok())
                .map(|o| o["status"]["phase"].clone())
                .unwrap_or_default();
            if phase == json!("Running") {
                Ok(())
            } else {
                Err(format!("phase {phase}"))
            }
        })
    })
    .await?;
    hub.log(|l| -> Result<(), TestError> {
        let s = l.latest.get(&config_map.key).ok_or("no ConfigMap report")?;
        let observed = s
            .observed
            .as_ref()
            .ok_or("ConfigMap not observed")?
            .to_value()?;
        assert!(observed.get("data").is_none(), "{observed}");
        assert_eq!(observed["metadata"]["name"], "settings");
        Ok(())
    })?;
    let text = metrics_text(metrics).await?;
    assert_eq!(
        metric(&text, "lifeboat_agent_work_items"),
        Some(3.0),
        "{text}"
    );

    // 5. Delete: the ConfigMap goes.
    store.remove(&member, &config_map.key);
    wait::until("the ConfigMap deleted", T, || async {
        match config_maps.get_opt("settings").await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err("still there".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;

    // 6. A dropped stream resumes from the cursor (only changes are resent).
    let opened = hub.log(|l| l.streams.len());
    hub.close_streams();
    let since = wait_for("the stream reopened", || {
        hub.log(|l| l.streams.get(opened).cloned())
            .ok_or_else(|| "not yet".to_string())
    })
    .await?;
    assert_eq!(since, Some(format!("e1:{}", store.revision(&member))));
    assert_eq!(
        hub.log(|l| l.streams[0].clone()),
        None,
        "the first stream had no cursor"
    );

    // 7. Crash; the hub restarts (new epoch) without the AppWrapper; the agent restarts.
    agent.abort().await;
    let registrations = hub.log(|l| l.registrations.len());
    let heartbeats = hub.log(|l| l.heartbeats.len());
    let reports = hub.log(|l| l.reports.len());
    hub.restart("e2", &member, vec![deployment.clone()]);
    let (agent, _) = start_agent(&ctx, &member, options.clone()).await?;
    wait::until("the AppWrapper no longer assigned deleted", T, || async {
        match appwrappers.get_opt("train").await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err("still there".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    wait_for("a full report after the restart", || {
        hub.log(|l| {
            l.reports[reports..]
                .iter()
                .find(|r| r.full)
                .filter(|r| r.items.iter().any(|i| i.key == deployment.key))
                .map(|_| ())
                .ok_or_else(|| "not yet".to_string())
        })
    })
    .await?;
    let adopted = deployments.get("web").await?;
    assert_eq!(
        adopted.metadata.uid.as_deref(),
        Some(web_uid.as_str()),
        "adopted, not recreated"
    );
    let labelled = deployments
        .list(&ListParams::default().labels("work.lifeboat.dev/binding-name"))
        .await?;
    assert_eq!(labelled.items.len(), 1, "no second copy");
    assert_eq!(
        hub.log(|l| l.registrations.len()),
        registrations,
        "the restarted agent reused the credential from its Secret"
    );
    assert!(hub.log(|l| l.heartbeats.len()) > heartbeats);
    assert_eq!(
        hub.log(|l| l.streams.last().cloned()),
        Some(None),
        "a new process has no cursor"
    );

    // 8. A revoked credential: 401 → registration with the bootstrap token, Secret replaced.
    hub.tokens().clear();
    wait_for("a second registration", || {
        let n = hub.log(|l| l.registrations.len());
        if n > registrations {
            Ok(())
        } else {
            Err(format!("{n} registrations"))
        }
    })
    .await?;
    let new_token = format!("cluster-token-{}", hub.issued.load(Ordering::SeqCst));
    wait::until("the Secret holds the new token", T, || async {
        let secret = secrets.get(SECRET_NAME).await.map_err(|e| e.to_string())?;
        let token = secret
            .data
            .and_then(|d| d.get("token").cloned())
            .unwrap_or_default();
        if token.0 == new_token.as_bytes() {
            Ok(())
        } else {
            Err("old token".to_string())
        }
    })
    .await?;
    wait_for("a heartbeat with the new token", || {
        hub.log(|l| l.heartbeats.iter().any(|(t, _)| *t == new_token))
            .then_some(())
            .ok_or_else(|| "not yet".to_string())
    })
    .await?;

    // 9. The hub deletes the cluster: the agent removes the work, marks its credential Secret
    // removed (so no restart registers again) and says it stopped in a last heartbeat.
    hub.stop.store(true, Ordering::SeqCst);
    wait::until("the hub's work removed", T, || async {
        let gone = deployments
            .get_opt("web")
            .await
            .map_err(|e| e.to_string())?
            .is_none();
        let secret = secrets
            .get_opt(SECRET_NAME)
            .await
            .map_err(|e| e.to_string())?;
        let marked = secret
            .as_ref()
            .and_then(lifeboat_agent::uplink::credential::removed_at);
        if gone && marked.is_some() {
            Ok(())
        } else {
            Err(format!("deployment gone {gone}, secret marked {marked:?}"))
        }
    })
    .await?;
    wait_for("a heartbeat saying the agent stopped", || {
        hub.log(|l| l.heartbeats.iter().any(|(_, h)| h.stopped))
            .then_some(())
            .ok_or_else(|| "not yet".to_string())
    })
    .await?;
    let registrations = hub.log(|l| l.registrations.len());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        hub.log(|l| l.registrations.len()),
        registrations,
        "a stopped agent registers nothing"
    );

    let replays = hub.log(|l| l.replays.clone());
    assert!(
        replays.is_empty(),
        "observedAt did not increase: {replays:?}"
    );
    agent.stop().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
