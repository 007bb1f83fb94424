//! What the work store's changes leave in the ledger: a dispatch or withdrawal event for each
//! change of a cluster's desired work. The builders are pure (unit-tested with fixed times);
//! [`observer`] is the store's observer that hands them to the feed.

use chrono::{DateTime, Utc};
use lifeboat_api::protocol::{Work, WorkKey};
use serde_json::json;

use crate::ledger::{EventKind, LedgerEvent, LedgerFeed, binding_ref};
use crate::work::store::{WorkChange, WorkObserver};

/// `to` of a dispatch event: the work was handed to the cluster's agent.
pub const DISPATCHED: &str = "Dispatched";
/// `to` of a withdrawal: the work was taken off the cluster.
pub const WITHDRAWN: &str = "Withdrawn";

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

/// The work store observer: a dispatch or withdrawal event per change. The binder changes the
/// store from synchronous code, so this never waits.
pub fn observer(feed: LedgerFeed) -> WorkObserver {
    Box::new(move |change| feed.record_now(work_change_event(&change, Utc::now())))
}

#[cfg(test)]
mod tests {
    use super::*;
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
}
