//! Helpers of the agent API's fleet tests and bench: a hub agent API on the fleet's hub
//! apiserver (its own namespace per test), a status processor stand-in that records what reaches
//! the intake, requests through the router without a socket, and an HTTPS client.

#![allow(dead_code)]

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use lifeboat_api::cluster::Cluster;
use lifeboat_api::credentials::BOOTSTRAP_TOKEN_TYPE;
use lifeboat_api::protocol::{
    self, Inventory, RegisterRequest, RegisterResponse, StatusResponse, Work, WorkKey, WorkStatus,
};
use lifeboat_e2e::harness::TestError;
use lifeboat_hub::agentapi::{AgentApi, AgentApiConfig, AgentApiDeps};
use lifeboat_hub::leadership::LeaderState;
use lifeboat_hub::status::intake::{self, StatusBatch};
use lifeboat_hub::work::store::WorkStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::sync::{OnceCell, watch};
use tower::ServiceExt;

pub const T: Duration = Duration::from_secs(30);

/// The Cluster CRD on the hub, installed once per test binary.
pub async fn ensure_cluster_crd(client: &kube::Client) -> Result<(), TestError> {
    static INSTALLED: OnceCell<()> = OnceCell::const_new();
    INSTALLED
        .get_or_try_init(|| async {
            let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
            let crd = Cluster::crd();
            let name = crd.metadata.name.clone().unwrap_or_default();
            crds.patch(
                &name,
                &PatchParams::apply("lifeboat-e2e").force(),
                &Patch::Apply(&crd),
            )
            .await?;
            tokio::time::timeout(
                T,
                await_condition(crds, &name, conditions::is_crd_established()),
            )
            .await??;
            Ok::<(), TestError>(())
        })
        .await?;
    Ok(())
}

/// Creates namespace `name` (if absent).
pub async fn ensure_namespace(client: &kube::Client, name: &str) -> Result<(), TestError> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A bootstrap token Secret.
pub async fn bootstrap_token(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    token: &str,
    expiration: Option<&str>,
    cluster: Option<&str>,
) -> Result<(), TestError> {
    let mut data = vec![("token", token)];
    if let Some(expiration) = expiration {
        data.push(("expiration", expiration));
    }
    if let Some(cluster) = cluster {
        data.push(("cluster-name", cluster));
    }
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        type_: Some(BOOTSTRAP_TOKEN_TYPE.into()),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await?;
    Ok(())
}

/// A hub agent API for one test.
pub struct Hub {
    pub api: AgentApi,
    pub app: Router,
    pub work: Arc<WorkStore>,
    /// Every batch that reached the intake (while `record` is set).
    pub batches: Arc<Mutex<Vec<StatusBatch>>>,
    pub record: Arc<AtomicBool>,
    /// How many items the processor stand-in took.
    pub taken: Arc<AtomicU64>,
    pub leader: watch::Sender<LeaderState>,
    pub registry: prometheus::Registry,
    pub client: kube::Client,
    pub namespace: String,
    /// A bootstrap token that registers any cluster.
    pub bootstrap: String,
}

impl Hub {
    /// Starts an agent API whose Secrets and Leases live in `namespace` (created here), with a
    /// work store of `epoch` and a processor stand-in that takes every item.
    pub async fn start(
        client: kube::Client,
        namespace: &str,
        epoch: &str,
        configure: impl FnOnce(&mut AgentApiConfig),
    ) -> Result<Hub, TestError> {
        let (work, bootstrap) = Self::prepare(&client, namespace, epoch).await?;
        Self::with_work(client, namespace, work, bootstrap, configure).await
    }

    /// [`Hub::start`] whose reports go to `intake` (e.g. the real status processor) instead of
    /// the stand-in; `batches` and `taken` stay empty.
    pub async fn start_with_intake(
        client: kube::Client,
        namespace: &str,
        epoch: &str,
        intake: intake::StatusIntake,
    ) -> Result<Hub, TestError> {
        let (work, bootstrap) = Self::prepare(&client, namespace, epoch).await?;
        Self::with_intake(client, namespace, work, bootstrap, intake, |_| {})
    }

    /// The namespace, the Cluster CRD and a bootstrap token on the hub apiserver, and a
    /// complete work store of `epoch`.
    async fn prepare(
        client: &kube::Client,
        namespace: &str,
        epoch: &str,
    ) -> Result<(Arc<WorkStore>, String), TestError> {
        ensure_cluster_crd(client).await?;
        ensure_namespace(client, namespace).await?;
        let bootstrap = format!("{namespace}-bootstrap-0123456789abcdef0123456789");
        match bootstrap_token(client, namespace, "bootstrap-any", &bootstrap, None, None).await {
            Ok(()) => {}
            Err(e) if e.to_string().contains("already exists") => {}
            Err(e) => return Err(e),
        }
        let work = Arc::new(WorkStore::new(epoch));
        // The binder's first pass is not part of these tests: the store is complete as it is.
        work.mark_ready();
        Ok((work, bootstrap))
    }

    /// [`Hub::start`] whose processor stand-in only counts what it takes (for the bench: no
    /// memory grows with the batches).
    pub async fn start_counting(
        client: kube::Client,
        namespace: &str,
        configure: impl FnOnce(&mut AgentApiConfig),
    ) -> Result<Hub, TestError> {
        let hub = Self::start(client, namespace, "bench", configure).await?;
        hub.record
            .store(false, std::sync::atomic::Ordering::Relaxed);
        Ok(hub)
    }

    /// Another API on the same namespace (e.g. a new leader term with another work store).
    pub async fn with_work(
        client: kube::Client,
        namespace: &str,
        work: Arc<WorkStore>,
        bootstrap: String,
        configure: impl FnOnce(&mut AgentApiConfig),
    ) -> Result<Hub, TestError> {
        let (intake, mut receiver) = intake::channel(64);
        let mut hub = Self::with_intake(client, namespace, work, bootstrap, intake, configure)?;
        let batches = Arc::new(Mutex::new(Vec::new()));
        let recorded = batches.clone();
        let record = Arc::new(AtomicBool::new(true));
        let taken = Arc::new(AtomicU64::new(0));
        let (recording, counter) = (record.clone(), taken.clone());
        tokio::spawn(async move {
            while let Some(submission) = receiver.recv().await {
                let accepted = submission.batch.report.items.len();
                counter.fetch_add(accepted as u64, Ordering::Relaxed);
                if recording.load(Ordering::Relaxed) {
                    recorded
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(submission.batch);
                }
                let _ = submission.reply.send(StatusResponse {
                    accepted,
                    rejected: vec![],
                });
            }
        });
        (hub.batches, hub.record, hub.taken) = (batches, record, taken);
        Ok(hub)
    }

    /// An agent API on `namespace` whose reports go to `intake`.
    pub fn with_intake(
        client: kube::Client,
        namespace: &str,
        work: Arc<WorkStore>,
        bootstrap: String,
        intake: intake::StatusIntake,
        configure: impl FnOnce(&mut AgentApiConfig),
    ) -> Result<Hub, TestError> {
        let (leader, leadership) = watch::channel(LeaderState::leader());
        let registry = prometheus::Registry::new();
        let mut config = AgentApiConfig {
            namespace: namespace.to_string(),
            ..AgentApiConfig::default()
        };
        configure(&mut config);
        let api = AgentApi::new(
            config,
            AgentApiDeps {
                client: client.clone(),
                work: work.clone(),
                intake,
                leadership,
                registry: registry.clone(),
            },
        )?;
        let app = api.router();
        Ok(Hub {
            api,
            app,
            work,
            batches: Arc::new(Mutex::new(Vec::new())),
            record: Arc::new(AtomicBool::new(false)),
            taken: Arc::new(AtomicU64::new(0)),
            leader,
            registry,
            client,
            namespace: namespace.to_string(),
            bootstrap,
        })
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> Reply {
        call(&self.app, method, path, token, body).await
    }

    /// A registration with bootstrap token `token` (`None`: no Authorization header).
    pub async fn register_as(&self, token: Option<&str>, request: &RegisterRequest) -> Reply {
        self.call(
            "POST",
            &protocol::register_path(),
            token,
            Some(json_bytes(request)),
        )
        .await
    }

    /// Registers `cluster` with the hub's bootstrap token; returns the cluster token.
    pub async fn register(&self, cluster: &str) -> Result<String, TestError> {
        let reply = self
            .register_as(Some(&self.bootstrap), &register_request(cluster))
            .await;
        if reply.status != StatusCode::OK {
            return Err(format!("registering {cluster}: {} {}", reply.status, reply.body).into());
        }
        let response: RegisterResponse = serde_json::from_value(reply.body)?;
        Ok(response.token)
    }

    pub async fn heartbeat(
        &self,
        cluster: &str,
        token: &str,
        inventory: Option<Inventory>,
    ) -> Reply {
        let body = json!({"identity": format!("agent-{cluster}"), "inventory": inventory});
        self.call(
            "POST",
            &protocol::heartbeat_path(cluster),
            Some(token),
            Some(serde_json::to_vec(&body).unwrap_or_default()),
        )
        .await
    }

    pub fn batches(&self) -> Vec<StatusBatch> {
        self.batches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Assigns a work item `name` to `cluster`.
    pub fn assign(&self, cluster: &str, name: &str) {
        self.work.upsert(cluster, work(&self.namespace, name));
    }

    /// A counter or gauge value of the hub's registry.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric(&self.registry, name, labels)
    }
}

pub fn metric(registry: &prometheus::Registry, name: &str, labels: &[(&str, &str)]) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().to_vec())
        .filter(|m| {
            labels.iter().all(|(k, v)| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == *k && l.value() == *v)
            })
        })
        // A family is a counter or a gauge; the other value reads 0.
        .map(|m| m.get_counter().get_value() + m.get_gauge().get_value())
        .sum()
}

pub fn register_request(cluster: &str) -> RegisterRequest {
    RegisterRequest {
        cluster_name: cluster.into(),
        identity: format!("agent-{cluster}"),
        agent_version: "0.1.0".into(),
        protocol_version: protocol::PROTOCOL_VERSION.into(),
        fencing_period_seconds: 60,
        provider: Some("kwok".into()),
        region: Some("eu-test-1".into()),
        zone: None,
    }
}

pub fn key(namespace: &str, name: &str) -> WorkKey {
    WorkKey {
        namespace: namespace.into(),
        name: name.into(),
    }
}

pub fn work(namespace: &str, name: &str) -> Work {
    Work {
        key: key(namespace, name),
        binding_uid: format!("uid-{name}"),
        manifest: json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}}),
        ..Default::default()
    }
}

/// A status item for assigned work `name`, observed at `second` (seconds after a fixed epoch).
pub fn status_item(namespace: &str, name: &str, second: i64) -> WorkStatus {
    WorkStatus {
        key: key(namespace, name),
        binding_uid: format!("uid-{name}"),
        revision: 1,
        applied: true,
        applied_message: None,
        observed: lifeboat_api::protocol::ObservedObject::from_value(
            &json!({"status": {"succeeded": 0, "active": 1}}),
        )
        .ok(),
        observed_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(1_780_000_000 + second)
                .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        ),
        reset_generation: None,
        fenced: false,
        gone: false,
    }
}

pub fn json_bytes(value: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

/// An answer: status, headers and the JSON body (`Null` when not JSON).
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Reply {
    /// The error reason of a refusal.
    pub fn reason(&self) -> &str {
        self.body["reason"].as_str().unwrap_or_default()
    }

    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or_default()
    }

    /// Fails unless this is a refusal with `code` and `reason`, whose message contains `needle`.
    pub fn refused(&self, code: u16, reason: &str, needle: &str) -> Result<(), TestError> {
        if self.status.as_u16() != code
            || self.reason() != reason
            || self.body["code"] != code
            || !self.message().contains(needle)
        {
            return Err(format!(
                "expected {code} {reason} mentioning {needle:?}, got {} {}",
                self.status, self.body
            )
            .into());
        }
        Ok(())
    }
}

pub async fn call(
    app: &Router,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Vec<u8>>,
) -> Reply {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    let request = match request.body(body.map(Body::from).unwrap_or_else(Body::empty)) {
        Ok(r) => r,
        Err(e) => {
            return Reply {
                status: StatusCode::IM_A_TEAPOT,
                headers: HeaderMap::new(),
                body: Value::String(format!("bad test request: {e}")),
            };
        }
    };
    let response = match app.clone().oneshot(request).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Reply {
        status,
        headers,
        body,
    }
}

/// Reads NDJSON lines off a streaming body until `until` says stop (or `timeout`).
pub struct Lines {
    body: Body,
    buffer: Vec<u8>,
}

impl Lines {
    pub fn new(body: Body) -> Lines {
        Lines {
            body,
            buffer: Vec::new(),
        }
    }

    /// The next line as a work event; `None` when the stream ended.
    pub async fn next(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<protocol::WorkEvent>, TestError> {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return Ok(Some(serde_json::from_slice(&line[..end])?));
            }
            let frame = tokio::time::timeout(timeout, self.body.frame())
                .await
                .map_err(|_| format!("no work event within {timeout:?}"))?;
            match frame {
                None => return Ok(None),
                Some(frame) => {
                    if let Ok(data) = frame?.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    /// Lines up to and including the next `Synced`.
    pub async fn until_synced(&mut self) -> Result<Vec<protocol::WorkEvent>, TestError> {
        let mut events = Vec::new();
        loop {
            match self.next(T).await? {
                None => return Err(format!("the stream ended before Synced: {events:?}").into()),
                Some(event) => {
                    let done = matches!(event, protocol::WorkEvent::Synced { .. });
                    events.push(event);
                    if done {
                        return Ok(events);
                    }
                }
            }
        }
    }
}

/// Opens the work stream of `cluster` through the router.
pub async fn open_work(
    app: &Router,
    cluster: &str,
    token: &str,
    since: Option<&str>,
) -> Result<(StatusCode, Lines), TestError> {
    let mut uri = protocol::work_path(cluster);
    if let Some(since) = since {
        uri = format!("{uri}?since={since}");
    }
    let request = Request::get(uri)
        .header("authorization", format!("Bearer {token}"))
        .body(Body::empty())?;
    let response = match app.clone().oneshot(request).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    Ok((response.status(), Lines::new(response.into_body())))
}

/// A serving certificate for 127.0.0.1/localhost from a fresh CA (the fleet's PKI code), and a
/// client configuration that trusts only that CA.
pub fn tls_pair(
    dir: &Path,
) -> Result<(Arc<rustls::ServerConfig>, rustls::ClientConfig), TestError> {
    let pki = lifeboat_e2e::pki::Pki::create(dir)?;
    let files = pki.serving_cert("agent-api", &[])?;
    let chain = CertificateDer::pem_file_iter(&files.cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(&files.key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(&pki.ca_cert)? {
        roots.add(ca?)?;
    }
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok((Arc::new(server), client))
}

pub type HttpsClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Body,
>;

/// An HTTPS client (HTTP/1.1, keep-alive) trusting only `tls`'s roots.
pub fn https_client(tls: rustls::ClientConfig) -> HttpsClient {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(connector)
}

/// A bench's main: a fresh fleet (by default of one member with one node) under
/// `target/e2e-fleets/{name}`, `bench` on it, then the fleet torn down (after the runtime's tasks
/// are stopped, so nothing calls an apiserver that is going away).
pub fn on_fleet<F, Fut>(name: &str, bench: F) -> std::process::ExitCode
where
    F: FnOnce(Arc<lifeboat_e2e::fleet::Fleet>) -> Fut,
    Fut: Future<Output = Result<(), Box<dyn std::error::Error + Send + Sync>>>,
{
    on_fleet_with(name, |_| {}, bench)
}

/// [`on_fleet`] with the fleet's shape changed by `configure` first.
pub fn on_fleet_with<F, Fut>(
    name: &str,
    configure: impl FnOnce(&mut lifeboat_e2e::fleet::FleetConfig),
    bench: F,
) -> std::process::ExitCode
where
    F: FnOnce(Arc<lifeboat_e2e::fleet::Fleet>) -> Fut,
    Fut: Future<Output = Result<(), Box<dyn std::error::Error + Send + Sync>>>,
{
    use lifeboat_e2e::fleet::{Fleet, FleetConfig, workspace_root};
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tokio runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut config = FleetConfig::new(workspace_root().join("target/e2e-fleets").join(name));
    config.members = 1;
    config.nodes_per_member = 1;
    configure(&mut config);
    let fleet = match runtime.block_on(Fleet::up(config)) {
        Ok(f) => Arc::new(f),
        Err(e) => {
            eprintln!("fleet up: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(bench(fleet.clone()));
    runtime.shutdown_background();
    fleet.teardown();
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench failed: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
