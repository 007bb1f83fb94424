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

/// The [`Placer`] of the running hub: Lifeboat's scheduler plugins over a snapshot of the
/// clusters. The snapshot is rebuilt only when a cluster changed (by name and resourceVersion),
/// so a burst of bindings shares one.
pub struct SchedulerPlacer {
    scheduler: lifeboat_scheduler::Scheduler,
    snapshot: std::sync::Mutex<Option<CachedSnapshot>>,
}

struct CachedSnapshot {
    versions: Vec<(String, String)>,
    snapshot: Arc<lifeboat_scheduler::Snapshot>,
}

impl SchedulerPlacer {
    pub fn new(config: &lifeboat_scheduler::SchedulerConfig) -> SchedulerPlacer {
        SchedulerPlacer {
            scheduler: lifeboat_scheduler::Scheduler::new(config),
            snapshot: std::sync::Mutex::new(None),
        }
    }

    fn snapshot(&self, clusters: &[Arc<Cluster>]) -> Arc<lifeboat_scheduler::Snapshot> {
        let mut versions: Vec<(String, String)> = clusters
            .iter()
            .map(|c| {
                (
                    c.metadata.name.clone().unwrap_or_default(),
                    c.metadata.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect();
        versions.sort();
        let mut cached = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = cached.as_ref()
            && c.versions == versions
        {
            return c.snapshot.clone();
        }
        let snapshot = Arc::new(lifeboat_scheduler::Snapshot::from_clusters(
            clusters.iter().map(|c| c.as_ref()),
        ));
        *cached = Some(CachedSnapshot {
            versions,
            snapshot: snapshot.clone(),
        });
        snapshot
    }
}

impl Placer for SchedulerPlacer {
    fn place(
        &self,
        binding: &ResourceBinding,
        clusters: &[Arc<Cluster>],
        now: &Time,
    ) -> Result<Vec<TargetCluster>, Unschedulable> {
        let request = lifeboat_scheduler::SchedulingRequest::from_binding(binding, None, now.0)
            .map_err(|e| Unschedulable {
                summary: format!("the binding cannot be scheduled: {e}"),
                rejections: Vec::new(),
            })?;
        let snapshot = self.snapshot(clusters);
        self.scheduler
            .schedule(&request, &snapshot)
            .map(|result| result.clusters)
            .map_err(|fit| Unschedulable {
                summary: fit.summary,
                rejections: fit.rejections,
            })
    }
}
