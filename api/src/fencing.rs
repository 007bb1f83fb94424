//! Names of the fencing credential: what the agent creates in its member cluster so that the hub
//! can delete (and only delete) what Lifeboat placed there, and how the hub keeps it.
//!
//! At most one copy of a `Directly` workload: when a cluster is lost, the hub creates the new copy
//! only on evidence that the old one no longer runs. While the agent is dead or cut off it cannot
//! give that evidence, so it gives the hub, ahead of time, a credential for its member's
//! kube-apiserver: the ServiceAccount [`SERVICE_ACCOUNT`], bound to the ClusterRole
//! [`CLUSTER_ROLE`] that grants only `delete`, and a ValidatingAdmissionPolicy
//! ([`ADMISSION_POLICY`]) that refuses that ServiceAccount any object without the binding labels
//! the agent puts on what it applies.

/// The ServiceAccount (in the agent's namespace) whose token is the credential.
pub const SERVICE_ACCOUNT: &str = "lifeboat-fencer";
/// The Secret (type `kubernetes.io/service-account-token`, in the agent's namespace) the member's
/// token controller fills with the ServiceAccount's token.
pub const TOKEN_SECRET: &str = "lifeboat-fencer-token";
/// ClusterRole and ClusterRoleBinding: `delete` on every resource, nothing else.
pub const CLUSTER_ROLE: &str = "lifeboat-fencer";
/// ValidatingAdmissionPolicy and its binding: the ServiceAccount may delete only objects that
/// carry [`crate::binding::LABEL_BINDING_NAME`].
pub const ADMISSION_POLICY: &str = "lifeboat-fencer.lifeboat.dev";

/// On the hub: the Secret type of a cluster's fencing credential (one per cluster, in the hub's
/// namespace, owned by the Cluster).
pub const CREDENTIAL_SECRET_TYPE: &str = "lifeboat.dev/fencing-credential";
/// Its keys.
pub const KEY_SERVER: &str = "server";
pub const KEY_CA: &str = "ca.crt";
pub const KEY_TOKEN: &str = "token";
pub const KEY_DIGEST: &str = "digest";

/// The hub's Secret holding cluster `cluster`'s fencing credential.
pub fn credential_secret_name(cluster: &str) -> String {
    format!("cluster-{cluster}-fencing")
}
