//! The plugin traits and the in-tree plugins.
//!
//! A Filter plugin says whether a cluster can take the workload at all and, if not, why; a
//! Score plugin rates a cluster that passed every filter, 0..=100. Plugins see the request and
//! a [`Candidate`]: the cluster's snapshot plus what fitting the request into it found,
//! computed at most once per cluster and decision, only when a plugin asks.

use std::borrow::Cow;
use std::cell::{OnceCell, RefCell};

use crate::fit::{self, FitEstimate, Scratch};
use crate::request::SchedulingRequest;
use crate::snapshot::ClusterSnapshot;

mod api_enablement;
mod available_capacity;
mod capacity_type;
mod cluster_affinity;
mod cluster_eviction;
mod cluster_locality;
mod gang_fit;
mod spread_constraint;
mod taint_toleration;

pub use api_enablement::ApiEnablement;
pub use available_capacity::AvailableCapacity;
pub use capacity_type::CapacityTypePreference;
pub use cluster_affinity::ClusterAffinity;
pub use cluster_eviction::ClusterEviction;
pub use cluster_locality::ClusterLocality;
pub use gang_fit::GangFit;
pub use spread_constraint::SpreadConstraint;
pub use taint_toleration::{TaintToleration, untolerated_no_execute};

/// Why a filter turned a cluster down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// For this cluster, with its particulars (which taint, until when, how many GPUs).
    pub reason: String,
    /// The same for counting clusters alike, Karmada style: `cluster(s) had untolerated taint
    /// {key: value}`. Clusters with equal summaries are counted together in the FitError.
    pub summary: Cow<'static, str>,
}

impl Rejection {
    pub fn new(reason: impl Into<String>, summary: impl Into<Cow<'static, str>>) -> Rejection {
        Rejection {
            reason: reason.into(),
            summary: summary.into(),
        }
    }
}

thread_local! {
    /// Packing buffers, reused by every decision made on this thread.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// A cluster being considered for one request.
pub struct Candidate<'a> {
    pub cluster: &'a ClusterSnapshot,
    request: &'a SchedulingRequest,
    /// Replicas in `spec.clusters`, when the cluster is there.
    current: Option<i32>,
    fit: OnceCell<FitEstimate>,
}

impl<'a> Candidate<'a> {
    pub fn new(request: &'a SchedulingRequest, cluster: &'a ClusterSnapshot) -> Candidate<'a> {
        Candidate {
            cluster,
            request,
            current: request.current_replicas(&cluster.name),
            fit: OnceCell::new(),
        }
    }

    /// A candidate whose fit was already computed (explaining a rejection after the fact).
    pub(crate) fn with_fit(
        request: &'a SchedulingRequest,
        cluster: &'a ClusterSnapshot,
        fit: Option<FitEstimate>,
    ) -> Candidate<'a> {
        let candidate = Candidate::new(request, cluster);
        if let Some(fit) = fit {
            let _ = candidate.fit.set(fit);
        }
        candidate
    }

    /// The fit, if it has been computed.
    pub(crate) fn fit_if_known(&self) -> Option<FitEstimate> {
        self.fit.get().copied()
    }

    /// Whether the cluster is in the binding's `spec.clusters`.
    pub fn is_current(&self) -> bool {
        self.current.is_some()
    }

    /// The replicas the binding has in this cluster now (0 when it is not there).
    pub fn current_replicas(&self) -> i32 {
        self.current.unwrap_or(0)
    }

    /// Fitting the request into this cluster, node by node (computed on first use).
    pub fn fit(&self) -> &FitEstimate {
        self.fit.get_or_init(|| {
            SCRATCH.with(|scratch| {
                fit::estimate(self.request, self.cluster, &mut scratch.borrow_mut())
            })
        })
    }
}

/// A Filter plugin.
pub trait FilterPlugin: Send + Sync {
    fn name(&self) -> &'static str;

    /// Whether the cluster can take the workload, and if not, why.
    fn filter(
        &self,
        request: &SchedulingRequest,
        candidate: &Candidate<'_>,
    ) -> Result<(), Rejection>;

    /// The same verdict as [`filter`](Self::filter) without building the reason: what the
    /// scheduler calls for every cluster of every decision. Reasons are built only for the
    /// clusters of a decision that fails, or when asked ([`Scheduler::explain`]).
    ///
    /// [`Scheduler::explain`]: crate::Scheduler::explain
    fn passes(&self, request: &SchedulingRequest, candidate: &Candidate<'_>) -> bool {
        self.filter(request, candidate).is_ok()
    }
}

/// A Score plugin: 0..=100, higher is better; the scheduler multiplies by the plugin's weight.
pub trait ScorePlugin: Send + Sync {
    fn name(&self) -> &'static str;
    fn score(&self, request: &SchedulingRequest, candidate: &Candidate<'_>) -> i64;
}

/// Filter plugin names, in the order they run (cheap first, GangFit last).
pub const FILTER_PLUGINS: [&str; 6] = [
    ClusterAffinity::NAME,
    SpreadConstraint::NAME,
    TaintToleration::NAME,
    ApiEnablement::NAME,
    ClusterEviction::NAME,
    GangFit::NAME,
];

/// Score plugin names.
pub const SCORE_PLUGINS: [&str; 3] = [
    ClusterLocality::NAME,
    AvailableCapacity::NAME,
    CapacityTypePreference::NAME,
];

/// The in-tree filter plugin of that name.
pub fn filter_plugin(name: &str) -> Option<Box<dyn FilterPlugin>> {
    Some(match name {
        ClusterAffinity::NAME => Box::new(ClusterAffinity),
        SpreadConstraint::NAME => Box::new(SpreadConstraint),
        TaintToleration::NAME => Box::new(TaintToleration),
        ApiEnablement::NAME => Box::new(ApiEnablement),
        ClusterEviction::NAME => Box::new(ClusterEviction),
        GangFit::NAME => Box::new(GangFit),
        _ => return None,
    })
}

/// The in-tree score plugin of that name.
pub fn score_plugin(name: &str) -> Option<Box<dyn ScorePlugin>> {
    Some(match name {
        ClusterLocality::NAME => Box::new(ClusterLocality),
        AvailableCapacity::NAME => Box::new(AvailableCapacity),
        CapacityTypePreference::NAME => Box::new(CapacityTypePreference),
        _ => return None,
    })
}

#[cfg(test)]
pub(crate) mod testing {
    //! Clusters and bindings for plugin tests, from JSON as the hub reads them.

    use k8s_openapi::jiff::Timestamp;
    use lifeboat_api::binding::ResourceBinding;
    use lifeboat_api::cluster::Cluster;
    use serde_json::{Value, json};

    use super::*;

    pub fn now() -> Timestamp {
        "2026-11-23T10:00:00Z".parse().unwrap()
    }

    /// A Ready cluster serving apps/v1 Deployments and AppWrappers; `spec` and `status` are
    /// merged over that.
    pub fn cluster(name: &str, spec: Value, status: Value) -> ClusterSnapshot {
        let mut base_status = json!({
            "conditions": [{"type": "Ready", "status": "True", "reason": "ClusterReady",
                            "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "apiEnablements": [
                {"groupVersion": "apps/v1", "resources": [{"name": "deployments", "kind": "Deployment"}]},
                {"groupVersion": "workload.codeflare.dev/v1beta2",
                 "resources": [{"name": "appwrappers", "kind": "AppWrapper"}]}
            ],
            "nodeGroups": [{"count": 4, "free": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "8"}}]
        });
        merge(&mut base_status, status);
        let c: Cluster = serde_json::from_value(json!({
            "apiVersion": "cluster.lifeboat.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": name, "labels": {"name": name}},
            "spec": spec, "status": base_status
        }))
        .unwrap();
        ClusterSnapshot::from_cluster(&c)
    }

    fn merge(base: &mut Value, over: Value) {
        if let (Value::Object(b), Value::Object(o)) = (base, over) {
            for (k, v) in o {
                b.insert(k, v);
            }
        }
    }

    /// A Deployment binding with `spec` merged over a 2-replica, 1-CPU default.
    pub fn deployment(spec: Value) -> SchedulingRequest {
        let mut base = json!({
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "web",
                         "name": "web", "uid": "9f0c6a52-0b7a-4d51-a3a4-8f1e2d7c5b10"},
            "replicas": 2,
            "replicaRequirements": {"resourceRequest": {"cpu": "1"}}
        });
        merge(&mut base, spec);
        request(base)
    }

    pub fn request(spec: Value) -> SchedulingRequest {
        let rb: ResourceBinding = serde_json::from_value(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "b", "namespace": "ml"},
            "spec": spec
        }))
        .unwrap();
        SchedulingRequest::from_binding(&rb, None, now()).unwrap()
    }

    /// Runs `filter` and checks that `passes` agrees with it.
    pub fn run_filter(
        plugin: &dyn FilterPlugin,
        request: &SchedulingRequest,
        cluster: &ClusterSnapshot,
    ) -> Result<(), Rejection> {
        let verdict = plugin.filter(request, &Candidate::new(request, cluster));
        assert_eq!(
            plugin.passes(request, &Candidate::new(request, cluster)),
            verdict.is_ok(),
            "{}: passes() disagrees with filter() on {}: {verdict:?}",
            plugin.name(),
            cluster.name
        );
        verdict
    }

    pub fn run_score(
        plugin: &dyn ScorePlugin,
        request: &SchedulingRequest,
        cluster: &ClusterSnapshot,
    ) -> i64 {
        plugin.score(request, &Candidate::new(request, cluster))
    }
}
