//! A serving certificate and what keeps it current, whatever its source:
//! - issued from a CA kept in a Secret: every replica and every restart signs with the same CA,
//!   so clients (an apiserver calling a webhook) trust one bundle; the certificate is re-issued
//!   before it expires and at once when the Secret's CA changes;
//! - read from PEM files (e.g. a mounted cert-manager Secret), re-read when they change;
//! - issued from a CA in memory, for tests and throwaway processes.
//!
//! Whatever the source, the server presents it through a [`ReloadingResolver`], so a rotation
//! needs no restart: the next TLS handshake presents the new certificate. Used by the agent's
//! and the hub's admission webhooks.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use futures::stream::{self, BoxStream, StreamExt};

use crate::authority::CA_LIFETIME;
use crate::files::DEFAULT_POLL_INTERVAL;
use crate::renewal::SERVING_LIFETIME;
use crate::secret::{CaOrigin, CaSecret, SecretError};
use crate::{
    CertificateAuthority, FileReloader, PemFiles, ReloadingResolver, Renewer, TlsError, Validity,
};

/// Where the serving certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertificateSource {
    /// Issued from the CA in this Secret (`kubernetes.io/tls`: `tls.crt`, `tls.key`), which is
    /// created when absent. `namespace: None` is the client's default namespace (in a pod: its
    /// own). Replicas and restarts share the CA and so the caBundle.
    CaSecret {
        namespace: Option<String>,
        name: String,
    },
    /// PEM files, e.g. a mounted cert-manager Secret, re-read every 5 s and served from the next
    /// handshake when they change. `ca` is the bundle the apiserver must trust; without it the
    /// certificate file is used (right for a self-signed certificate).
    Files {
        cert: PathBuf,
        key: PathBuf,
        ca: Option<PathBuf>,
    },
    /// A CA in memory, lost at exit: for tests and a single throwaway agent (replicas would each
    /// have their own and disagree on the caBundle).
    Ephemeral,
}

/// Why the serving certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    CaSecret(#[from] SecretError),
}

/// The webhook's serving certificate and what keeps it current.
pub struct Certificates {
    resolver: Arc<ReloadingResolver>,
    keeper: Keeper,
}

enum Keeper {
    Issuing {
        renewer: Box<Renewer>,
        /// The CA whenever it changes (the Secret's), or nothing (a CA in memory).
        ca_updates: BoxStream<'static, Result<CertificateAuthority, SecretError>>,
    },
    Files(FileReloader),
}

impl Certificates {
    /// The first certificate, for `names` (DNS names or IP addresses the clients dial) when it
    /// is issued here. A CA Secret is read or created with `client`; a CA made here is named
    /// `ca_common_name`, and a Secret made here is labelled as managed by `managed_by`.
    pub async fn prepare(
        source: &CertificateSource,
        names: &[String],
        client: &kube::Client,
        ca_common_name: &str,
        managed_by: &str,
    ) -> Result<Self, CertificateError> {
        let issuing = |ca: CertificateAuthority, ca_updates| {
            let common_name = names.first().ok_or(TlsError::NoNames)?;
            let renewer = Renewer::start(ca, common_name, names, SERVING_LIFETIME)?;
            Ok::<_, CertificateError>(Self {
                resolver: renewer.resolver().clone(),
                keeper: Keeper::Issuing {
                    renewer: Box::new(renewer),
                    ca_updates,
                },
            })
        };
        match source {
            CertificateSource::Ephemeral => issuing(
                CertificateAuthority::generate(
                    ca_common_name,
                    Validity::starting_now(CA_LIFETIME),
                )?,
                stream::pending().boxed(),
            ),
            CertificateSource::CaSecret { namespace, name } => {
                let namespace = namespace
                    .clone()
                    .unwrap_or_else(|| client.default_namespace().to_string());
                let secret =
                    CaSecret::new(client.clone(), &namespace, name).with_labels(BTreeMap::from([
                        (
                            "app.kubernetes.io/managed-by".to_string(),
                            managed_by.to_string(),
                        ),
                    ]));
                let (ca, origin) = secret
                    .ensure(ca_common_name, Validity::starting_now(CA_LIFETIME))
                    .await?;
                let how = match origin {
                    CaOrigin::Existing => "read",
                    CaOrigin::Created => "created",
                    CaOrigin::CreatedByAnother => "read (created by another replica meanwhile)",
                };
                tracing::info!(secret = %secret.display_name(), "serving CA {how}");
                issuing(ca, secret.watch().boxed())
            }
            CertificateSource::Files { cert, key, ca } => {
                let files = PemFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    ca: ca.clone(),
                };
                let resolver = ReloadingResolver::new(files.load().await?)?;
                Ok(Self {
                    keeper: Keeper::Files(FileReloader::new(files, resolver.clone())),
                    resolver,
                })
            }
        }
    }

    /// What the TLS server asks at every handshake.
    pub fn resolver(&self) -> &Arc<ReloadingResolver> {
        &self.resolver
    }

    /// Keeps the certificate current until `shutdown` completes: re-issues before expiry and
    /// follows the CA Secret, or re-reads the files.
    pub async fn keep_current(self, shutdown: impl Future<Output = ()>) {
        match self.keeper {
            Keeper::Issuing {
                renewer,
                ca_updates,
            } => renewer.run(ca_updates, shutdown).await,
            Keeper::Files(reloader) => reloader.run(DEFAULT_POLL_INTERVAL, shutdown).await,
        }
    }
}
