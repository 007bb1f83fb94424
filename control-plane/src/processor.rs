//! The status processor: agents' reports → interpreted health and reflected status → each
//! binding's per-cluster items ([`crate::status::next_item`]) → the binding's status (written
//! only when something changed) and the template's status (the kind's AggregateStatus).
//!
//! [`StatusState`] is the decision core, IO-free: it checks each report against the cluster's
//! assigned work, refuses replays (a report older than the last one taken for that binding and
//! cluster), runs the interpreters and folds the result in. [`run`] is the IO around it: a thread
//! that takes batches from the intake (Lua is CPU work, kept off the async executor) and a writer
//! task that applies dirty bindings' status with server-side apply.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use lifeboat_api::binding::{AggregatedStatusItem, ResourceBinding, ResourceHealth};
use lifeboat_api::health::FailureClass;
use lifeboat_api::protocol::{RejectedItem, StatusResponse, WorkKey, WorkStatus};
use lifeboat_interpreter::HealthState;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::intake::{StatusBatch, StatusReceiver};
use crate::interpreters::{InterpreterHandle, Interpreters};
use crate::status::{self, HealthVerdict, Observation};
use crate::work_store::WorkStore;

/// Field manager of everything the processor writes.
pub const FIELD_MANAGER: &str = "lifeboat-hub/status";

/// A change of health of one binding in one cluster (for the ledger and metrics).
#[derive(Debug, Clone, PartialEq)]
pub struct HealthTransition {
    pub key: WorkKey,
    pub cluster: String,
    pub from: ResourceHealth,
    pub to: ResourceHealth,
    pub class: Option<FailureClass>,
    pub reason: Option<String>,
    pub at: Time,
}

/// What one batch did.
#[derive(Debug, Default)]
pub struct Processed {
    pub response: StatusResponse,
    /// Bindings whose items changed.
    pub dirty: Vec<WorkKey>,
    pub transitions: Vec<HealthTransition>,
}

#[derive(Debug, Default)]
struct Tracked {
    uid: String,
    items: BTreeMap<String, AggregatedStatusItem>,
    /// The agent's `observedAt` of the last report taken, per cluster (replay protection).
    last_report: HashMap<String, Time>,
}

/// Per-binding status as the processor knows it.
#[derive(Debug, Default)]
pub struct StatusState {
    bindings: HashMap<WorkKey, Tracked>,
}

impl StatusState {
    /// Folds a batch in. `binding` finds the binding of a key (the processor seeds a binding it
    /// has not seen yet from the binding's own status, so timers survive a hub restart).
    pub fn process(
        &mut self,
        batch: &StatusBatch,
        work: &WorkStore,
        binding: impl Fn(&WorkKey) -> Option<Arc<ResourceBinding>>,
        interpreters: &Interpreters,
        now: &Time,
    ) -> Processed {
        let mut processed = Processed::default();
        let mut dirty = HashSet::new();
        for report in &batch.report.items {
            match self.take(&batch.cluster, report, work, &binding, interpreters, now) {
                Ok(update) => {
                    processed.response.accepted += 1;
                    if let Some(transition) = update {
                        dirty.insert(report.key.clone());
                        if let Some(t) = transition {
                            processed.transitions.push(t);
                        }
                    }
                }
                Err(reason) => processed.response.rejected.push(RejectedItem {
                    key: report.key.clone(),
                    reason,
                }),
            }
        }
        processed.dirty = dirty.into_iter().collect();
        processed.dirty.sort();
        processed
    }

    /// `Ok(None)`: taken, nothing changed; `Ok(Some(t))`: changed, with a health transition
    /// if any; `Err(why)`: refused.
    #[allow(clippy::type_complexity)]
    fn take(
        &mut self,
        cluster: &str,
        report: &WorkStatus,
        work: &WorkStore,
        binding: &impl Fn(&WorkKey) -> Option<Arc<ResourceBinding>>,
        interpreters: &Interpreters,
        now: &Time,
    ) -> Result<Option<Option<HealthTransition>>, String> {
        let assigned = work
            .get(cluster, &report.key)
            .ok_or_else(|| format!("{} is not assigned to cluster {cluster}", report.key))?;
        if assigned.binding_uid != report.binding_uid {
            return Err(format!(
                "binding UID {} is not the one assigned ({})",
                report.binding_uid, assigned.binding_uid
            ));
        }
        if self
            .bindings
            .get(&report.key)
            .is_none_or(|t| t.uid != report.binding_uid)
        {
            let mut tracked = Tracked {
                uid: report.binding_uid.clone(),
                ..Default::default()
            };
            if let Some(b) = binding(&report.key)
                && b.metadata.uid.as_deref() == Some(report.binding_uid.as_str())
                && let Some(status) = &b.status
            {
                for item in &status.aggregated_status {
                    tracked
                        .items
                        .insert(item.cluster_name.clone(), item.clone());
                }
            }
            self.bindings.insert(report.key.clone(), tracked);
        }
        let Some(tracked) = self.bindings.get_mut(&report.key) else {
            return Err("internal: binding not tracked".into());
        };
        if let Some(last) = tracked.last_report.get(cluster) {
            if report.observed_at.0 < last.0 {
                return Err(format!(
                    "stale: observed at {} but a report observed at {} was already taken",
                    report.observed_at.0, last.0
                ));
            }
            if report.observed_at.0 == last.0 {
                // The same report again (a retried or replayed request): nothing new.
                return Ok(None);
            }
        }
        let (verdict, reflected) = match &report.observed {
            Some(observed) => interpret(interpreters, observed),
            None => (HealthVerdict::NoRule, None),
        };
        let update = status::next_item(
            tracked.items.get(cluster),
            &Observation {
                cluster,
                report,
                verdict,
                reflected,
            },
            now,
        );
        tracked
            .last_report
            .insert(cluster.to_string(), report.observed_at.clone());
        let transition = update.health_transition.map(|(from, to)| HealthTransition {
            key: report.key.clone(),
            cluster: cluster.to_string(),
            from,
            to,
            class: update.item.failure_class,
            reason: update.item.health_reason.clone(),
            at: now.clone(),
        });
        let changed = update.changed;
        tracked.items.insert(cluster.to_string(), update.item);
        Ok(changed.then_some(transition))
    }

    /// The items of a binding, by cluster name.
    pub fn items(&self, key: &WorkKey) -> Vec<AggregatedStatusItem> {
        self.bindings
            .get(key)
            .map(|t| t.items.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The UID the state of `key` belongs to.
    pub fn uid(&self, key: &WorkKey) -> Option<&str> {
        self.bindings.get(key).map(|t| t.uid.as_str())
    }

    /// Drops a binding (deleted, or re-created with another UID).
    pub fn forget(&mut self, key: &WorkKey) {
        self.bindings.remove(key);
    }

    /// How many bindings are tracked.
    pub fn len(&self) -> usize {
        self.bindings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bindings.is_empty()
    }
}

/// Health and reflected status of an observed object. A kind without a ReflectStatus rule
/// reflects its whole `status`, as Karmada's fallback does.
fn interpret(
    interpreters: &Interpreters,
    observed: &serde_json::Value,
) -> (HealthVerdict, Option<serde_json::Value>) {
    let verdict = match interpreters.interpret_health(observed) {
        Ok(None) => HealthVerdict::NoRule,
        Ok(Some(health)) => HealthVerdict::Judged {
            health: match health.state {
                HealthState::Healthy => ResourceHealth::Healthy,
                HealthState::Unhealthy => ResourceHealth::Unhealthy,
                HealthState::Unknown => ResourceHealth::Unknown,
            },
            reason: health.reason,
            class: health.class,
        },
        Err(e) => HealthVerdict::Failed(e.to_string()),
    };
    let reflected = match interpreters.reflect_status(observed) {
        Ok(Some(status)) => Some(status),
        Ok(None) => observed.get("status").cloned(),
        Err(e) => {
            tracing::debug!(error = %e, "ReflectStatus failed; reflecting nothing");
            None
        }
    };
    (verdict, reflected)
}

/// What the processor's IO needs.
pub struct ProcessorDeps {
    pub client: kube::Client,
    pub bindings: Store<ResourceBinding>,
    pub work: Arc<WorkStore>,
    pub interpreters: InterpreterHandle,
    pub metrics: ProcessorMetrics,
    /// Health transitions go here (the ledger), if set.
    pub transitions: Option<mpsc::UnboundedSender<HealthTransition>>,
    /// Bindings whose status was written (the template status aggregation follows them).
    pub written: Option<mpsc::UnboundedSender<WorkKey>>,
    /// Parallel status writes.
    pub write_concurrency: usize,
}

/// The processor's metrics.
#[derive(Clone)]
pub struct ProcessorMetrics {
    pub items: prometheus::IntCounterVec,
    pub batch_seconds: prometheus::Histogram,
    pub status_writes: prometheus::IntCounterVec,
    pub health_transitions: prometheus::IntCounterVec,
}

impl ProcessorMetrics {
    pub fn new(registry: &prometheus::Registry) -> Result<ProcessorMetrics, prometheus::Error> {
        let items = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_status_items_processed_total",
                "Status items reported by agents, by result (accepted, rejected)",
            ),
            &["result"],
        )?;
        let batch_seconds = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "lifeboat_hub_status_batch_duration_seconds",
                "Time to interpret and fold one batch of status reports",
            )
            .buckets(vec![
                0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
            ]),
        )?;
        let status_writes = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_binding_status_writes_total",
                "Binding status writes by result",
            ),
            &["result"],
        )?;
        let health_transitions = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_health_transitions_total",
                "Per-cluster health changes of bindings, by new health",
            ),
            &["health"],
        )?;
        registry.register(Box::new(items.clone()))?;
        registry.register(Box::new(batch_seconds.clone()))?;
        registry.register(Box::new(status_writes.clone()))?;
        registry.register(Box::new(health_transitions.clone()))?;
        Ok(ProcessorMetrics {
            items,
            batch_seconds,
            status_writes,
            health_transitions,
        })
    }
}

/// Shared between the processing thread and the writer.
pub type SharedState = Arc<Mutex<StatusState>>;

/// Runs the processor until the intake closes: a thread folds batches in, a task writes the
/// dirty bindings. Returns the shared state (for tests and the template aggregation).
pub fn run(mut intake: StatusReceiver, deps: ProcessorDeps) -> SharedState {
    let state: SharedState = Arc::new(Mutex::new(StatusState::default()));
    let (dirty_tx, dirty_rx) = mpsc::unbounded_channel::<WorkKey>();
    let thread_state = state.clone();
    let bindings = deps.bindings.clone();
    let work = deps.work.clone();
    let interpreters = deps.interpreters.clone();
    let metrics = deps.metrics.clone();
    let transitions = deps.transitions.clone();
    let spawned = std::thread::Builder::new()
        .name("status-processor".into())
        .spawn(move || {
            while let Some(submission) = intake.blocking_recv() {
                let started = Instant::now();
                let now = Time(k8s_openapi::jiff::Timestamp::now());
                let current = interpreters.current();
                let processed = {
                    let mut guard = thread_state.lock().unwrap_or_else(|e| e.into_inner());
                    guard.process(
                        &submission.batch,
                        &work,
                        |key| bindings.get(&ObjectRef::new(&key.name).within(&key.namespace)),
                        &current,
                        &now,
                    )
                };
                metrics
                    .items
                    .with_label_values(&["accepted"])
                    .inc_by(processed.response.accepted as u64);
                metrics
                    .items
                    .with_label_values(&["rejected"])
                    .inc_by(processed.response.rejected.len() as u64);
                metrics
                    .batch_seconds
                    .observe(started.elapsed().as_secs_f64());
                for t in processed.transitions {
                    metrics
                        .health_transitions
                        .with_label_values(&[t.to.as_str()])
                        .inc();
                    if let Some(tx) = &transitions {
                        let _ = tx.send(t);
                    }
                }
                for key in processed.dirty {
                    let _ = dirty_tx.send(key);
                }
                let _ = submission.reply.send(processed.response);
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the status processor thread");
    }
    tokio::spawn(write_dirty(dirty_rx, state.clone(), deps).in_current_span());
    state
}

/// Writes the status of dirty bindings, each at most `write_concurrency` at once; a binding
/// that becomes dirty again while being written is written again after.
async fn write_dirty(
    mut rx: mpsc::UnboundedReceiver<WorkKey>,
    state: SharedState,
    deps: ProcessorDeps,
) {
    let ProcessorDeps {
        client,
        bindings,
        metrics,
        written,
        write_concurrency,
        ..
    } = deps;
    let semaphore = Arc::new(tokio::sync::Semaphore::new(write_concurrency.max(1)));
    let pending: Arc<Mutex<HashSet<WorkKey>>> = Arc::new(Mutex::new(HashSet::new()));
    while let Some(key) = rx.recv().await {
        if !pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone())
        {
            continue;
        }
        let Ok(permit) = semaphore.clone().acquire_owned().await else {
            return;
        };
        let (client, bindings, state, pending, metrics, written) = (
            client.clone(),
            bindings.clone(),
            state.clone(),
            pending.clone(),
            metrics.clone(),
            written.clone(),
        );
        tokio::spawn(async move {
            // Taken off the pending set before reading the state: a change that lands during
            // the write marks the binding dirty again.
            pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
            let result = write_status(&client, &bindings, &state, &key).await;
            let label = match &result {
                Ok(true) => "written",
                Ok(false) => "unchanged",
                Err(_) => "error",
            };
            metrics.status_writes.with_label_values(&[label]).inc();
            match result {
                Ok(true) => {
                    if let Some(tx) = &written {
                        let _ = tx.send(key);
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(binding = %key, error = %e, "writing binding status failed")
                }
            }
            drop(permit);
        });
    }
}

/// Applies the binding's items and conditions if they differ from what the binding has.
/// `Ok(false)`: nothing to write (or the binding is gone).
pub async fn write_status(
    client: &kube::Client,
    bindings: &Store<ResourceBinding>,
    state: &SharedState,
    key: &WorkKey,
) -> Result<bool, kube::Error> {
    let Some(binding) = bindings.get(&ObjectRef::new(&key.name).within(&key.namespace)) else {
        return Ok(false);
    };
    let uid = binding.metadata.uid.clone().unwrap_or_default();
    let items = {
        let guard = state.lock().unwrap_or_else(|e| e.into_inner());
        if guard.uid(key) != Some(uid.as_str()) {
            return Ok(false);
        }
        guard.items(key)
    };
    let (patch, changed) =
        status_patch(&binding, items, &Time(k8s_openapi::jiff::Timestamp::now()));
    if !changed {
        return Ok(false);
    }
    let api: Api<ResourceBinding> = Api::namespaced(client.clone(), &key.namespace);
    api.patch_status(
        &key.name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(patch),
    )
    .await?;
    Ok(true)
}

/// The status patch for a binding: the items of the clusters it is placed on or being evicted
/// from (old copies still report under Gracefully and Never), and the two conditions; and
/// whether it differs from the binding's current status.
pub fn status_patch(
    binding: &ResourceBinding,
    items: Vec<AggregatedStatusItem>,
    now: &Time,
) -> (serde_json::Value, bool) {
    let wanted: HashSet<&str> = binding
        .spec
        .clusters
        .iter()
        .map(|c| c.name.as_str())
        .chain(
            binding
                .spec
                .graceful_eviction_tasks
                .iter()
                .map(|t| t.from_cluster.as_str()),
        )
        .collect();
    let items: Vec<AggregatedStatusItem> = items
        .into_iter()
        .filter(|i| wanted.contains(i.cluster_name.as_str()))
        .collect();
    let previous = binding
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let conditions = status::conditions(
        &binding.spec.clusters,
        &items,
        previous,
        binding.metadata.generation,
        now,
    );
    let current_items = binding
        .status
        .as_ref()
        .map(|s| s.aggregated_status.as_slice())
        .unwrap_or_default();
    let same_conditions = conditions.iter().all(|c| {
        previous.iter().any(|p| {
            p.type_ == c.type_
                && p.status == c.status
                && p.reason == c.reason
                && p.message == c.message
                && p.observed_generation == c.observed_generation
        })
    });
    let changed = current_items != items.as_slice() || !same_conditions;
    let patch = serde_json::json!({
        "apiVersion": "work.lifeboat.dev/v1alpha1",
        "kind": "ResourceBinding",
        "metadata": {"name": binding.metadata.name, "namespace": binding.metadata.namespace},
        "status": {"aggregatedStatus": items, "conditions": conditions},
    });
    (patch, changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpreters::Interpreters;
    use k8s_openapi::jiff::Timestamp;
    use lifeboat_api::binding::ResourceBindingSpec;
    use lifeboat_api::protocol::{StatusReport, Work};
    use lifeboat_interpreter::{Runtime, RuntimeConfig};
    use serde_json::json;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(1_800_000_000 + second).unwrap())
    }

    fn key() -> WorkKey {
        WorkKey {
            namespace: "ml".into(),
            name: "train-appwrapper".into(),
        }
    }

    fn interpreters() -> Interpreters {
        let builtin =
            Interpreters::builtin(Arc::new(Runtime::new(RuntimeConfig::default()))).unwrap();
        Interpreters::layered(builtin, &[]).0
    }

    fn store_with_work() -> WorkStore {
        let store = WorkStore::new("e1");
        store.upsert(
            "m1",
            Work {
                key: key(),
                binding_uid: "uid-1".into(),
                manifest: json!({}),
                ..Default::default()
            },
        );
        store
    }

    fn appwrapper(phase: &str, unhealthy: Option<&str>) -> serde_json::Value {
        let mut conditions = vec![
            json!({"type": "PodsReady", "status": if phase == "Running" { "True" } else { "False" },
            "reason": "x", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}),
        ];
        if let Some(msg) = unhealthy {
            conditions.push(
                json!({"type": "Unhealthy", "status": "True", "reason": "FoundFailedPods",
                "message": msg, "lastTransitionTime": "2026-01-01T00:00:00Z"}),
            );
        }
        json!({
            "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": {"name": "train", "namespace": "ml", "generation": 1},
            "spec": {"components": []},
            "status": {"phase": phase, "conditions": conditions}
        })
    }

    fn report(second: i64, observed: serde_json::Value) -> WorkStatus {
        WorkStatus {
            key: key(),
            binding_uid: "uid-1".into(),
            revision: 1,
            applied: true,
            applied_message: None,
            observed: Some(observed),
            observed_at: at(second),
            reset_generation: None,
            fenced: false,
        }
    }

    fn batch(cluster: &str, items: Vec<WorkStatus>) -> StatusBatch {
        StatusBatch {
            cluster: cluster.into(),
            report: StatusReport { items, full: false },
        }
    }

    #[test]
    fn reports_become_items_and_replays_change_nothing() {
        let work = store_with_work();
        let interp = interpreters();
        let mut state = StatusState::default();
        let none = |_: &WorkKey| None;
        let b = batch("m1", vec![report(1, appwrapper("Running", None))]);
        let p = state.process(&b, &work, none, &interp, &at(100));
        assert_eq!(p.response.accepted, 1);
        assert_eq!(p.dirty, vec![key()]);
        let item = &state.items(&key())[0];
        assert_eq!(item.health, ResourceHealth::Healthy);
        assert_eq!(item.status.as_ref().unwrap()["phase"], "Running");
        // the very same batch again: accepted, nothing dirty
        let p = state.process(&b, &work, none, &interp, &at(101));
        assert_eq!((p.response.accepted, p.dirty.len()), (1, 0));
        // an older report is refused as stale
        let old = batch(
            "m1",
            vec![report(0, appwrapper("Failed", Some("[Infrastructure] x")))],
        );
        let p = state.process(&old, &work, none, &interp, &at(102));
        assert_eq!(p.response.accepted, 0);
        assert!(p.response.rejected[0].reason.starts_with("stale"));
        assert_eq!(state.items(&key())[0].health, ResourceHealth::Healthy);
    }

    #[test]
    fn the_agents_failure_class_reaches_the_item() {
        let work = store_with_work();
        let interp = interpreters();
        let mut state = StatusState::default();
        let b = batch(
            "m1",
            vec![report(
                1,
                appwrapper("Failed", Some("[Infrastructure] node n1 is NotReady")),
            )],
        );
        let p = state.process(&b, &work, |_| None, &interp, &at(5));
        let item = &state.items(&key())[0];
        assert_eq!(item.health, ResourceHealth::Unhealthy);
        assert_eq!(item.failure_class, Some(FailureClass::Infrastructure));
        assert_eq!(item.unhealthy_since, Some(at(5)));
        assert_eq!(p.transitions.len(), 1);
        assert_eq!(p.transitions[0].to, ResourceHealth::Unhealthy);
    }

    #[test]
    fn work_of_another_cluster_or_binding_is_refused() {
        let work = store_with_work();
        let interp = interpreters();
        let mut state = StatusState::default();
        let p = state.process(
            &batch("m2", vec![report(1, appwrapper("Running", None))]),
            &work,
            |_| None,
            &interp,
            &at(1),
        );
        assert_eq!(p.response.accepted, 0);
        assert!(
            p.response.rejected[0]
                .reason
                .contains("not assigned to cluster m2")
        );
        let mut other_uid = report(1, appwrapper("Running", None));
        other_uid.binding_uid = "uid-old".into();
        let p = state.process(
            &batch("m1", vec![other_uid]),
            &work,
            |_| None,
            &interp,
            &at(1),
        );
        assert!(p.response.rejected[0].reason.contains("binding UID"));
        assert!(state.is_empty());
    }

    #[test]
    fn timers_survive_a_restart_through_the_bindings_status() {
        let work = store_with_work();
        let interp = interpreters();
        let mut binding = ResourceBinding::new("train-appwrapper", ResourceBindingSpec::default());
        binding.metadata.namespace = Some("ml".into());
        binding.metadata.uid = Some("uid-1".into());
        binding.status = Some(
            serde_json::from_value(json!({"aggregatedStatus": [{
                "clusterName": "m1", "applied": true, "health": "Unhealthy",
                "failureClass": "Capacity", "unhealthySince": "2027-01-15T08:00:00Z"
            }]}))
            .unwrap(),
        );
        let binding = Arc::new(binding);
        let mut state = StatusState::default();
        // after the restart the agent reports Unknown (its own restart): the timer stays
        let unknown = appwrapper("Resuming", None);
        let b = batch("m1", vec![report(1, unknown)]);
        state.process(&b, &work, |_| Some(binding.clone()), &interp, &at(500));
        let item = &state.items(&key())[0];
        assert_eq!(
            item.unhealthy_since.as_ref().unwrap().0.to_string(),
            "2027-01-15T08:00:00Z"
        );
    }

    #[test]
    fn the_patch_keeps_placed_and_evicting_clusters_only() {
        let mut binding: ResourceBinding = serde_json::from_value(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "b", "namespace": "ml", "generation": 2},
            "spec": {"resource": {"apiVersion": "v1", "kind": "Pod", "name": "p"},
                     "clusters": [{"name": "m2"}],
                     "gracefulEvictionTasks": [{"fromCluster": "m1", "reason": "ApplicationFailure", "producer": "hub"}]}
        }))
        .unwrap();
        let item = |c: &str, h| AggregatedStatusItem {
            cluster_name: c.into(),
            applied: true,
            health: h,
            ..Default::default()
        };
        let items = vec![
            item("m1", ResourceHealth::Unhealthy),
            item("m2", ResourceHealth::Healthy),
            item("m3", ResourceHealth::Healthy),
        ];
        let (patch, changed) = status_patch(&binding, items.clone(), &at(1));
        assert!(changed);
        let clusters: Vec<&str> = patch["status"]["aggregatedStatus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["clusterName"].as_str().unwrap())
            .collect();
        assert_eq!(clusters, ["m1", "m2"]);
        assert_eq!(patch["status"]["conditions"][1]["status"], "True");
        // once the binding carries that status, the same items are no change
        binding.status = Some(serde_json::from_value(patch["status"].clone()).unwrap());
        let (_, changed) = status_patch(&binding, items, &at(2));
        assert!(!changed);
    }
}
