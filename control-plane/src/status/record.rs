//! What the status processor's health transitions leave in the ledger: a health transition
//! event per binding and cluster. The builder is pure (unit-tested); [`health_transitions`]
//! hands the processor's transitions to the feed.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::ledger::{EventKind, LedgerEvent, LedgerFeed, binding_ref, ledger_time};
use crate::status::processor::HealthTransition;
use crate::work::store::WorkStore;

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

/// Records the processor's health transitions until its sender is dropped; the binding's UID is
/// the one of the work assigned in that cluster, when there is one.
pub async fn health_transitions(
    feed: LedgerFeed,
    mut transitions: mpsc::UnboundedReceiver<HealthTransition>,
    work: Arc<WorkStore>,
) {
    while let Some(transition) = transitions.recv().await {
        let uid = work
            .get(&transition.cluster, &transition.key)
            .map(|w| w.binding_uid.clone());
        feed.record(health_event(&transition, uid.as_deref())).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use lifeboat_api::binding::ResourceHealth;
    use lifeboat_api::health::FailureClass;
    use lifeboat_api::protocol::WorkKey;

    fn key() -> WorkKey {
        WorkKey {
            namespace: "ml".into(),
            name: "train-appwrapper".into(),
        }
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
}
