//! Credentials of the agent API.
//!
//! - A **bootstrap token** is a Secret of type [`BOOTSTRAP_TOKEN_TYPE`](lifeboat_api::credentials::BOOTSTRAP_TOKEN_TYPE) in the hub namespace
//!   (data `token`, optional `expiration` in RFC 3339 and `cluster-name`); it lets an agent
//!   register.
//! - A **cluster token** is minted at registration (32 random bytes, hex) and handed to the agent
//!   once; the hub keeps only its SHA-256, in the Secret `cluster-<name>-credential` of type
//!   [`CLUSTER_CREDENTIAL_TYPE`](lifeboat_api::credentials::CLUSTER_CREDENTIAL_TYPE) (owned by the Cluster, so deleting the Cluster revokes it).
//!
//! Presented tokens are hashed first and looked up by digest, so no comparison ever runs on the
//! secret itself and its timing says nothing about it.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher;
use ring::digest;
use tokio::sync::watch;

use lifeboat_api::cluster::CLUSTER_NAME_LABEL;
use lifeboat_api::credentials::{
    BOOTSTRAP_CLUSTER_NAME_KEY, BOOTSTRAP_EXPIRATION_KEY, BOOTSTRAP_TOKEN_KEY, CREDENTIAL_HASH_KEY,
    MIN_BOOTSTRAP_TOKEN_BYTES, hex,
};

/// SHA-256 of a token.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenHash([u8; 32]);

impl TokenHash {
    pub fn of(token: &str) -> TokenHash {
        let mut out = [0u8; 32];
        out.copy_from_slice(digest::digest(&digest::SHA256, token.as_bytes()).as_ref());
        TokenHash(out)
    }

    pub fn to_hex(self) -> String {
        hex(&self.0)
    }

    pub fn from_hex(text: &str) -> Option<TokenHash> {
        let text = text.trim();
        if text.len() != 64 || !text.is_ascii() {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(TokenHash(out))
    }
}

impl std::fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Only a prefix: enough to tell two apart in a log, not to look one up.
        write!(f, "TokenHash({}…)", &self.to_hex()[..8])
    }
}

/// The token of an `Authorization: Bearer <token>` header value, if it is one.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let (scheme, token) = header?.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Name of the Secret holding cluster `cluster`'s credential hash.
pub fn credential_secret_name(cluster: &str) -> String {
    format!("cluster-{cluster}-credential")
}

fn secret_data<'a>(secret: &'a Secret, key: &str) -> Option<&'a [u8]> {
    secret
        .data
        .as_ref()?
        .get(key)
        .map(|b| b.0.as_slice())
        .filter(|b| !b.is_empty())
}

fn secret_text(secret: &Secret, key: &str) -> Option<String> {
    secret_data(secret, key).map(|b| String::from_utf8_lossy(b).trim().to_string())
}

/// One bootstrap token as read from its Secret.
#[derive(Debug, Clone, PartialEq)]
pub struct BootstrapToken {
    /// The Secret's name (for logs and errors; never the token).
    pub name: String,
    pub hash: TokenHash,
    pub expiration: Option<Timestamp>,
    /// The only cluster the token may register, when set.
    pub cluster_name: Option<String>,
}

impl BootstrapToken {
    /// Reads a bootstrap token Secret; `Err` says why it is unusable.
    pub fn from_secret(secret: &Secret) -> Result<BootstrapToken, String> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let token = secret_data(secret, BOOTSTRAP_TOKEN_KEY)
            .ok_or_else(|| format!("bootstrap token Secret {name} has no data.token"))?;
        let token = std::str::from_utf8(token)
            .map_err(|_| format!("bootstrap token Secret {name}: data.token is not UTF-8"))?
            .trim();
        if token.len() < MIN_BOOTSTRAP_TOKEN_BYTES {
            return Err(format!(
                "bootstrap token Secret {name}: data.token has {} bytes, at least {MIN_BOOTSTRAP_TOKEN_BYTES} are required",
                token.len()
            ));
        }
        let expiration = match secret_text(secret, BOOTSTRAP_EXPIRATION_KEY) {
            None => None,
            Some(text) => Some(text.parse::<Timestamp>().map_err(|e| {
                format!("bootstrap token Secret {name}: data.expiration {text:?} is not an RFC 3339 time: {e}")
            })?),
        };
        Ok(BootstrapToken {
            name,
            hash: TokenHash::of(token),
            expiration,
            cluster_name: secret_text(secret, BOOTSTRAP_CLUSTER_NAME_KEY),
        })
    }
}

/// Why a bootstrap token does not let `cluster` register.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BootstrapRefusal {
    #[error("the bootstrap token is not known to the hub")]
    Unknown,
    #[error("bootstrap token {name} expired at {expiration}")]
    Expired { name: String, expiration: String },
    #[error("bootstrap token {name} only registers cluster {bound}, not {cluster}")]
    OtherCluster {
        name: String,
        bound: String,
        cluster: String,
    },
}

/// The known bootstrap token that `presented` is. Unusable Secrets are skipped.
pub fn find_bootstrap<'a>(
    tokens: impl IntoIterator<Item = &'a Secret>,
    presented: &str,
) -> Result<BootstrapToken, BootstrapRefusal> {
    let hash = TokenHash::of(presented);
    tokens
        .into_iter()
        .filter_map(|s| BootstrapToken::from_secret(s).ok())
        .find(|t| t.hash == hash)
        .ok_or(BootstrapRefusal::Unknown)
}

impl BootstrapToken {
    /// Whether this token lets `cluster` register at `now`.
    pub fn permits(&self, cluster: &str, now: Timestamp) -> Result<(), BootstrapRefusal> {
        if let Some(expiration) = self.expiration
            && expiration <= now
        {
            return Err(BootstrapRefusal::Expired {
                name: self.name.clone(),
                expiration: expiration.to_string(),
            });
        }
        if let Some(bound) = &self.cluster_name
            && bound != cluster
        {
            return Err(BootstrapRefusal::OtherCluster {
                name: self.name.clone(),
                bound: bound.clone(),
                cluster: cluster.to_string(),
            });
        }
        Ok(())
    }
}

/// What a registration presents as its bearer token.
#[derive(Debug, Clone, PartialEq)]
pub enum Registrant {
    /// The current credential of `cluster` (an agent re-registering itself: a rotation).
    Credential { cluster: String },
    /// A bootstrap token.
    Bootstrap(BootstrapToken),
}

/// Why a registrant may not register a cluster.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterRefusal {
    #[error(transparent)]
    Bootstrap(#[from] BootstrapRefusal),
    #[error("the credential of cluster {own} cannot register cluster {cluster}")]
    OtherClustersCredential { own: String, cluster: String },
    #[error(
        "cluster {cluster} is already registered (its agent holds a live credential) and \
         bootstrap token {token} is not bound to it: a bootstrap token without a cluster-name only \
         registers new clusters. Register with the cluster's current credential, or with a \
         bootstrap token bound to {cluster} (`lifeboatctl join {cluster}`), or revoke the \
         credential first (delete Secret {secret} in the hub's namespace)"
    )]
    AlreadyRegistered {
        cluster: String,
        token: String,
        secret: String,
    },
    #[error(
        "cluster {cluster} is not registered on the hub (its Cluster is gone): register with a \
         bootstrap token"
    )]
    ClusterGone { cluster: String },
}

impl RegisterRefusal {
    /// Whether the refusal is about the credential itself (401) rather than what it may do (403).
    pub fn is_unauthorized(&self) -> bool {
        matches!(
            self,
            RegisterRefusal::Bootstrap(
                BootstrapRefusal::Unknown | BootstrapRefusal::Expired { .. }
            ) | RegisterRefusal::ClusterGone { .. }
        )
    }
}

impl Registrant {
    /// What the token alone says about registering `cluster` at `now` (expired, bound to
    /// another cluster, another cluster's credential), before the cluster's state is read.
    pub fn may_name(&self, cluster: &str, now: Timestamp) -> Result<(), RegisterRefusal> {
        match self {
            Registrant::Credential { cluster: own } if own != cluster => {
                Err(RegisterRefusal::OtherClustersCredential {
                    own: own.clone(),
                    cluster: cluster.to_string(),
                })
            }
            Registrant::Credential { .. } => Ok(()),
            Registrant::Bootstrap(token) => Ok(token.permits(cluster, now)?),
        }
    }

    /// Whether this registrant may register `cluster` at `now`. `registered`: the Cluster
    /// exists and holds a live credential, so registering it replaces (revokes) that
    /// credential: only that credential itself or a bootstrap token bound to the cluster's name
    /// may do so. An unbound bootstrap token registers new clusters only (it would otherwise
    /// take over any cluster); a credential only re-registers its own, existing, Cluster.
    pub fn may_register(
        &self,
        cluster: &str,
        registered: bool,
        now: Timestamp,
    ) -> Result<(), RegisterRefusal> {
        self.may_name(cluster, now)?;
        match self {
            Registrant::Credential { .. } if !registered => Err(RegisterRefusal::ClusterGone {
                cluster: cluster.to_string(),
            }),
            Registrant::Bootstrap(token) if registered && token.cluster_name.is_none() => {
                Err(RegisterRefusal::AlreadyRegistered {
                    cluster: cluster.to_string(),
                    token: token.name.clone(),
                    secret: credential_secret_name(cluster),
                })
            }
            _ => Ok(()),
        }
    }

    /// For logs: the bootstrap token's Secret, or "current credential".
    pub fn describe(&self) -> String {
        match self {
            Registrant::Credential { .. } => "the cluster's current credential".to_string(),
            Registrant::Bootstrap(token) => format!("bootstrap token {}", token.name),
        }
    }
}

/// A cluster credential as read from its Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCredential {
    pub cluster: String,
    pub hash: TokenHash,
}

impl StoredCredential {
    /// Reads a credential Secret; `None` when it is not a well-formed one (its name must be the
    /// one of the cluster its label names).
    pub fn from_secret(secret: &Secret) -> Option<StoredCredential> {
        let cluster = secret.metadata.labels.as_ref()?.get(CLUSTER_NAME_LABEL)?;
        if secret.metadata.name.as_deref() != Some(credential_secret_name(cluster).as_str()) {
            return None;
        }
        let hash = TokenHash::from_hex(&secret_text(secret, CREDENTIAL_HASH_KEY)?)?;
        Some(StoredCredential {
            cluster: cluster.clone(),
            hash,
        })
    }
}

#[derive(Default)]
struct IndexState {
    /// Secret name → its credential.
    by_secret: HashMap<String, StoredCredential>,
    /// Digest → cluster.
    by_hash: HashMap<TokenHash, String>,
    /// Secrets seen since the watch (re)started its initial listing.
    relisting: Option<HashMap<String, StoredCredential>>,
}

impl IndexState {
    fn rebuild_hashes(&mut self) {
        self.by_hash = self
            .by_secret
            .values()
            .map(|c| (c.hash, c.cluster.clone()))
            .collect();
    }
}

/// Cluster credentials by digest, fed by a watch on the credential Secrets (linkerd's
/// index-fed-by-watch pattern): a request authenticates without any call to the apiserver.
pub struct CredentialIndex {
    state: RwLock<IndexState>,
    /// Bumped on every change, so registration can wait until its new credential is live.
    generation: watch::Sender<u64>,
    ready: watch::Sender<bool>,
}

impl Default for CredentialIndex {
    fn default() -> Self {
        CredentialIndex {
            state: RwLock::new(IndexState::default()),
            generation: watch::channel(0).0,
            ready: watch::channel(false).0,
        }
    }
}

impl CredentialIndex {
    /// The cluster whose credential has digest `hash`.
    pub fn cluster_of(&self, hash: &TokenHash) -> Option<String> {
        self.read().by_hash.get(hash).cloned()
    }

    /// Whether `cluster` has a live credential.
    pub fn has_credential(&self, cluster: &str) -> bool {
        self.read()
            .by_secret
            .get(&credential_secret_name(cluster))
            .is_some_and(|c| c.cluster == cluster)
    }

    /// A receiver that sees every change of the index.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Whether the first listing is in.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until the first listing is in, at most `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let mut ready = self.ready.subscribe();
        tokio::time::timeout(timeout, ready.wait_for(|r| *r))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Waits until `cluster`'s credential is `hash`, at most `timeout`.
    pub async fn wait_for(&self, cluster: &str, hash: TokenHash, timeout: Duration) -> bool {
        let mut generation = self.generation.subscribe();
        let live = || self.cluster_of(&hash).as_deref() == Some(cluster);
        tokio::time::timeout(timeout, async {
            loop {
                generation.borrow_and_update();
                if live() {
                    return true;
                }
                if generation.changed().await.is_err() {
                    return false;
                }
            }
        })
        .await
        .unwrap_or(false)
    }

    /// Folds one watch event in.
    pub fn apply(&self, event: watcher::Event<Secret>) {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Init => state.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(secret) => {
                if let (Some(name), Some(credential)) = (
                    secret.metadata.name.clone(),
                    StoredCredential::from_secret(&secret),
                ) {
                    state
                        .relisting
                        .get_or_insert_with(HashMap::new)
                        .insert(name, credential);
                }
                return;
            }
            watcher::Event::InitDone => {
                state.by_secret = state.relisting.take().unwrap_or_default();
                self.ready.send_replace(true);
            }
            watcher::Event::Apply(secret) => {
                let Some(name) = secret.metadata.name.clone() else {
                    return;
                };
                match StoredCredential::from_secret(&secret) {
                    Some(credential) => state.by_secret.insert(name, credential),
                    None => {
                        tracing::warn!(secret = %name, "ignoring a malformed cluster credential Secret");
                        state.by_secret.remove(&name)
                    }
                };
            }
            watcher::Event::Delete(secret) => {
                if let Some(name) = &secret.metadata.name {
                    state.by_secret.remove(name);
                }
            }
        }
        state.rebuild_hashes();
        drop(state);
        self.generation.send_modify(|g| *g += 1);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, IndexState> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use kube::api::ObjectMeta;
    use std::collections::BTreeMap;

    fn secret(name: &str, labels: &[(&str, &str)], data: &[(&str, &str)]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        }
    }

    const TOKEN: &str = "0123456789abcdef0123456789abcdef-bootstrap";

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn hashes_round_trip_through_hex_and_match_sha256() {
        let hash = TokenHash::of("abc");
        assert_eq!(
            hash.to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(TokenHash::from_hex(&hash.to_hex()), Some(hash));
        assert_eq!(TokenHash::from_hex("ba78"), None);
        assert_eq!(TokenHash::from_hex(&"zz".repeat(32)), None);
        assert!(!format!("{hash:?}").contains(&hash.to_hex()));
    }

    #[test]
    fn bearer_tokens_are_parsed_from_the_header() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(Some("Bearer")), None);
        assert_eq!(bearer(None), None);
    }

    fn check_bootstrap<'a>(
        tokens: impl IntoIterator<Item = &'a Secret>,
        presented: &str,
        cluster: &str,
        now: Timestamp,
    ) -> Result<BootstrapToken, BootstrapRefusal> {
        let token = find_bootstrap(tokens, presented)?;
        token.permits(cluster, now)?;
        Ok(token)
    }

    #[test]
    fn bootstrap_tokens_are_checked_for_expiry_and_cluster() {
        let now = at("2026-05-01T12:00:00Z");
        let open = secret("open", &[], &[("token", TOKEN)]);
        let result = check_bootstrap([&open], TOKEN, "gpu-east", now).unwrap();
        assert_eq!(result.name, "open");
        assert_eq!(
            check_bootstrap(
                [&open],
                "another-token-of-enough-length-xxxxxxxx",
                "gpu-east",
                now
            ),
            Err(BootstrapRefusal::Unknown)
        );

        let expired = secret(
            "old",
            &[],
            &[("token", TOKEN), ("expiration", "2026-05-01T11:59:59Z")],
        );
        let err = check_bootstrap([&expired], TOKEN, "gpu-east", now).unwrap_err();
        assert!(matches!(err, BootstrapRefusal::Expired { .. }));
        assert!(err.to_string().contains("2026-05-01T11:59:59Z"), "{err}");
        let later = secret(
            "later",
            &[],
            &[("token", TOKEN), ("expiration", "2026-05-02T00:00:00Z")],
        );
        assert!(check_bootstrap([&later], TOKEN, "gpu-east", now).is_ok());

        let bound = secret(
            "bound",
            &[],
            &[("token", TOKEN), ("cluster-name", "gpu-west")],
        );
        let err = check_bootstrap([&bound], TOKEN, "gpu-east", now).unwrap_err();
        assert_eq!(
            err.to_string(),
            "bootstrap token bound only registers cluster gpu-west, not gpu-east"
        );
        assert!(check_bootstrap([&bound], TOKEN, "gpu-west", now).is_ok());
    }

    #[test]
    fn only_the_own_credential_or_a_bound_token_registers_a_registered_cluster() {
        let now = at("2026-05-01T12:00:00Z");
        let unbound = Registrant::Bootstrap(
            BootstrapToken::from_secret(&secret("any", &[], &[("token", TOKEN)])).unwrap(),
        );
        let bound = Registrant::Bootstrap(
            BootstrapToken::from_secret(&secret(
                "join-a",
                &[],
                &[("token", TOKEN), ("cluster-name", "a")],
            ))
            .unwrap(),
        );
        let own = Registrant::Credential {
            cluster: "a".into(),
        };
        // A new name: any bootstrap token that permits it.
        assert_eq!(unbound.may_register("a", false, now), Ok(()));
        assert_eq!(bound.may_register("a", false, now), Ok(()));
        // A registered name: its own credential or a token bound to it; never an unbound one.
        assert_eq!(own.may_register("a", true, now), Ok(()));
        assert_eq!(bound.may_register("a", true, now), Ok(()));
        let refusal = unbound.may_register("a", true, now).unwrap_err();
        assert!(!refusal.is_unauthorized(), "a 403: {refusal}");
        let message = refusal.to_string();
        for needle in [
            "cluster a is already registered",
            "bootstrap token any is not bound",
            "lifeboatctl join a",
            "cluster-a-credential",
        ] {
            assert!(message.contains(needle), "{needle:?} in {message}");
        }
        // A credential acts for its own cluster only, and only while that Cluster exists.
        let other = own.may_register("b", true, now).unwrap_err();
        assert!(!other.is_unauthorized());
        assert_eq!(
            other.to_string(),
            "the credential of cluster a cannot register cluster b"
        );
        assert!(
            own.may_register("a", false, now)
                .unwrap_err()
                .is_unauthorized()
        );
        // The token's own limits come first: bound elsewhere (403), expired (401).
        assert!(matches!(
            bound.may_name("b", now),
            Err(RegisterRefusal::Bootstrap(
                BootstrapRefusal::OtherCluster { .. }
            ))
        ));
        let expired = Registrant::Bootstrap(
            BootstrapToken::from_secret(&secret(
                "old",
                &[],
                &[("token", TOKEN), ("expiration", "2026-05-01T11:00:00Z")],
            ))
            .unwrap(),
        );
        assert!(
            expired
                .may_register("a", false, now)
                .unwrap_err()
                .is_unauthorized()
        );
    }

    #[test]
    fn unusable_bootstrap_secrets_are_refused_with_why() {
        let short = secret("short", &[], &[("token", "tooshort")]);
        assert!(
            BootstrapToken::from_secret(&short)
                .unwrap_err()
                .contains("at least 32")
        );
        let bad_time = secret("t", &[], &[("token", TOKEN), ("expiration", "tomorrow")]);
        assert!(
            BootstrapToken::from_secret(&bad_time)
                .unwrap_err()
                .contains("RFC 3339")
        );
        // an unusable Secret never matches, even with the right token
        assert_eq!(
            check_bootstrap([&bad_time], TOKEN, "c", at("2026-01-01T00:00:00Z")),
            Err(BootstrapRefusal::Unknown)
        );
    }

    fn credential(cluster: &str, token: &str) -> Secret {
        secret(
            &credential_secret_name(cluster),
            &[(CLUSTER_NAME_LABEL, cluster)],
            &[(CREDENTIAL_HASH_KEY, &TokenHash::of(token).to_hex())],
        )
    }

    #[test]
    fn the_index_follows_the_watch() {
        let index = CredentialIndex::default();
        assert!(!index.is_ready());
        index.apply(watcher::Event::Init);
        index.apply(watcher::Event::InitApply(credential("a", "token-a")));
        // not visible before the listing is complete
        assert_eq!(index.cluster_of(&TokenHash::of("token-a")), None);
        index.apply(watcher::Event::InitDone);
        assert!(index.is_ready());
        assert_eq!(
            index.cluster_of(&TokenHash::of("token-a")).as_deref(),
            Some("a")
        );

        // rotation: the new token works, the old one does not
        index.apply(watcher::Event::Apply(credential("a", "token-a2")));
        assert_eq!(index.cluster_of(&TokenHash::of("token-a")), None);
        assert_eq!(
            index.cluster_of(&TokenHash::of("token-a2")).as_deref(),
            Some("a")
        );

        // a Secret whose name is not its label's cluster's is ignored
        let mut forged = credential("b", "token-b");
        forged.metadata.name = Some("cluster-a-credential-copy".into());
        index.apply(watcher::Event::Apply(forged));
        assert_eq!(index.cluster_of(&TokenHash::of("token-b")), None);

        assert!(index.has_credential("a"));
        assert!(!index.has_credential("b"));

        // revocation
        index.apply(watcher::Event::Delete(credential("a", "token-a2")));
        assert!(!index.has_credential("a"));
        assert_eq!(index.cluster_of(&TokenHash::of("token-a2")), None);

        // a relist drops what is gone
        index.apply(watcher::Event::Apply(credential("c", "token-c")));
        index.apply(watcher::Event::Init);
        index.apply(watcher::Event::InitDone);
        assert_eq!(index.cluster_of(&TokenHash::of("token-c")), None);
    }

    #[tokio::test]
    async fn registration_can_wait_for_its_credential() {
        let index = std::sync::Arc::new(CredentialIndex::default());
        let hash = TokenHash::of("token-a");
        assert!(!index.wait_for("a", hash, Duration::from_millis(20)).await);
        let feeder = index.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            feeder.apply(watcher::Event::Apply(credential("a", "token-a")));
        });
        assert!(index.wait_for("a", hash, Duration::from_secs(5)).await);
    }
}
