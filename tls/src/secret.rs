//! The Kubernetes edge of certificates: a CA kept in a Secret, so that every replica of a
//! server and every restart signs with the same CA (and clients keep one CA bundle).
//!
//! The Secret is of type `kubernetes.io/tls` with the CA certificate in `tls.crt` and its key
//! in `tls.key`, the layout cert-manager's CA issuer reads too. [`CaSecret::ensure`] reads it,
//! creates it when absent and, when another replica created it first (409), reads the winner's.
//! It never overwrites a Secret it cannot use: that is an error naming the Secret and the key.

use std::collections::BTreeMap;

use futures::{Stream, StreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

use crate::{CertificateAuthority, TlsError, Validity};

/// Key of the CA certificate in the Secret.
pub const CA_CERT_KEY: &str = "tls.crt";
/// Key of the CA's private key in the Secret.
pub const CA_KEY_KEY: &str = "tls.key";

/// Why the CA Secret could not be read, created or used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("reading Secret {namespace}/{name}: {source}")]
    Get {
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("creating Secret {namespace}/{name}: {source}")]
    Create {
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("watching Secret {namespace}/{name}: {reason}")]
    Watch {
        namespace: String,
        name: String,
        reason: String,
    },
    /// The Secret exists but holds no usable CA; it is left as it is.
    #[error("Secret {namespace}/{name} does not hold a usable CA (left unchanged): {source}")]
    Invalid {
        namespace: String,
        name: String,
        #[source]
        source: TlsError,
    },
    #[error(transparent)]
    Generate(TlsError),
}

/// How [`CaSecret::ensure`] came by its CA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaOrigin {
    /// The Secret was there.
    Existing,
    /// This call created it.
    Created,
    /// Another writer created it between our read and our create; theirs is used.
    CreatedByAnother,
}

/// A CA kept in one Secret.
#[derive(Clone)]
pub struct CaSecret {
    api: Api<Secret>,
    namespace: String,
    name: String,
    labels: BTreeMap<String, String>,
}

impl CaSecret {
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            labels: BTreeMap::new(),
        }
    }

    /// Labels a created Secret carries.
    pub fn with_labels(mut self, labels: BTreeMap<String, String>) -> Self {
        self.labels = labels;
        self
    }

    /// `namespace/name`.
    pub fn display_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The CA in the Secret; when there is none, a new CA named `common_name` valid for
    /// `validity` is created in it (or, if another replica won the race, theirs is read).
    pub async fn ensure(
        &self,
        common_name: &str,
        validity: Validity,
    ) -> Result<(CertificateAuthority, CaOrigin), SecretError> {
        if let Some(secret) = self.get().await? {
            return Ok((self.authority_of(&secret)?, CaOrigin::Existing));
        }
        let ca =
            CertificateAuthority::generate(common_name, validity).map_err(SecretError::Generate)?;
        match self
            .api
            .create(&PostParams::default(), &self.secret_for(&ca))
            .await
        {
            Ok(_) => Ok((ca, CaOrigin::Created)),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let secret = self.get().await?.ok_or_else(|| SecretError::Get {
                    namespace: self.namespace.clone(),
                    name: self.name.clone(),
                    source: Box::new(kube::Error::Api(status)),
                })?;
                Ok((self.authority_of(&secret)?, CaOrigin::CreatedByAnother))
            }
            Err(source) => Err(SecretError::Create {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            }),
        }
    }

    async fn get(&self) -> Result<Option<Secret>, SecretError> {
        self.api
            .get_opt(&self.name)
            .await
            .map_err(|source| SecretError::Get {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            })
    }

    /// The Secret object holding `ca`.
    pub fn secret_for(&self, ca: &CertificateAuthority) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: (!self.labels.is_empty()).then(|| self.labels.clone()),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(BTreeMap::from([
                (
                    CA_CERT_KEY.to_string(),
                    ByteString(ca.cert_pem().as_bytes().to_vec()),
                ),
                (
                    CA_KEY_KEY.to_string(),
                    ByteString(ca.key_pem().as_bytes().to_vec()),
                ),
            ])),
            ..Default::default()
        }
    }

    /// The CA a Secret holds, or why it holds none (naming the Secret and the key).
    pub fn authority_of(&self, secret: &Secret) -> Result<CertificateAuthority, SecretError> {
        let invalid = |source| SecretError::Invalid {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        };
        let value = |key: &str| -> Result<String, TlsError> {
            let bytes = secret
                .data
                .as_ref()
                .and_then(|data| data.get(key))
                .ok_or_else(|| TlsError::pem(&format!("data.{key}"), "missing"))?;
            String::from_utf8(bytes.0.clone())
                .map_err(|_| TlsError::pem(&format!("data.{key}"), "not PEM text"))
        };
        let cert = value(CA_CERT_KEY).map_err(invalid)?;
        let key = value(CA_KEY_KEY).map_err(invalid)?;
        CertificateAuthority::from_pem(&cert, &key, &format!("data.{CA_CERT_KEY}/{CA_KEY_KEY}"))
            .map_err(invalid)
    }

    /// The CA each time the Secret is created or changed (first: its current content, if it
    /// exists). Deletions are not reported: whoever holds a CA keeps using it, and the next
    /// [`ensure`](Self::ensure) creates a new one. Watch errors are retried with backoff and
    /// reported in between.
    pub fn watch(&self) -> impl Stream<Item = Result<CertificateAuthority, SecretError>> + use<> {
        let this = self.clone();
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        watcher(self.api.clone(), config)
            .default_backoff()
            .applied_objects()
            .map(move |event| match event {
                Ok(secret) => this.authority_of(&secret),
                Err(error) => Err(SecretError::Watch {
                    namespace: this.namespace.clone(),
                    name: this.name.clone(),
                    reason: error.to_string(),
                }),
            })
    }
}
