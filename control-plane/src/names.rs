//! The names the hub shares with its agents and with `lifeboatctl`: the bootstrap-token and
//! credential Secrets (types, data keys, the cluster label), each cluster's Lease and the
//! annotation the heartbeat handler keeps on it. Below the agent API and the cluster health
//! monitor, which both use them.

/// Secret type of bootstrap tokens.
pub const BOOTSTRAP_TOKEN_TYPE: &str = "lifeboat.dev/bootstrap-token";
/// Secret type of the stored hash of a cluster token.
pub const CLUSTER_CREDENTIAL_TYPE: &str = "lifeboat.dev/cluster-credential";
/// Label naming the cluster a credential (or Lease) belongs to.
pub const CLUSTER_NAME_LABEL: &str = "cluster.lifeboat.dev/name";
/// Bootstrap token data keys.
pub const BOOTSTRAP_TOKEN_KEY: &str = "token";
pub const BOOTSTRAP_EXPIRATION_KEY: &str = "expiration";
pub const BOOTSTRAP_CLUSTER_NAME_KEY: &str = "cluster-name";
/// Credential data key: the hex SHA-256 of the cluster token.
pub const CREDENTIAL_HASH_KEY: &str = "token-sha256";
/// Annotation on a cluster's Lease while its agent reports that the member's kube-apiserver has
/// not answered it: since when (RFC 3339, the hub's clock). Every heartbeat writes the Lease
/// (server-side apply): one that says so sets it, one that does not removes it.
pub const ANNOTATION_MEMBER_API_UNREACHABLE_SINCE: &str =
    "cluster.lifeboat.dev/member-api-unreachable-since";
/// Name of cluster `cluster`'s Lease in the hub namespace.
pub fn lease_name(cluster: &str) -> String {
    format!("cluster-{cluster}")
}
