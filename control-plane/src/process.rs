//! Running the hub: one process that installs its CRDs, serves `/healthz`, `/readyz` and
//! `/metrics`, serves the agent API over TLS, and — while it holds the leader Lease — binds
//! templates to clusters, dispatches their work, folds the agents' status reports into the
//! bindings and the templates, and keeps the clusters' health.
//!
//! One leader term per process: the work store and its epoch are made at start and a hub that
//! loses its Lease exits (as kube-controller-manager does), so a new term always starts from a
//! fresh epoch and the agents re-sync from the new leader's full snapshot.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use lifeboat_api::binding::ResourceBinding;
use lifeboat_api::cluster::Cluster;
use lifeboat_api::config::ResourceInterpreterCustomization;
use lifeboat_api::policy::{ClusterPropagationPolicy, PropagationPolicy};
use lifeboat_interpreter::{Runtime, RuntimeConfig};
use lifeboat_runtime::cache::Cache;
use lifeboat_runtime::leader::{LeaderElector, Leadership, LeaseConfig};
use lifeboat_runtime::readiness::{Readiness, WatchSync};
use lifeboat_scheduler::SchedulerConfig;
use lifeboat_tls::{PemFiles, Validity};
use prometheus::Registry;
use tokio::sync::{mpsc, watch};

use crate::agentapi::{AgentApi, AgentApiConfig, AgentApiDeps};
use crate::binding::binder::{Binder, BinderMetrics, Caches};
use crate::binding::placement::SchedulerPlacer;
use crate::binding::templates::{self, KindsSynced, Templates};
use crate::clusters::health::{ClusterHealth, ClusterHealthConfig, ClusterHealthMonitor};
use crate::clusters::recovery::{HubPhase, Recovered, Recovery};
use crate::failover::record::{FailoverMetrics, FailoverRecorder};
use crate::interpreters::{InterpreterHandle, Interpreters};
use crate::leadership::LeaderState;
use crate::ledger::{Ledger, LedgerFeed, LedgerMetrics, LedgerWriter, LedgerWriterTask};
use crate::status::processor::{self, ProcessorDeps, ProcessorMetrics};
use crate::work::store::WorkStore;

mod lead;

use lead::*;

/// Field manager of the CRDs the hub installs.
pub const CRD_FIELD_MANAGER: &str = "lifeboat-hub";

/// Where the agent API's serving certificate comes from.
#[derive(Debug, Clone)]
pub enum AgentApiTls {
    /// Issued by the hub from a CA kept in this Secret of the hub namespace (created when
    /// absent, shared by the replicas), for these DNS names and IP addresses; re-issued before
    /// it expires and when the CA changes.
    CaSecret { secret: String, names: Vec<String> },
    /// PEM files (cert-manager, a mounted Secret), re-read when they change.
    Files(PemFiles),
}

/// How to run the hub.
#[derive(Debug, Clone)]
pub struct HubOptions {
    /// Kubeconfig of the hub cluster (`None`: in-cluster or the default kubeconfig).
    pub kubeconfig: Option<PathBuf>,
    /// Install or update the hub's CRDs at start.
    pub install_crds: bool,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (`None`: not served).
    pub metrics_bind: Option<SocketAddr>,
    /// Where the agent API is served.
    pub agent_api_bind: SocketAddr,
    pub agent_api_tls: AgentApiTls,
    pub agent_api: AgentApiConfig,
    pub cluster_health: ClusterHealthConfig,
    /// `None`: this process always leads (one replica).
    pub leader_election: Option<LeaseConfig>,
    /// Templates bound in parallel.
    pub binder_workers: usize,
    /// Binding status writes in parallel.
    pub status_writers: usize,
    pub scheduler: SchedulerConfig,
    /// Bindings evicted per second from lost or deleted clusters (cluster failover).
    pub cluster_eviction_rate: f64,
    /// The event ledger: `sqlite://PATH` or `postgres://...` (see [`crate::ledger::Ledger::connect`]).
    pub database_url: String,
    /// How long a new leader waits at most for the agents of the Ready clusters to re-send
    /// their full state before it decides anything (`crate::clusters::recovery`).
    pub recovery_timeout: Duration,
    /// The customization admission webhook (`crate::admission`), served by every replica.
    pub webhook: Option<crate::admission::WebhookOptions>,
}

/// Default of [`HubOptions::recovery_timeout`]: three default cluster leases (a dead agent's
/// cluster is judged lost within one lease of the new leader's start).
pub const DEFAULT_RECOVERY_TIMEOUT: Duration = Duration::from_secs(120);

/// Why the hub stopped. Each variant names the step.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig { path: String, reason: String },
    #[error("connecting to the hub cluster: {0}")]
    Client(String),
    #[error("installing the hub CRDs: {0}")]
    Install(#[from] lifeboat_runtime::crd::InstallError),
    #[error("creating the hub namespace {namespace}: {source}")]
    Namespace {
        namespace: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("leader election: {0}")]
    LeaderElection(#[from] lifeboat_runtime::leader::ConfigError),
    #[error("the agent API certificate: {0}")]
    Tls(#[from] lifeboat_tls::TlsError),
    #[error("the agent API CA Secret: {0}")]
    CaSecret(#[from] lifeboat_tls::secret::SecretError),
    #[error("the built-in interpreters: {0}")]
    Interpreters(String),
    #[error("the agent API: {0}")]
    AgentApi(#[from] crate::agentapi::AgentApiError),
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("lost the leader Lease; exiting so that a new term starts from a fresh epoch")]
    LostLeadership,
    #[error("the event ledger: {0}")]
    Ledger(#[from] crate::ledger::LedgerError),
    #[error("the customization webhook: {0}")]
    Webhook(#[from] crate::admission::WebhookError),
}

/// A client of the hub cluster.
pub async fn client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, HubError> {
    use lifeboat_runtime::client::{ClientError, from_kubeconfig};
    from_kubeconfig(kubeconfig.map(PathBuf::as_path))
        .await
        .map_err(|e| match e {
            ClientError::Kubeconfig { path, reason } => HubError::Kubeconfig { path, reason },
            ClientError::Client(e) => HubError::Client(e.to_string()),
        })
}

/// A new epoch for this process's work store (agents holding a cursor of another epoch are
/// sent a full snapshot).
fn new_epoch() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{nanos:x}-{:x}", std::process::id())
}

/// A watch-fed cache without managed fields. `on_event` sees each event after the cache took
/// it; `sync` is marked at the end of the first list.
fn cache<K>(
    api: Api<K>,
    sync: WatchSync,
    on_event: impl Fn(&watcher::Event<K>) + Send + 'static,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    Cache::new(api, K::plural(&()).into_owned())
        .without_managed_fields()
        .report_sync(sync)
        .spawn(on_event)
        .0
}

/// Creates the hub namespace when absent.
async fn ensure_namespace(client: &kube::Client, namespace: &str) -> Result<(), HubError> {
    let api: Api<Namespace> = Api::all(client.clone());
    let object = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(namespace.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        // Allowed to use the namespace but not to create namespaces: fine if it exists.
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
        Err(source) => Err(HubError::Namespace {
            namespace: namespace.to_string(),
            source: Box::new(source),
        }),
    }
}

/// The agent API's TLS configuration, and the task that keeps its certificate fresh.
async fn agent_api_tls(
    client: &kube::Client,
    options: &HubOptions,
    stop: watch::Receiver<bool>,
) -> Result<Arc<rustls::ServerConfig>, HubError> {
    let stopped = async move {
        let mut stop = stop;
        let _ = stop.wait_for(|s| *s).await;
    };
    match &options.agent_api_tls {
        AgentApiTls::CaSecret { secret, names } => {
            let ca_secret = lifeboat_tls::secret::CaSecret::new(
                client.clone(),
                &options.agent_api.namespace,
                secret,
            );
            let (ca, origin) = ca_secret
                .ensure(
                    "lifeboat-hub-ca",
                    Validity::starting_now(Duration::from_secs(10 * 365 * 24 * 3600)),
                )
                .await?;
            tracing::info!(secret = %ca_secret.display_name(), ?origin, "agent API CA");
            let renewer = lifeboat_tls::Renewer::start(
                ca,
                "lifeboat-hub",
                names,
                lifeboat_tls::renewal::SERVING_LIFETIME,
            )?;
            let config = renewer
                .resolver()
                .server_config(vec![b"http/1.1".to_vec()])?;
            tokio::spawn(renewer.run(
                futures::stream::pending::<Result<lifeboat_tls::CertificateAuthority, String>>(),
                stopped,
            ));
            Ok(config)
        }
        AgentApiTls::Files(files) => {
            let resolver = lifeboat_tls::ReloadingResolver::new(files.load().await?)?;
            let config = resolver.server_config(vec![b"http/1.1".to_vec()])?;
            let reloader = lifeboat_tls::FileReloader::new(files.clone(), resolver);
            tokio::spawn(reloader.run(Duration::from_secs(10), stopped));
            Ok(config)
        }
    }
}

/// Runs the hub until `shutdown` completes (or the leader Lease is lost).
pub async fn run(
    options: HubOptions,
    registry: Registry,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), HubError> {
    let client = client(options.kubeconfig.as_ref()).await?;
    if options.install_crds {
        for generated in lifeboat_api::crds::hub() {
            lifeboat_runtime::crd::ensure(
                &client,
                &generated.crd,
                CRD_FIELD_MANAGER,
                lifeboat_runtime::crd::ESTABLISHED_TIMEOUT,
            )
            .await?;
        }
    }
    ensure_namespace(&client, &options.agent_api.namespace).await?;
    if let Some(webhook) = &options.webhook {
        crate::admission::start(webhook, &client, &options.agent_api.namespace).await?;
    }
    // The ledger's migrations run here: a database the hub cannot use stops it at start.
    let ledger = Ledger::connect(&options.database_url).await?;
    tracing::info!(backend = ledger.backend().as_str(), "event ledger ready");
    let reader = ledger.clone();
    let (ledger_writer, ledger_task) =
        LedgerWriter::spawn(ledger, LedgerMetrics::new(&registry)?, Default::default());
    let result = lead(options, registry, shutdown, client, ledger_writer, reader).await;
    close_ledger(ledger_task).await;
    result
}

/// Writes what the ledger writer still holds, once every loop that records is done.
async fn close_ledger(task: LedgerWriterTask) {
    match task.shutdown().await {
        Ok(()) => tracing::info!("event ledger flushed"),
        Err(error) => tracing::error!(%error, "event ledger: events lost"),
    }
}
