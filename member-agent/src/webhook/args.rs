//! Command-line flags of the webhook, to `#[command(flatten)]` into the agent's CLI.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::{CertificateSource, ClientConfigTarget, DEFAULT_CA_SECRET, WebhookConfig};

/// The webhook's flags. The webhook runs when a way to reach it is given: `--webhook-url-host`
/// or `--webhook-service`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct WebhookArgs {
    /// Serve the AppWrapper admission webhook; the apiserver calls it at
    /// https://HOST:PORT (an agent outside the cluster), e.g. 127.0.0.1.
    #[arg(
        long = "webhook-url-host",
        env = "LIFEBOAT_WEBHOOK_URL_HOST",
        value_name = "HOST"
    )]
    pub url_host: Option<String>,

    /// Port in the webhook URL, when it differs from the bound port (e.g. behind a proxy).
    #[arg(
        long = "webhook-url-port",
        env = "LIFEBOAT_WEBHOOK_URL_PORT",
        value_name = "PORT"
    )]
    pub url_port: Option<u16>,

    /// Serve the AppWrapper admission webhook; the apiserver calls it through this Service
    /// (in-cluster deployment).
    #[arg(
        long = "webhook-service",
        env = "LIFEBOAT_WEBHOOK_SERVICE",
        value_name = "NAMESPACE/NAME:PORT",
        conflicts_with = "url_host"
    )]
    pub service: Option<String>,

    /// Address the webhook server listens on.
    #[arg(
        long = "webhook-bind",
        env = "LIFEBOAT_WEBHOOK_BIND",
        default_value = "0.0.0.0:9443"
    )]
    pub bind: SocketAddr,

    /// Secret holding the CA that issues the serving certificate (`kubernetes.io/tls`), created
    /// when absent; replicas and restarts share it. NAMESPACE defaults to the client's (in a pod:
    /// its own). Not used with --webhook-cert-file.
    #[arg(
        long = "webhook-ca-secret",
        env = "LIFEBOAT_WEBHOOK_CA_SECRET",
        value_name = "[NAMESPACE/]NAME",
        default_value = DEFAULT_CA_SECRET,
        conflicts_with = "cert_file"
    )]
    pub ca_secret: String,

    /// Serving certificate (PEM, leaf first), re-read when it changes (e.g. a mounted
    /// cert-manager Secret). Without it the certificate is issued from the CA in
    /// --webhook-ca-secret.
    #[arg(
        long = "webhook-cert-file",
        env = "LIFEBOAT_WEBHOOK_CERT_FILE",
        requires = "key_file"
    )]
    pub cert_file: Option<PathBuf>,

    /// Private key of `--webhook-cert-file` (PEM).
    #[arg(
        long = "webhook-key-file",
        env = "LIFEBOAT_WEBHOOK_KEY_FILE",
        requires = "cert_file"
    )]
    pub key_file: Option<PathBuf>,

    /// CA bundle the apiserver must trust (PEM); defaults to the certificate file.
    #[arg(
        long = "webhook-ca-file",
        env = "LIFEBOAT_WEBHOOK_CA_FILE",
        requires = "cert_file"
    )]
    pub ca_file: Option<PathBuf>,
}

/// A flag value that cannot work, naming the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag}: {reason}")]
pub struct ArgsError {
    pub flag: &'static str,
    pub reason: String,
}

impl WebhookArgs {
    /// The webhook configuration, or `None` when no way to reach the webhook was given (the
    /// webhook is not served).
    pub fn config(&self) -> Result<Option<WebhookConfig>, ArgsError> {
        let target = match (&self.url_host, &self.service) {
            (None, None) => return Ok(None),
            (Some(_), Some(_)) => {
                return Err(ArgsError {
                    flag: "--webhook-service",
                    reason: "give either --webhook-url-host or --webhook-service, not both".into(),
                });
            }
            (Some(host), None) if host.trim().is_empty() => {
                return Err(ArgsError {
                    flag: "--webhook-url-host",
                    reason: "must not be empty".into(),
                });
            }
            (Some(host), None) => ClientConfigTarget::Url {
                host: host.clone(),
                port: self.url_port,
            },
            (None, Some(service)) => parse_service(service)?,
        };
        let certificate = match (&self.cert_file, &self.key_file) {
            (None, None) => parse_ca_secret(&self.ca_secret)?,
            (Some(cert), Some(key)) => CertificateSource::Files {
                cert: cert.clone(),
                key: key.clone(),
                ca: self.ca_file.clone(),
            },
            (Some(_), None) => {
                return Err(ArgsError {
                    flag: "--webhook-key-file",
                    reason: "required with --webhook-cert-file".into(),
                });
            }
            (None, Some(_)) => {
                return Err(ArgsError {
                    flag: "--webhook-cert-file",
                    reason: "required with --webhook-key-file".into(),
                });
            }
        };
        Ok(Some(WebhookConfig {
            bind: self.bind,
            target,
            certificate,
        }))
    }
}

/// `[NAMESPACE/]NAME`.
fn parse_ca_secret(value: &str) -> Result<CertificateSource, ArgsError> {
    let (namespace, name) = match value.split_once('/') {
        Some((namespace, name)) => (Some(namespace), name),
        None => (None, value),
    };
    if name.is_empty() || namespace.is_some_and(str::is_empty) || name.contains('/') {
        return Err(ArgsError {
            flag: "--webhook-ca-secret",
            reason: format!("`{value}` is not [NAMESPACE/]NAME"),
        });
    }
    Ok(CertificateSource::CaSecret {
        namespace: namespace.map(str::to_string),
        name: name.to_string(),
    })
}

/// `NAMESPACE/NAME:PORT`.
fn parse_service(value: &str) -> Result<ClientConfigTarget, ArgsError> {
    ClientConfigTarget::parse_service(value).map_err(|reason| ArgsError {
        flag: "--webhook-service",
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        webhook: WebhookArgs,
    }

    fn parse(args: &[&str]) -> Result<Option<WebhookConfig>, String> {
        let cli = Cli::try_parse_from(std::iter::once("agent").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.webhook.config().map_err(|e| e.to_string())
    }

    #[test]
    fn no_target_means_no_webhook() {
        assert_eq!(parse(&[]), Ok(None));
    }

    #[test]
    fn url_and_service_targets() {
        let config = parse(&[
            "--webhook-url-host",
            "127.0.0.1",
            "--webhook-bind",
            "127.0.0.1:0",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            config.target,
            ClientConfigTarget::Url {
                host: "127.0.0.1".into(),
                port: None
            }
        );
        assert_eq!(config.bind.port(), 0);
        assert_eq!(config.certificate, super::super::tls::default_source());
        assert_eq!(
            config.certificate,
            CertificateSource::CaSecret {
                namespace: None,
                name: "lifeboat-agent-webhook-ca".into()
            }
        );
        let config = parse(&[
            "--webhook-url-host",
            "127.0.0.1",
            "--webhook-ca-secret",
            "lifeboat-system/webhook-ca",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            config.certificate,
            CertificateSource::CaSecret {
                namespace: Some("lifeboat-system".into()),
                name: "webhook-ca".into()
            }
        );

        let config = parse(&[
            "--webhook-service",
            "lifeboat-system/agent-webhook:443",
            "--webhook-cert-file",
            "/tls/tls.crt",
            "--webhook-key-file",
            "/tls/tls.key",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            config.target,
            ClientConfigTarget::Service {
                namespace: "lifeboat-system".into(),
                name: "agent-webhook".into(),
                port: 443
            }
        );
        assert_eq!(config.bind, "0.0.0.0:9443".parse().unwrap());
        assert_eq!(
            config.certificate,
            CertificateSource::Files {
                cert: "/tls/tls.crt".into(),
                key: "/tls/tls.key".into(),
                ca: None
            }
        );
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (value, reason) in [
            ("agent:443", "no `/`"),
            ("ns/agent", "no `:PORT`"),
            ("/agent:443", "must not be empty"),
            ("ns/agent:0", "not a port number"),
            ("ns/agent:https", "not a port number"),
        ] {
            let err = parse(&["--webhook-service", value]).unwrap_err();
            assert!(
                err.starts_with("--webhook-service: ") && err.contains(reason),
                "{value}: {err}"
            );
        }
        let err = parse(&["--webhook-url-host", "h", "--webhook-service", "a/b:1"]).unwrap_err();
        assert!(err.contains("cannot be used with"), "{err}");
        let err = parse(&["--webhook-url-host", "h", "--webhook-cert-file", "c"]).unwrap_err();
        assert!(err.contains("--webhook-key-file"), "{err}");
        for value in ["", "/ca", "ns/", "a/b/c"] {
            let err =
                parse(&["--webhook-url-host", "h", "--webhook-ca-secret", value]).unwrap_err();
            assert!(
                err.starts_with("--webhook-ca-secret: ") && err.contains("[NAMESPACE/]NAME"),
                "{value}: {err}"
            );
        }
        let err = parse(&[
            "--webhook-url-host",
            "h",
            "--webhook-ca-secret",
            "ca",
            "--webhook-cert-file",
            "c",
            "--webhook-key-file",
            "k",
        ])
        .unwrap_err();
        assert!(err.contains("cannot be used with"), "{err}");
        let err = parse(&["--webhook-url-host", " "]).unwrap_err();
        assert!(
            err.contains("--webhook-url-host: must not be empty"),
            "{err}"
        );
    }
}
