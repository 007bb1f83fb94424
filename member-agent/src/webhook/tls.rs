//! The webhook's serving certificate: [`lifeboat_tls::source`] (shared with the hub's
//! webhook), with the agent's CA Secret and CA name.

pub use lifeboat_tls::source::{CertificateError, CertificateSource, Certificates};

use crate::install::FIELD_MANAGER;

/// Name of the Secret holding the webhook's CA, unless `--webhook-ca-secret` says otherwise.
pub const DEFAULT_CA_SECRET: &str = "lifeboat-agent-webhook-ca";
/// Subject (CN) of a CA the webhook generates.
pub const CA_COMMON_NAME: &str = "lifeboat-agent-webhook-ca";

/// The agent's default: a CA in the Secret [`DEFAULT_CA_SECRET`] of its namespace.
pub fn default_source() -> CertificateSource {
    CertificateSource::CaSecret {
        namespace: None,
        name: DEFAULT_CA_SECRET.into(),
    }
}

/// The first certificate from `source` for `names`, the agent's CA name and labels.
pub async fn prepare(
    source: &CertificateSource,
    names: &[String],
    client: &kube::Client,
) -> Result<Certificates, CertificateError> {
    Certificates::prepare(source, names, client, CA_COMMON_NAME, FIELD_MANAGER).await
}
