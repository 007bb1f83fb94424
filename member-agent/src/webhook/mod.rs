//! The AppWrapper admission webhook (reference §4): defaulting on create (queue and trusted user
//! labels) and validation on create (structure, namespaces, nesting, podSets, the component cap,
//! and one SubjectAccessReview per wrapped kind) and update (deep immutability). Every rejection
//! names each field and the reason.
//!
//! Decisions are pure ([`admission`]); IO is the HTTPS server ([`server`]), the apiserver calls
//! for the RBAC check ([`access`], bounded per request and overall), the serving certificate
//! ([`tls`], rotated without a restart) and the registration ([`registration`]).
//!
//! ```no_run
//! # async fn example(client: kube::Client, app_config: std::sync::Arc<lifeboat_agent::config::AppWrapperConfig>) -> Result<(), Box<dyn std::error::Error>> {
//! use lifeboat_agent::webhook::{self, ClientConfigTarget, Webhook, WebhookConfig};
//! let registry = prometheus::Registry::new();
//! let config = WebhookConfig {
//!     bind: "127.0.0.1:0".parse()?,
//!     target: ClientConfigTarget::Url { host: "127.0.0.1".into(), port: None },
//!     certificate: webhook::tls::default_source(), // a CA in Secret lifeboat-agent-webhook-ca
//! };
//! let webhook = Webhook::bind(config, &client, &registry).await?;
//! let endpoint = webhook.endpoint();
//! tokio::spawn(webhook.serve(app_config, std::future::pending()));
//! webhook::register(&client, &endpoint).await?; // returns once the apiserver calls us
//! # Ok(()) }
//! ```

pub mod access;
pub mod admission;
pub mod args;
pub mod registration;
pub mod server;
pub mod tls;

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use lifeboat_tls::ServingCertificate;
use prometheus::Registry;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::config::AppWrapperConfig;

pub use access::{AccessLimits, Authorizer, KubeAuthorizer};
pub use admission::MAX_COMPONENTS;
pub use args::WebhookArgs;
pub use registration::{
    MUTATING_CONFIGURATION, MUTATING_WEBHOOK, RegisterError, VALIDATING_CONFIGURATION,
    VALIDATING_WEBHOOK, register, unregister,
};
pub use server::{AdmissionMetrics, HEALTHZ_PATH, MAX_REVIEW_BYTES, MUTATE_PATH, VALIDATE_PATH};
pub use tls::{CertificateError, CertificateSource, Certificates, DEFAULT_CA_SECRET};

pub use lifeboat_runtime::webhook::{ClientConfigTarget, WebhookEndpoint};

/// Everything the webhook server needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    /// Listen address; port 0 picks a free port (see [`Webhook::local_addr`]).
    pub bind: SocketAddr,
    /// How the apiserver reaches us (also the names of a generated certificate).
    pub target: ClientConfigTarget,
    pub certificate: CertificateSource,
}

/// Why the webhook could not start or keep serving.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook serving certificate: {0}")]
    Certificate(#[from] CertificateError),
    #[error("binding the webhook server to {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("registering the webhook metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("serving the webhook: {0}")]
    Serve(#[source] std::io::Error),
    #[error(transparent)]
    Register(#[from] RegisterError),
}

impl From<lifeboat_tls::TlsError> for WebhookError {
    fn from(error: lifeboat_tls::TlsError) -> Self {
        WebhookError::Certificate(error.into())
    }
}

/// A bound webhook server, not yet serving.
pub struct Webhook {
    listener: server::TlsListener,
    local_addr: SocketAddr,
    certificates: Certificates,
    target: ClientConfigTarget,
    metrics: AdmissionMetrics,
    client: kube::Client,
}

impl Webhook {
    /// Prepares the certificate (reading or creating the CA Secret with `client`), binds the
    /// port and registers the metrics in `registry`. Every fallible step of starting happens
    /// here. `client` also serves discovery, the SubjectAccessReviews and re-registration.
    pub async fn bind(
        config: WebhookConfig,
        client: &kube::Client,
        registry: &Registry,
    ) -> Result<Self, WebhookError> {
        let certificates = tls::prepare(
            &config.certificate,
            &config.target.certificate_names(),
            client,
        )
        .await?;
        let acceptor = TlsAcceptor::from(
            certificates
                .resolver()
                .server_config(vec![b"http/1.1".to_vec()])?,
        );
        let metrics = AdmissionMetrics::register(registry)?;
        let tcp = TcpListener::bind(config.bind)
            .await
            .map_err(|source| WebhookError::Bind {
                addr: config.bind,
                source,
            })?;
        let local_addr = tcp.local_addr().map_err(|source| WebhookError::Bind {
            addr: config.bind,
            source,
        })?;
        Ok(Self {
            listener: server::TlsListener::new(tcp, acceptor, "AppWrapper webhook"),
            local_addr,
            certificates,
            target: config.target,
            metrics,
            client: client.clone(),
        })
    }

    /// The address actually bound (the free port when `bind` asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The serving certificate now (its `ca_bundle_pem` is what the apiserver must trust).
    pub fn certificate(&self) -> ServingCertificate {
        self.certificates.resolver().current()
    }

    /// What to [`register`]: the target (a URL target gets the bound port unless it named
    /// one), the CA bundle, probes in namespace `default`, 60 s to become live.
    pub fn endpoint(&self) -> WebhookEndpoint {
        let target = match &self.target {
            ClientConfigTarget::Url { host, port } => ClientConfigTarget::Url {
                host: host.clone(),
                port: Some(port.unwrap_or(self.local_addr.port())),
            },
            other => other.clone(),
        };
        WebhookEndpoint {
            target,
            ca_bundle_pem: self.certificate().ca_bundle_pem,
            probe_namespace: "default".into(),
            ready_timeout: Duration::from_secs(60),
        }
    }

    /// Serves admission requests until `shutdown` completes (in-flight requests finish), keeps
    /// the certificate current meanwhile, and when the CA bundle changes (a new CA in the
    /// Secret, a rotated CA file) applies the webhook configurations with the new bundle.
    pub async fn serve(
        self,
        app_config: Arc<AppWrapperConfig>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), WebhookError> {
        let shutdown = shutdown.boxed().shared();
        let endpoint = self.endpoint();
        let changes = self.certificates.resolver().subscribe();
        self.metrics.certificate_served(&self.certificate());
        let state = Arc::new(server::WebhookState {
            authorizer: KubeAuthorizer::new(self.client.clone()),
            config: app_config,
            metrics: self.metrics.clone(),
            limits: AccessLimits::default(),
        });
        tracing::info!(addr = %self.local_addr, "AppWrapper admission webhook serving");
        let serving = axum::serve(self.listener, server::router(state))
            .with_graceful_shutdown(shutdown.clone())
            .into_future();
        let keeping = async {
            tokio::join!(
                self.certificates.keep_current(shutdown.clone()),
                registration::follow_certificate(
                    self.client,
                    endpoint,
                    changes,
                    self.metrics,
                    shutdown
                ),
            )
        };
        let mut serving = std::pin::pin!(serving);
        tokio::select! {
            // the server failed: the rest stops with it
            served = &mut serving => return served.map_err(WebhookError::Serve),
            // shutdown: let in-flight requests finish
            _ = keeping => {}
        }
        serving.await.map_err(WebhookError::Serve)
    }
}

/// Binds, serves and registers the webhook; returns when `shutdown` completes, or at once with
/// the error if starting or registration fails (the server then stops too).
pub async fn run(
    config: WebhookConfig,
    client: kube::Client,
    app_config: Arc<AppWrapperConfig>,
    registry: &Registry,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), WebhookError> {
    let webhook = Webhook::bind(config, &client, registry).await?;
    let endpoint = webhook.endpoint();
    let serving = webhook.serve(app_config, shutdown);
    let registering = async {
        register(&client, &endpoint).await?;
        tracing::info!(url = %endpoint.base_url(), "AppWrapper admission webhooks registered and live");
        Ok::<(), WebhookError>(())
    };
    tokio::try_join!(serving, registering).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn binding_port_zero_resolves_the_endpoint_port() {
        let registry = Registry::new();
        let webhook = Webhook::bind(
            WebhookConfig {
                bind: "127.0.0.1:0".parse().unwrap(),
                target: ClientConfigTarget::Url {
                    host: "127.0.0.1".into(),
                    port: None,
                },
                certificate: CertificateSource::Ephemeral,
            },
            &kube_client_that_is_never_called(),
            &registry,
        )
        .await
        .unwrap();
        let port = webhook.local_addr().port();
        assert_ne!(port, 0);
        let endpoint = webhook.endpoint();
        assert_eq!(endpoint.base_url(), format!("https://127.0.0.1:{port}"));
        assert_eq!(endpoint.ca_bundle_pem, webhook.certificate().ca_bundle_pem);
        // the metric is registered at bind: a second webhook on the same registry is refused
        let again = Webhook::bind(
            WebhookConfig {
                bind: "127.0.0.1:0".parse().unwrap(),
                target: ClientConfigTarget::Url {
                    host: "127.0.0.1".into(),
                    port: None,
                },
                certificate: CertificateSource::Ephemeral,
            },
            &kube_client_that_is_never_called(),
            &registry,
        )
        .await;
        assert!(matches!(again, Err(WebhookError::Metrics(_))));
    }

    /// One HTTP/1.1 request over TLS, trusting only `ca_pem`, as the apiserver does.
    async fn https(addr: SocketAddr, ca_pem: &str, request: &str) -> Result<String, String> {
        use rustls::pki_types::ServerName;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let config = lifeboat_tls::client::trusting(ca_pem).map_err(|e| e.to_string())?;
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        let name = ServerName::try_from(addr.ip().to_string()).map_err(|e| e.to_string())?;
        let mut tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        tls.write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut response = String::new();
        tls.read_to_string(&mut response)
            .await
            .map_err(|e| e.to_string())?;
        Ok(response)
    }

    fn kube_client_that_is_never_called() -> kube::Client {
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    #[tokio::test]
    async fn serves_https_with_the_generated_certificate_and_shuts_down() {
        let registry = Registry::new();
        let webhook = Webhook::bind(
            WebhookConfig {
                bind: "127.0.0.1:0".parse().unwrap(),
                target: ClientConfigTarget::Url {
                    host: "127.0.0.1".into(),
                    port: None,
                },
                certificate: CertificateSource::Ephemeral,
            },
            &kube_client_that_is_never_called(),
            &registry,
        )
        .await
        .unwrap();
        let addr = webhook.local_addr();
        let ca = webhook.certificate().ca_bundle_pem.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(webhook.serve(
            Arc::new(AppWrapperConfig::default()),
            async move {
                let _ = stopped.await;
            },
        ));

        let health = https(
            addr,
            &ca,
            "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        assert!(health.starts_with("HTTP/1.1 200"), "{health}");
        assert!(health.ends_with("ok"), "{health}");

        let garbage = "{oops";
        let bad = https(
            addr,
            &ca,
            &format!(
                "POST {VALIDATE_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{garbage}",
                garbage.len()
            ),
        )
        .await
        .unwrap();
        assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
        assert!(bad.contains("malformed admission request"), "{bad}");

        // a client trusting another CA is refused by its own verification
        let other_ca = lifeboat_tls::CertificateAuthority::generate(
            "other",
            lifeboat_tls::Validity::starting_now(Duration::from_secs(3600)),
        )
        .unwrap()
        .cert_pem()
        .to_string();
        let refused = https(addr, &other_ca, "GET /healthz HTTP/1.1\r\n\r\n").await;
        assert!(refused.is_err());

        stop.send(()).unwrap();
        let result = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .unwrap()
            .unwrap();
        assert!(result.is_ok(), "{result:?}");
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }
}
