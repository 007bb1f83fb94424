//! What the hub records in the ledger, and from where: a dispatch or withdrawal for each change
//! of a cluster's desired work (the [`WorkStore`] observer), a health transition per binding and
//! cluster (the status processor), a cluster `Ready` transition (the cluster health monitor).
//!
//! The event builders are pure (unit-tested with fixed times); [`LedgerFeed`] hands their events
//! to the [`LedgerWriter`] only while this process leads, so a standby records nothing.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use lifeboat_api::protocol::{Work, WorkKey};
use serde_json::json;
use tokio::sync::{broadcast, mpsc, watch};

use super::{BindingRef, EventKind, LedgerEvent, LedgerWriter};
use crate::clusters::health::{ClusterHealth, ReadinessTransition};
use crate::failover::decide::AppliedReset;
use crate::leadership::LeaderState;
use crate::status::processor::HealthTransition;
use crate::work::store::{WorkChange, WorkObserver, WorkStore};

/// `to` of a dispatch event: the work was handed to the cluster's agent.
pub const DISPATCHED: &str = "Dispatched";
/// `to` of a withdrawal: the work was taken off the cluster.
pub const WITHDRAWN: &str = "Withdrawn";

/// A Kubernetes time as the ledger's.
pub fn ledger_time(time: &Time) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(time.0.as_microsecond()).unwrap_or(DateTime::UNIX_EPOCH)
}

fn binding_ref(key: &WorkKey, uid: &str) -> BindingRef {
    let binding = BindingRef::new(&key.namespace, &key.name);
    if uid.is_empty() {
        binding
    } else {
        binding.with_uid(uid)
    }
}

/// New or changed work handed to `cluster`, with the revision it took and what it is; reason
/// `ResetRequested` when it newly asks for a reset (`reset_asked`).
pub fn dispatch_event(
    cluster: &str,
    work: &Work,
    reset_asked: bool,
    at: DateTime<Utc>,
) -> LedgerEvent {
    let mut event = LedgerEvent::new(EventKind::Dispatch, at)
        .with_binding(binding_ref(&work.key, &work.binding_uid))
        .with_cluster(cluster)
        .with_to(DISPATCHED)
        .with_detail("revision", work.revision);
    for field in ["apiVersion", "kind"] {
        if let Some(value) = work.manifest.get(field).and_then(|v| v.as_str()) {
            event = event.with_detail(field, value);
        }
    }
    if let Some(mode) = &work.purge_mode {
        event = event.with_detail("purgeMode", json!(mode));
    }
    if let Some(reset) = &work.reset {
        event = event.with_detail("reset", json!(reset));
        if reset_asked {
            event = event.with_reason("ResetRequested");
        }
    }
    event
}

/// Work taken off `cluster` (the binding left it, or was deleted), at the store's `revision`.
pub fn withdrawal_event(
    cluster: &str,
    key: &WorkKey,
    binding_uid: &str,
    revision: i64,
    at: DateTime<Utc>,
) -> LedgerEvent {
    LedgerEvent::new(EventKind::Dispatch, at)
        .with_binding(binding_ref(key, binding_uid))
        .with_cluster(cluster)
        .with_to(WITHDRAWN)
        .with_detail("revision", revision)
}

/// The event of a work store change.
pub fn work_change_event(change: &WorkChange, at: DateTime<Utc>) -> LedgerEvent {
    match change {
        WorkChange::Dispatched {
            cluster,
            work,
            reset_asked,
        } => dispatch_event(cluster, work, *reset_asked, at),
        WorkChange::Withdrawn {
            cluster,
            key,
            binding_uid,
            revision,
        } => withdrawal_event(cluster, key, binding_uid, *revision, at),
    }
}

/// A binding's health changed in one cluster. `binding_uid`: the UID of the work assigned
/// there, when known.
pub fn health_event(transition: &HealthTransition, binding_uid: Option<&str>) -> LedgerEvent {
    let mut event = LedgerEvent::new(EventKind::HealthTransition, ledger_time(&transition.at))
        .with_binding(binding_ref(
            &transition.key,
            binding_uid.unwrap_or_default(),
        ))
        .with_cluster(&transition.cluster)
        .with_transition(transition.from.as_str(), transition.to.as_str());
    if let Some(class) = transition.class {
        event = event.with_class(class);
    }
    if let Some(reason) = &transition.reason {
        event = event.with_reason(reason);
    }
    event
}

/// `to` of an in-place reset decision.
pub const RESET: &str = "InPlaceReset";

/// An in-place reset the binder wrote into binding `key` (UID `binding_uid`): a `Decision`,
/// `to: InPlaceReset`, reason `Failure` or `Manual`, the failure class of a failure reset, and
/// in `details` the generation, the failure resets counted so far, the pause, the manual
/// request and the message.
pub fn reset_event(
    key: &WorkKey,
    binding_uid: &str,
    applied: &AppliedReset,
    at: DateTime<Utc>,
) -> LedgerEvent {
    let AppliedReset { reset, record } = applied;
    let mut event = LedgerEvent::new(EventKind::Decision, at)
        .with_binding(binding_ref(key, binding_uid))
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

/// The `Ready` condition status a cluster health shows, in the ledger's words.
pub fn ready_state(health: ClusterHealth) -> &'static str {
    match health {
        ClusterHealth::Ready => "Ready",
        ClusterHealth::Unreachable | ClusterHealth::NotRegistered => "Unknown",
        ClusterHealth::MemberApiUnreachable => "NotReady",
    }
}

/// A cluster's `Ready` condition changed (`from` absent the first time the monitor judged it);
/// the reason is the condition's, the message goes in `details`.
pub fn cluster_event(transition: &ReadinessTransition) -> LedgerEvent {
    let to = ready_state(transition.to);
    let event = LedgerEvent::new(EventKind::ClusterTransition, ledger_time(&transition.at))
        .with_cluster(&transition.cluster);
    let event = match transition.from {
        Some(from) => event.with_transition(ready_state(from), to),
        None => event.with_to(to),
    };
    event
        .with_reason(transition.to.reason())
        .with_detail("message", transition.message.as_str())
}

/// Hands the hub's events to the ledger writer while this process leads.
#[derive(Clone)]
pub struct LedgerFeed {
    writer: LedgerWriter,
    leading: watch::Receiver<LeaderState>,
}

impl LedgerFeed {
    pub fn new(writer: LedgerWriter, leading: watch::Receiver<LeaderState>) -> LedgerFeed {
        LedgerFeed { writer, leading }
    }

    fn leads(&self) -> bool {
        self.leading.borrow().is_leader
    }

    /// Queues `event` if this process leads; never waits (a full queue drops it, counted and
    /// logged by the writer).
    pub fn record_now(&self, event: LedgerEvent) {
        if self.leads() {
            let _ = self.writer.try_record(event);
        }
    }

    /// Queues `event` if this process leads, waiting briefly for room (see
    /// [`LedgerWriter::record`]).
    pub async fn record(&self, event: LedgerEvent) {
        if self.leads() {
            let _ = self.writer.record(event).await;
        }
    }

    /// The work store observer: a dispatch or withdrawal event per change. The binder changes
    /// the store from synchronous code, so this never waits.
    pub fn work_observer(&self) -> WorkObserver {
        let feed = self.clone();
        Box::new(move |change| feed.record_now(work_change_event(&change, Utc::now())))
    }

    /// Records the processor's health transitions until its sender is dropped.
    pub async fn health_transitions(
        self,
        mut transitions: mpsc::UnboundedReceiver<HealthTransition>,
        work: Arc<WorkStore>,
    ) {
        while let Some(transition) = transitions.recv().await {
            let uid = work
                .get(&transition.cluster, &transition.key)
                .map(|w| w.binding_uid.clone());
            self.record(health_event(&transition, uid.as_deref())).await;
        }
    }

    /// Records the cluster health monitor's transitions until it is dropped.
    pub async fn cluster_transitions(
        self,
        mut transitions: broadcast::Receiver<ReadinessTransition>,
    ) {
        loop {
            match transitions.recv().await {
                Ok(transition) => self.record(cluster_event(&transition)).await,
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::error!(
                        missed,
                        "the ledger fell behind the cluster health monitor: cluster transitions not recorded"
                    );
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use lifeboat_api::binding::ResourceHealth;
    use lifeboat_api::health::FailureClass;
    use lifeboat_api::policy::PurgeMode;
    use lifeboat_api::protocol::ResetRequest;

    fn at() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-23T10:00:00.123456Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn key() -> WorkKey {
        WorkKey {
            namespace: "ml".into(),
            name: "train-appwrapper".into(),
        }
    }

    fn work() -> Work {
        Work {
            key: key(),
            binding_uid: "uid-1".into(),
            revision: 7,
            manifest: json!({"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper"}),
            purge_mode: Some(PurgeMode::Directly),
            reset: None,
        }
    }

    #[test]
    fn a_dispatch_names_binding_cluster_revision_and_kind() {
        let event = dispatch_event("member-2", &work(), false, at());
        assert_eq!(event.kind, EventKind::Dispatch);
        assert_eq!(event.at, at());
        let binding = event.binding.as_ref().unwrap();
        assert_eq!(binding.to_string(), "ml/train-appwrapper");
        assert_eq!(binding.uid.as_deref(), Some("uid-1"));
        assert_eq!(event.cluster.as_deref(), Some("member-2"));
        assert_eq!(
            (event.from.as_deref(), event.to.as_deref()),
            (None, Some("Dispatched"))
        );
        assert_eq!(event.reason, None);
        assert_eq!(
            event.details,
            json!({"revision": 7, "apiVersion": "workload.codeflare.dev/v1beta2",
                   "kind": "AppWrapper", "purgeMode": "Directly"})
        );
        let mut reset = work();
        reset.reset = Some(ResetRequest {
            generation: 2,
            pause_seconds: 30,
        });
        reset.purge_mode = None;
        let event = dispatch_event("member-2", &reset, true, at());
        assert_eq!(event.reason.as_deref(), Some("ResetRequested"));
        assert_eq!(
            event.details["reset"],
            json!({"generation": 2, "pauseSeconds": 30})
        );
        assert!(event.details.get("purgeMode").is_none());
        // The same reset on a later change (a new template) is no new request.
        let event = dispatch_event("member-2", &reset, false, at());
        assert_eq!(event.reason, None);
        assert_eq!(event.details["reset"]["generation"], 2);
    }

    #[test]
    fn a_reset_is_a_decision_with_its_generation_and_why() {
        use crate::failover::decide::Reset;
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

    #[test]
    fn a_withdrawal_keeps_the_uid_and_the_revision() {
        let change = WorkChange::Withdrawn {
            cluster: "member-1".into(),
            key: key(),
            binding_uid: "uid-1".into(),
            revision: 9,
        };
        let event = work_change_event(&change, at());
        assert_eq!(event.kind, EventKind::Dispatch);
        assert_eq!(event.to.as_deref(), Some("Withdrawn"));
        assert_eq!(event.cluster.as_deref(), Some("member-1"));
        assert_eq!(
            event.binding.as_ref().unwrap().uid.as_deref(),
            Some("uid-1")
        );
        assert_eq!(event.details, json!({"revision": 9}));
        // An unknown UID is left out rather than stored empty.
        let event = withdrawal_event("member-1", &key(), "", 1, at());
        assert_eq!(event.binding.unwrap().uid, None);
    }

    #[test]
    fn a_health_transition_keeps_class_reason_and_the_processors_time() {
        let when = Time(Timestamp::from_microsecond(1_800_000_000_000_042).unwrap());
        let transition = HealthTransition {
            key: key(),
            cluster: "member-2".into(),
            from: ResourceHealth::Healthy,
            to: ResourceHealth::Unhealthy,
            class: Some(FailureClass::Infrastructure),
            reason: Some("node n1 is NotReady".into()),
            at: when,
        };
        let event = health_event(&transition, Some("uid-1"));
        assert_eq!(event.kind, EventKind::HealthTransition);
        assert_eq!(event.at.timestamp_micros(), 1_800_000_000_000_042);
        assert_eq!(event.from.as_deref(), Some("Healthy"));
        assert_eq!(event.to.as_deref(), Some("Unhealthy"));
        assert_eq!(event.class, Some(FailureClass::Infrastructure));
        assert_eq!(event.reason.as_deref(), Some("node n1 is NotReady"));
        assert_eq!(
            event.binding.as_ref().unwrap().uid.as_deref(),
            Some("uid-1")
        );
        let quiet = HealthTransition {
            class: None,
            reason: None,
            ..transition
        };
        let event = health_event(&quiet, None);
        assert_eq!((event.class, event.reason), (None, None));
        assert_eq!(event.binding.unwrap().uid, None);
    }

    #[test]
    fn a_cluster_transition_shows_the_ready_condition_and_its_reason() {
        let when = Time(Timestamp::from_second(1_800_000_000).unwrap());
        let lost = ReadinessTransition {
            cluster: "member-1".into(),
            from: Some(ClusterHealth::Ready),
            to: ClusterHealth::Unreachable,
            message: "the lease expired".into(),
            at: when.clone(),
        };
        let event = cluster_event(&lost);
        assert_eq!(event.kind, EventKind::ClusterTransition);
        assert_eq!(event.binding, None);
        assert_eq!(event.cluster.as_deref(), Some("member-1"));
        assert_eq!(event.from.as_deref(), Some("Ready"));
        assert_eq!(event.to.as_deref(), Some("Unknown"));
        assert_eq!(
            event.reason.as_deref(),
            Some(ClusterHealth::Unreachable.reason())
        );
        assert_eq!(event.details, json!({"message": "the lease expired"}));
        assert_eq!(event.at.timestamp(), 1_800_000_000);
        let first = ReadinessTransition {
            from: None,
            to: ClusterHealth::NotRegistered,
            ..lost
        };
        let event = cluster_event(&first);
        assert_eq!(
            (event.from.as_deref(), event.to.as_deref()),
            (None, Some("Unknown"))
        );
        assert_eq!(
            event.reason.as_deref(),
            Some(ClusterHealth::NotRegistered.reason())
        );
        assert_eq!(ready_state(ClusterHealth::Ready), "Ready");
        assert_eq!(ready_state(ClusterHealth::MemberApiUnreachable), "NotReady");
    }
}
