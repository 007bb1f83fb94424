//! What the cluster health monitor's transitions leave in the ledger: a cluster `Ready`
//! transition event. The builders are pure (unit-tested); [`cluster_transitions`] hands the
//! monitor's transitions to the feed.

use tokio::sync::broadcast;

use crate::clusters::health::{ClusterHealth, ReadinessTransition};
use crate::ledger::{EventKind, LedgerEvent, LedgerFeed, ledger_time};

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

/// Records the cluster health monitor's transitions until it is dropped.
pub async fn cluster_transitions(
    feed: LedgerFeed,
    mut transitions: broadcast::Receiver<ReadinessTransition>,
) {
    loop {
        match transitions.recv().await {
            Ok(transition) => feed.record(cluster_event(&transition)).await,
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

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
