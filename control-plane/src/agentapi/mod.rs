//! The hub side of the agent protocol ([`lifeboat_api::protocol`]): HTTPS (axum over rustls),
//! the agent dials out.
//!
//! - `POST …/register` (bootstrap token): creates the Cluster if absent, mints the cluster
//!   token, stores its SHA-256 in the Secret `cluster-<name>-credential`, renews the Lease.
//! - `POST …/clusters/{c}/heartbeat`: renews the Lease `cluster-<c>`, writes the inventory into
//!   the Cluster status (only when it changed).
//! - `GET …/clusters/{c}/work?since=epoch:rev`: an NDJSON stream of the cluster's desired work,
//!   resumable by revision.
//! - `POST …/clusters/{c}/status`: batched status reports, checked against the cluster's
//!   assigned work, handed to the status processor through the [`StatusIntake`].
//!
//! Credentials, clusters and bootstrap tokens are read from watch-fed indexes, never with a
//! call per request. Only the leader serves; a standby answers 503 `NotLeader` naming the leader.

pub mod auth;
pub mod error;
pub mod fencing;
mod heartbeat;
pub mod metrics;
mod register;
pub mod server;
mod status;
mod work;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, MatchedPath, Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Resource};
use lifeboat_api::cluster::{Cluster, HUB_SYSTEM_NAMESPACE};
use lifeboat_api::protocol::{self, API_PREFIX};
use lifeboat_runtime::cache::Cache;
use ring::rand::SystemRandom;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::leadership::LeaderState;
use crate::status::intake::StatusIntake;
use crate::work::store::WorkStore;
use auth::{CredentialIndex, TokenHash};
pub use error::ApiError;
use lifeboat_api::credentials::{BOOTSTRAP_TOKEN_TYPE, CLUSTER_CREDENTIAL_TYPE};
pub use metrics::AgentApiMetrics;

/// Field manager of what the agent API writes (Cluster status inventory, Leases, credentials).
pub const FIELD_MANAGER: &str = "lifeboat-hub/agent-api";

/// Settings of the agent API.
#[derive(Debug, Clone)]
pub struct AgentApiConfig {
    /// Namespace of the bootstrap tokens, credentials and Leases.
    pub namespace: String,
    /// A cluster is lost when its Lease is not renewed for this long (Karmada: 40 s).
    pub lease_duration: Duration,
    /// How often agents heartbeat (told to them at registration).
    pub heartbeat_interval: Duration,
    /// Default fencing period (per-cluster override: `Cluster.spec.fencingPeriodSeconds`).
    pub fencing_period: Duration,
    /// Largest request body read (413 above).
    pub body_limit: usize,
    /// A work stream sends a `Bookmark` line this often, so dead connections are noticed.
    pub bookmark_interval: Duration,
    /// How long a request waits for the watch-fed indexes to load (hub start) or a registration
    /// for its new credential to be live, before answering 503.
    pub cache_wait: Duration,
    /// Connection limits and timeouts of the HTTPS server.
    pub connections: server::ConnectionLimits,
}

impl Default for AgentApiConfig {
    fn default() -> Self {
        AgentApiConfig {
            namespace: HUB_SYSTEM_NAMESPACE.to_string(),
            lease_duration: Duration::from_secs(40),
            heartbeat_interval: Duration::from_secs(10),
            fencing_period: Duration::from_secs(60),
            body_limit: protocol::MAX_BODY_BYTES,
            bookmark_interval: Duration::from_secs(15),
            cache_wait: Duration::from_secs(10),
            connections: server::ConnectionLimits::default(),
        }
    }
}

impl AgentApiConfig {
    fn lease_seconds(&self) -> i32 {
        seconds(self.lease_duration)
    }
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX).max(1)
}

/// What the agent API needs from the rest of the hub.
pub struct AgentApiDeps {
    /// A client of the hub cluster.
    pub client: kube::Client,
    /// The desired work of every cluster.
    pub work: Arc<WorkStore>,
    /// Where status batches go.
    pub intake: StatusIntake,
    /// Whether this process leads.
    pub leadership: watch::Receiver<LeaderState>,
    /// Where the metrics are registered.
    pub registry: prometheus::Registry,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentApiError {
    #[error("registering the agent API metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("serving the agent API: {0}")]
    Serve(#[from] std::io::Error),
}

/// Aborts the watch tasks when the last handle on the API goes.
struct Tasks(Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// What the handlers share.
pub(crate) struct Shared {
    config: AgentApiConfig,
    client: kube::Client,
    work: Arc<WorkStore>,
    intake: StatusIntake,
    leadership: watch::Receiver<LeaderState>,
    metrics: AgentApiMetrics,
    credentials: Arc<CredentialIndex>,
    bootstrap: Store<Secret>,
    /// The clusters' fencing credentials ([`fencing`]).
    fencing: Store<Secret>,
    clusters: Store<Cluster>,
    /// Per cluster, the status fields this API last wrote (so a heartbeat writes only changes).
    agent_status: Mutex<HashMap<String, heartbeat::Written>>,
    /// Per cluster, the last report taken per work (replay refusal before the processor).
    last_taken: Mutex<HashMap<String, status::TakenReports>>,
    rng: SystemRandom,
    shutdown: watch::Sender<bool>,
    _tasks: Tasks,
}

/// The agent API. Construct it inside a tokio runtime: it starts its watches at once.
#[derive(Clone)]
pub struct AgentApi {
    shared: Arc<Shared>,
}

impl AgentApi {
    /// Starts the watches (credential Secrets, bootstrap token Secrets, Clusters) and registers
    /// the metrics.
    pub fn new(config: AgentApiConfig, deps: AgentApiDeps) -> Result<AgentApi, AgentApiError> {
        let metrics = AgentApiMetrics::register(&deps.registry)?;
        let secrets: Api<Secret> = Api::namespaced(deps.client.clone(), &config.namespace);
        let credentials = Arc::new(CredentialIndex::default());
        let credential_task = {
            let index = credentials.clone();
            let stream = lifeboat_runtime::watch::backoff(watcher(
                secrets.clone(),
                watcher::Config::default().fields(&format!("type={CLUSTER_CREDENTIAL_TYPE}")),
            ));
            tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(event) => index.apply(event),
                        Err(error) => {
                            tracing::warn!(%error, "watching cluster credential Secrets")
                        }
                    }
                }
            })
        };
        let (bootstrap, bootstrap_task) = Cache::new(secrets.clone(), "bootstrap token Secrets")
            .config(watcher::Config::default().fields(&format!("type={BOOTSTRAP_TOKEN_TYPE}")))
            .spawn(|_| {});
        let (fencing, fencing_task) = Cache::new(secrets.clone(), "fencing credential Secrets")
            .config(watcher::Config::default().fields(&format!(
                "type={}",
                lifeboat_api::fencing::CREDENTIAL_SECRET_TYPE
            )))
            .spawn(|_| {});
        let (clusters, cluster_task) =
            Cache::new(Api::<Cluster>::all(deps.client.clone()), "Clusters").spawn(|_| {});
        Ok(AgentApi {
            shared: Arc::new(Shared {
                config,
                client: deps.client,
                work: deps.work,
                intake: deps.intake,
                leadership: deps.leadership,
                metrics,
                credentials,
                bootstrap,
                fencing,
                clusters,
                agent_status: Mutex::new(HashMap::new()),
                last_taken: Mutex::new(HashMap::new()),
                rng: SystemRandom::new(),
                shutdown: watch::channel(false).0,
                _tasks: Tasks(vec![
                    credential_task,
                    bootstrap_task,
                    fencing_task,
                    cluster_task,
                ]),
            }),
        })
    }

    /// The routes, for serving or for `oneshot` in tests.
    pub fn router(&self) -> Router {
        let shared = self.shared.clone();
        Router::new()
            .route(&protocol::register_path(), post(register::register))
            .route(
                &format!("{API_PREFIX}/clusters/{{cluster}}/heartbeat"),
                post(heartbeat::heartbeat),
            )
            .route(
                &format!("{API_PREFIX}/clusters/{{cluster}}/work"),
                get(work::work),
            )
            .route(
                &format!("{API_PREFIX}/clusters/{{cluster}}/status"),
                post(status::status),
            )
            .route_layer(middleware::from_fn_with_state(
                shared.clone(),
                only_the_leader,
            ))
            .route_layer(middleware::from_fn_with_state(shared.clone(), measure))
            .layer(DefaultBodyLimit::max(shared.config.body_limit))
            .with_state(shared)
    }

    /// Serves HTTPS on `listener` (with the connection limits and timeouts of
    /// [`AgentApiConfig::connections`], [`server`]) until `shutdown` completes; open work
    /// streams end then too, and the requests in flight finish.
    pub async fn serve(
        self,
        listener: TcpListener,
        tls: Arc<rustls::ServerConfig>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), AgentApiError> {
        let streams = self.shared.shutdown.clone();
        let (stop, stopping) = watch::channel(false);
        let shutdown = tokio::spawn(async move {
            shutdown.await;
            streams.send_replace(true);
            stop.send_replace(true);
        });
        let served = server::serve(
            listener,
            tokio_rustls::TlsAcceptor::from(tls),
            self.router(),
            self.shared.config.connections.clone(),
            self.shared.metrics.clone(),
            stopping,
        )
        .await;
        shutdown.abort();
        served?;
        Ok(())
    }

    /// Ends every open work stream (as at shutdown), e.g. when the hub loses leadership and
    /// the caller replaces this API.
    pub fn close_streams(&self) {
        self.shared.shutdown.send_replace(true);
    }

    /// Whether the watch-fed indexes have loaded.
    pub fn is_ready(&self) -> bool {
        self.shared.credentials.is_ready()
    }

    pub fn metrics(&self) -> &AgentApiMetrics {
        &self.shared.metrics
    }

    /// The clusters' fencing credential Secrets, as the agents gave them (for the fencer).
    pub fn fencing_credentials(&self) -> Store<Secret> {
        self.shared.fencing.clone()
    }
}

impl Shared {
    /// Creates or replaces (server-side apply) the Secret `name` of `cluster` in the hub's
    /// namespace: labelled with the cluster, owned by the Cluster (so it goes with it).
    pub(crate) async fn apply_cluster_secret(
        &self,
        cluster: &Cluster,
        name: &str,
        type_: &str,
        data: std::collections::BTreeMap<String, Vec<u8>>,
    ) -> Result<(), ApiError> {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.config.namespace.clone()),
                labels: Some(
                    [(
                        lifeboat_api::cluster::CLUSTER_NAME_LABEL.to_string(),
                        kube::ResourceExt::name_any(cluster),
                    )]
                    .into(),
                ),
                owner_references: cluster.owner_ref(&()).map(|o| vec![o]),
                ..Default::default()
            },
            type_: Some(type_.to_string()),
            data: Some(
                data.into_iter()
                    .map(|(k, v)| (k, k8s_openapi::ByteString(v)))
                    .collect(),
            ),
            ..Secret::default()
        };
        Api::<Secret>::namespaced(self.client.clone(), &self.config.namespace)
            .patch(
                name,
                &kube::api::PatchParams::apply(FIELD_MANAGER).force(),
                &kube::api::Patch::Apply(&secret),
            )
            .await
            .map_err(|e| ApiError::from_kube(&format!("storing Secret {name}"), e))?;
        Ok(())
    }
}

/// The metric label of a route.
fn endpoint_label(path: &str) -> &'static str {
    match path.rsplit('/').next() {
        Some("register") => "register",
        Some("heartbeat") => "heartbeat",
        Some("work") => "work",
        Some("status") => "status",
        _ => "other",
    }
}

async fn measure(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let endpoint = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| endpoint_label(p.as_str()))
        .unwrap_or("other");
    let started = Instant::now();
    let response = next.run(request).await;
    shared
        .metrics
        .duration
        .with_label_values(&[endpoint])
        .observe(started.elapsed().as_secs_f64());
    shared
        .metrics
        .requests
        .with_label_values(&[endpoint, response.status().as_str()])
        .inc();
    response
}

async fn only_the_leader(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let state = shared.leadership.borrow().clone();
    if !state.is_leader {
        return ApiError::NotLeader {
            leader: state.leader_url,
        }
        .into_response();
    }
    next.run(request).await
}

/// An authenticated cluster call.
pub(crate) struct Caller {
    pub cluster: String,
    pub object: Arc<Cluster>,
    /// The digest of the token the call came with.
    pub token: TokenHash,
}

impl Shared {
    /// The cluster token's cluster, which must be `path_cluster`, and its Cluster object.
    /// A Cluster being deleted is still returned (a heartbeat tells the agent to stop).
    pub(crate) async fn authenticate(
        &self,
        headers: &HeaderMap,
        path_cluster: &str,
    ) -> Result<Caller, ApiError> {
        let header = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let token = auth::bearer(header).ok_or_else(|| {
            ApiError::Unauthorized("no bearer token in the Authorization header".into())
        })?;
        if !self.credentials.is_ready()
            && !self.credentials.wait_ready(self.config.cache_wait).await
        {
            return Err(ApiError::Unavailable(
                "the hub is still loading the cluster credentials".into(),
            ));
        }
        let digest = TokenHash::of(token);
        let cluster = self.credentials.cluster_of(&digest).ok_or_else(|| {
            ApiError::Unauthorized(
                "the token is not a cluster credential the hub knows (unknown or revoked)".into(),
            )
        })?;
        if cluster != path_cluster {
            return Err(ApiError::Forbidden(format!(
                "the credential of cluster {cluster} cannot act for cluster {path_cluster}"
            )));
        }
        self.wait_clusters_ready().await?;
        let object = self
            .clusters
            .get(&ObjectRef::new(&cluster))
            .ok_or_else(|| {
                ApiError::Unauthorized(format!(
                    "cluster {cluster} is not registered on the hub (its Cluster is gone)"
                ))
            })?;
        Ok(Caller {
            cluster,
            object,
            token: digest,
        })
    }

    /// [`Shared::authenticate`], refusing a Cluster that is being deleted.
    pub(crate) async fn authenticate_active(
        &self,
        headers: &HeaderMap,
        path_cluster: &str,
    ) -> Result<Caller, ApiError> {
        let caller = self.authenticate(headers, path_cluster).await?;
        if caller.object.metadata.deletion_timestamp.is_some() {
            return Err(ApiError::Unauthorized(format!(
                "cluster {} is being deleted from the hub",
                caller.cluster
            )));
        }
        Ok(caller)
    }

    async fn wait_clusters_ready(&self) -> Result<(), ApiError> {
        tokio::time::timeout(self.config.cache_wait, self.clusters.wait_until_ready())
            .await
            .ok()
            .and_then(|r| r.ok())
            .ok_or_else(|| ApiError::Unavailable("the hub is still loading the Clusters".into()))
    }

    /// The hub's fencing period for `cluster`, in seconds.
    pub(crate) fn fencing_seconds(&self, cluster: Option<&Cluster>) -> i32 {
        cluster
            .and_then(|c| c.spec.fencing_period_seconds)
            .unwrap_or_else(|| seconds(self.config.fencing_period))
    }

    pub(crate) fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// Reads the body of `request` (at most the configured limit) and decodes it as `T`; errors
/// name the line and column.
pub(crate) async fn json_body<T: serde::de::DeserializeOwned>(
    request: Request,
    what: &str,
    limit: usize,
) -> Result<T, ApiError> {
    let bytes = Bytes::from_request(request, &())
        .await
        .map_err(|rejection| {
            if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::TooLarge { limit }
            } else {
                ApiError::BadRequest(format!("reading the {what}: {}", rejection.body_text()))
            }
        })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::BadRequest(format!("invalid {what} JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_get_low_cardinality_labels() {
        assert_eq!(endpoint_label(&protocol::register_path()), "register");
        assert_eq!(endpoint_label(&protocol::heartbeat_path("a")), "heartbeat");
        assert_eq!(
            endpoint_label(&format!("{API_PREFIX}/clusters/{{cluster}}/work")),
            "work"
        );
        assert_eq!(endpoint_label(&protocol::status_path("a")), "status");
        assert_eq!(endpoint_label("/metrics"), "other");
    }
}
