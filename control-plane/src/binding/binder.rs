//! The binder: for each workload template on the hub, fetch (template, policies, binding,
//! clusters from the caches) → decide (policy, replicas, whether to schedule, where) → apply
//! (the binding's spec and its `Scheduled`/`PolicyBound` conditions, by server-side apply, only
//! when they change) → dispatch (the work of each target cluster into the [`WorkStore`]).
//!
//! Keyed by template, so a template, its policy and its binding are always decided together.
//! A binding is scheduled when it is new, when its placement, replicas or requirements change,
//! when one of its clusters is gone, when a reschedule is asked for, and — while it is not
//! scheduled — whenever the clusters change. Otherwise it stays where it is.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use lifeboat_api::binding::{
    self as api_binding, CONDITION_POLICY_BOUND, CONDITION_SCHEDULED, ClusterRejection,
    LABEL_POLICY_NAME, PolicyReference, REASON_NO_CLUSTER_FIT, REASON_SUCCESS, ResourceBinding,
    ResourceBindingSpec, TargetCluster,
};
use lifeboat_api::cluster::Cluster;
use lifeboat_api::policy::{AnyPolicy, ClusterPropagationPolicy, PropagationPolicy, PurgeMode};
use lifeboat_api::protocol::WorkKey;
use lifeboat_api::stages;
use serde_json::Value;
use tracing::Instrument;

use crate::binding::detector::{self, Replicas, TemplateKind, TemplateMeta};
use crate::binding::placement::{Placer, Unschedulable};
use crate::binding::templates::{TemplateKey, Templates};
use crate::failover::fencer::{FenceHandle, FenceRequest};
use crate::failover::phase::{self, EvictionRateLimiter};
use crate::failover::record::{FailoverRecorder, PassRecord};
use crate::failover::{self, AppliedReset};
use crate::interpreters::InterpreterHandle;
use crate::status::aggregate::condition;
use crate::status::handoff::{Decider, Handoff};
use crate::status::processor::SharedState;
use crate::work::dispatch;
use crate::work::store::WorkStore;
use lifeboat_runtime::kube_error::KubeError;
use lifeboat_runtime::queue::WorkQueue;

mod apply;
mod metrics;
mod pass;
mod plan;
mod queueing;

pub use metrics::*;
pub use plan::*;

/// Field manager of the binding spec (every spec field the hub decides).
pub const SPEC_MANAGER: &str = "lifeboat-hub";
/// Field manager of the scheduler's status fields.
pub const SCHEDULER_MANAGER: &str = "lifeboat-hub/scheduler";

/// Why one reconcile failed. Each has a low-cardinality metric label.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("kubernetes API ({context}): {0}", context = .0.context())]
    Kube(#[source] KubeError),
    #[error("the binding changed since it was read; retrying")]
    Conflict,
    #[error("interpreting the template: {0}")]
    Interpret(String),
    #[error("serializing {what}: {source}")]
    Serialization {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

impl BindError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            BindError::Kube(e) => e.metric_label(),
            BindError::Conflict => "conflict",
            BindError::Interpret(_) => "interpret",
            BindError::Serialization { .. } => "serialization",
        }
    }

    fn kube(context: &'static str, source: kube::Error) -> BindError {
        let error = KubeError::new(context, source);
        if error.is_conflict() {
            return BindError::Conflict;
        }
        BindError::Kube(error)
    }
}

/// The caches the binder decides from.
#[derive(Clone)]
pub struct Caches {
    pub templates: Arc<Templates>,
    pub policies: Store<PropagationPolicy>,
    pub cluster_policies: Store<ClusterPropagationPolicy>,
    pub bindings: Store<ResourceBinding>,
    pub clusters: Store<Cluster>,
}

impl Caches {
    pub fn binding(&self, namespace: &str, name: &str) -> Option<Arc<ResourceBinding>> {
        self.bindings.get(&ObjectRef::new(name).within(namespace))
    }
}

/// The binder.
pub struct Binder {
    pub client: kube::Client,
    pub caches: Caches,
    pub interpreters: InterpreterHandle,
    pub placer: Arc<dyn Placer>,
    pub work: Arc<WorkStore>,
    pub queue: WorkQueue<TemplateKey>,
    pub metrics: BinderMetrics,
    /// Policies, rebuilt when a policy changes.
    policy_index: RwLock<Arc<Vec<AnyPolicy>>>,
    /// The clusters each binding's work is dispatched to.
    dispatched: Mutex<HashMap<WorkKey, BTreeSet<String>>>,
    /// The clusters whose old copy of each binding the hub waits to hear is gone (`Directly`
    /// eviction tasks not purged yet).
    purging: Mutex<HashMap<WorkKey, BTreeSet<String>>>,
    /// Cluster evictions (a lost or deleted cluster) go through this bucket.
    cluster_evictions: Mutex<EvictionRateLimiter>,
    /// Off while the hub recovers (`crate::clusters::recovery`): bindings are only dispatched as they
    /// are, nothing is evicted, placed or created.
    deciding: AtomicBool,
    /// The status processor's state: a binding whose newest per-cluster status is not in the
    /// cached binding yet is decided once it is.
    status_view: Option<SharedState>,
    /// Ledger, Events and metrics of placements and failovers.
    recorder: Option<FailoverRecorder>,
    /// What decisions read of each Cluster last time ([`decision_fingerprint`]).
    cluster_fingerprints: Mutex<HashMap<String, u64>>,
    /// Asked to fence the old copy of a `Directly` eviction whose cluster cannot say it is gone.
    fencer: Option<FenceHandle>,
    /// New status from the processor, decided on before it is written ([`crate::status::handoff`]).
    handoff: Option<Arc<Handoff>>,
    /// What the failover phase read of each binding at its last pass ([`decision_view`]).
    decided: Mutex<HashMap<WorkKey, u64>>,
    /// What the last pass read of each template ([`TemplateRead`]).
    template_reads: Mutex<HashMap<TemplateKey, Arc<TemplateRead>>>,
}

/// A template as a pass reads it: serialised, and what the interpreter's replica scripts say
/// of it. Kept per template while its resourceVersion and the interpreters are the same: a
/// burst of failovers makes several passes per binding over an unchanged template.
struct TemplateRead {
    resource_version: String,
    interpreters: Arc<crate::interpreters::Interpreters>,
    json: Arc<Value>,
    /// Filled by the first pass that needs it (a template no policy selects has none).
    replicas: Mutex<Option<Replicas>>,
}

/// A hash of everything placement and failover read of a Cluster: all of it but the heartbeat
/// time and the object's bookkeeping (resourceVersion, managed fields). Heartbeats move
/// `lastHeartbeatTime` every quarter lease; with 100 clusters, re-looking at their bindings each
/// time cost most of the binder's work.
pub fn decision_fingerprint(cluster: &Cluster) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut seen = cluster.clone();
    seen.metadata.resource_version = None;
    seen.metadata.managed_fields = None;
    if let Some(status) = seen.status.as_mut() {
        status.last_heartbeat_time = None;
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(&seen)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// Karmada's default cluster eviction rate is 0.5 bindings/s; a lost GPU cluster's jobs should
/// move within a minute, so the hub's default is 100 times that.
pub const DEFAULT_CLUSTER_EVICTION_RATE: f64 = 50.0;
/// Nothing fits: the clusters may change.
const UNSCHEDULABLE_RETRY: Duration = Duration::from_secs(30);
/// An eviction waits for another cluster to fit: try again sooner (a failover is due).
const NO_OTHER_CLUSTER_RETRY: Duration = Duration::from_secs(10);

/// A reconcile's result: what it leads to, and the report of a pass that wrote and dispatched.
pub struct Reconciled {
    pub outcome: Outcome,
    report: Option<Report>,
}

impl From<Outcome> for Reconciled {
    fn from(outcome: Outcome) -> Reconciled {
        Reconciled {
            outcome,
            report: None,
        }
    }
}

/// What a pass reports once its spec is written and its work dispatched ([`Binder::report`]).
struct Report {
    binding: Arc<ResourceBinding>,
    before: Option<Arc<ResourceBinding>>,
    scheduling: Option<Result<(), Unschedulable>>,
    policy: AnyPolicy,
    blocked: Vec<failover::Blocked>,
    resets: Vec<AppliedReset>,
    evicted: Vec<failover::Eviction>,
    settled: Vec<failover::TaskChange>,
    template: Option<k8s_openapi::api::core::v1::ObjectReference>,
    now: Time,
}

/// What a reconcile leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Try again after this long (e.g. unschedulable: the clusters may change).
    RetryAfter(Duration),
}

impl Binder {
    pub fn new(
        client: kube::Client,
        caches: Caches,
        interpreters: InterpreterHandle,
        placer: Arc<dyn Placer>,
        work: Arc<WorkStore>,
        metrics: BinderMetrics,
    ) -> Binder {
        Binder {
            client,
            caches,
            interpreters,
            placer,
            work,
            queue: WorkQueue::new(),
            metrics,
            policy_index: RwLock::new(Arc::new(Vec::new())),
            dispatched: Mutex::new(HashMap::new()),
            purging: Mutex::new(HashMap::new()),
            cluster_evictions: Mutex::new(EvictionRateLimiter::new(DEFAULT_CLUSTER_EVICTION_RATE)),
            deciding: AtomicBool::new(true),
            status_view: None,
            recorder: None,
            cluster_fingerprints: Mutex::new(HashMap::new()),
            fencer: None,
            handoff: None,
            decided: Mutex::new(HashMap::new()),
            template_reads: Mutex::new(HashMap::new()),
        }
    }

    /// Decides on the processor's new status as soon as it is folded in, before its write
    /// (which waits for the decision): a failover is then one binding write, the spec.
    pub fn with_handoff(mut self, handoff: Arc<Handoff>) -> Binder {
        self.handoff = Some(handoff);
        self
    }

    /// Fences (the hub's own deletion through a member's kube-apiserver) the old copies that
    /// `Directly` evictions wait for on clusters that are not Ready.
    pub fn with_fencer(mut self, fencer: FenceHandle) -> Binder {
        self.fencer = Some(fencer);
        self
    }

    /// Records placements and failovers (ledger, Events, metrics).
    pub fn with_recorder(mut self, recorder: FailoverRecorder) -> Binder {
        self.recorder = Some(recorder);
        self
    }

    /// Decides on the status as the processor knows it: a binding whose cached status lags
    /// behind the processor's is not decided until the cache has caught up.
    pub fn with_status_view(mut self, state: SharedState) -> Binder {
        self.status_view = Some(state);
        self
    }

    /// Turns decisions off (a recovering hub) or on.
    pub fn set_deciding(&self, on: bool) {
        self.deciding.store(on, Ordering::SeqCst);
    }

    pub fn is_deciding(&self) -> bool {
        self.deciding.load(Ordering::SeqCst)
    }

    /// The binding as a decision must see it: with the processor's per-cluster items where
    /// they are newer than the cached status (a status write on its way, or not yet seen).
    /// Deciding on them at once, rather than after the write came back through the watch,
    /// takes a binding write off every failover's path; the resourceVersion the spec write is
    /// guarded by is the cached binding's, untouched.
    fn with_newest_status(&self, binding: Arc<ResourceBinding>) -> Arc<ResourceBinding> {
        if !decides_on_status(&binding) {
            return binding;
        }
        let newest = self.status_view.as_ref().and_then(|state| {
            state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .newest_items(&binding)
        });
        match newest {
            Some(items) => {
                let mut seen = (*binding).clone();
                seen.status
                    .get_or_insert_with(Default::default)
                    .aggregated_status = items;
                Arc::new(seen)
            }
            None => binding,
        }
    }

    /// Cluster evictions per second (on average; as many at once).
    pub fn with_cluster_eviction_rate(self, per_second: f64) -> Binder {
        *self
            .cluster_evictions
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = EvictionRateLimiter::new(per_second);
        self
    }
}

/// The template a binding belongs to.
pub fn template_key_of(binding: &ResourceBinding) -> Option<TemplateKey> {
    let kind = detector::template_kind(
        &binding.spec.resource.api_version,
        &binding.spec.resource.kind,
    )?;
    Some(TemplateKey {
        kind: kind.kind,
        namespace: binding.metadata.namespace.clone().unwrap_or_default(),
        name: binding.spec.resource.name.clone(),
    })
}

/// What the failover phase reads of a binding besides its template, policy and the clusters: its
/// spec (by generation), annotations (manual resets, purge confirmations) and per-cluster
/// status, hashed.
fn decision_view(binding: &ResourceBinding) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    binding.metadata.generation.hash(&mut hasher);
    binding.metadata.annotations.hash(&mut hasher);
    serde_json::to_string(
        &binding
            .status
            .as_ref()
            .map(|s| s.aggregated_status.as_slice())
            .unwrap_or_default(),
    )
    .unwrap_or_default()
    .hash(&mut hasher);
    hasher.finish()
}

/// Whether the failover phase reads this binding's per-cluster status (a failover policy, or
/// eviction tasks to settle).
fn decides_on_status(binding: &ResourceBinding) -> bool {
    binding.spec.failover.is_some() || !binding.spec.graceful_eviction_tasks.is_empty()
}

/// The binding (work) key of a template.
fn work_key_of(key: &TemplateKey) -> Option<WorkKey> {
    let kind = key.template_kind()?;
    Some(WorkKey {
        namespace: key.namespace.clone(),
        name: api_binding::binding_name(&key.name, kind.kind),
    })
}

impl Decider for Binder {
    /// Queues the binding's template when the failover phase reads its status (and decisions
    /// are on): the decision then sees the new items before they are written.
    fn status_changed(&self, key: &WorkKey) -> bool {
        if !self.is_deciding() {
            return false;
        }
        let Some(binding) = self.caches.binding(&key.namespace, &key.name) else {
            return false;
        };
        if !decides_on_status(&binding) {
            return false;
        }
        let Some(template) = template_key_of(&binding) else {
            return false;
        };
        self.queue.add(template);
        true
    }
}

#[cfg(test)]
mod tests;
