//! Lifeboat's hub scheduler, as pure functions over a snapshot: no IO, no kube client, no
//! async. The hub builds a [`Snapshot`] of every `Cluster` once per scheduling round, a
//! [`SchedulingRequest`] from each `ResourceBinding`, and calls [`Scheduler::schedule`]; it
//! writes the result to `spec.clusters` and the `Scheduled` condition, or the [`FitError`]'s
//! summary and per-cluster rejections to the condition and `status.rejectedClusters`.
//!
//! A decision runs, per cluster, the enabled Filter plugins (ClusterAffinity,
//! SpreadConstraint, TaintToleration, APIEnablement, ClusterEviction, GangFit), then the Score
//! plugins (ClusterLocality, AvailableCapacity, CapacityType) weighted by configuration; then
//! picks clusters: a gang workload goes whole to exactly one cluster; others are Duplicated
//! (every cluster the spread constraints select runs all replicas) or Divided (static weights,
//! dynamic weights by available replicas, or Aggregated), by Karmada's rules.
//!
//! ```
//! # use lifeboat_scheduler::*;
//! # fn demo(clusters: &[lifeboat_api::cluster::Cluster],
//! #         binding: &lifeboat_api::binding::ResourceBinding) -> Result<(), Box<dyn std::error::Error>> {
//! let scheduler = Scheduler::new(&SchedulerConfig::from_flags("*", "AvailableCapacity=2")?);
//! let snapshot = Snapshot::from_clusters(clusters);
//! let now = k8s_openapi::jiff::Timestamp::now();
//! let request = SchedulingRequest::from_binding(binding, None, now)?;
//! match scheduler.schedule(&request, &snapshot) {
//!     Ok(result) => println!("{:?}", result.clusters),
//!     Err(fit) => println!("{} ({} rejections)", fit.summary, fit.rejections.len()),
//! }
//! # Ok(()) }
//! ```

pub mod assign;
pub mod config;
pub mod fit;
pub mod plugins;
pub mod quantity;
pub mod request;
pub mod select;
pub mod selector;
pub mod snapshot;

mod scheduler;

pub use config::{ConfigError, SchedulerConfig};
pub use fit::{FitEstimate, FitFailure};
pub use plugins::{Candidate, FilterPlugin, Rejection, ScorePlugin};
pub use request::{RequestError, SchedulingRequest};
pub use scheduler::{
    CLUSTER_STATUS, ClusterScore, FitError, REPLICA_SCHEDULING, SPREAD_CONSTRAINT, ScheduleResult,
    Scheduler,
};
pub use snapshot::{ClusterSnapshot, Snapshot};

#[cfg(test)]
mod tests;
