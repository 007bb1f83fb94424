//! Running the agent: client, CRD, health and metrics endpoints, webhook, leader election,
//! controller.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use lifeboat_runtime::leader::{self, LeaderElector, Leadership, LeaseConfig};
use lifeboat_runtime::readiness::Readiness;
use prometheus::Registry;

use crate::config::OperatorConfig;
use crate::controller::{self, ControllerOptions, watches::CoreWatches};
use crate::install;
use crate::metrics::Metrics;
use crate::webhook;

/// How to run the agent.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Kubeconfig of the member cluster (`None`: in-cluster or the default kubeconfig).
    pub kubeconfig: Option<PathBuf>,
    pub config: OperatorConfig,
    /// Name of this cluster, for logs and spans.
    pub cluster: String,
    /// Where to serve `/metrics`, `/healthz` and `/readyz` (`None`: not served).
    pub metrics_bind: Option<SocketAddr>,
    pub concurrency: u16,
    /// Install or update the AppWrapper CRD at start.
    pub install_crd: bool,
    /// Serve and register the admission webhook (`None`: no webhook).
    pub webhook: Option<webhook::WebhookConfig>,
    /// Reconcile only while holding this Lease (`None`: always, a single replica). An empty
    /// `namespace` means the client's default namespace (in a pod: its own).
    pub leader_election: Option<LeaseConfig>,
    /// Hub mode: register with the hub and apply its work, while leading (`None`: standalone).
    pub hub: Option<crate::uplink::HubOptions>,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig { path: String, reason: String },
    #[error("building a Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error(transparent)]
    Install(#[from] install::InstallError),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("admission webhook: {0}")]
    Webhook(#[from] webhook::WebhookError),
    #[error("registering the admission webhook: {0}")]
    Register(#[from] webhook::RegisterError),
    #[error(transparent)]
    LeaderElection(#[from] leader::ConfigError),
    #[error("hub mode: {0}")]
    Hub(#[from] crate::uplink::SetupError),
    #[error("serving metrics on {addr}: {source}")]
    Serve {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A client for the member cluster.
pub async fn client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, AgentError> {
    kube::Client::try_from(member_config(kubeconfig).await?).map_err(AgentError::Client)
}

/// The member cluster's client configuration.
async fn member_config(kubeconfig: Option<&PathBuf>) -> Result<kube::Config, AgentError> {
    use lifeboat_runtime::client::{ClientError, config_from_kubeconfig};
    config_from_kubeconfig(kubeconfig.map(PathBuf::as_path))
        .await
        .map_err(|e| match e {
            ClientError::Kubeconfig { path, reason } => AgentError::Kubeconfig { path, reason },
            ClientError::Client(e) => AgentError::Client(e),
        })
}

/// Runs the agent until `shutdown` resolves. `registry` collects its metrics (and the caller's).
/// Every task it starts ends with it, also when this future is dropped (the in-process
/// equivalent of a crash: the Lease is not released).
pub async fn run(
    options: AgentOptions,
    registry: Registry,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), AgentError> {
    let member = member_config(options.kubeconfig.as_ref()).await?;
    let client = kube::Client::try_from(member.clone()).map_err(AgentError::Client)?;
    if options.install_crd {
        install::ensure_crd(&client).await?;
    }
    let metrics = Metrics::new(&registry)?;
    let app_config = Arc::new(options.config.appwrapper.clone());
    let (leadership, elector) = match options.leader_election.clone() {
        Some(mut lease) => {
            if lease.namespace.is_empty() {
                lease.namespace = client.default_namespace().to_string();
            }
            tracing::info!(lease = %lease.name, namespace = %lease.namespace, identity = %lease.identity, "leader election on");
            let (elector, leadership) = LeaderElector::new(client.clone(), lease)?;
            (leadership, Some(elector))
        }
        None => (Leadership::always(), None),
    };
    // Registered before anything is served: not ready until the controller's watches synced.
    let readiness = Readiness::new();
    let core_watches = CoreWatches::expect(&readiness);
    let mut background = tokio::task::JoinSet::new();
    // Shutdown reaches both the controller and the webhook server.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    if let Some(addr) = options.metrics_bind {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| AgentError::Serve { addr, source })?;
        let app = http_router(registry.clone(), readiness.clone());
        background.spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "metrics server stopped");
            }
        });
        tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    }
    // Served by every replica, leading or not.
    if let Some(config) = options.webhook.clone() {
        let hook = webhook::Webhook::bind(config, &client, &registry).await?;
        let endpoint = hook.endpoint();
        tracing::info!(addr = %hook.local_addr(), "serving the admission webhook");
        let serve = hook.serve(app_config.clone(), stopped(stop_rx.clone()));
        background.spawn(async move {
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "admission webhook stopped");
            }
        });
        webhook::register(&client, &endpoint).await?;
        tracing::info!("admission webhook registered and live");
    }
    // Hub mode (`crate::uplink`): runs while this replica leads.
    if let Some(hub) = options.hub.clone() {
        let hub = crate::uplink::HubMode::new(
            client.clone(),
            hub,
            &options.cluster,
            &app_config,
            &registry,
            &member,
            options.kubeconfig.is_some() || std::env::var_os("KUBECONFIG").is_some(),
        )?;
        background.spawn(hub.run(leadership.clone(), stopped(stop_rx.clone())));
    }
    background.spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let controller = async move {
        controller::run(
            client,
            app_config,
            metrics,
            ControllerOptions {
                cluster: options.cluster,
                concurrency: options.concurrency,
                leadership,
                readiness,
                core_watches,
            },
            stopped(stop_rx),
        )
        .await;
        // The controller made its last write: the lease may go.
        let _ = release_tx.send(());
    };
    match elector {
        Some(elector) => {
            let campaign = elector.run(async move {
                let _ = release_rx.await;
            });
            tokio::join!(controller, campaign);
        }
        None => controller.await,
    }
    Ok(())
}

/// `/healthz`, `/readyz` and `/metrics` (the one router of every Lifeboat process).
pub use lifeboat_runtime::http::router as http_router;

/// An agent running as a task of this process (tests, benchmarks, an embedding binary).
pub struct SpawnedAgent {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), AgentError>>,
}

impl SpawnedAgent {
    /// Kills the agent as a crash would: every task it started ends at once, nothing is
    /// released (its Lease lapses after its duration).
    pub async fn abort(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }

    /// Stops the agent gracefully (reconciles in flight finish, the Lease is released) and
    /// waits until it has finished.
    pub async fn stop(mut self) -> Result<(), AgentError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(result) => result,
            Err(e) => {
                tracing::error!(error = %e, "agent task panicked or was cancelled");
                Ok(())
            }
        }
    }
}

impl Drop for SpawnedAgent {
    /// An agent outlives no handle: dropping one that was not stopped aborts it.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the agent on the current tokio runtime. The CRD is installed (if asked) before this
/// returns, so AppWrappers can be created at once.
pub async fn spawn(options: AgentOptions, registry: Registry) -> Result<SpawnedAgent, AgentError> {
    let mut options = options;
    if options.install_crd {
        install::ensure_crd(&client(options.kubeconfig.as_ref()).await?).await?;
        options.install_crd = false;
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run(options, registry, async move {
        let _ = stopped.await;
    }));
    Ok(SpawnedAgent {
        stop: Some(stop),
        task,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use tower::ServiceExt;

    async fn get(app: &axum::Router, path: &str) -> (StatusCode, String) {
        let request = axum::http::Request::get(path)
            .body(axum::body::Body::empty())
            .expect("a request");
        let response = app.clone().oneshot(request).await.expect("an answer");
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("a body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn readyz_waits_for_every_watch_healthz_does_not() {
        let registry = Registry::new();
        let metrics = Metrics::new(&registry).expect("metrics");
        let readiness = Readiness::new();
        let core = CoreWatches::expect(&readiness);
        let app = http_router(registry, readiness.clone());
        assert_eq!(get(&app, "/healthz").await, (StatusCode::OK, "ok".into()));
        assert_eq!(
            get(&app, "/readyz").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "watches not synced yet: appwrappers, nodes, pods".into()
            )
        );
        core.appwrappers.synced();
        core.pods.synced();
        assert_eq!(
            get(&app, "/readyz").await.1,
            "watches not synced yet: nodes"
        );
        core.nodes.synced();
        assert_eq!(get(&app, "/readyz").await, (StatusCode::OK, "ok".into()));
        // A wrapped kind watched for the first time: unready until it synced.
        let jobs = readiness.expect("batch/v1 Job");
        assert_eq!(
            get(&app, "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        jobs.synced();
        assert_eq!(get(&app, "/readyz").await.0, StatusCode::OK);
        metrics.leader.set(1);
        let (status, body) = get(&app, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("lifeboat_agent_leader 1"), "{body}");
    }
}
