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
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use lifeboat_api::binding::{
    self as api_binding, CONDITION_POLICY_BOUND, CONDITION_SCHEDULED, ClusterRejection,
    LABEL_POLICY_NAME, PolicyReference, REASON_NO_CLUSTER_FIT, REASON_SUCCESS, ResourceBinding,
    ResourceBindingSpec,
};
use lifeboat_api::cluster::Cluster;
use lifeboat_api::policy::{AnyPolicy, ClusterPropagationPolicy, PropagationPolicy};
use lifeboat_api::protocol::WorkKey;
use serde_json::Value;
use tracing::Instrument;

use crate::detector::{self, Replicas, TemplateKind, TemplateMeta};
use crate::dispatch;
use crate::interpreters::InterpreterHandle;
use crate::placement::{Placer, Unschedulable};
use crate::queue::WorkQueue;
use crate::status::condition;
use crate::templates::{TemplateKey, Templates};
use crate::work_store::WorkStore;

/// Field manager of the binding spec (every spec field the hub decides).
pub const SPEC_MANAGER: &str = "lifeboat-hub";
/// Field manager of the scheduler's status fields.
pub const SCHEDULER_MANAGER: &str = "lifeboat-hub/scheduler";

/// Why one reconcile failed. Each has a low-cardinality metric label.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("kubernetes API ({context}): {source}")]
    Kube {
        context: &'static str,
        #[source]
        source: Box<kube::Error>,
    },
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
            BindError::Kube { .. } => "kube",
            BindError::Conflict => "conflict",
            BindError::Interpret(_) => "interpret",
            BindError::Serialization { .. } => "serialization",
        }
    }

    fn kube(context: &'static str, source: kube::Error) -> BindError {
        if let kube::Error::Api(s) = &source
            && s.code == 409
        {
            return BindError::Conflict;
        }
        BindError::Kube {
            context,
            source: Box::new(source),
        }
    }
}

/// The binder's metrics.
#[derive(Clone)]
pub struct BinderMetrics {
    pub reconciles: prometheus::IntCounterVec,
    pub scheduling_seconds: prometheus::Histogram,
    pub bindings: prometheus::IntGaugeVec,
}

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
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(scheduling_seconds.clone()))?;
        registry.register(Box::new(bindings.clone()))?;
        Ok(BinderMetrics {
            reconciles,
            scheduling_seconds,
            bindings,
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
        }
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

    /// Queues the templates whose binding is not scheduled, or is placed on `cluster` (the
    /// clusters changed).
    pub fn queue_for_cluster_change(&self, cluster: &str) {
        for binding in self.caches.bindings.state() {
            let scheduled = binding
                .condition(CONDITION_SCHEDULED)
                .is_some_and(|c| c.status == "True");
            let placed_there = binding.spec.clusters.iter().any(|c| c.name == cluster);
            if (!scheduled || placed_there)
                && let Some(key) = template_key_of(&binding)
            {
                self.queue.add(key);
            }
        }
    }

    /// A binding was deleted: its work leaves every cluster, and its template (if it still
    /// exists) is bound again.
    pub fn binding_deleted(&self, binding: &ResourceBinding) {
        let key = dispatch::work_key(binding);
        let clusters = self
            .dispatched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
            .unwrap_or_default();
        for cluster in clusters {
            self.work.remove(&cluster, &key);
        }
        if let Some(template) = template_key_of(binding) {
            self.queue.add(template);
        }
    }

    /// Runs `workers` reconcile loops until the queue is closed.
    pub async fn run_workers(self: Arc<Self>, workers: usize) {
        let mut handles = Vec::new();
        for _ in 0..workers.max(1) {
            let binder = self.clone();
            handles.push(tokio::spawn(async move {
                while let Some(key) = binder.queue.next().await {
                    let span = tracing::info_span!("bind", template = %key);
                    let result = binder.reconcile(&key).instrument(span.clone()).await;
                    let label = match &result {
                        Ok(_) => "ok",
                        Err(e) => e.metric_label(),
                    };
                    binder.metrics.reconciles.with_label_values(&[label]).inc();
                    match result {
                        Ok(Outcome::Done) => {}
                        Ok(Outcome::RetryAfter(d)) => binder.queue.add_after(key.clone(), d),
                        Err(BindError::Conflict) => binder
                            .queue
                            .add_after(key.clone(), Duration::from_millis(50)),
                        Err(e) => {
                            span.in_scope(
                                || tracing::warn!(error = %e, "binding failed; retrying"),
                            );
                            binder.queue.add_after(key.clone(), Duration::from_secs(5));
                        }
                    }
                    binder.queue.done(&key);
                }
            }));
        }
        for h in handles {
            let _ = h.await;
        }
    }

    /// Decides and applies one template's binding.
    pub async fn reconcile(&self, key: &TemplateKey) -> Result<Outcome, BindError> {
        let Some(kind) = key.template_kind() else {
            return Ok(Outcome::Done);
        };
        let binding_name = api_binding::binding_name(&key.name, kind.kind);
        let existing = self.caches.binding(&key.namespace, &binding_name);
        let Some(template) = self.caches.templates.get(key) else {
            // Gone: the garbage collector deletes the binding (it is owned by the template),
            // and the binding's deletion takes the work off the members.
            return Ok(Outcome::Done);
        };
        if template.metadata.deletion_timestamp.is_some() {
            return Ok(Outcome::Done);
        }
        let template_json =
            serde_json::to_value(&*template).map_err(|source| BindError::Serialization {
                what: "template",
                source,
            })?;
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
                self.dispatch(&binding, &template_json)?;
            }
            return Ok(Outcome::Done);
        };
        let replicas = self.replicas(&template_json)?;
        let uid = template.metadata.uid.clone().unwrap_or_default();
        let mut desired = detector::binding_spec(kind, &meta, &uid, "", policy, replicas);
        if let Some(current) = &existing {
            desired.clusters = current.spec.clusters.clone();
            desired.graceful_eviction_tasks = current.spec.graceful_eviction_tasks.clone();
            desired.eviction_history = current.spec.eviction_history.clone();
            desired.in_place_resets = current.spec.in_place_resets.clone();
            desired.reschedule_triggered_at = current.spec.reschedule_triggered_at.clone();
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let clusters = self.caches.clusters.state();
        let schedule = needs_scheduling(existing.as_deref(), &desired, &clusters);
        let mut scheduling: Option<Result<(), Unschedulable>> = None;
        if schedule {
            let mut candidate = ResourceBinding::new(&binding_name, desired.clone());
            candidate.metadata.namespace = Some(key.namespace.clone());
            let started = Instant::now();
            let placed = self.placer.place(&candidate, &clusters, &now);
            self.metrics
                .scheduling_seconds
                .observe(started.elapsed().as_secs_f64());
            scheduling = Some(match placed {
                Ok(targets) => {
                    desired.clusters = targets;
                    Ok(())
                }
                // Keep the current placement when nothing fits: a copy is never removed for
                // lack of a better place (karmada#7455).
                Err(unschedulable) => Err(unschedulable),
            });
        }
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
        self.apply_status(&binding, scheduling.as_ref(), Some(policy), &now)
            .await?;
        self.dispatch(&binding, &template_json)?;
        Ok(match scheduling {
            Some(Err(_)) => Outcome::RetryAfter(Duration::from_secs(30)),
            _ => Outcome::Done,
        })
    }

    fn replicas(&self, template: &Value) -> Result<Replicas, BindError> {
        let interpreters = self.interpreters.current();
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

    /// Writes the `Scheduled` (when scheduling ran) and `PolicyBound` conditions, if changed.
    async fn apply_status(
        &self,
        binding: &ResourceBinding,
        scheduling: Option<&Result<(), Unschedulable>>,
        policy: Option<&AnyPolicy>,
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
        for target in &binding.spec.clusters {
            let work = dispatch::work_for(binding, &base, target, |obj, n| {
                interpreters
                    .revise_replica(obj, n)
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| BindError::Interpret(e.to_string()))?;
            self.work.upsert(&target.name, work);
            wanted.insert(target.name.clone());
        }
        // An eviction that keeps the old copy (Gracefully, Never) keeps its work too.
        for task in &binding.spec.graceful_eviction_tasks {
            if task.purge_mode != Some(lifeboat_api::policy::PurgeMode::Directly) {
                wanted.insert(task.from_cluster.clone());
            }
        }
        let mut dispatched = self.dispatched.lock().unwrap_or_else(|e| e.into_inner());
        let previous = dispatched
            .insert(key.clone(), wanted.clone())
            .unwrap_or_default();
        for cluster in previous.difference(&wanted) {
            self.work.remove(cluster, &key);
        }
        Ok(())
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
        for b in self.caches.bindings.state() {
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
