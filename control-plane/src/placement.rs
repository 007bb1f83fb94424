//! The seam between the binder and the scheduler: where a binding should run, given the
//! clusters, or why it cannot run anywhere.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use lifeboat_api::binding::{ClusterRejection, ResourceBinding, TargetCluster};
use lifeboat_api::cluster::Cluster;

/// Nothing fits: a summary for the `Scheduled` condition and a reason per rejected cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unschedulable {
    pub summary: String,
    pub rejections: Vec<ClusterRejection>,
}

/// Chooses the clusters of a binding.
pub trait Placer: Send + Sync {
    /// The target clusters (with replicas) of `binding` among `clusters`.
    fn place(
        &self,
        binding: &ResourceBinding,
        clusters: &[Arc<Cluster>],
        now: &Time,
    ) -> Result<Vec<TargetCluster>, Unschedulable>;
}
