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

use crate::detector::{self, Replicas, TemplateKind, TemplateMeta};
use crate::dispatch;
use crate::failover::{self, AppliedReset};
use crate::failover_phase::{self, EvictionRateLimiter};
use crate::failover_record::{FailoverRecorder, PassRecord};
use crate::fencer::{FenceHandle, FenceRequest};
use crate::handoff::{Decider, Handoff};
use crate::interpreters::InterpreterHandle;
use crate::placement::{Placer, Unschedulable};
use crate::processor::SharedState;
use crate::status::condition;
use crate::templates::{TemplateKey, Templates};
use crate::work_store::WorkStore;
use lifeboat_runtime::kube_error::KubeError;
use lifeboat_runtime::queue::WorkQueue;

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

/// The binder's metrics.
#[derive(Clone)]
pub struct BinderMetrics {
    pub reconciles: prometheus::IntCounterVec,
    pub scheduling_seconds: prometheus::Histogram,
    pub bindings: prometheus::IntGaugeVec,
    /// Bindings whose `FailoverBlocked` condition is True now, by its reason.
    pub blocked: prometheus::IntGaugeVec,
    /// Time spent per stage of a pass ([`PASS_STAGES`]).
    pub stage_seconds: prometheus::HistogramVec,
}

/// The stages of a binder pass, as `lifeboat_hub_binder_stage_duration_seconds{stage}` counts
/// them: the template read for the pass (serialised, replica scripts), the decision (failover
/// phase and scheduler), the spec write, the dispatch, and the report after it (conditions,
/// Events, ledger: off the worker).
pub const PASS_STAGES: [&str; 5] = ["template", "decide", "spec_write", "dispatch", "report"];

impl BinderMetrics {
    pub fn new(registry: &prometheus::Registry) -> Result<BinderMetrics, prometheus::Error> {
        let reconciles = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_binder_reconciles_total",
                "Template reconciles by result (ok, or the error kind)",
            ),
            &["result"],
        )?;
        let scheduling_seconds = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "lifeboat_hub_scheduling_duration_seconds",
                "Time to choose the clusters of one binding (the scheduler's decision alone)",
            )
            .buckets(vec![
                0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1,
            ]),
        )?;
        let bindings = prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_bindings",
                "Bindings by state: Scheduled, Unschedulable, Applied, Healthy, Unhealthy, Unknown",
            ),
            &["state"],
        )?;
        let blocked = prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_bindings_failover_blocked",
                "Bindings whose FailoverBlocked condition is True now, by its reason (WaitingForFence: a Directly failover waits for evidence that the old copy no longer runs)",
            ),
            &["reason"],
        )?;
        for reason in api_binding::FAILOVER_BLOCKED_REASONS {
            blocked.with_label_values(&[reason]);
        }
        let stage_seconds = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new(
                "lifeboat_hub_binder_stage_duration_seconds",
                "Time of one stage of a binder pass: template (serialised, replica scripts), decide (failover phase, scheduler), spec_write, dispatch, report (conditions, Events, ledger)",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5,
            ]),
            &["stage"],
        )?;
        for stage in PASS_STAGES {
            stage_seconds.with_label_values(&[stage]);
        }
        registry.register(Box::new(stage_seconds.clone()))?;
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(scheduling_seconds.clone()))?;
        registry.register(Box::new(bindings.clone()))?;
        registry.register(Box::new(blocked.clone()))?;
        Ok(BinderMetrics {
            reconciles,
            scheduling_seconds,
            bindings,
            blocked,
            stage_seconds,
        })
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
    /// Off while the hub recovers (`crate::recovery`): bindings are only dispatched as they
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
    /// New status from the processor, decided on before it is written ([`crate::handoff`]).
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

/// What the failover phase leaves for the rest of the reconcile.
#[derive(Debug, Default)]
struct FailoverStep {
    /// The spec before this pass's evictions (settled tasks applied): kept when no other
    /// cluster fits.
    without_evictions: Option<ResourceBindingSpec>,
    evicted: Vec<failover::Eviction>,
    /// Resets written into the spec.
    resets: Vec<AppliedReset>,
    blocked: Vec<failover::Blocked>,
    /// Look again after this long (a toleration, a delay, a grace period, the rate limit).
    look_again: Option<Duration>,
    settled: Vec<failover::TaskChange>,
}

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

    /// Rebuilds the policy index from the caches (after a policy event).
    pub fn refresh_policies(&self) {
        let mut all: Vec<AnyPolicy> = self
            .caches
            .policies
            .state()
            .into_iter()
            .map(|p| AnyPolicy::Namespaced((*p).clone()))
            .collect();
        all.extend(
            self.caches
                .cluster_policies
                .state()
                .into_iter()
                .map(|p| AnyPolicy::Cluster((*p).clone())),
        );
        *self.policy_index.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(all);
    }

    fn policies(&self) -> Arc<Vec<AnyPolicy>> {
        self.policy_index
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Queues every template (a policy changed; the initial pass).
    pub fn queue_all(&self) {
        for key in self.caches.templates.keys() {
            self.queue.add(key);
        }
    }

    /// Queues the templates of one namespace (a PropagationPolicy there changed: it selects
    /// only templates of its own namespace).
    pub fn queue_namespace(&self, namespace: &str) {
        for key in self
            .caches
            .templates
            .keys()
            .into_iter()
            .filter(|k| k.namespace == namespace)
        {
            self.queue.add(key);
        }
    }

    /// A Cluster was updated: its bindings are looked at again when something a decision reads
    /// changed (not for a heartbeat that only moved `lastHeartbeatTime`). Returns whether it
    /// queued them.
    pub fn cluster_changed(&self, cluster: &Cluster) -> bool {
        let name = cluster.name_any();
        let fingerprint = decision_fingerprint(cluster);
        let previous = self
            .cluster_fingerprints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.clone(), fingerprint);
        if previous == Some(fingerprint) {
            return false;
        }
        self.queue_for_cluster_change(&name);
        true
    }

    /// A Cluster was deleted: its bindings are looked at again.
    pub fn cluster_deleted(&self, cluster: &Cluster) {
        let name = cluster.name_any();
        self.cluster_fingerprints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&name);
        self.queue_for_cluster_change(&name);
    }

    /// Queues the templates whose binding is not scheduled, is placed on `cluster`, or is
    /// being evicted from it (the clusters changed).
    pub fn queue_for_cluster_change(&self, cluster: &str) {
        for binding in self.caches.bindings.state() {
            let scheduled = binding
                .condition(CONDITION_SCHEDULED)
                .is_some_and(|c| c.status == "True");
            let placed_there = binding.spec.clusters.iter().any(|c| c.name == cluster)
                || binding
                    .spec
                    .graceful_eviction_tasks
                    .iter()
                    .any(|t| t.from_cluster == cluster);
            if (!scheduled || placed_there)
                && let Some(key) = template_key_of(&binding)
            {
                self.queue.add(key);
            }
        }
    }

    /// A binding changed (its status, mostly): its template is bound again when the failover
    /// phase may have something to decide.
    /// A binding that shows what the last pass already decided on (the echo of the binder's
    /// own spec write, or of a status write it decided on before it was written) is not looked
    /// at again: in a burst of failovers those echoes were most of the binder's passes. The
    /// binding is compared as a pass would see it, with the processor's newer items in place
    /// ([`Binder::with_newest_status`]): the echo of a spec write that overtook the status write
    /// it decided on shows the same.
    pub fn binding_changed(&self, binding: &ResourceBinding) {
        if !failover_phase::wants_a_look(binding) {
            return;
        }
        let seen = self
            .decided
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&dispatch::work_key(binding))
            .copied();
        if seen.is_some()
            && seen
                == Some(decision_view(
                    &self.with_newest_status(Arc::new(binding.clone())),
                ))
        {
            return;
        }
        if let Some(key) = template_key_of(binding) {
            self.queue.add(key);
        }
    }

    /// A binding was deleted: its work leaves every cluster, and its template (if it still
    /// exists) is bound again.
    pub fn binding_deleted(&self, binding: &ResourceBinding) {
        let key = dispatch::work_key(binding);
        self.decided
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        let clusters = self
            .dispatched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
            .unwrap_or_default();
        for cluster in clusters {
            self.work.remove(&cluster, &key);
        }
        let purging = self
            .purging
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
            .unwrap_or_default();
        for cluster in purging {
            self.work.settle_purge(&cluster, &key);
        }
        if let Some(template) = template_key_of(binding) {
            self.queue.add(template);
        }
    }

    /// Runs `workers` reconcile loops until the queue is closed. A reconcile's report of what
    /// it wrote (the binding's conditions, Events, the ledger: [`Report`]) runs after the spec
    /// write and the dispatch, off the worker, so a burst of failovers waits on one binding
    /// write each; the key stays busy until its report is done (the next reconcile of that
    /// binding comes after it), and at most `workers` reports run at once, the others queue.
    /// (Fewer at once were tried for bursts, BENCHMARKS.md issue 20: a binding's key stays busy
    /// until its report is done, so a new failure of a binding whose report waited was decided
    /// late.)
    pub async fn run_workers(self: Arc<Self>, workers: usize) {
        let reports = Arc::new(tokio::sync::Semaphore::new(workers.max(1)));
        let mut handles = Vec::new();
        for _ in 0..workers.max(1) {
            let binder = self.clone();
            let reports = reports.clone();
            handles.push(tokio::spawn(async move {
                while let Some(key) = binder.queue.next().await {
                    // The processor's status writes held for this decision end with it.
                    let held = binder
                        .handoff
                        .as_ref()
                        .zip(work_key_of(&key))
                        .map(|(handoff, work)| (handoff.deciding(&work), work));
                    // `clusters` is filled once the pass knows the placement.
                    let span = tracing::info_span!(
                        "bind",
                        template = %key,
                        clusters = tracing::field::Empty
                    );
                    let result = binder.reconcile(&key).instrument(span.clone()).await;
                    if let (Some(handoff), Some((seen, work))) = (&binder.handoff, &held) {
                        handoff.done(work, *seen);
                    }
                    let (outcome, report) = match result {
                        Ok(Reconciled { outcome, report }) => (Ok(outcome), report),
                        Err(e) => (Err(e), None),
                    };
                    let Some(report) = report else {
                        binder.settle(&key, outcome, &span);
                        continue;
                    };
                    // The worker goes on to the next decision at once; reports queue for a
                    // permit (a burst's spec writes come before its reports).
                    let (binder, reports) = (binder.clone(), reports.clone());
                    tokio::spawn(async move {
                        let reported = match reports.acquire_owned().await {
                            Ok(_permit) => {
                                let started = Instant::now();
                                let reported = binder.report(report).instrument(span.clone()).await;
                                binder.observe_stage("report", started.elapsed());
                                reported
                            }
                            Err(_) => Ok(()),
                        };
                        binder.settle(&key, reported.and(outcome), &span);
                    });
                }
            }));
        }
        for h in handles {
            let _ = h.await;
        }
    }

    fn observe_stage(&self, stage: &str, took: Duration) {
        self.metrics
            .stage_seconds
            .with_label_values(&[stage])
            .observe(took.as_secs_f64());
    }

    /// Counts a reconcile, queues it again as its outcome says, and frees its key.
    fn settle(&self, key: &TemplateKey, result: Result<Outcome, BindError>, span: &tracing::Span) {
        let label = match &result {
            Ok(_) => "ok",
            Err(e) => e.metric_label(),
        };
        self.metrics.reconciles.with_label_values(&[label]).inc();
        match result {
            Ok(Outcome::Done) => {}
            Ok(Outcome::RetryAfter(d)) => self.queue.add_after(key.clone(), d),
            Err(BindError::Conflict) => {
                self.queue.add_after(key.clone(), Duration::from_millis(50))
            }
            Err(e) => {
                span.in_scope(|| tracing::warn!(error = %e, "binding failed; retrying"));
                self.queue.add_after(key.clone(), Duration::from_secs(5));
            }
        }
        self.queue.done(key);
    }

    /// Reports a pass whose spec is written and dispatched: the binding's conditions, fences
    /// asked for, confirmations pruned, and the ledger, Events and metrics.
    async fn report(&self, report: Report) -> Result<(), BindError> {
        let Report {
            binding,
            before,
            scheduling,
            policy,
            blocked,
            resets,
            evicted,
            settled,
            template,
            now,
        } = report;
        // The fence first: it is what a Directly failover waits for, the conditions are not.
        self.ask_for_fences(&binding, &blocked);
        self.apply_status(&binding, scheduling.as_ref(), Some(&policy), &blocked, &now)
            .await?;
        self.prune_confirmations(&binding).await?;
        if let Some(recorder) = &self.recorder {
            recorder
                .record(PassRecord {
                    before: before.as_deref(),
                    after: &binding,
                    evicted: &evicted,
                    resets: &resets,
                    settled: &settled,
                    blocked: &blocked,
                    template,
                    now: &now,
                })
                .await;
        }
        Ok(())
    }

    /// Decides and applies one template's binding: the spec written and the work dispatched;
    /// the report of the pass is left to the caller ([`Binder::report`]).
    pub async fn reconcile(&self, key: &TemplateKey) -> Result<Reconciled, BindError> {
        let Some(kind) = key.template_kind() else {
            return Ok(Outcome::Done.into());
        };
        let binding_name = api_binding::binding_name(&key.name, kind.kind);
        let existing = self
            .caches
            .binding(&key.namespace, &binding_name)
            .map(|b| self.with_newest_status(b));
        let Some(template) = self.caches.templates.get(key) else {
            // Gone: the garbage collector deletes the binding (it is owned by the template),
            // and the binding's deletion takes the work off the members.
            self.forget_template(key);
            return Ok(Outcome::Done.into());
        };
        if template.metadata.deletion_timestamp.is_some() {
            self.forget_template(key);
            return Ok(Outcome::Done.into());
        }
        let started = Instant::now();
        let read = self.read_template(key, &template)?;
        let template_json = &*read.json;
        let mut template_time = started.elapsed();
        if !self.is_deciding() {
            // Recovering: the agents get their work back as the bindings say; nothing is
            // decided on a status that may predate the restart.
            if let Some(binding) = &existing {
                self.dispatch(binding, template_json)?;
            }
            return Ok(Outcome::Done.into());
        }
        let labels = template.labels().clone();
        let meta = TemplateMeta {
            api_version: &kind.api_version(),
            kind: kind.kind,
            namespace: &key.namespace,
            name: &key.name,
            labels: &labels,
        };
        let policies = self.policies();
        let chosen = detector::select_policy(policies.iter(), &meta);
        let Some(policy) = chosen else {
            if let Some(binding) = existing {
                self.unbound(&binding, &policies).await?;
                self.dispatch(&binding, template_json)?;
            }
            return Ok(Outcome::Done.into());
        };
        let started = Instant::now();
        let replicas = self.replicas_of(&read)?;
        template_time += started.elapsed();
        self.observe_stage("template", template_time);
        let started = Instant::now();
        let uid = template.metadata.uid.clone().unwrap_or_default();
        let mut desired = detector::binding_spec(kind, &meta, &uid, "", policy, replicas);
        // (Fields the failover phase owns are carried over from the current binding.)
        if let Some(current) = &existing {
            desired.clusters = current.spec.clusters.clone();
            desired.graceful_eviction_tasks = current.spec.graceful_eviction_tasks.clone();
            desired.eviction_history = current.spec.eviction_history.clone();
            desired.in_place_resets = current.spec.in_place_resets.clone();
            desired.reschedule_triggered_at = current.spec.reschedule_triggered_at.clone();
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let clusters = self.caches.clusters.state();
        let mut candidate = ResourceBinding::new(&binding_name, desired);
        candidate.metadata.namespace = Some(key.namespace.clone());
        let inputs = PlanInputs {
            clusters: &clusters,
            placer: self.placer.as_ref(),
            cluster_evictions: &self.cluster_evictions,
            now: &now,
            instant: Instant::now(),
            scheduling_seconds: Some(&self.metrics.scheduling_seconds),
        };
        let planned = plan(existing.as_deref(), candidate, &inputs);
        let Planned {
            spec: desired,
            scheduling,
            mut blocked,
            resets,
            mut retry,
            evicted,
            settled,
        } = planned;
        self.observe_stage("decide", started.elapsed());
        let started = Instant::now();
        let binding = self
            .apply_spec(
                kind,
                &template,
                existing.as_deref(),
                &binding_name,
                desired,
                policy,
            )
            .await?;
        self.observe_stage("spec_write", started.elapsed());
        if let Some(seen) = &existing {
            // What this pass decided on, at the generation it wrote.
            let mut view = (**seen).clone();
            view.metadata.generation = binding.metadata.generation;
            self.decided
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(dispatch::work_key(&binding), decision_view(&view));
        }
        let placed: Vec<&str> = binding
            .spec
            .clusters
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        tracing::Span::current().record("clusters", tracing::field::display(placed.join(",")));
        for eviction in &evicted {
            tracing::debug!(target: stages::TARGET, stage = stages::EVICTION_WRITTEN,
                cluster = %eviction.cluster, work = %dispatch::work_key(&binding), reason = eviction.reason);
        }
        // The spec (placement, eviction) is written: dispatch before the status write, which
        // only reports the pass (conditions) and is not an input of the work.
        let started = Instant::now();
        self.dispatch(&binding, template_json)?;
        self.observe_stage("dispatch", started.elapsed());
        // What the written binding waits for is decided on it, here (the echo of this write is
        // not looked at again, nor is the template's status echo): a Directly eviction's block
        // (reported, and its fence asked for, by this pass), an in-place reset's deadline (the
        // pass that writes a reset must wake at its timeout). Should the written binding have
        // more to decide, one more pass follows at once.
        let mut again = false;
        let wrote =
            existing.as_ref().map(|e| e.metadata.generation) != Some(binding.metadata.generation);
        if wrote {
            match after_write(&self.with_newest_status(binding.clone()), &inputs) {
                Some(after) => {
                    blocked.retain(|b| b.reason == failover_phase::REASON_NO_OTHER_CLUSTER);
                    blocked.extend(after.blocked);
                    retry = match (retry, after.look_again) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                None => again = true,
            }
        }
        Ok(Reconciled {
            outcome: match retry {
                _ if again => Outcome::RetryAfter(Duration::ZERO),
                Some(after) => Outcome::RetryAfter(after),
                None => Outcome::Done,
            },
            report: Some(Report {
                binding,
                before: existing,
                scheduling,
                policy: policy.clone(),
                blocked,
                resets,
                evicted,
                settled,
                template: self.caches.templates.object_ref(key),
                now,
            }),
        })
    }

    /// The template serialised, from the last pass's read while its resourceVersion and the
    /// interpreters are unchanged.
    fn read_template(
        &self,
        key: &TemplateKey,
        template: &DynamicObject,
    ) -> Result<Arc<TemplateRead>, BindError> {
        let interpreters = self.interpreters.current();
        let resource_version = template.metadata.resource_version.clone();
        let cached = self
            .template_reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned();
        if let Some(read) = cached
            && Some(&read.resource_version) == resource_version.as_ref()
            && Arc::ptr_eq(&read.interpreters, &interpreters)
        {
            return Ok(read);
        }
        let json = serde_json::to_value(template).map_err(|source| BindError::Serialization {
            what: "template",
            source,
        })?;
        let read = Arc::new(TemplateRead {
            resource_version: resource_version.clone().unwrap_or_default(),
            interpreters,
            json: Arc::new(json),
            replicas: Mutex::new(None),
        });
        let mut reads = self
            .template_reads
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match resource_version {
            Some(_) => reads.insert(key.clone(), read.clone()),
            None => reads.remove(key),
        };
        Ok(read)
    }

    fn forget_template(&self, key: &TemplateKey) {
        self.template_reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// What the replica scripts say of the template read, run once per read.
    fn replicas_of(&self, read: &TemplateRead) -> Result<Replicas, BindError> {
        let mut cached = read.replicas.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(replicas) = &*cached {
            return Ok(replicas.clone());
        }
        let replicas = replicas(&read.interpreters, &read.json)?;
        *cached = Some(replicas.clone());
        Ok(replicas)
    }
}

/// What the interpreter's replica scripts say of a template.
fn replicas(
    interpreters: &crate::interpreters::Interpreters,
    template: &Value,
) -> Result<Replicas, BindError> {
    let mut replicas = Replicas::default();
    if let Some(r) = interpreters
        .get_replicas(template)
        .map_err(|e| BindError::Interpret(e.to_string()))?
    {
        replicas.replicas = r.replica;
        if let Some(requires) = r.requires {
            replicas.requirements = Some(convert(&requires, "replica requirements")?);
        }
    }
    if let Some(Some(components)) = interpreters
        .get_components(template)
        .map_err(|e| BindError::Interpret(e.to_string()))?
    {
        replicas.components = convert(&components, "components")?;
    }
    Ok(replicas)
}

impl Binder {
    /// Applies the spec when it differs from the current binding's; returns the binding as it
    /// now is.
    async fn apply_spec(
        &self,
        kind: &TemplateKind,
        template: &DynamicObject,
        existing: Option<&ResourceBinding>,
        name: &str,
        desired: ResourceBindingSpec,
        policy: &AnyPolicy,
    ) -> Result<Arc<ResourceBinding>, BindError> {
        let namespace = template.namespace().unwrap_or_default();
        let policy_ref = detector::policy_reference(policy);
        let labels = BTreeMap::from([(LABEL_POLICY_NAME.to_string(), policy_label(&policy_ref))]);
        let owner = OwnerReference {
            api_version: kind.api_version(),
            kind: kind.kind.to_string(),
            name: template.name_any(),
            uid: template.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(false),
        };
        if let Some(current) = existing
            && same_spec(&current.spec, &desired)
            && current.labels().get(LABEL_POLICY_NAME) == labels.get(LABEL_POLICY_NAME)
            && current
                .owner_references()
                .iter()
                .any(|o| o.uid == owner.uid)
        {
            return Ok(Arc::new(current.clone()));
        }
        let mut metadata = serde_json::json!({
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner],
        });
        if let Some(current) = existing
            && let Some(rv) = &current.metadata.resource_version
        {
            metadata["resourceVersion"] = Value::String(rv.clone());
        }
        let patch = serde_json::json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1",
            "kind": "ResourceBinding",
            "metadata": metadata,
            "spec": desired,
        });
        let api: Api<ResourceBinding> = Api::namespaced(self.client.clone(), &namespace);
        let applied = api
            .patch(
                name,
                &PatchParams::apply(SPEC_MANAGER).force(),
                &Patch::Apply(patch),
            )
            .await
            .map_err(|e| BindError::kube("apply binding spec", e))?;
        tracing::debug!(binding = name, clusters = ?applied.spec.clusters, "binding spec applied");
        Ok(Arc::new(applied))
    }

    /// Writes the `Scheduled` (when scheduling ran), `PolicyBound` and `FailoverBlocked`
    /// conditions, if changed.
    async fn apply_status(
        &self,
        binding: &ResourceBinding,
        scheduling: Option<&Result<(), Unschedulable>>,
        policy: Option<&AnyPolicy>,
        blocked: &[failover::Blocked],
        now: &Time,
    ) -> Result<(), BindError> {
        let previous = binding
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let generation = binding.metadata.generation;
        let mut conditions = Vec::new();
        let mut rejected: Option<Vec<ClusterRejection>> = None;
        let mut scheduled_at = None;
        match scheduling {
            Some(Ok(())) => {
                conditions.push(condition(
                    CONDITION_SCHEDULED,
                    "True",
                    REASON_SUCCESS,
                    "Binding has been scheduled successfully.".into(),
                    &previous,
                    generation,
                    now,
                ));
                rejected = Some(Vec::new());
                scheduled_at = Some(now.clone());
            }
            Some(Err(u)) => {
                conditions.push(condition(
                    CONDITION_SCHEDULED,
                    "False",
                    REASON_NO_CLUSTER_FIT,
                    u.summary.clone(),
                    &previous,
                    generation,
                    now,
                ));
                rejected = Some(u.rejections.clone());
            }
            None => {
                if let Some(c) = previous.iter().find(|c| c.type_ == CONDITION_SCHEDULED) {
                    conditions.push(c.clone());
                }
            }
        }
        conditions.push(match policy {
            Some(p) => condition(
                CONDITION_POLICY_BOUND,
                "True",
                "PolicyMatched",
                format!("placed by {}", policy_label(&detector::policy_reference(p))),
                &previous,
                generation,
                now,
            ),
            None => return Ok(()),
        });
        if let Some(c) = failover_phase::blocked_condition(blocked, &previous, generation, now) {
            conditions.push(c);
        }
        let status = binding.status.clone().unwrap_or_default();
        let unchanged = conditions.iter().all(|c| {
            previous.iter().any(|p| {
                p.type_ == c.type_
                    && p.status == c.status
                    && p.reason == c.reason
                    && p.message == c.message
                    && p.observed_generation == c.observed_generation
            })
        }) && rejected
            .as_ref()
            .is_none_or(|r| *r == status.rejected_clusters)
            && (scheduling.is_none() || status.scheduler_observed_generation == generation);
        if unchanged {
            return Ok(());
        }
        let mut body = serde_json::json!({
            "conditions": conditions,
            "schedulerObservedGeneration": generation,
        });
        let last = scheduled_at.or(status.last_scheduled_time.clone());
        if let Some(t) = last {
            body["lastScheduledTime"] =
                serde_json::to_value(t).map_err(|source| BindError::Serialization {
                    what: "lastScheduledTime",
                    source,
                })?;
        }
        body["rejectedClusters"] = serde_json::to_value(
            rejected.unwrap_or(status.rejected_clusters),
        )
        .map_err(|source| BindError::Serialization {
            what: "rejectedClusters",
            source,
        })?;
        self.patch_scheduler_status(binding, body).await
    }

    async fn patch_scheduler_status(
        &self,
        binding: &ResourceBinding,
        status: Value,
    ) -> Result<(), BindError> {
        let (namespace, name) = binding.key();
        let patch = serde_json::json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1",
            "kind": "ResourceBinding",
            "metadata": {"name": name, "namespace": namespace},
            "status": status,
        });
        let api: Api<ResourceBinding> = Api::namespaced(self.client.clone(), &namespace);
        api.patch_status(
            &name,
            &PatchParams::apply(SCHEDULER_MANAGER).force(),
            &Patch::Apply(patch),
        )
        .await
        .map_err(|e| BindError::kube("apply binding status", e))?;
        Ok(())
    }

    /// The template no longer matches any policy: the binding keeps its placement and says
    /// why in `PolicyBound`.
    async fn unbound(
        &self,
        binding: &ResourceBinding,
        policies: &[AnyPolicy],
    ) -> Result<(), BindError> {
        let previous = binding
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let (reason, message) = match &binding.spec.policy {
            Some(reference) if !policies.iter().any(|p| detector::is_policy(reference, p)) => (
                "PolicyDeleted",
                format!(
                    "{} was deleted; the placement is kept",
                    policy_label(reference)
                ),
            ),
            Some(reference) => (
                "PolicyNoLongerMatches",
                format!(
                    "{} no longer selects the template; the placement is kept",
                    policy_label(reference)
                ),
            ),
            None => (
                "NoPolicy",
                "no policy selects the template; the placement is kept".to_string(),
            ),
        };
        if previous
            .iter()
            .any(|c| c.type_ == CONDITION_POLICY_BOUND && c.status == "False" && c.reason == reason)
        {
            return Ok(());
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let mut conditions: Vec<Condition> = previous
            .iter()
            .filter(|c| c.type_ == CONDITION_SCHEDULED)
            .cloned()
            .collect();
        conditions.push(condition(
            CONDITION_POLICY_BOUND,
            "False",
            reason,
            message,
            &previous,
            binding.metadata.generation,
            &now,
        ));
        let status = binding.status.clone().unwrap_or_default();
        self.patch_scheduler_status(
            binding,
            serde_json::json!({
                "conditions": conditions,
                "schedulerObservedGeneration": status.scheduler_observed_generation,
                "lastScheduledTime": status.last_scheduled_time,
                "rejectedClusters": status.rejected_clusters,
            }),
        )
        .await
    }

    /// Puts the binding's work into the store for each cluster it runs on (and each cluster
    /// whose old copy an eviction keeps), and takes it off the others.
    fn dispatch(&self, binding: &ResourceBinding, template: &Value) -> Result<(), BindError> {
        let key = dispatch::work_key(binding);
        let base = dispatch::base_manifest(template, binding)
            .map_err(|e| BindError::Interpret(format!("building the manifest: {e}")))?;
        let interpreters = self.interpreters.current();
        let mut wanted = BTreeSet::new();
        let kept = binding
            .spec
            .graceful_eviction_tasks
            .iter()
            .filter(|t| t.purge_mode != Some(PurgeMode::Directly))
            .map(|t| TargetCluster {
                name: t.from_cluster.clone(),
                replicas: t.replicas.unwrap_or_default(),
            });
        // A Directly eviction's new copy waits until the old one is gone (never two copies).
        let placed = binding
            .spec
            .clusters
            .iter()
            .filter(|t| failover::may_create_in(&binding.spec, &t.name))
            .cloned();
        // An eviction that keeps the old copy (Gracefully, Never) keeps its work too.
        for target in placed.chain(kept) {
            if !wanted.insert(target.name.clone()) {
                continue;
            }
            let work = dispatch::work_for(binding, &base, &target, |obj, n| {
                interpreters
                    .revise_replica(obj, n)
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| BindError::Interpret(e.to_string()))?;
            if let Some(revision) = self.work.upsert(&target.name, work) {
                tracing::debug!(target: stages::TARGET, stage = stages::WORK_DISPATCHED,
                    cluster = %target.name, work = %key, revision);
            }
        }
        // A Directly eviction's old copy: withdrawn, and its agent asked to report it gone.
        let awaited: BTreeSet<String> = dispatch::awaited_purges(&binding.spec)
            .into_iter()
            .filter(|c| !wanted.contains(c))
            .collect();
        let mut dispatched = self.dispatched.lock().unwrap_or_else(|e| e.into_inner());
        let previous = dispatched
            .insert(key.clone(), wanted.clone())
            .unwrap_or_default();
        for cluster in previous.difference(&wanted) {
            if !awaited.contains(cluster) {
                self.work.remove(cluster, &key);
            }
        }
        drop(dispatched);
        let uid = binding.metadata.uid.clone().unwrap_or_default();
        for cluster in &awaited {
            if self.work.withdraw_for_purge(cluster, &key, &uid).is_some() {
                tracing::info!(binding = %key, %cluster, "old copy withdrawn: waiting for its agent to report it gone (purgeMode Directly)");
            }
        }
        let mut purging = self.purging.lock().unwrap_or_else(|e| e.into_inner());
        let before = if awaited.is_empty() {
            purging.remove(&key)
        } else {
            purging.insert(key.clone(), awaited.clone())
        }
        .unwrap_or_default();
        for cluster in before.difference(&awaited) {
            self.work.settle_purge(cluster, &key);
        }
        Ok(())
    }

    /// Drops from the binding's confirm-purge annotation the clusters that no longer have a
    /// `Never` eviction task: that purge is done, and the entry must not confirm a later
    /// eviction from the same cluster in advance. A JSON merge patch with the binding's
    /// resourceVersion (a concurrent change is a conflict, retried).
    async fn prune_confirmations(&self, binding: &ResourceBinding) -> Result<(), BindError> {
        let Some(remaining) = failover_phase::pruned_confirmations(binding) else {
            return Ok(());
        };
        let (namespace, name) = binding.key();
        let value = (!remaining.is_empty()).then(|| remaining.join(","));
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": binding.metadata.resource_version,
            "annotations": {api_binding::ANNOTATION_CONFIRM_PURGE: value},
        }});
        let api: Api<ResourceBinding> = Api::namespaced(self.client.clone(), &namespace);
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| BindError::kube("prune confirm-purge annotation", e))?;
        tracing::info!(binding = %format!("{namespace}/{name}"), kept = ?value, "confirmations of done purges removed from the annotation");
        Ok(())
    }

    /// Asks the fencer to delete each old copy a `Directly` eviction waits for on a cluster that
    /// cannot say it is gone (`WaitingForFence`).
    fn ask_for_fences(&self, binding: &ResourceBinding, blocked: &[failover::Blocked]) {
        let Some(fencer) = &self.fencer else { return };
        let (namespace, name) = binding.key();
        let resource = &binding.spec.resource;
        for b in blocked
            .iter()
            .filter(|b| b.reason == api_binding::BLOCKED_WAITING_FOR_FENCE)
        {
            fencer.request(FenceRequest {
                cluster: b.cluster.clone(),
                key: WorkKey {
                    namespace: namespace.clone(),
                    name: name.clone(),
                },
                binding_uid: binding.metadata.uid.clone().unwrap_or_default(),
                api_version: resource.api_version.clone(),
                kind: resource.kind.clone(),
                namespace: (!resource.namespace.is_empty()).then(|| resource.namespace.clone()),
                name: resource.name.clone(),
            });
        }
    }

    /// Counts bindings by state for the `lifeboat_hub_bindings` gauge.
    pub fn update_binding_gauges(&self) {
        let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
        for state in [
            "Scheduled",
            "Unschedulable",
            "Applied",
            "Healthy",
            "Unhealthy",
            "Unknown",
        ] {
            counts.insert(state, 0);
        }
        let mut blocked: BTreeMap<String, i64> = api_binding::FAILOVER_BLOCKED_REASONS
            .iter()
            .map(|r| (r.to_string(), 0))
            .collect();
        for b in self.caches.bindings.state() {
            if let Some(c) = b
                .condition(api_binding::CONDITION_FAILOVER_BLOCKED)
                .filter(|c| c.status == "True")
            {
                *blocked.entry(c.reason.clone()).or_default() += 1;
            }
            let status = |t: &str| b.condition(t).map(|c| c.status.clone());
            match status(CONDITION_SCHEDULED).as_deref() {
                Some("True") => *counts.entry("Scheduled").or_default() += 1,
                Some("False") => *counts.entry("Unschedulable").or_default() += 1,
                _ => {}
            }
            if status(api_binding::CONDITION_FULLY_APPLIED).as_deref() == Some("True") {
                *counts.entry("Applied").or_default() += 1;
            }
            match status(api_binding::CONDITION_HEALTHY).as_deref() {
                Some("True") => *counts.entry("Healthy").or_default() += 1,
                Some("False") => *counts.entry("Unhealthy").or_default() += 1,
                _ => *counts.entry("Unknown").or_default() += 1,
            }
        }
        for (state, n) in counts {
            self.metrics.bindings.with_label_values(&[state]).set(n);
        }
        for (reason, n) in blocked {
            self.metrics.blocked.with_label_values(&[&reason]).set(n);
        }
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

/// `PropagationPolicy/ns/name` or `ClusterPropagationPolicy/name` (also a label value once
/// made label-safe: `ns.name` / `name`).
fn policy_label(reference: &PolicyReference) -> String {
    let full = if reference.namespace.is_empty() {
        reference.name.clone()
    } else {
        format!("{}.{}", reference.namespace, reference.name)
    };
    // Label values are at most 63 characters.
    full.chars()
        .take(63)
        .collect::<String>()
        .trim_end_matches(['.', '-', '_'])
        .to_string()
}

/// Whether the binding must be (re)scheduled.
pub fn needs_scheduling(
    existing: Option<&ResourceBinding>,
    desired: &ResourceBindingSpec,
    clusters: &[Arc<Cluster>],
) -> bool {
    let Some(current) = existing else {
        return true;
    };
    if current.spec.clusters.is_empty() {
        return true;
    }
    let spec = &current.spec;
    if spec.placement != desired.placement
        || spec.replicas != desired.replicas
        || spec.replica_requirements != desired.replica_requirements
        || spec.components != desired.components
        || spec.gang != desired.gang
    {
        return true;
    }
    let exists = |name: &str| {
        clusters
            .iter()
            .any(|c| c.name_any() == name && c.metadata.deletion_timestamp.is_none())
    };
    if spec.clusters.iter().any(|c| !exists(&c.name)) {
        return true;
    }
    let status = current.status.clone().unwrap_or_default();
    if let Some(asked) = &spec.reschedule_triggered_at
        && status
            .last_scheduled_time
            .as_ref()
            .is_none_or(|last| last.0 < asked.0)
    {
        return true;
    }
    // Not scheduled (nothing fitted last time): try again.
    current
        .condition(CONDITION_SCHEDULED)
        .is_none_or(|c| c.status != "True")
}

/// What [`plan`] reads besides the binding.
pub struct PlanInputs<'a> {
    pub clusters: &'a [Arc<Cluster>],
    pub placer: &'a dyn Placer,
    pub cluster_evictions: &'a Mutex<EvictionRateLimiter>,
    /// The clock of the decision (timers, eviction times).
    pub now: &'a Time,
    /// The clock of the rate limit.
    pub instant: Instant,
    pub scheduling_seconds: Option<&'a prometheus::Histogram>,
}

/// The binding's spec as it should be, and what to say and when to look again.
#[derive(Debug)]
pub struct Planned {
    pub spec: ResourceBindingSpec,
    /// `None`: scheduling did not run (the `Scheduled` condition stays as it is).
    pub scheduling: Option<Result<(), Unschedulable>>,
    pub blocked: Vec<failover::Blocked>,
    /// In-place resets written into `spec`.
    pub resets: Vec<AppliedReset>,
    pub retry: Option<Duration>,
    /// The evictions written into `spec` (not those kept back because no other cluster fits).
    pub evicted: Vec<failover::Eviction>,
    /// The eviction tasks settled into `spec`.
    pub settled: Vec<failover::TaskChange>,
}

/// Decides one binding's spec: the failover phase over the current binding (evictions and
/// settled eviction tasks, written into the candidate's spec), then scheduling when it is due.
/// An eviction for which no other cluster fits is not made: the copy stays and `blocked` says
/// why (karmada#7455 purges the only copy). Pure apart from the rate limiter's state.
pub fn plan(
    existing: Option<&ResourceBinding>,
    mut candidate: ResourceBinding,
    inputs: &PlanInputs<'_>,
) -> Planned {
    let step = match existing {
        Some(current) => failover_step(current, &mut candidate.spec, inputs),
        None => FailoverStep::default(),
    };
    let mut blocked = step.blocked;
    let mut retry = step.look_again;
    let mut evicted = Vec::new();
    let mut scheduling: Option<Result<(), Unschedulable>> = None;
    let schedule =
        !step.evicted.is_empty() || needs_scheduling(existing, &candidate.spec, inputs.clusters);
    if schedule {
        let started = Instant::now();
        let placed = inputs.placer.place(&candidate, inputs.clusters, inputs.now);
        if let Some(h) = inputs.scheduling_seconds {
            h.observe(started.elapsed().as_secs_f64());
        }
        match placed {
            Ok(targets) => {
                for eviction in &step.evicted {
                    tracing::info!(
                        cluster = %eviction.cluster,
                        reason = eviction.reason,
                        class = ?eviction.class,
                        purge_mode = ?eviction.purge_mode,
                        to = ?targets.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
                        message = %eviction.message,
                        "evicted"
                    );
                }
                candidate.spec.clusters = targets;
                // A cluster left for any reason takes its reset record with it: a later copy
                // there is a new object, never reset.
                let placed = &candidate.spec.clusters;
                candidate
                    .spec
                    .in_place_resets
                    .retain(|r| placed.iter().any(|c| c.name == r.cluster_name));
                scheduling = Some(Ok(()));
                evicted = step.evicted;
            }
            Err(unschedulable) => match step.without_evictions {
                Some(kept) => {
                    // Scheduled keeps describing the placement the binding keeps.
                    for cluster in step.evicted.iter().map(|e| &e.cluster) {
                        blocked.push(failover::Blocked {
                            cluster: cluster.clone(),
                            reason: failover_phase::REASON_NO_OTHER_CLUSTER,
                            message: format!(
                                "the workload should leave {cluster}, but no other cluster fits ({}); its copy there is kept",
                                unschedulable.summary
                            ),
                        });
                    }
                    candidate.spec = kept;
                    retry = Some(
                        retry.map_or(NO_OTHER_CLUSTER_RETRY, |r| r.min(NO_OTHER_CLUSTER_RETRY)),
                    );
                }
                // Keep the current placement when nothing fits: a copy is never removed for
                // lack of a better place (karmada#7455).
                None => {
                    scheduling = Some(Err(unschedulable));
                    retry = Some(retry.map_or(UNSCHEDULABLE_RETRY, |r| r.min(UNSCHEDULABLE_RETRY)));
                }
            },
        }
    }
    Planned {
        spec: candidate.spec,
        scheduling,
        blocked,
        resets: step.resets,
        retry,
        evicted,
        settled: step.settled,
    }
}

/// What the failover decision says of a binding as a pass wrote it: what its evictions wait for
/// and when to look again; `None` when it has more to decide (an eviction, a reset, a task to
/// settle), which is another pass's.
struct AfterWrite {
    blocked: Vec<failover::Blocked>,
    look_again: Option<Duration>,
}

fn after_write(written: &ResourceBinding, inputs: &PlanInputs<'_>) -> Option<AfterWrite> {
    let pass = decide_over(written, &written.spec, inputs);
    if !pass.decision.evictions.is_empty()
        || !pass.decision.resets.is_empty()
        || !pass.task_changes.is_empty()
    {
        return None;
    }
    Some(AfterWrite {
        blocked: pass.decision.blocked,
        look_again: pass
            .decision
            .next_check
            .as_ref()
            .map(|at| failover_phase::until(inputs.now, at)),
    })
}

/// The pure failover decision over `current` with the `desired` spec, the clusters and the
/// clock of `inputs`.
fn decide_over(
    current: &ResourceBinding,
    desired: &ResourceBindingSpec,
    inputs: &PlanInputs<'_>,
) -> failover_phase::Pass {
    let now = inputs.now;
    let states = failover_phase::cluster_states(inputs.clusters);
    // Whether the workload still fits in its cluster (a node notice moves an AppWrapper only
    // when it does not).
    let fits = |name: &str| {
        let one: Vec<Arc<Cluster>> = inputs
            .clusters
            .iter()
            .filter(|c| c.name_any() == name)
            .cloned()
            .collect();
        inputs.placer.place(current, &one, now).is_ok()
    };
    let ctx = failover::Context {
        now,
        clusters: &states,
        resets_itself: current.spec.resource.kind == "AppWrapper",
        fits: &fits,
    };
    failover_phase::decide(current, desired, &ctx)
}

/// The failover phase: decides evictions and settles eviction tasks over the desired spec
/// (`failover::decide`, `failover::settle_tasks`) and applies them to it. Cluster evictions
/// wait for the rate limit.
fn failover_step(
    current: &ResourceBinding,
    desired: &mut ResourceBindingSpec,
    inputs: &PlanInputs<'_>,
) -> FailoverStep {
    if current.spec.clusters.is_empty() && current.spec.graceful_eviction_tasks.is_empty() {
        return FailoverStep::default();
    }
    let now = inputs.now;
    let pass = decide_over(current, desired, inputs);
    let mut look_again = pass
        .decision
        .next_check
        .as_ref()
        .map(|at| failover_phase::until(now, at));
    let mut evictions = Vec::new();
    for eviction in pass.decision.evictions {
        if failover_phase::is_cluster_eviction(&eviction) {
            let taken = inputs
                .cluster_evictions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .try_take(inputs.instant);
            if let Err(wait) = taken {
                look_again = Some(look_again.map_or(wait, |l| l.min(wait)));
                continue;
            }
        }
        evictions.push(eviction);
    }
    for change in &pass.task_changes {
        tracing::info!(?change, "eviction task settled");
    }
    // Resets first: they stay when an eviction is taken back for lack of another cluster.
    let resets = failover::apply_resets(desired, &pass.decision.resets, now);
    failover::apply_task_changes(desired, &pass.task_changes, now);
    let without_evictions = (!evictions.is_empty()).then(|| desired.clone());
    failover::apply_evictions(desired, &evictions, now);
    FailoverStep {
        without_evictions,
        evicted: evictions,
        resets,
        blocked: pass.decision.blocked,
        look_again,
        settled: pass.task_changes,
    }
}

/// Equal in every field the binder decides.
fn same_spec(a: &ResourceBindingSpec, b: &ResourceBindingSpec) -> bool {
    a.resource.api_version == b.resource.api_version
        && a.resource.kind == b.resource.kind
        && a.resource.name == b.resource.name
        && a.resource.uid == b.resource.uid
        && a.replicas == b.replicas
        && a.replica_requirements == b.replica_requirements
        && a.components == b.components
        && a.gang == b.gang
        && a.placement == b.placement
        && a.failover == b.failover
        && a.policy == b.policy
        && a.clusters == b.clusters
        && a.graceful_eviction_tasks == b.graceful_eviction_tasks
        && a.eviction_history == b.eviction_history
        && a.in_place_resets == b.in_place_resets
}

/// Converts an interpreter result to the API type of the same JSON shape.
fn convert<T: serde::Serialize, U: serde::de::DeserializeOwned>(
    value: &T,
    what: &'static str,
) -> Result<U, BindError> {
    let json =
        serde_json::to_value(value).map_err(|source| BindError::Serialization { what, source })?;
    serde_json::from_value(json).map_err(|source| BindError::Serialization { what, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::SchedulerPlacer;
    use serde_json::json;

    fn cluster(name: &str) -> Arc<Cluster> {
        Arc::new(Cluster::new(name, Default::default()))
    }

    fn binding(spec: Value, scheduled: Option<&str>) -> ResourceBinding {
        let mut b: ResourceBinding = serde_json::from_value(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "w-deployment", "namespace": "ns"},
            "spec": spec,
        }))
        .unwrap();
        if let Some(s) = scheduled {
            b.status = Some(
                serde_json::from_value(json!({"conditions": [{
                "type": "Scheduled", "status": s, "reason": "x", "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "lastScheduledTime": "2026-01-01T00:00:00Z"}))
                .unwrap(),
            );
        }
        b
    }

    #[test]
    fn a_heartbeat_that_only_moves_its_time_changes_no_decision_input() {
        let mut c = (*member("a", None)).clone();
        let before = decision_fingerprint(&c);
        c.metadata.resource_version = Some("42".into());
        if let Some(s) = c.status.as_mut() {
            s.last_heartbeat_time = Some(at(30));
        }
        assert_eq!(decision_fingerprint(&c), before);
        // The inventory, the Ready condition, taints and labels are decision inputs.
        let mut noticed = c.clone();
        if let Some(s) = noticed.status.as_mut() {
            s.node_groups =
                serde_json::from_value(json!([{"count": 1, "free": {"nvidia.com/gpu": "8"}}]))
                    .unwrap();
        }
        assert_ne!(decision_fingerprint(&noticed), before);
        let mut lost = c.clone();
        if let Some(s) = lost.status.as_mut() {
            s.conditions[0].status = "Unknown".into();
        }
        assert_ne!(decision_fingerprint(&lost), before);
        let mut labelled = c.clone();
        labelled.metadata.labels = Some([("region".to_string(), "eu".to_string())].into());
        assert_ne!(decision_fingerprint(&labelled), before);
    }

    #[test]
    fn scheduling_happens_only_when_something_moved() {
        let spec = json!({"resource": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "w"},
                          "replicas": 3, "clusters": [{"name": "a", "replicas": 3}]});
        let desired: ResourceBindingSpec = serde_json::from_value(spec.clone()).unwrap();
        let clusters = vec![cluster("a"), cluster("b")];
        assert!(needs_scheduling(None, &desired, &clusters));
        let current = binding(spec.clone(), Some("True"));
        assert!(!needs_scheduling(Some(&current), &desired, &clusters));
        // replicas changed
        let mut resized = desired.clone();
        resized.replicas = 5;
        assert!(needs_scheduling(Some(&current), &resized, &clusters));
        // its cluster is gone
        assert!(needs_scheduling(Some(&current), &desired, &[cluster("b")]));
        // not scheduled last time
        let failed = binding(spec.clone(), Some("False"));
        assert!(needs_scheduling(Some(&failed), &desired, &clusters));
        // a reschedule asked after the last schedule
        let mut asked = spec;
        asked["rescheduleTriggeredAt"] = json!("2026-02-01T00:00:00Z");
        let current = binding(asked.clone(), Some("True"));
        let desired: ResourceBindingSpec = serde_json::from_value(asked).unwrap();
        assert!(needs_scheduling(Some(&current), &desired, &clusters));
    }

    /// Places on the first cluster (by the order given) that no eviction task or history entry
    /// names, as the ClusterEviction filter would.
    struct FirstFree;

    impl Placer for FirstFree {
        fn place(
            &self,
            binding: &ResourceBinding,
            clusters: &[Arc<Cluster>],
            _now: &Time,
        ) -> Result<Vec<TargetCluster>, Unschedulable> {
            let spec = &binding.spec;
            clusters
                .iter()
                .map(|c| c.name_any())
                .find(|n| {
                    !spec
                        .graceful_eviction_tasks
                        .iter()
                        .any(|t| &t.from_cluster == n)
                        && !spec.eviction_history.iter().any(|r| &r.cluster_name == n)
                })
                .map(|name| vec![TargetCluster { name, replicas: 0 }])
                .ok_or_else(|| Unschedulable {
                    summary: "0/1 clusters are available".into(),
                    rejections: Vec::new(),
                })
        }
    }

    fn at(second: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_900_000_000 + second).unwrap())
    }

    fn member(name: &str, ready_since: Option<(&str, i64)>) -> Arc<Cluster> {
        let mut c = Cluster::new(name, Default::default());
        let (status, since) = ready_since.unwrap_or(("True", 0));
        c.status = Some(
            serde_json::from_value(json!({"conditions": [{
                "type": "Ready", "status": status, "reason": "x", "message": "",
                "lastTransitionTime": at(since).0.to_string()}]}))
            .unwrap(),
        );
        Arc::new(c)
    }

    /// An AppWrapper-less Job binding placed on `placed`, scheduled, with these status items.
    fn placed(failover: Value, placed: &[&str], items: Value) -> ResourceBinding {
        let clusters: Vec<Value> = placed.iter().map(|c| json!({"name": c})).collect();
        serde_json::from_value(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "w-job", "namespace": "ns", "generation": 2},
            "spec": {"resource": {"apiVersion": "batch/v1", "kind": "Job", "name": "w"},
                     "clusters": clusters, "failover": failover},
            "status": {"schedulerObservedGeneration": 2, "aggregatedStatus": items,
                       "lastScheduledTime": at(0).0.to_string(),
                       "conditions": [{"type": "Scheduled", "status": "True", "reason": "Success",
                                       "message": "", "lastTransitionTime": at(0).0.to_string()}]}
        }))
        .unwrap()
    }

    /// Unhealthy since the start of second `since`: the hub's whole-second `unhealthySince` is
    /// written in the second before (a whole-second time counts from the end of its second).
    fn unhealthy(cluster: &str, since: i64, class: &str) -> Value {
        json!({"clusterName": cluster, "applied": true, "health": "Unhealthy",
               "failureClass": class, "healthReason": "FoundFailedPods: pod p failed",
               "unhealthySince": at(since - 1).0.to_string(),
               "firstObservedAt": at(0).0.to_string(), "lastHealthyTime": at(0).0.to_string()})
    }

    fn app_failover(toleration: i32) -> Value {
        json!({"application": {"decisionConditions": {"tolerationSeconds": toleration},
                               "purgeMode": "Gracefully"}})
    }

    fn plan_at(
        current: &ResourceBinding,
        clusters: &[Arc<Cluster>],
        now: i64,
        limiter: &Mutex<EvictionRateLimiter>,
        instant: Instant,
    ) -> Planned {
        let now = at(now);
        plan(
            Some(current),
            current.clone(),
            &PlanInputs {
                clusters,
                placer: &FirstFree,
                cluster_evictions: limiter,
                now: &now,
                instant,
                scheduling_seconds: None,
            },
        )
    }

    fn names(spec: &ResourceBindingSpec) -> Vec<&str> {
        spec.clusters.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn an_unhealthy_placement_moves_in_one_write_once_its_toleration_is_over() {
        let b = placed(
            app_failover(60),
            &["a"],
            json!([unhealthy("a", 100, "Infrastructure")]),
        );
        let clusters = [member("a", None), member("b", None)];
        let limiter = Mutex::new(EvictionRateLimiter::new(50.0));
        let early = plan_at(&b, &clusters, 159, &limiter, Instant::now());
        assert_eq!(names(&early.spec), ["a"]);
        assert!(early.scheduling.is_none() && early.spec.graceful_eviction_tasks.is_empty());
        // The binder looks again exactly when the toleration ends.
        assert_eq!(early.retry, Some(Duration::from_secs(1)));

        let due = plan_at(&b, &clusters, 160, &limiter, Instant::now());
        assert_eq!(names(&due.spec), ["b"]);
        assert!(matches!(due.scheduling, Some(Ok(()))));
        let task = &due.spec.graceful_eviction_tasks[0];
        assert_eq!(
            (task.from_cluster.as_str(), task.reason.as_str()),
            ("a", "ApplicationFailure")
        );
        assert_eq!(task.clusters_before_failover, ["a"]);
        let record = &due.spec.eviction_history[0];
        assert_eq!(record.cluster_name, "a");
        assert_eq!(
            record.failure_class,
            Some(lifeboat_api::health::FailureClass::Infrastructure)
        );
        assert_eq!(record.evicted_at, at(160));
        assert!(due.blocked.is_empty());
    }

    /// A Directly eviction's block (and so its fence) is decided on the binding as the pass
    /// wrote it, in that pass: the echo of the write is not looked at again.
    #[test]
    fn a_directly_eviction_is_blocked_on_its_purge_in_the_pass_that_writes_it() {
        let limiter = Mutex::new(EvictionRateLimiter::new(50.0));
        // An application failure in a Ready cluster: its agent confirms the purge.
        let application = placed(
            json!({"application": {"decisionConditions": {"tolerationSeconds": 0},
                                   "purgeMode": "Directly"}}),
            &["a"],
            json!([unhealthy("a", 100, "Infrastructure")]),
        );
        let ready = [member("a", None), member("b", None)];
        // A cluster not Ready since 50 with a toleration of 60 s: nobody there can confirm it.
        let cluster = placed(
            json!({"cluster": {"tolerationSeconds": 60, "purgeMode": "Directly"}}),
            &["a"],
            json!([]),
        );
        let lost = [member("a", Some(("False", 50))), member("b", None)];
        for (binding, clusters, reason) in [
            (&application, &ready, api_binding::BLOCKED_WAITING_FOR_PURGE),
            (&cluster, &lost, api_binding::BLOCKED_WAITING_FOR_FENCE),
        ] {
            let due = plan_at(binding, clusters, 160, &limiter, Instant::now());
            assert_eq!(names(&due.spec), ["b"]);
            assert!(due.blocked.is_empty(), "nothing waits before the write");
            let mut written = binding.clone();
            written.spec = due.spec;
            written.metadata.generation = Some(3);
            let now = at(160);
            let after = after_write(
                &written,
                &PlanInputs {
                    clusters,
                    placer: &FirstFree,
                    cluster_evictions: &limiter,
                    now: &now,
                    instant: Instant::now(),
                    scheduling_seconds: None,
                },
            )
            .expect("the written binding has nothing more to decide");
            let blocked: Vec<(&str, &str)> = after
                .blocked
                .iter()
                .map(|b| (b.cluster.as_str(), b.reason))
                .collect();
            assert_eq!(blocked, [("a", reason)]);
        }
    }

    #[test]
    fn no_other_cluster_fits_keeps_the_copy_and_says_so() {
        let b = placed(
            app_failover(0),
            &["a"],
            json!([unhealthy("a", 100, "Infrastructure")]),
        );
        let limiter = Mutex::new(EvictionRateLimiter::new(50.0));
        let planned = plan_at(&b, &[member("a", None)], 100, &limiter, Instant::now());
        assert_eq!(names(&planned.spec), ["a"]);
        assert!(planned.spec.graceful_eviction_tasks.is_empty());
        assert!(planned.spec.eviction_history.is_empty());
        // Scheduled still describes the placement the binding keeps.
        assert!(planned.scheduling.is_none());
        assert_eq!(planned.blocked.len(), 1);
        assert_eq!(
            planned.blocked[0].reason,
            failover_phase::REASON_NO_OTHER_CLUSTER
        );
        assert_eq!(planned.retry, Some(NO_OTHER_CLUSTER_RETRY));
    }

    #[test]
    fn an_application_failure_without_opt_in_stays_and_says_why() {
        let b = placed(
            app_failover(0),
            &["a"],
            json!([unhealthy("a", 100, "Application")]),
        );
        let limiter = Mutex::new(EvictionRateLimiter::new(50.0));
        let clusters = [member("a", None), member("b", None)];
        let planned = plan_at(&b, &clusters, 500, &limiter, Instant::now());
        assert_eq!(names(&planned.spec), ["a"]);
        assert!(planned.spec.eviction_history.is_empty());
        assert_eq!(planned.blocked[0].reason, "ApplicationFailure");
        assert_eq!(planned.retry, None);
    }

    #[test]
    fn a_lost_clusters_bindings_move_after_its_toleration_at_the_eviction_rate() {
        // No failover policy at all: cluster failover still applies, with its defaults (60 s).
        let b = placed(Value::Null, &["a"], json!([]));
        // Written as second 0: the toleration counts from the end of that second.
        let clusters = [member("a", Some(("Unknown", 0))), member("b", None)];
        let limiter = Mutex::new(EvictionRateLimiter::new(1.0));
        let start = Instant::now();
        let early = plan_at(&b, &clusters, 31, &limiter, start);
        assert_eq!(names(&early.spec), ["a"]);
        assert_eq!(early.retry, Some(Duration::from_secs(30)));

        let first = plan_at(&b, &clusters, 61, &limiter, start);
        assert_eq!(names(&first.spec), ["b"]);
        assert_eq!(first.spec.eviction_history[0].reason, "ClusterFailure");
        // The next binding in the same instant waits for the bucket (1/s).
        let second = plan_at(&b, &clusters, 61, &limiter, start);
        assert_eq!(names(&second.spec), ["a"]);
        assert!(second.spec.graceful_eviction_tasks.is_empty());
        let wait = second.retry.unwrap();
        assert!(wait > Duration::from_millis(900) && wait <= Duration::from_secs(1));
        let later = plan_at(&b, &clusters, 62, &limiter, start + Duration::from_secs(1));
        assert_eq!(names(&later.spec), ["b"]);
    }

    /// A member whose GPU nodes are all of one capacity type, as its agent reports them.
    fn gpu_member(name: &str, capacity_type: &str) -> Arc<Cluster> {
        let mut c = (*member(name, None)).clone();
        if let Some(status) = c.status.as_mut() {
            status.node_groups = serde_json::from_value(json!([{"count": 2,
                "free": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti", "pods": "110"},
                "capacityType": capacity_type}]))
            .unwrap();
            status.api_enablements = serde_json::from_value(json!([{
                "groupVersion": "workload.codeflare.dev/v1beta2",
                "resources": [{"name": "appwrappers", "kind": "AppWrapper"}]}]))
            .unwrap();
        }
        Arc::new(c)
    }

    #[test]
    fn a_spot_appwrapper_whose_member_lost_its_spot_nodes_moves_with_the_real_scheduler() {
        // Every spot node of `a` has a reclamation notice (its agent reports on-demand capacity
        // only); the agent resets the AppWrapper (SpotReclamation). It cannot run in `a` any
        // more, so the hub moves it to `b` at once.
        let b: ResourceBinding = serde_json::from_value(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "train-appwrapper", "namespace": "ml", "generation": 1},
            "spec": {
                "resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "train"},
                "replicas": 1, "gang": true,
                "replicaRequirements": {
                    "resourceRequest": {"nvidia.com/gpu": "8"},
                    "nodeClaim": {"nodeSelector": {"karpenter.sh/capacity-type": "spot"}}},
                "clusters": [{"name": "a", "replicas": 1}],
                "failover": {"application": {"decisionConditions": {"tolerationSeconds": 0}}}
            },
            "status": {"schedulerObservedGeneration": 1, "aggregatedStatus": [{
                "clusterName": "a", "applied": true, "health": "Unhealthy",
                "failureClass": "Infrastructure", "unhealthySince": at(10).0.to_string(),
                "healthReason": "SpotReclamation: pod train-0 runs on node a-1, which has a spot reclamation notice",
                "status": {"phase": "Resetting"}}]}
        }))
        .unwrap();
        let placer = SchedulerPlacer::new(&lifeboat_scheduler::SchedulerConfig::default());
        let limiter = Mutex::new(EvictionRateLimiter::new(50.0));
        let now = at(11);
        let clusters = [gpu_member("a", "on-demand"), gpu_member("b", "spot")];
        let planned = plan(
            Some(&b),
            b.clone(),
            &PlanInputs {
                clusters: &clusters,
                placer: &placer,
                cluster_evictions: &limiter,
                now: &now,
                instant: Instant::now(),
                scheduling_seconds: None,
            },
        );
        assert_eq!(names(&planned.spec), ["b"], "{:?}", planned.blocked);
        assert_eq!(planned.evicted.len(), 1);
        // While `a` still has room for it, the member's own reset is left to work.
        let roomy = [gpu_member("a", "spot"), gpu_member("b", "spot")];
        let kept = plan(
            Some(&b),
            b.clone(),
            &PlanInputs {
                clusters: &roomy,
                placer: &placer,
                cluster_evictions: &limiter,
                now: &now,
                instant: Instant::now(),
                scheduling_seconds: None,
            },
        );
        assert_eq!(names(&kept.spec), ["a"]);
    }

    #[test]
    fn a_deleted_cluster_loses_its_placement_with_a_record() {
        let b = placed(Value::Null, &["a"], json!([]));
        let limiter = Mutex::new(EvictionRateLimiter::new(50.0));
        let planned = plan_at(&b, &[member("b", None)], 0, &limiter, Instant::now());
        assert_eq!(names(&planned.spec), ["b"]);
        assert_eq!(planned.spec.eviction_history[0].reason, "ClusterDeleted");
    }

    #[test]
    fn the_old_copy_goes_once_the_new_placement_is_healthy() {
        let mut b = placed(
            app_failover(0),
            &["b"],
            json!([{"clusterName": "b", "applied": true, "health": "Unknown"}]),
        );
        b.spec.graceful_eviction_tasks.push(
            serde_json::from_value(json!({
            "fromCluster": "a", "purgeMode": "Gracefully", "reason": "ApplicationFailure",
            "producer": "lifeboat-hub", "gracePeriodSeconds": 600,
            "creationTimestamp": at(0).0.to_string()}))
            .unwrap(),
        );
        let clusters = [member("a", None), member("b", None)];
        let limiter = Mutex::new(EvictionRateLimiter::new(50.0));
        // Not Healthy yet: the task stays, and the binder looks again when the grace ends.
        let waiting = plan_at(&b, &clusters, 100, &limiter, Instant::now());
        assert_eq!(waiting.spec.graceful_eviction_tasks.len(), 1);
        assert_eq!(waiting.retry, Some(Duration::from_secs(500)));
        b.status.as_mut().unwrap().aggregated_status[0].health =
            lifeboat_api::binding::ResourceHealth::Healthy;
        let done = plan_at(&b, &clusters, 100, &limiter, Instant::now());
        assert!(done.spec.graceful_eviction_tasks.is_empty());
        assert_eq!(names(&done.spec), ["b"]);
    }

    #[test]
    fn a_failing_workload_is_reset_in_place_in_the_same_write_then_moved() {
        let failover = json!({"application": {"decisionConditions": {"tolerationSeconds": 0},
            "purgeMode": "Gracefully", "inPlaceReset": {"limit": 1, "pauseSeconds": 2}}});
        let mut b = placed(
            failover,
            &["a"],
            json!([unhealthy("a", 100, "Infrastructure")]),
        );
        let clusters = [member("a", None), member("b", None)];
        let limiter = Mutex::new(EvictionRateLimiter::new(50.0));
        let reset = plan_at(&b, &clusters, 100, &limiter, Instant::now());
        assert_eq!(names(&reset.spec), ["a"], "reset in place, not moved");
        assert!(reset.scheduling.is_none() && reset.spec.eviction_history.is_empty());
        assert_eq!(reset.resets.len(), 1);
        assert_eq!(reset.resets[0].reset.reason(), failover::RESET_FAILURE);
        let record = &reset.spec.in_place_resets[0];
        assert_eq!(
            (
                record.cluster_name.as_str(),
                record.generation,
                record.count
            ),
            ("a", 1, 1)
        );
        assert_eq!(record.last_requested_at, at(100));
        assert_eq!(record.pause_seconds, Some(2));
        assert_eq!(reset.resets[0].record, *record);
        // The work of cluster a asks for it.
        b.spec = reset.spec.clone();
        assert_eq!(
            dispatch::reset_request(&b, "a"),
            Some(lifeboat_api::protocol::ResetRequest {
                generation: 1,
                pause_seconds: 2
            })
        );
        // In flight: the next pass changes nothing until the reset's timeout (asked in second
        // 100, a 2 s pause, the default 600 s), and looks again then.
        let waiting = plan_at(&b, &clusters, 702, &limiter, Instant::now());
        assert!(waiting.resets.is_empty());
        assert_eq!(waiting.spec, b.spec);
        assert_eq!(waiting.retry, Some(Duration::from_secs(1)));
        // Never completed: moved, and the record leaves with the copy.
        let timed_out = plan_at(&b, &clusters, 703, &limiter, Instant::now());
        assert_eq!(names(&timed_out.spec), ["b"]);
        assert!(timed_out.spec.in_place_resets.is_empty());
        assert_eq!(
            timed_out.spec.eviction_history[0].reason,
            "InPlaceResetTimedOut"
        );
        // Re-created (generation 1), failing again: the limit is used up, it moves, and the
        // record leaves with the copy.
        b.status.as_mut().unwrap().aggregated_status[0].reset_generation = Some(1);
        let moved = plan_at(&b, &clusters, 10_000, &limiter, Instant::now());
        assert!(moved.resets.is_empty());
        assert_eq!(names(&moved.spec), ["b"]);
        assert!(moved.spec.in_place_resets.is_empty());
        assert_eq!(moved.spec.eviction_history[0].cluster_name, "a");
    }

    #[test]
    fn policy_labels_are_label_safe() {
        let long = PolicyReference {
            kind: "PropagationPolicy".into(),
            namespace: "n".repeat(40),
            name: "p".repeat(40),
            generation: None,
        };
        assert!(policy_label(&long).len() <= 63);
        let cpp = PolicyReference {
            kind: "ClusterPropagationPolicy".into(),
            namespace: String::new(),
            name: "gpu".into(),
            generation: None,
        };
        assert_eq!(policy_label(&cpp), "gpu");
    }
}
