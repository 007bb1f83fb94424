//! What an admission webhook of Lifeboat's needs to be reached by an apiserver, shared by the
//! agent's AppWrapper webhook and the hub's customization webhook: where the apiserver calls it
//! ([`ClientConfigTarget`], [`WebhookEndpoint`]), the `clientConfig` of its registration, and
//! the `--webhook-service` flag's syntax.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{ServiceReference, WebhookClientConfig};

/// How the apiserver reaches the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientConfigTarget {
    /// `https://{host}:{port}/...`: the process runs outside the cluster (as in the local
    /// fleet). `port: None` means the port the server is bound to.
    Url { host: String, port: Option<u16> },
    /// A Service in front of the pods (in-cluster deployment).
    Service {
        namespace: String,
        name: String,
        port: u16,
    },
}

impl ClientConfigTarget {
    /// The names a generated serving certificate must carry for this target.
    pub fn certificate_names(&self) -> Vec<String> {
        match self {
            ClientConfigTarget::Url { host, .. } => vec![host.clone()],
            ClientConfigTarget::Service {
                namespace, name, ..
            } => vec![
                format!("{name}.{namespace}.svc"),
                format!("{name}.{namespace}.svc.cluster.local"),
                format!("{name}.{namespace}"),
                name.clone(),
            ],
        }
    }

    /// `NAMESPACE/NAME:PORT` (the `--webhook-service` flag); `Err` says what is wrong.
    pub fn parse_service(value: &str) -> Result<ClientConfigTarget, String> {
        let (namespace, rest) = value
            .split_once('/')
            .ok_or_else(|| format!("`{value}` is not NAMESPACE/NAME:PORT (no `/`)"))?;
        let (name, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| format!("`{value}` is not NAMESPACE/NAME:PORT (no `:PORT`)"))?;
        if namespace.is_empty() || name.is_empty() {
            return Err(format!(
                "`{value}`: the namespace and the name must not be empty"
            ));
        }
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("`{port}` is not a port number (1-65535)"))?;
        Ok(ClientConfigTarget::Service {
            namespace: namespace.into(),
            name: name.into(),
            port,
        })
    }
}

/// Where a webhook is and the CA that signed its certificate: what a registration needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookEndpoint {
    /// With the port resolved for URL targets.
    pub target: ClientConfigTarget,
    pub ca_bundle_pem: String,
    /// Namespace of the dry-run probes that confirm the apiserver calls the webhook.
    pub probe_namespace: String,
    /// How long a registration waits for the apiserver to call the webhook.
    pub ready_timeout: Duration,
}

impl WebhookEndpoint {
    /// `https://host:port` for URL targets; `https://name.namespace.svc:port` for a Service.
    pub fn base_url(&self) -> String {
        match &self.target {
            ClientConfigTarget::Url { host, port } => {
                let host = match host.parse::<IpAddr>() {
                    Ok(IpAddr::V6(v6)) => format!("[{v6}]"),
                    _ => host.clone(),
                };
                match port {
                    Some(port) => format!("https://{host}:{port}"),
                    None => format!("https://{host}"),
                }
            }
            ClientConfigTarget::Service {
                namespace,
                name,
                port,
            } => format!("https://{name}.{namespace}.svc:{port}"),
        }
    }

    /// The `clientConfig` of a webhook served at `path`, trusting the endpoint's CA bundle.
    pub fn client_config(&self, path: &str) -> WebhookClientConfig {
        let ca_bundle = Some(ByteString(self.ca_bundle_pem.clone().into_bytes()));
        match &self.target {
            ClientConfigTarget::Url { .. } => WebhookClientConfig {
                ca_bundle,
                url: Some(format!("{}{path}", self.base_url())),
                service: None,
            },
            ClientConfigTarget::Service {
                namespace,
                name,
                port,
            } => WebhookClientConfig {
                ca_bundle,
                url: None,
                service: Some(ServiceReference {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    path: Some(path.to_string()),
                    port: Some(i32::from(*port)),
                }),
            },
        }
    }
}

/// Whether a registered client config reaches `ours` (same URL, or same Service and path),
/// whatever its caBundle: a process updates only registrations that point at itself.
pub fn points_at(registered: &WebhookClientConfig, ours: &WebhookClientConfig) -> bool {
    registered.url == ours.url && registered.service == ours.service
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_names_follow_the_target() {
        let url = ClientConfigTarget::Url {
            host: "127.0.0.1".into(),
            port: None,
        };
        assert_eq!(url.certificate_names(), vec!["127.0.0.1"]);
        let svc = ClientConfigTarget::Service {
            namespace: "ns".into(),
            name: "agent".into(),
            port: 443,
        };
        assert_eq!(svc.certificate_names()[0], "agent.ns.svc");
        assert!(
            svc.certificate_names()
                .contains(&"agent.ns.svc.cluster.local".to_string())
        );
    }

    #[test]
    fn base_urls_bracket_ipv6_hosts_and_client_configs_carry_the_path() {
        let endpoint = |target| WebhookEndpoint {
            target,
            ca_bundle_pem: "CA".into(),
            probe_namespace: "default".into(),
            ready_timeout: Duration::from_secs(1),
        };
        let v6 = endpoint(ClientConfigTarget::Url {
            host: "::1".into(),
            port: Some(9443),
        });
        assert_eq!(v6.base_url(), "https://[::1]:9443");
        assert_eq!(
            v6.client_config("/validate").url.as_deref(),
            Some("https://[::1]:9443/validate")
        );
        let svc = endpoint(ClientConfigTarget::Service {
            namespace: "ns".into(),
            name: "hub".into(),
            port: 443,
        });
        let config = svc.client_config("/validate");
        assert_eq!(config.service.unwrap().path.as_deref(), Some("/validate"));
        assert_eq!(config.ca_bundle.unwrap().0, b"CA");
    }

    #[test]
    fn services_parse_or_say_why_not() {
        assert_eq!(
            ClientConfigTarget::parse_service("ns/hub:443"),
            Ok(ClientConfigTarget::Service {
                namespace: "ns".into(),
                name: "hub".into(),
                port: 443
            })
        );
        assert!(
            ClientConfigTarget::parse_service("hub:443")
                .unwrap_err()
                .contains("no `/`")
        );
        assert!(
            ClientConfigTarget::parse_service("ns/hub:0")
                .unwrap_err()
                .contains("not a port number")
        );
    }
}
