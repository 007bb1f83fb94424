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
use crate::binder::{Binder, BinderMetrics, Caches};
use crate::clusters::{ClusterHealth, ClusterHealthConfig, ClusterHealthMonitor};
use crate::failover_record::{FailoverMetrics, FailoverRecorder};
use crate::interpreters::{InterpreterHandle, Interpreters};
use crate::leadership::LeaderState;
use crate::ledger::{Ledger, LedgerFeed, LedgerMetrics, LedgerWriter, LedgerWriterTask};
use crate::placement::SchedulerPlacer;
use crate::processor::{self, ProcessorDeps, ProcessorMetrics};
use crate::recovery::{HubPhase, Recovered, Recovery};
use crate::templates::{self, KindsSynced, Templates};
use crate::work_store::WorkStore;

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
    /// their full state before it decides anything (`crate::recovery`).
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

/// The hub's loops, from the caches to the end of the leader term (or `shutdown`).
async fn lead(
    options: HubOptions,
    registry: Registry,
    shutdown: impl Future<Output = ()> + Send + 'static,
    client: kube::Client,
    ledger_writer: LedgerWriter,
    ledger_reader: Ledger,
) -> Result<(), HubError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |rx: watch::Receiver<bool>| async move {
        let mut rx = rx;
        let _ = rx.wait_for(|s| *s).await;
    };

    // Leadership: the Lease, mirrored into the LeaderState the agent API and monitor read.
    let (leadership, elector) = match options.leader_election.clone() {
        Some(mut lease) => {
            if lease.namespace.is_empty() {
                lease.namespace = options.agent_api.namespace.clone();
            }
            tracing::info!(lease = %lease.name, namespace = %lease.namespace, identity = %lease.identity, "leader election on");
            let (elector, leadership) = LeaderElector::new(client.clone(), lease)?;
            (leadership, Some(elector))
        }
        None => (Leadership::always(), None),
    };
    let (leader_tx, leader_rx) = watch::channel(LeaderState::standby(None));
    {
        let mut leadership = leadership.clone();
        tokio::spawn(async move {
            loop {
                leadership.acquired().await;
                leader_tx.send_replace(LeaderState::leader());
                leadership.lost().await;
                leader_tx.send_replace(LeaderState::standby(None));
            }
        });
    }
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    if let Some(elector) = elector {
        tokio::spawn(elector.run(async move {
            let _ = release_rx.await;
        }));
    }

    // Caches.
    let readiness = Readiness::new();
    let binder_slot: Arc<std::sync::OnceLock<Arc<Binder>>> = Arc::new(std::sync::OnceLock::new());
    let (binding_events_tx, binding_events_rx) = mpsc::unbounded_channel::<Arc<ResourceBinding>>();
    let aggregate_all = binding_events_tx.clone();
    let policies = {
        let slot = binder_slot.clone();
        cache(
            Api::<PropagationPolicy>::all(client.clone()),
            readiness.expect("PropagationPolicies"),
            move |event| policy_changed(&slot, event),
        )
    };
    let cluster_policies = {
        let slot = binder_slot.clone();
        cache(
            Api::<ClusterPropagationPolicy>::all(client.clone()),
            readiness.expect("ClusterPropagationPolicies"),
            move |event| policy_changed(&slot, event),
        )
    };
    let clusters = {
        let slot = binder_slot.clone();
        cache(
            Api::<Cluster>::all(client.clone()),
            readiness.expect("Clusters"),
            move |event| {
                let Some(binder) = slot.get() else { return };
                match event {
                    // A heartbeat that only moves `lastHeartbeatTime` changes no decision.
                    watcher::Event::Apply(c) => {
                        binder.cluster_changed(c);
                    }
                    watcher::Event::Delete(c) => binder.cluster_deleted(c),
                    watcher::Event::InitDone => binder.queue_all(),
                    _ => {}
                }
            },
        )
    };
    let bindings = {
        let slot = binder_slot.clone();
        let leading = leader_rx.clone();
        cache(
            Api::<ResourceBinding>::all(client.clone()),
            readiness.expect("ResourceBindings"),
            move |event| match event {
                // Only the leader writes template status (it sends every binding once when
                // it starts leading).
                watcher::Event::Apply(b) | watcher::Event::InitApply(b)
                    if leading.borrow().is_leader =>
                {
                    let _ = binding_events_tx.send(Arc::new(b.clone()));
                    // The failover phase acts on status changes (health, old copies gone).
                    if let Some(binder) = slot.get() {
                        binder.binding_changed(b);
                    }
                }
                watcher::Event::Delete(b) => {
                    if let Some(binder) = slot.get() {
                        binder.binding_deleted(b);
                    }
                }
                _ => {}
            },
        )
    };

    // Interpreters: the built-ins, with the hub's customizations layered over them and
    // replaced whenever one changes.
    let runtime = Arc::new(Runtime::new(RuntimeConfig::default()));
    let builtin =
        Interpreters::builtin(runtime).map_err(|e| HubError::Interpreters(e.to_string()))?;
    let interpreters = InterpreterHandle::new(Interpreters::layered(builtin.clone(), &[]).0);
    {
        let handle = interpreters.clone();
        let store_slot: Arc<std::sync::OnceLock<Store<ResourceInterpreterCustomization>>> =
            Arc::new(std::sync::OnceLock::new());
        let slot = store_slot.clone();
        let binder = binder_slot.clone();
        let leading = leader_rx.clone();
        let aggregate = aggregate_all.clone();
        let rejected_events = crate::interpreters::RejectedEvents::new(client.clone());
        let store = cache(
            Api::<ResourceInterpreterCustomization>::all(client.clone()),
            readiness.expect("ResourceInterpreterCustomizations"),
            move |event| {
                if matches!(event, watcher::Event::Init | watcher::Event::InitApply(_)) {
                    return;
                }
                let Some(store) = slot.get() else { return };
                let all: Vec<ResourceInterpreterCustomization> =
                    store.state().iter().map(|c| (**c).clone()).collect();
                let (layered, rejected) = Interpreters::layered(builtin.clone(), &all);
                for r in &rejected {
                    tracing::warn!(customization = %r.name, reason = %r.reason, "interpreter customization rejected");
                }
                if leading.borrow().is_leader {
                    rejected_events.post(&rejected);
                }
                handle.replace(layered);
                tracing::info!(
                    customizations = all.len(),
                    rejected = rejected.len(),
                    "interpreter customizations loaded"
                );
                // What the scripts decide (replicas, requirements, components, the templates'
                // aggregated status) is decided again now, not at the next unrelated change.
                if let Some(binder) = binder.get() {
                    binder.queue_all();
                    if leading.borrow().is_leader {
                        for binding in binder.caches.bindings.state() {
                            let _ = aggregate.send(binding);
                        }
                    }
                }
            },
        );
        let _ = store_slot.set(store);
    }

    // The work store, the status intake and processor, the agent API.
    let work = Arc::new(WorkStore::new(new_epoch()));
    // Only the leader records: the feed checks the leader state on every event.
    let ledger = LedgerFeed::new(ledger_writer, leader_rx.clone());
    let _ = work.observe(ledger.work_observer());
    let (health_tx, health_rx) = mpsc::unbounded_channel();
    tokio::spawn(ledger.clone().health_transitions(health_rx, work.clone()));
    let (intake, receiver) = crate::intake::channel(1024);
    let processor_metrics = ProcessorMetrics::new(&registry)?;
    let (full_reports_tx, full_reports) = mpsc::unbounded_channel();
    let handoff = crate::handoff::Handoff::new();
    let status_view = processor::run(
        receiver,
        ProcessorDeps {
            client: client.clone(),
            bindings: bindings.clone(),
            work: work.clone(),
            interpreters: interpreters.clone(),
            metrics: processor_metrics,
            transitions: Some(health_tx),
            written: None,
            full_reports: Some(full_reports_tx),
            write_concurrency: options.status_writers.max(1),
            handoff: Some(handoff.clone()),
        },
    );
    let tls = agent_api_tls(&client, &options, stop_rx.clone()).await?;
    let api = AgentApi::new(
        options.agent_api.clone(),
        AgentApiDeps {
            client: client.clone(),
            work: work.clone(),
            intake: intake.clone(),
            leadership: leader_rx.clone(),
            registry: registry.clone(),
        },
    )?;
    // The hub's own fence (a Directly eviction's old copy on a cluster that cannot say it is
    // gone), with the fencing credentials the agents gave.
    let fencer = crate::fencer::spawn(crate::fencer::FencerDeps {
        credentials: api.fencing_credentials(),
        namespace: options.agent_api.namespace.clone(),
        work: work.clone(),
        intake,
        leadership: leader_rx.clone(),
        metrics: crate::fencer::FencerMetrics::new(&registry)?,
    });
    let listener = tokio::net::TcpListener::bind(options.agent_api_bind)
        .await
        .map_err(|source| HubError::Listen {
            addr: options.agent_api_bind,
            source,
        })?;
    tracing::info!(addr = %options.agent_api_bind, "serving the agent API");
    tokio::spawn({
        let stop = stop_rx.clone();
        async move {
            if let Err(error) = api.serve(listener, tls, stopped(stop)).await {
                tracing::error!(%error, "agent API stopped");
            }
        }
    });

    if let Some(addr) = options.metrics_bind {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| HubError::Listen { addr, source })?;
        let app = lifeboat_runtime::http::router(registry.clone(), readiness.clone());
        tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::error!(%error, "metrics server stopped");
            }
        });
        tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    }

    // Cluster health (acts only while leading).
    let monitor =
        ClusterHealthMonitor::new(options.cluster_health.clone(), client.clone(), &registry)?;
    tokio::spawn(ledger.clone().cluster_transitions(monitor.subscribe()));
    let cluster_health = monitor.readiness();
    tokio::spawn(monitor.run(leader_rx.clone(), stopped(stop_rx.clone())));

    // Templates and the binder.
    let templates = Arc::new(Templates::new());
    let binder = Arc::new(
        Binder::new(
            client.clone(),
            Caches {
                templates: templates.clone(),
                policies,
                cluster_policies,
                bindings,
                clusters,
            },
            interpreters.clone(),
            Arc::new(SchedulerPlacer::new(&options.scheduler)),
            work.clone(),
            BinderMetrics::new(&registry)?,
        )
        .with_cluster_eviction_rate(options.cluster_eviction_rate)
        .with_status_view(status_view)
        .with_handoff(handoff.clone())
        .with_fencer(fencer)
        .with_recorder(FailoverRecorder::new(
            Some(ledger.clone()),
            Some(client.clone()),
            FailoverMetrics::new(&registry)?,
        )),
    );
    // Nothing is decided before this leader has recovered.
    binder.set_deciding(false);
    let _ = binder_slot.set(binder.clone());
    {
        let decider: std::sync::Weak<Binder> = Arc::downgrade(&binder);
        handoff.set_decider(decider);
    }
    let (kinds_tx, mut kinds_rx) = watch::channel(KindsSynced::default());
    {
        let queue = binder.queue.clone();
        tokio::spawn(templates::run(
            client.clone(),
            templates.clone(),
            move |key| queue.add(key),
            kinds_tx,
            stop_rx.clone(),
        ));
    }
    tokio::spawn(crate::template_status::run(
        client.clone(),
        binder.caches.clone(),
        interpreters.clone(),
        binding_events_rx,
    ));

    // Leading: wait for every cache, give every binding's work back to the agents, open the
    // work streams, recover (hear from every Ready cluster), then decide.
    let phase = PhaseGauge::new(&registry)?;
    phase.set(HubPhase::Standby);
    let mut leading = leadership.clone();
    let mut stop = stop_rx.clone();
    tokio::select! {
        _ = leading.acquired() => {}
        _ = stop.wait_for(|s| *s) => return Ok(()),
    }
    phase.set(HubPhase::Recovering);
    tracing::info!("leading: recovering");
    while !(readiness.is_ready() && kinds_rx.borrow().complete()) {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = kinds_rx.changed() => {}
            _ = stop.wait_for(|s| *s) => return Ok(()),
        }
    }
    // /readyz says Recovering until the decisions start.
    let recovered = readiness.expect("recovery");
    binder.refresh_policies();
    binder.queue_all();
    let workers = tokio::spawn(binder.clone().run_workers(options.binder_workers.max(1)));
    let started = std::time::Instant::now();
    while !binder.queue.is_idle() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ready_clusters: Vec<String> = binder
        .caches
        .clusters
        .state()
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none() && c.is_ready())
        .map(|c| kube::ResourceExt::name_any(c.as_ref()))
        .collect();
    work.mark_ready();
    for binding in binder.caches.bindings.state() {
        let _ = aggregate_all.send(binding);
    }
    tracing::info!(
        templates = templates.keys().len(),
        work = work.total(),
        seconds = started.elapsed().as_secs_f64(),
        "the bindings' work is back in the store: work streams open"
    );
    let recovery = Recovery::new(ready_clusters, Instant::now(), options.recovery_timeout);
    let interrupted = tokio::select! {
        outcome = recover(recovery, full_reports, cluster_health) => {
            match outcome {
                Recovered::Complete => tracing::info!(
                    seconds = started.elapsed().as_secs_f64(),
                    "recovered: every Ready cluster re-sent its state or was lost; deciding"
                ),
                Recovered::TimedOut { waiting } => tracing::warn!(
                    seconds = started.elapsed().as_secs_f64(),
                    waiting = %waiting.join(","),
                    "recovery timed out: these clusters neither re-sent their state nor lost their lease; deciding anyway"
                ),
            }
            None
        }
        _ = leading.lost() => Some(Err(HubError::LostLeadership)),
        _ = stop.wait_for(|s| *s) => Some(Ok(())),
    };
    if let Some(result) = interrupted {
        binder.queue.close();
        let _ = workers.await;
        if result.is_ok() {
            let _ = release_tx.send(());
        }
        return result;
    }
    binder.set_deciding(true);
    binder.queue_all();
    phase.set(HubPhase::Running);
    recovered.synced();
    tokio::spawn(backfill_evictions(
        ledger_reader,
        binder.caches.bindings.clone(),
        ledger.clone(),
    ));
    let gauges = {
        let binder = binder.clone();
        tokio::spawn(async move {
            loop {
                binder.update_binding_gauges();
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        })
    };

    let result = tokio::select! {
        _ = leading.lost() => Err(HubError::LostLeadership),
        _ = stop.wait_for(|s| *s) => Ok(()),
    };
    binder.queue.close();
    let _ = workers.await;
    gauges.abort();
    // The last write is done: the Lease may go.
    let _ = release_tx.send(());
    result
}

/// Waits until `recovery` is over: full reports and lost clusters come in, the deadline passes.
async fn recover(
    mut recovery: Recovery,
    mut full_reports: mpsc::UnboundedReceiver<String>,
    mut cluster_health: watch::Receiver<std::collections::BTreeMap<String, ClusterHealth>>,
) -> Recovered {
    loop {
        for (cluster, health) in cluster_health.borrow_and_update().iter() {
            if *health != ClusterHealth::Ready {
                recovery.lost(cluster);
            }
        }
        if let Some(outcome) = recovery.outcome(Instant::now()) {
            return outcome;
        }
        tracing::debug!(waiting = %recovery.waiting().join(","), "recovering");
        tokio::select! {
            Some(cluster) = full_reports.recv() => {
                tracing::info!(%cluster, "recovery: the cluster re-sent its full state");
                recovery.full_report(&cluster);
            }
            Ok(()) = cluster_health.changed() => {}
            _ = tokio::time::sleep_until(recovery.deadline().into()) => {}
        }
    }
}

/// Most ledger events of one binding read back to find its missing evictions.
const BACKFILL_HISTORY_LIMIT: u32 = 10_000;

/// Records the evictions in the bindings' history that the ledger lacks (a hub killed between
/// writing an eviction and writing its ledger event), so the timeline stays whole across a crash.
async fn backfill_evictions(reader: Ledger, bindings: Store<ResourceBinding>, feed: LedgerFeed) {
    let mut added = 0usize;
    for binding in bindings.state() {
        if binding.spec.eviction_history.is_empty() {
            continue;
        }
        let (namespace, name) = binding.key();
        let recorded = match reader
            .history_of_binding(&namespace, &name, BACKFILL_HISTORY_LIMIT)
            .await
        {
            Ok(recorded) => recorded,
            Err(error) => {
                tracing::warn!(%error, binding = %format!("{namespace}/{name}"), "reading the ledger to backfill evictions failed");
                continue;
            }
        };
        for event in crate::failover_record::missing_evictions(&binding, &recorded) {
            feed.record(event).await;
            added += 1;
        }
    }
    if added > 0 {
        tracing::warn!(
            evictions = added,
            "the ledger lacked evictions recorded in the bindings (a hub stopped before writing them): added"
        );
    }
}

/// `lifeboat_hub_phase{phase}`: 1 for what this process is doing (Standby, Recovering,
/// Running), 0 for the others.
struct PhaseGauge(prometheus::IntGaugeVec);

impl PhaseGauge {
    fn new(registry: &Registry) -> Result<PhaseGauge, prometheus::Error> {
        let gauge = prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_phase",
                "1 for what this hub process is doing: Standby (another leads), Recovering (leading, waiting for the agents' full state; nothing is decided), Running",
            ),
            &["phase"],
        )?;
        registry.register(Box::new(gauge.clone()))?;
        Ok(PhaseGauge(gauge))
    }

    fn set(&self, now: HubPhase) {
        for phase in HubPhase::ALL {
            self.0
                .with_label_values(&[phase.as_str()])
                .set(i64::from(phase == now));
        }
        tracing::info!(phase = now.as_str(), "hub phase");
    }
}

/// A policy changed: rebuild the index and bind again the templates it may select or have
/// selected (a PropagationPolicy: those of its namespace; a ClusterPropagationPolicy: all).
fn policy_changed<K: kube::Resource>(
    slot: &std::sync::OnceLock<Arc<Binder>>,
    event: &watcher::Event<K>,
) {
    let Some(binder) = slot.get() else { return };
    match event {
        watcher::Event::Apply(policy) | watcher::Event::Delete(policy) => {
            binder.refresh_policies();
            match policy.meta().namespace.as_deref() {
                Some(namespace) => binder.queue_namespace(namespace),
                None => binder.queue_all(),
            }
        }
        watcher::Event::InitDone => {
            binder.refresh_policies();
            binder.queue_all();
        }
        _ => {}
    }
}
