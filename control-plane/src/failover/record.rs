//! What the binder's decisions leave besides the binding itself: the event ledger (each
//! eviction with its inputs, each placement, each blocked failover and settled eviction task),
//! Kubernetes Events on the binding and on its template, and metrics (failovers by reason and
//! class, failover duration, blocked failovers).
//!
//! The ledger events and the Event texts are built by pure functions (unit-tested with fixed
//! times); [`FailoverRecorder`] does the IO. Only the leader records: the ledger feed checks the
//! leadership, and only the leader's binder runs.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use lifeboat_api::binding::{GracefulEvictionTask, ResourceBinding};
use serde_json::json;

use crate::failover::decide::{AppliedReset, Blocked, Eviction, PurgeEvidence, TaskChange};
use crate::ledger::{BindingRef, EventKind, LedgerEvent, LedgerFeed, ledger_time};

/// `to` of a placement event.
pub const PLACED: &str = "Placed";
/// `to` of an eviction event.
pub const EVICTED: &str = "Evicted";
/// `to` of a decision that blocks a failover.
pub const BLOCKED: &str = "Blocked";
/// `to` of an eviction task whose old copy is confirmed gone (Directly).
pub const PURGED: &str = "Purged";
/// `to` of an eviction task that ended (its old copy, if kept, goes now).
pub const TASK_DONE: &str = "EvictionTaskDone";

/// The reason of the Event posted on a binding for each in-place reset.
pub const EVENT_IN_PLACE_RESET: &str = "InPlaceReset";

/// The failover metrics (low-cardinality labels: reason and class are closed sets).
#[derive(Clone)]
pub struct FailoverMetrics {
    /// Evictions made, by reason (`ApplicationFailure`, `InPlaceResetTimedOut`, `ClusterFailure`,
    /// `ClusterDeleted`) and failure class.
    pub failovers: prometheus::IntCounterVec,
    /// From the first Unhealthy report (or the cluster leaving Ready) to the new placement
    /// Healthy, for evictions whose task ends that way.
    pub duration: prometheus::Histogram,
    /// Failovers that were due but blocked, by reason, counted when the block begins.
    pub blocked: prometheus::IntCounterVec,
    /// In-place resets written into bindings, by reason (`failure`, `manual`).
    pub in_place_resets: prometheus::IntCounterVec,
}

impl FailoverMetrics {
    pub fn new(registry: &prometheus::Registry) -> Result<FailoverMetrics, prometheus::Error> {
        let failovers = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_failovers_total",
                "Evictions of a workload from a cluster (failovers), by reason and failure class",
            ),
            &["reason", "class"],
        )?;
        let duration = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "lifeboat_hub_failover_duration_seconds",
                "From the first Unhealthy report of the evicted copy (or its cluster leaving Ready) to the new placement Healthy",
            )
            .buckets(vec![
                0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
            ]),
        )?;
        let blocked = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_failovers_blocked_total",
                "Failovers that were due but blocked (NoOtherClusterFits, ApplicationFailure, NeverHealthy, WaitingForPurge, WaitingForFence, WaitingForPurgeConfirmation, InPlaceResetTimedOut), counted when the block begins",
            ),
            &["reason"],
        )?;
        let in_place_resets = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_in_place_resets_total",
                "In-place resets asked of agents (delete and recreate the workload in its cluster), by reason (failure, manual)",
            ),
            &["reason"],
        )?;
        // Every known series exists at 0 from the start, so rate() and increase() in alerts and
        // dashboards see the first failover instead of a series that appears with it (Prometheus
        // cannot tell "0 to 1" from "absent to 1").
        for reason in [
            lifeboat_api::binding::EVICTION_APPLICATION_FAILURE,
            lifeboat_api::binding::EVICTION_CLUSTER_FAILURE,
            lifeboat_api::binding::EVICTION_CLUSTER_DELETED,
            lifeboat_api::binding::EVICTION_RESET_TIMED_OUT,
        ] {
            for class in lifeboat_api::health::FailureClass::ALL {
                failovers.with_label_values(&[reason, class.as_str()]);
            }
        }
        for reason in lifeboat_api::binding::FAILOVER_BLOCKED_REASONS {
            blocked.with_label_values(&[reason]);
        }
        for reason in [
            crate::failover::decide::RESET_FAILURE,
            crate::failover::decide::RESET_MANUAL,
        ] {
            in_place_resets.with_label_values(&[reason]);
        }
        registry.register(Box::new(failovers.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(blocked.clone()))?;
        registry.register(Box::new(in_place_resets.clone()))?;
        Ok(FailoverMetrics {
            failovers,
            duration,
            blocked,
            in_place_resets,
        })
    }
}

/// What one binder pass changed, as far as the records go.
pub struct PassRecord<'a> {
    /// The binding before the pass (`None`: it was created by it).
    pub before: Option<&'a ResourceBinding>,
    /// The binding as written.
    pub after: &'a ResourceBinding,
    /// Evictions made (written into the spec).
    pub evicted: &'a [Eviction],
    /// In-place resets written into the spec.
    pub resets: &'a [AppliedReset],
    /// Eviction tasks settled.
    pub settled: &'a [TaskChange],
    /// Failovers blocked now.
    pub blocked: &'a [Blocked],
    /// The template (for its Events).
    pub template: Option<ObjectReference>,
    pub now: &'a Time,
}

fn binding_ref(binding: &ResourceBinding) -> BindingRef {
    let (namespace, name) = binding.key();
    let reference = BindingRef::new(namespace, name);
    match binding.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => reference.with_uid(uid),
        _ => reference,
    }
}

fn clusters(binding: &ResourceBinding) -> Vec<String> {
    binding
        .spec
        .clusters
        .iter()
        .map(|c| c.name.clone())
        .collect()
}

/// An eviction with the inputs that decided it: reason, class, message (health reason and
/// timer), purge mode, grace period, how long the cluster stays out, preserved labels, and
/// where the workload went.
pub fn eviction_event(binding: &ResourceBinding, eviction: &Eviction, now: &Time) -> LedgerEvent {
    let mut event = LedgerEvent::new(EventKind::Eviction, ledger_time(now))
        .with_binding(binding_ref(binding))
        .with_cluster(&eviction.cluster)
        .with_to(EVICTED)
        .with_reason(eviction.reason)
        .with_class(eviction.class)
        .with_detail("message", eviction.message.as_str())
        .with_detail("purgeMode", json!(eviction.purge_mode))
        .with_detail("placedOn", json!(clusters(binding)));
    if let Some(grace) = eviction.grace_period_seconds {
        event = event.with_detail("gracePeriodSeconds", grace);
    }
    event = event.with_detail(
        "blockedForSeconds",
        eviction.block_seconds.map_or(json!(null), |s| json!(s)),
    );
    if let Some(since) = &eviction.failing_since {
        event = event.with_detail("failingSince", json!(since));
    }
    if !eviction.preserved.is_empty() {
        event = event.with_detail("preservedLabels", json!(eviction.preserved));
    }
    event
}

/// The binding was placed on `cluster` (first placement, a failover's new copy, a policy
/// change).
pub fn placement_event(binding: &ResourceBinding, cluster: &str, now: &Time) -> LedgerEvent {
    let replicas = binding
        .spec
        .clusters
        .iter()
        .find(|c| c.name == cluster)
        .map(|c| c.replicas)
        .unwrap_or_default();
    LedgerEvent::new(EventKind::Placement, ledger_time(now))
        .with_binding(binding_ref(binding))
        .with_cluster(cluster)
        .with_to(PLACED)
        .with_detail("replicas", replicas)
        .with_detail("placedOn", json!(clusters(binding)))
}

/// A failover that is due but does not happen, and why.
pub fn blocked_event(binding: &ResourceBinding, blocked: &Blocked, now: &Time) -> LedgerEvent {
    LedgerEvent::new(EventKind::Decision, ledger_time(now))
        .with_binding(binding_ref(binding))
        .with_cluster(&blocked.cluster)
        .with_to(BLOCKED)
        .with_reason(blocked.reason)
        .with_detail("message", blocked.message.as_str())
}

/// An eviction task moved on: the old copy is gone (Directly), or the task ended.
pub fn settled_event(binding: &ResourceBinding, change: &TaskChange, now: &Time) -> LedgerEvent {
    let event =
        LedgerEvent::new(EventKind::Decision, ledger_time(now)).with_binding(binding_ref(binding));
    match change {
        TaskChange::Purged { cluster, evidence } => event
            .with_cluster(cluster)
            .with_to(PURGED)
            .with_reason("OldCopyGone")
            .with_detail("by", evidence.as_str()),
        TaskChange::Remove { cluster, why } => event
            .with_cluster(cluster)
            .with_to(TASK_DONE)
            .with_detail("message", why.as_str()),
    }
}

/// Seconds from the trouble to the new placement Healthy, for a task that ends now because the
/// new placement is Healthy.
pub fn failover_seconds(task: &GracefulEvictionTask, now: &Time) -> Option<f64> {
    let since = task.failing_since.as_ref()?;
    let seconds = now.0.duration_since(since.0).as_secs_f64();
    (seconds >= 0.0).then_some(seconds)
}

/// The failovers blocked now that were not blocked for the same reason before: the condition
/// only says the first reason, so a block is new when its (cluster, reason) was not in the
/// previous message's set.
pub fn newly_blocked<'b>(
    before: Option<&ResourceBinding>,
    blocked: &'b [Blocked],
) -> Vec<&'b Blocked> {
    let previous =
        before.and_then(|b| b.condition(lifeboat_api::binding::CONDITION_FAILOVER_BLOCKED));
    let was: BTreeSet<&str> = previous
        .filter(|c| c.status == "True")
        .map(|c| c.message.split("; ").collect())
        .unwrap_or_default();
    blocked
        .iter()
        .filter(|b| !was.contains(b.message.as_str()))
        .collect()
}

/// The evictions in the binding's history that the ledger does not hold (`recorded`: the
/// binding's ledger events): what a hub killed between writing an eviction and writing its
/// ledger event leaves out. The binding is the source of truth; the missing events are built
/// from its records (at their eviction time, marked `recovered`). Times compare to the second,
/// the precision of the binding's timestamps.
pub fn missing_evictions(
    binding: &ResourceBinding,
    recorded: &[crate::ledger::LedgerRecord],
) -> Vec<LedgerEvent> {
    let have: BTreeSet<(&str, i64)> = recorded
        .iter()
        .filter(|r| r.event.kind == EventKind::Eviction)
        .filter_map(|r| Some((r.event.cluster.as_deref()?, r.event.at.timestamp())))
        .collect();
    binding
        .spec
        .eviction_history
        .iter()
        .filter(|r| !have.contains(&(r.cluster_name.as_str(), r.evicted_at.0.as_second())))
        .map(|r| {
            let mut event = LedgerEvent::new(EventKind::Eviction, ledger_time(&r.evicted_at))
                .with_binding(binding_ref(binding))
                .with_cluster(&r.cluster_name)
                .with_to(EVICTED)
                .with_reason(&r.reason)
                .with_detail("recovered", true)
                .with_detail(
                    "blockedUntil",
                    r.expires_at.as_ref().map_or(json!(null), |t| json!(t)),
                );
            if let Some(class) = r.failure_class {
                event = event.with_class(class);
            }
            if let Some(message) = &r.message {
                event = event.with_detail("message", message.as_str());
            }
            event
        })
        .collect()
}

/// Records a pass: ledger, Events, metrics.
pub struct FailoverRecorder {
    ledger: Option<LedgerFeed>,
    /// Where Events go, and who posts them.
    events: Option<(kube::Client, Reporter)>,
    metrics: FailoverMetrics,
}

impl FailoverRecorder {
    pub fn new(
        ledger: Option<LedgerFeed>,
        client: Option<kube::Client>,
        metrics: FailoverMetrics,
    ) -> FailoverRecorder {
        let events = client.map(|client| {
            (
                client,
                Reporter {
                    controller: "lifeboat-hub".into(),
                    instance: std::env::var("POD_NAME").ok(),
                },
            )
        });
        FailoverRecorder {
            ledger,
            events,
            metrics,
        }
    }

    async fn ledger(&self, event: LedgerEvent) {
        if let Some(ledger) = &self.ledger {
            ledger.record(event).await;
        }
    }

    /// Posts `event` on the binding and, with `on_template`, on its template too. A recorder of
    /// its own each time: a shared one folds later Events of the same reason on the same
    /// object into the first one's series, keeping the first note, and each failover is news.
    async fn publish(&self, pass: &PassRecord<'_>, event: Event, on_template: bool) {
        let Some((client, reporter)) = &self.events else {
            return;
        };
        let mut references = vec![pass.after.object_ref(&())];
        if on_template {
            references.extend(pass.template.clone());
        }
        for reference in references {
            let recorder = Recorder::new(client.clone(), reporter.clone());
            if let Err(error) = recorder.publish(&event, &reference).await {
                tracing::warn!(%error, reason = %event.reason, "publishing an Event failed");
            }
        }
    }

    async fn warn(&self, pass: &PassRecord<'_>, reason: &str, note: String) {
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(truncate_note(note)),
            action: "Failover".into(),
            secondary: None,
        };
        self.publish(pass, event, true).await;
    }

    /// Records what `pass` did.
    pub async fn record(&self, pass: PassRecord<'_>) {
        let now = pass.now;
        let before: BTreeSet<String> = pass
            .before
            .map(clusters)
            .unwrap_or_default()
            .into_iter()
            .collect();
        for eviction in pass.evicted {
            self.metrics
                .failovers
                .with_label_values(&[eviction.reason, eviction.class.as_str()])
                .inc();
            self.ledger(eviction_event(pass.after, eviction, now)).await;
            let note = format!(
                "evicted from {} ({}, class {}), placed on {}: {}",
                eviction.cluster,
                eviction.reason,
                eviction.class.as_str(),
                placed_on(pass.after),
                eviction.message
            );
            self.warn(&pass, "Evicted", note).await;
        }
        for applied in pass.resets {
            let reset = &applied.reset;
            tracing::info!(
                cluster = %reset.cluster,
                generation = applied.record.generation,
                count = applied.record.count,
                reason = reset.reason(),
                pause_seconds = reset.pause_seconds,
                message = %reset.message,
                "in-place reset asked"
            );
            self.metrics
                .in_place_resets
                .with_label_values(&[reset.reason()])
                .inc();
            let (namespace, name) = pass.after.key();
            let key = lifeboat_api::protocol::WorkKey { namespace, name };
            let uid = pass.after.metadata.uid.clone().unwrap_or_default();
            self.ledger(reset_event(&key, &uid, applied, ledger_time(now)))
                .await;
            self.publish(&pass, reset_k8s_event(applied), false).await;
        }
        for cluster in clusters(pass.after).iter().filter(|c| !before.contains(*c)) {
            self.ledger(placement_event(pass.after, cluster, now)).await;
        }
        for change in pass.settled {
            if let (TaskChange::Remove { cluster, .. }, Some(before)) = (change, pass.before)
                && crate::failover::decide::new_placement_healthy(before)
                && let Some(task) = before
                    .spec
                    .graceful_eviction_tasks
                    .iter()
                    .find(|t| &t.from_cluster == cluster)
                && let Some(seconds) = failover_seconds(task, now)
            {
                self.metrics.duration.observe(seconds);
            }
            self.ledger(settled_event(pass.after, change, now)).await;
            if let TaskChange::Purged { cluster, evidence } = change {
                self.publish(&pass, purged_k8s_event(cluster, *evidence), false)
                    .await;
            }
        }
        for blocked in newly_blocked(pass.before, pass.blocked) {
            self.metrics
                .blocked
                .with_label_values(&[blocked.reason])
                .inc();
            self.ledger(blocked_event(pass.after, blocked, now)).await;
            self.warn(
                &pass,
                "FailoverBlocked",
                format!("{}: {}", blocked.reason, blocked.message),
            )
            .await;
        }
    }
}

/// The Event of a `Directly` eviction's old copy confirmed gone, saying by what (the new copy is
/// created now).
pub fn purged_k8s_event(cluster: &str, evidence: PurgeEvidence) -> Event {
    let by = match evidence {
        PurgeEvidence::Agent => "its agent deleted it",
        PurgeEvidence::Hub => {
            "the hub deleted it through the member's kube-apiserver with the cluster's fencing credential (its agent is silent)"
        }
        PurgeEvidence::Operator => "an operator confirmed it (lifeboatctl confirm-purge)",
        PurgeEvidence::ClusterDeleted => "the Cluster was deleted",
    };
    Event {
        type_: EventType::Normal,
        reason: PURGED.into(),
        note: Some(truncate_note(format!(
            "the old copy in {cluster} is gone ({by}): the new copy may be created"
        ))),
        action: "Purge".into(),
        secondary: None,
    }
}

/// The Event of an in-place reset on its binding: Warning for a failure, Normal for a manual
/// request.
pub fn reset_k8s_event(applied: &AppliedReset) -> Event {
    let reset = &applied.reset;
    let record = &applied.record;
    let note = format!(
        "in-place reset in {} (generation {}, pause {}s): {}",
        reset.cluster, record.generation, reset.pause_seconds, reset.message
    );
    Event {
        type_: match reset.manual {
            Some(_) => EventType::Normal,
            None => EventType::Warning,
        },
        reason: EVENT_IN_PLACE_RESET.into(),
        note: Some(truncate_note(note)),
        action: "ResetInPlace".into(),
        secondary: None,
    }
}

fn placed_on(binding: &ResourceBinding) -> String {
    match clusters(binding).as_slice() {
        [] => "no cluster".into(),
        names => names.join(", "),
    }
}

/// Event notes are limited to 1 KiB by the API server.
fn truncate_note(mut note: String) -> String {
    const MAX: usize = 1000;
    if note.len() > MAX {
        let mut end = MAX - 3;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    note
}

/// `to` of an in-place reset decision.
pub const RESET: &str = "InPlaceReset";

/// An in-place reset the binder wrote into binding `key` (UID `binding_uid`): a `Decision`,
/// `to: InPlaceReset`, reason `Failure` or `Manual`, the failure class of a failure reset, and
/// in `details` the generation, the failure resets counted so far, the pause, the manual
/// request and the message.
pub fn reset_event(
    key: &lifeboat_api::protocol::WorkKey,
    binding_uid: &str,
    applied: &AppliedReset,
    at: chrono::DateTime<chrono::Utc>,
) -> LedgerEvent {
    let AppliedReset { reset, record } = applied;
    let mut event = LedgerEvent::new(EventKind::Decision, at)
        .with_binding(crate::ledger::binding_ref(key, binding_uid))
        .with_cluster(&reset.cluster)
        .with_to(RESET)
        .with_reason(match reset.manual {
            Some(_) => "Manual",
            None => "Failure",
        })
        .with_detail("generation", record.generation)
        .with_detail("count", record.count)
        .with_detail("pauseSeconds", reset.pause_seconds)
        .with_detail("message", reset.message.as_str());
    if let Some(value) = &reset.manual {
        event = event.with_detail("manualRequest", value.as_str());
    }
    if let Some(class) = reset.class {
        event = event.with_class(class);
    }
    event
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;
    use lifeboat_api::health::FailureClass;
    use lifeboat_api::policy::PurgeMode;
    use std::collections::BTreeMap;

    #[test]
    fn every_known_failover_and_reset_series_is_exported_at_zero_from_the_start() {
        let registry = prometheus::Registry::new();
        let _metrics = FailoverMetrics::new(&registry).unwrap();
        let series = |name: &str| crate::test_metrics::series(&registry, name);
        let failovers = series("lifeboat_hub_failovers_total");
        assert_eq!(
            failovers.len(),
            4 * FailureClass::ALL.len(),
            "{failovers:?}"
        );
        assert!(failovers.iter().all(|(_, v)| *v == 0.0));
        // Labels come sorted by name: class, reason.
        assert!(
            failovers
                .iter()
                .any(|(l, _)| l == &["Infrastructure", "ClusterFailure"])
        );
        let resets = series("lifeboat_hub_in_place_resets_total");
        let mut reasons: Vec<String> = resets.into_iter().flat_map(|(l, _)| l).collect();
        reasons.sort();
        assert_eq!(reasons, ["failure", "manual"]);
    }

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(1_900_000_000 + second).unwrap())
    }

    fn binding(clusters: &[&str], condition: Option<(&str, &str)>) -> ResourceBinding {
        let conditions: Vec<serde_json::Value> = condition
            .map(|(status, message)| {
                vec![json!({"type": "FailoverBlocked", "status": status, "reason": "NoOtherClusterFits",
                    "message": message, "lastTransitionTime": "2030-01-01T00:00:00Z"})]
            })
            .unwrap_or_default();
        serde_json::from_value(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "train-appwrapper", "namespace": "ml", "uid": "u1"},
            "spec": {
                "resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "train"},
                "clusters": clusters.iter().map(|c| json!({"name": c})).collect::<Vec<_>>()
            },
            "status": {"conditions": conditions}
        }))
        .unwrap()
    }

    fn eviction() -> Eviction {
        Eviction {
            cluster: "a".into(),
            reason: "ApplicationFailure",
            class: FailureClass::Infrastructure,
            message: "unhealthy in a since ... (node n1 NotReady; toleration 0s)".into(),
            purge_mode: PurgeMode::Gracefully,
            grace_period_seconds: Some(600),
            preserved: BTreeMap::from([("checkpoint".to_string(), "step-40".to_string())]),
            block_seconds: None,
            failing_since: Some(MicroTime(at(5).0)),
        }
    }

    #[test]
    fn an_eviction_event_carries_the_inputs_of_the_decision() {
        let event = eviction_event(&binding(&["b"], None), &eviction(), &at(7));
        assert_eq!(event.kind, EventKind::Eviction);
        assert_eq!(event.cluster.as_deref(), Some("a"));
        assert_eq!(event.to.as_deref(), Some(EVICTED));
        assert_eq!(event.reason.as_deref(), Some("ApplicationFailure"));
        assert_eq!(event.class, Some(FailureClass::Infrastructure));
        let details = &event.details;
        assert_eq!(details["purgeMode"], "Gracefully");
        assert_eq!(details["gracePeriodSeconds"], 600);
        assert_eq!(
            details["blockedForSeconds"],
            json!(null),
            "blocked for good"
        );
        assert_eq!(details["placedOn"], json!(["b"]));
        assert_eq!(details["preservedLabels"]["checkpoint"], "step-40");
        assert!(details["message"].as_str().unwrap().contains("NotReady"));
        assert_eq!(event.binding.as_ref().unwrap().uid.as_deref(), Some("u1"));
    }

    #[test]
    fn placement_and_settled_tasks_are_recorded_with_their_cluster() {
        let b = binding(&["b"], None);
        let placed = placement_event(&b, "b", &at(1));
        assert_eq!(
            (placed.kind, placed.to.as_deref()),
            (EventKind::Placement, Some(PLACED))
        );
        let purged = settled_event(
            &b,
            &TaskChange::Purged {
                cluster: "a".into(),
                evidence: crate::failover::decide::PurgeEvidence::Hub,
            },
            &at(2),
        );
        assert_eq!(purged.to.as_deref(), Some(PURGED));
        assert_eq!(purged.details["by"], "hub-fence");
        let done = settled_event(
            &b,
            &TaskChange::Remove {
                cluster: "a".into(),
                why: "the new placement is Healthy".into(),
            },
            &at(3),
        );
        assert_eq!(
            (done.cluster.as_deref(), done.to.as_deref()),
            (Some("a"), Some(TASK_DONE))
        );
    }

    #[test]
    fn the_failover_duration_runs_from_the_trouble_to_now() {
        let task = GracefulEvictionTask {
            from_cluster: "a".into(),
            purge_mode: None,
            replicas: None,
            reason: "ApplicationFailure".into(),
            message: None,
            producer: "lifeboat-hub".into(),
            grace_period_seconds: None,
            suppress_deletion: None,
            preserved_label_state: BTreeMap::new(),
            clusters_before_failover: vec![],
            creation_timestamp: Some(at(6)),
            purged_at: None,
            failing_since: Some(MicroTime(at(5).0)),
        };
        assert_eq!(failover_seconds(&task, &at(9)), Some(4.0));
        let unknown = GracefulEvictionTask {
            failing_since: None,
            ..task
        };
        assert_eq!(failover_seconds(&unknown, &at(9)), None);
    }

    #[test]
    fn a_block_is_recorded_when_it_begins_not_on_every_pass() {
        let block = Blocked {
            cluster: "a".into(),
            reason: "NoOtherClusterFits",
            message: "the workload should leave a, but no other cluster fits".into(),
        };
        let other = Blocked {
            cluster: "b".into(),
            reason: "WaitingForPurge",
            message: "the new copy waits".into(),
        };
        let blocks = [block.clone(), other.clone()];
        // Nothing blocked before: both are new.
        assert_eq!(
            newly_blocked(Some(&binding(&["a"], None)), &blocks).len(),
            2
        );
        // The first was already in the condition's message: only the second is new.
        let before = binding(&["a"], Some(("True", block.message.as_str())));
        assert_eq!(newly_blocked(Some(&before), &blocks), vec![&other]);
        // A condition that went False counts for nothing.
        let cleared = binding(&["a"], Some(("False", block.message.as_str())));
        assert_eq!(newly_blocked(Some(&cleared), &blocks).len(), 2);
        assert_eq!(newly_blocked(None, &blocks).len(), 2);
    }

    #[test]
    fn evictions_the_ledger_lacks_are_rebuilt_from_the_bindings_history() {
        let mut b = binding(&["c"], None);
        b.spec.eviction_history = serde_json::from_value(json!([
            {"clusterName": "a", "reason": "ApplicationFailure", "failureClass": "Infrastructure",
             "message": "unhealthy in a", "evictedAt": "2030-03-17T17:46:40Z"},
            {"clusterName": "b", "reason": "ClusterFailure", "evictedAt": "2030-03-17T17:50:00Z",
             "expiresAt": "2030-03-17T18:00:00Z"}
        ]))
        .unwrap();
        // The ledger has the first (at a finer time within the same second), not the second.
        let first = eviction_event(&b, &eviction(), &b.spec.eviction_history[0].evicted_at);
        let mut first_at_micros = first.clone();
        first_at_micros.at += chrono::Duration::microseconds(250_000);
        let recorded = vec![crate::ledger::LedgerRecord {
            id: 1,
            event: first_at_micros,
        }];
        let missing = missing_evictions(&b, &recorded);
        assert_eq!(missing.len(), 1, "{missing:?}");
        let rebuilt = &missing[0];
        assert_eq!(rebuilt.cluster.as_deref(), Some("b"));
        assert_eq!(rebuilt.reason.as_deref(), Some("ClusterFailure"));
        assert_eq!(rebuilt.details["recovered"], true);
        assert_eq!(rebuilt.details["blockedUntil"], "2030-03-17T18:00:00Z");
        assert_eq!(
            rebuilt.at,
            ledger_time(&b.spec.eviction_history[1].evicted_at)
        );
        // Nothing recorded at all: both.
        assert_eq!(missing_evictions(&b, &[]).len(), 2);
    }

    #[test]
    fn long_notes_are_cut_on_a_character_boundary() {
        let note = truncate_note("é".repeat(800));
        assert!(note.len() <= 1000 && note.ends_with("..."));
    }

    #[test]
    fn a_reset_is_a_decision_with_its_generation_and_why() {
        use crate::failover::decide::Reset;
        use lifeboat_api::protocol::WorkKey;
        let key = || WorkKey {
            namespace: "ml".into(),
            name: "train-appwrapper".into(),
        };
        let at = || {
            chrono::DateTime::parse_from_rfc3339("2026-11-23T10:00:00.123456Z")
                .unwrap()
                .with_timezone(&chrono::Utc)
        };
        use lifeboat_api::binding::InPlaceResetRecord;
        let record = InPlaceResetRecord {
            cluster_name: "member-1".into(),
            generation: 2,
            count: 2,
            last_requested_at: Time(Timestamp::from_second(1_800_000_000).unwrap()),
            manual_request: None,
            pause_seconds: Some(1),
        };
        let failure = AppliedReset {
            reset: Reset {
                cluster: "member-1".into(),
                manual: None,
                pause_seconds: 1,
                class: Some(FailureClass::Unknown),
                message: "unhealthy: reset 2 of 2".into(),
            },
            record: record.clone(),
        };
        let event = reset_event(&key(), "uid-1", &failure, at());
        assert_eq!(event.kind, EventKind::Decision);
        assert_eq!(event.cluster.as_deref(), Some("member-1"));
        assert_eq!(
            (event.to.as_deref(), event.reason.as_deref()),
            (Some("InPlaceReset"), Some("Failure"))
        );
        assert_eq!(event.class, Some(FailureClass::Unknown));
        assert_eq!(
            event.binding.as_ref().unwrap().uid.as_deref(),
            Some("uid-1")
        );
        assert_eq!(
            event.details,
            json!({"generation": 2, "count": 2, "pauseSeconds": 1,
                   "message": "unhealthy: reset 2 of 2"})
        );
        let manual = AppliedReset {
            reset: Reset {
                manual: Some("member-1/n1".into()),
                class: None,
                ..failure.reset.clone()
            },
            record,
        };
        let event = reset_event(&key(), "uid-1", &manual, at());
        assert_eq!(event.reason.as_deref(), Some("Manual"));
        assert_eq!(event.class, None);
        assert_eq!(event.details["manualRequest"], "member-1/n1");
    }
}
