//! The names the hub shares with its agents and with `lifeboatctl` (the bootstrap-token and
//! credential Secrets, each cluster's Lease and the annotation the heartbeat handler keeps on
//! it). They are the contract, so they live in `lifeboat-api`; this module gathers them for the
//! agent API and the cluster health monitor, which both use them.

pub use lifeboat_api::cluster::{
    ANNOTATION_MEMBER_API_UNREACHABLE_SINCE, CLUSTER_NAME_LABEL, lease_name,
};
pub use lifeboat_api::credentials::{
    BOOTSTRAP_CLUSTER_NAME_KEY, BOOTSTRAP_EXPIRATION_KEY, BOOTSTRAP_TOKEN_KEY,
    BOOTSTRAP_TOKEN_TYPE, CLUSTER_CREDENTIAL_TYPE, CREDENTIAL_HASH_KEY,
};
