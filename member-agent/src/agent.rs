//! Running the agent: client, CRD, metrics endpoint, controller.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};

use crate::config::OperatorConfig;
use crate::controller::{self, ControllerOptions};
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
    /// Where to serve `/metrics` and `/healthz` (`None`: not served).
    pub metrics_bind: Option<SocketAddr>,
    pub concurrency: u16,
    /// Install or update the AppWrapper CRD at start.
    pub install_crd: bool,
    /// Serve and register the admission webhook (`None`: no webhook).
    pub webhook: Option<webhook::WebhookConfig>,
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
    #[error("serving metrics on {addr}: {source}")]
    Serve {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A client for the member cluster.
pub async fn client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, AgentError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc =
                kube::config::Kubeconfig::read_from(path).map_err(|e| AgentError::Kubeconfig {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| AgentError::Kubeconfig {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| AgentError::Kubeconfig {
                path: "(inferred)".into(),
                reason: e.to_string(),
            })?,
    };
    kube::Client::try_from(config).map_err(AgentError::Client)
}

/// Runs the agent until `shutdown` resolves. `registry` collects its metrics (and the caller's).
pub async fn run(
    options: AgentOptions,
    registry: Registry,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), AgentError> {
    let client = client(options.kubeconfig.as_ref()).await?;
    if options.install_crd {
        install::ensure_crd(&client).await?;
    }
    let metrics = Metrics::new(&registry)?;
    let app_config = Arc::new(options.config.appwrapper.clone());
    // Shutdown reaches both the controller and the webhook server.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    if let Some(config) = options.webhook.clone() {
        let hook = webhook::Webhook::bind(config, &client, &registry).await?;
        let endpoint = hook.endpoint();
        tracing::info!(addr = %hook.local_addr(), "serving the admission webhook");
        let serve = hook.serve(app_config.clone(), stopped(stop_rx.clone()));
        tokio::spawn(async move {
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "admission webhook stopped");
            }
        });
        webhook::register(&client, &endpoint).await?;
        tracing::info!("admission webhook registered and live");
    }
    if let Some(addr) = options.metrics_bind {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| AgentError::Serve { addr, source })?;
        let registry = Arc::new(registry.clone());
        let app = axum::Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route(
                "/metrics",
                get(move || {
                    let registry = registry.clone();
                    async move {
                        let mut out = Vec::new();
                        let _ = TextEncoder::new().encode(&registry.gather(), &mut out);
                        String::from_utf8(out).unwrap_or_default()
                    }
                }),
            );
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "metrics server stopped");
            }
        });
        tracing::info!(%addr, "serving /metrics and /healthz");
    }
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    controller::run(
        client,
        app_config,
        metrics,
        ControllerOptions {
            cluster: options.cluster,
            concurrency: options.concurrency,
        },
        stopped(stop_rx),
    )
    .await;
    Ok(())
}

/// An agent running as a task of this process (tests, benchmarks, an embedding binary).
pub struct SpawnedAgent {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), AgentError>>,
}

impl SpawnedAgent {
    /// Stops the agent and waits until it has finished.
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
