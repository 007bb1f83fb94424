//! The cluster's credential for the hub: obtained by registering with the bootstrap token, kept
//! in a Secret of the member (so a restarted agent reuses it instead of registering again), and
//! replaced by registering again when the hub answers 401 (revoked or unknown token).
//!
//! When the hub deletes the cluster, the Secret is kept with the annotation
//! [`REMOVED_ANNOTATION`]: an agent that finds it there stays out of hub mode (a restart does
//! not register the cluster again) until the Secret is deleted, the explicit act of joining
//! again.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use lifeboat_api::binding::FIELD_MANAGER;
use lifeboat_api::protocol::{RegisterRequest, RegisterResponse, register_path};

use super::client::{CallError, HubClient};
use super::namespaces::{CREATED_BY, CREATED_BY_LABEL, Namespaces};

/// Annotation on the credential Secret once the hub removed this cluster: when (RFC 3339).
pub const REMOVED_ANNOTATION: &str = "hub.lifeboat.dev/removed-from-hub";

const TOKEN_KEY: &str = "token";
const CLUSTER_KEY: &str = "cluster-name";
const HEARTBEAT_KEY: &str = "heartbeat-interval-seconds";
const LEASE_KEY: &str = "lease-duration-seconds";

/// Defaults when the hub's answer (or an old Secret) does not say.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);
const DEFAULT_LEASE: Duration = Duration::from_secs(40);

/// `NAMESPACE/NAME` of the credential Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
}

impl SecretRef {
    pub fn parse(text: &str) -> Result<Self, String> {
        let (namespace, name) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not NAMESPACE/NAME"))?;
        for (what, part) in [("namespace", namespace), ("name", name)] {
            if part.is_empty()
                || part.len() > 253
                || !part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
                || part.starts_with(['-', '.'])
                || part.ends_with(['-', '.'])
            {
                return Err(format!(
                    "{what} {part:?} is not a DNS subdomain (lower case letters, digits, '-', '.')"
                ));
            }
        }
        Ok(Self {
            namespace: namespace.into(),
            name: name.into(),
        })
    }
}

impl std::fmt::Display for SecretRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What registration gave and the Secret keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub cluster: String,
    pub token: String,
    pub heartbeat_interval: Duration,
    pub lease_duration: Duration,
}

fn seconds(value: i32, default: Duration) -> Duration {
    u64::try_from(value)
        .ok()
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
        .unwrap_or(default)
}

impl Credential {
    pub fn from_response(response: &RegisterResponse) -> Self {
        Self {
            cluster: response.cluster_name.clone(),
            token: response.token.clone(),
            heartbeat_interval: seconds(response.heartbeat_interval_seconds, DEFAULT_HEARTBEAT),
            lease_duration: seconds(response.lease_duration_seconds, DEFAULT_LEASE),
        }
    }

    /// The credential a Secret holds, if it holds one for `cluster`.
    pub fn from_secret(secret: &Secret, cluster: &str) -> Option<Self> {
        let data = secret.data.as_ref()?;
        let text = |key: &str| {
            data.get(key)
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
                .map(|s| s.trim().to_string())
        };
        let token = text(TOKEN_KEY).filter(|t| !t.is_empty())?;
        if text(CLUSTER_KEY).as_deref() != Some(cluster) {
            return None;
        }
        let number = |key: &str| text(key).and_then(|s| s.parse::<i32>().ok()).unwrap_or(0);
        Some(Self {
            cluster: cluster.to_string(),
            token,
            heartbeat_interval: seconds(number(HEARTBEAT_KEY), DEFAULT_HEARTBEAT),
            lease_duration: seconds(number(LEASE_KEY), DEFAULT_LEASE),
        })
    }

    pub fn to_secret(&self, at: &SecretRef) -> Secret {
        let bytes = |s: String| ByteString(s.into_bytes());
        Secret {
            metadata: ObjectMeta {
                name: Some(at.name.clone()),
                namespace: Some(at.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    CREATED_BY_LABEL.to_string(),
                    CREATED_BY.to_string(),
                )])),
                ..Default::default()
            },
            type_: Some("Opaque".into()),
            data: Some(BTreeMap::from([
                (TOKEN_KEY.to_string(), bytes(self.token.clone())),
                (CLUSTER_KEY.to_string(), bytes(self.cluster.clone())),
                (
                    HEARTBEAT_KEY.to_string(),
                    bytes(self.heartbeat_interval.as_secs().to_string()),
                ),
                (
                    LEASE_KEY.to_string(),
                    bytes(self.lease_duration.as_secs().to_string()),
                ),
            ])),
            ..Default::default()
        }
    }
}

/// Why no credential could be had.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("reading the bootstrap token {path}: {reason}")]
    BootstrapToken { path: String, reason: String },
    #[error("registering: {0}")]
    Register(#[from] CallError),
    #[error("the hub registered cluster {got:?}, not {want:?}")]
    WrongCluster { want: String, got: String },
    #[error("the hub answered a registration without a token")]
    NoToken,
    #[error(
        "the hub removed this cluster at {at} (Secret {secret} says so): delete that Secret to \
         join the hub again"
    )]
    RemovedFromHub { secret: String, at: String },
}

/// The credential of this term, loaded from the Secret or obtained by registering.
pub struct Credentials {
    client: kube::Client,
    hub: Arc<HubClient>,
    secret: SecretRef,
    bootstrap_token_file: PathBuf,
    request: RegisterRequest,
    namespaces: Arc<Namespaces>,
    current: Mutex<Option<Credential>>,
    /// One registration at a time: callers that saw the same 401 share it.
    registering: tokio::sync::Mutex<()>,
}

impl Credentials {
    pub fn new(
        client: kube::Client,
        hub: Arc<HubClient>,
        secret: SecretRef,
        bootstrap_token_file: PathBuf,
        request: RegisterRequest,
        namespaces: Arc<Namespaces>,
    ) -> Self {
        Self {
            client,
            hub,
            secret,
            bootstrap_token_file,
            request,
            namespaces,
            current: Mutex::new(None),
            registering: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Credential>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The credential in use, if any yet.
    pub fn current(&self) -> Option<Credential> {
        self.lock().clone()
    }

    /// The credential: the one in use, else the Secret's, else a new registration.
    pub async fn get(&self) -> Result<Credential, CredentialError> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let _one = self.registering.lock().await;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.secret.namespace);
        match api.get_opt(&self.secret.name).await {
            Ok(Some(secret)) => {
                if let Some(at) = removed_at(&secret) {
                    return Err(CredentialError::RemovedFromHub {
                        secret: self.secret.to_string(),
                        at,
                    });
                }
                if let Some(c) = Credential::from_secret(&secret, &self.request.cluster_name) {
                    tracing::info!(secret = %self.secret, "reusing the cluster credential");
                    *self.lock() = Some(c.clone());
                    return Ok(c);
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(secret = %self.secret, error = %e, "cannot read the credential Secret; registering")
            }
        }
        self.register().await
    }

    /// The hub refused `token` (401): register again, unless another caller already replaced
    /// it. Returns the credential to use now.
    pub async fn rejected(&self, token: &str) -> Result<Credential, CredentialError> {
        let _one = self.registering.lock().await;
        if let Some(c) = self.current()
            && c.token != token
        {
            return Ok(c);
        }
        tracing::warn!(
            "the hub refused the cluster credential; registering again with the bootstrap token"
        );
        self.register().await
    }

    /// The hub deleted the cluster: keep the Secret, annotated [`REMOVED_ANNOTATION`] with
    /// `at`, so no later start registers the cluster again. The credential stays in memory for
    /// the last heartbeat that tells the hub the agent stopped.
    pub async fn mark_removed(&self, at: &str) -> Result<(), kube::Error> {
        let mut secret = match self.current() {
            Some(credential) => credential.to_secret(&self.secret),
            None => Secret {
                metadata: ObjectMeta {
                    name: Some(self.secret.name.clone()),
                    namespace: Some(self.secret.namespace.clone()),
                    labels: Some(BTreeMap::from([(
                        CREATED_BY_LABEL.to_string(),
                        CREATED_BY.to_string(),
                    )])),
                    ..Default::default()
                },
                type_: Some("Opaque".into()),
                ..Default::default()
            },
        };
        secret.metadata.annotations = Some(BTreeMap::from([(
            REMOVED_ANNOTATION.to_string(),
            at.to_string(),
        )]));
        self.namespaces.ensure(&self.secret.namespace).await?;
        Api::<Secret>::namespaced(self.client.clone(), &self.secret.namespace)
            .patch(
                &self.secret.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&secret),
            )
            .await?;
        Ok(())
    }

    /// Registers with the bootstrap token and keeps the answer (memory and Secret). The caller
    /// holds `registering`.
    async fn register(&self) -> Result<Credential, CredentialError> {
        let bootstrap = tokio::fs::read_to_string(&self.bootstrap_token_file)
            .await
            .map_err(|e| CredentialError::BootstrapToken {
                path: self.bootstrap_token_file.display().to_string(),
                reason: e.to_string(),
            })?;
        let bootstrap = bootstrap.trim();
        if bootstrap.is_empty() {
            return Err(CredentialError::BootstrapToken {
                path: self.bootstrap_token_file.display().to_string(),
                reason: "the file is empty".into(),
            });
        }
        let response: RegisterResponse = self
            .hub
            .post("register", &register_path(), bootstrap, &self.request)
            .await?;
        if response.cluster_name != self.request.cluster_name {
            return Err(CredentialError::WrongCluster {
                want: self.request.cluster_name.clone(),
                got: response.cluster_name,
            });
        }
        if response.token.is_empty() {
            return Err(CredentialError::NoToken);
        }
        let credential = Credential::from_response(&response);
        *self.lock() = Some(credential.clone());
        tracing::info!(cluster = %credential.cluster, heartbeat = ?credential.heartbeat_interval,
            lease = ?credential.lease_duration, "registered with the hub");
        // Without the Secret a restart registers again: worth a warning, not a failure.
        if let Err(e) = self.store(&credential).await {
            tracing::warn!(secret = %self.secret, error = %e, "cannot keep the cluster credential in its Secret");
        }
        Ok(credential)
    }

    async fn store(&self, credential: &Credential) -> Result<(), kube::Error> {
        self.namespaces.ensure(&self.secret.namespace).await?;
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.secret.namespace);
        api.patch(
            &self.secret.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&credential.to_secret(&self.secret)),
        )
        .await?;
        Ok(())
    }
}

/// When the hub removed this cluster, if the credential Secret says it did
/// ([`REMOVED_ANNOTATION`]).
pub fn removed_at(secret: &Secret) -> Option<String> {
    secret
        .metadata
        .annotations
        .as_ref()?
        .get(REMOVED_ANNOTATION)
        .cloned()
}

/// Reads the credential Secret at `at` and says when the hub removed this cluster, if it did.
pub async fn removed_from_hub(
    client: &kube::Client,
    at: &SecretRef,
) -> Result<Option<String>, kube::Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &at.namespace);
    Ok(api.get_opt(&at.name).await?.as_ref().and_then(removed_at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_refs_are_namespace_slash_name() {
        assert_eq!(
            SecretRef::parse("lifeboat-system/lifeboat-hub-credential"),
            Ok(SecretRef {
                namespace: "lifeboat-system".into(),
                name: "lifeboat-hub-credential".into()
            })
        );
        for bad in ["nothing", "/x", "x/", "Upper/x", "x/y/z", "-x/y"] {
            assert!(SecretRef::parse(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn a_credential_round_trips_through_its_secret_for_its_cluster_only() {
        let response = RegisterResponse {
            cluster_name: "member-1".into(),
            token: "t0ken".into(),
            lease_duration_seconds: 40,
            heartbeat_interval_seconds: 0,
            fencing_period_seconds: 60,
        };
        let c = Credential::from_response(&response);
        assert_eq!(
            c.heartbeat_interval, DEFAULT_HEARTBEAT,
            "0 means the default"
        );
        assert_eq!(c.lease_duration, Duration::from_secs(40));
        let at = SecretRef::parse("lifeboat-system/cred").expect("ref");
        let secret = c.to_secret(&at);
        assert_eq!(
            secret.metadata.namespace.as_deref(),
            Some("lifeboat-system")
        );
        assert_eq!(Credential::from_secret(&secret, "member-1"), Some(c));
        // Another cluster's credential (a renamed agent) is not reused.
        assert_eq!(Credential::from_secret(&secret, "member-2"), None);
        let mut empty = secret.clone();
        empty
            .data
            .as_mut()
            .expect("data")
            .insert(TOKEN_KEY.into(), ByteString(b"  ".to_vec()));
        assert_eq!(Credential::from_secret(&empty, "member-1"), None);
    }
}
