//! What the ledger records: one append-only event, as the hub builds it and as a query returns it.
//! Pure types, no IO.

use std::fmt;

use chrono::{DateTime, Utc};
use lifeboat_api::health::FailureClass;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What kind of thing happened. The strings (`as_str`) are stored in the `kind` column and are
/// stable: renaming one is a migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    /// Work sent to a cluster (`to` e.g. `Applied`) or removed from it (`to` e.g. `Removed`).
    Dispatch,
    /// The health of a binding's copy on one cluster changed (`from`/`to` health, with the
    /// failure class and the reason).
    HealthTransition,
    /// A cluster's condition changed (`Ready`/`Unknown`/`NotReady`) or a taint was added/removed.
    ClusterTransition,
    /// A failover decision (evict / place / reset / purge / wait) with its inputs in `details`.
    Decision,
    /// A copy of a binding was evicted from a cluster.
    Eviction,
    /// A binding was placed on a cluster.
    Placement,
}

impl EventKind {
    pub const ALL: [EventKind; 6] = [
        EventKind::Dispatch,
        EventKind::HealthTransition,
        EventKind::ClusterTransition,
        EventKind::Decision,
        EventKind::Eviction,
        EventKind::Placement,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Dispatch => "Dispatch",
            EventKind::HealthTransition => "HealthTransition",
            EventKind::ClusterTransition => "ClusterTransition",
            EventKind::Decision => "Decision",
            EventKind::Eviction => "Eviction",
            EventKind::Placement => "Placement",
        }
    }

    /// The kind of that name, if it is one.
    pub fn parse(text: &str) -> Option<EventKind> {
        Self::ALL.into_iter().find(|k| k.as_str() == text)
    }

    /// Position in `ALL` (for per-kind arrays such as metric handles).
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The ResourceBinding an event is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BindingRef {
    pub namespace: String,
    pub name: String,
    /// Tells a re-created binding of the same name apart from its predecessor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl BindingRef {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            uid: None,
        }
    }

    pub fn with_uid(mut self, uid: impl Into<String>) -> Self {
        self.uid = Some(uid.into());
        self
    }
}

impl fmt::Display for BindingRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One ledger event. Built with [`LedgerEvent::new`] and the `with_*` methods:
///
/// ```
/// use chrono::Utc;
/// use lifeboat_api::health::FailureClass;
/// use lifeboat_ledger::{BindingRef, EventKind, LedgerEvent};
///
/// let event = LedgerEvent::new(EventKind::HealthTransition, Utc::now())
///     .with_binding(BindingRef::new("team-a", "train-llm"))
///     .with_cluster("member-1")
///     .with_transition("Healthy", "Unhealthy")
///     .with_class(FailureClass::Infrastructure)
///     .with_reason("node gpu-3 NotReady");
/// assert_eq!(event.kind, EventKind::HealthTransition);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LedgerEvent {
    /// When it happened (UTC; stored with microsecond precision).
    pub at: DateTime<Utc>,
    pub kind: EventKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<BindingRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The state before (a health, a cluster condition, a phase), when the event is a transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The state after, or the action taken (e.g. `Applied`, `evict`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<FailureClass>,
    /// Everything else (a decision's inputs, chosen and rejected clusters, ...): a JSON object.
    #[serde(default = "empty_object")]
    pub details: Value,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

/// `at` with the precision the ledger stores (microseconds), so that what is recorded compares
/// equal to what is read back.
pub(crate) fn truncate_to_micros(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(at.timestamp_micros()).unwrap_or(at)
}

impl LedgerEvent {
    pub fn new(kind: EventKind, at: DateTime<Utc>) -> Self {
        Self {
            at: truncate_to_micros(at),
            kind,
            binding: None,
            cluster: None,
            from: None,
            to: None,
            reason: None,
            class: None,
            details: empty_object(),
        }
    }

    pub fn with_binding(mut self, binding: BindingRef) -> Self {
        self.binding = Some(binding);
        self
    }

    pub fn with_cluster(mut self, cluster: impl Into<String>) -> Self {
        self.cluster = Some(cluster.into());
        self
    }

    pub fn with_transition(mut self, from: impl Into<String>, to: impl Into<String>) -> Self {
        self.from = Some(from.into());
        self.to = Some(to.into());
        self
    }

    /// Only the resulting state or action (no `from`), e.g. a dispatch's `Applied`.
    pub fn with_to(mut self, to: impl Into<String>) -> Self {
        self.to = Some(to.into());
        self
    }

    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    pub fn with_class(mut self, class: FailureClass) -> Self {
        self.class = Some(class);
        self
    }

    /// Replaces `details` (by convention a JSON object, e.g. `serde_json::json!({...})` or
    /// `serde_json::to_value(&inputs)`).
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    /// Adds one key to `details` (turning a non-object `details` into an object first).
    pub fn with_detail(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        if !self.details.is_object() {
            self.details = empty_object();
        }
        if let Value::Object(map) = &mut self.details {
            map.insert(key.into(), value.into());
        }
        self
    }
}

/// An event as stored: with the id the database gave it (increasing in write order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerRecord {
    pub id: i64,
    #[serde(flatten)]
    pub event: LedgerEvent,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kind_strings_are_stable_and_round_trip() {
        let names: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "Dispatch",
                "HealthTransition",
                "ClusterTransition",
                "Decision",
                "Eviction",
                "Placement"
            ]
        );
        for (i, kind) in EventKind::ALL.into_iter().enumerate() {
            assert_eq!(EventKind::parse(kind.as_str()), Some(kind));
            assert_eq!(kind.index(), i);
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                json!(kind.as_str()),
                "serde and the column use the same string"
            );
        }
        assert_eq!(EventKind::parse("dispatch"), None);
    }

    #[test]
    fn time_is_kept_to_the_microsecond() {
        let at = DateTime::parse_from_rfc3339("2026-11-23T10:00:00.123456789Z")
            .unwrap()
            .with_timezone(&Utc);
        let event = LedgerEvent::new(EventKind::Dispatch, at);
        assert_eq!(event.at.to_rfc3339(), "2026-11-23T10:00:00.123456+00:00");
    }

    #[test]
    fn builder_sets_every_field_and_details_merge() {
        let at = Utc::now();
        let event = LedgerEvent::new(EventKind::Decision, at)
            .with_binding(BindingRef::new("ns", "b").with_uid("u-1"))
            .with_cluster("member-2")
            .with_transition("Healthy", "Unhealthy")
            .with_reason("GPU XID 79")
            .with_class(FailureClass::Infrastructure)
            .with_details(json!("not an object"))
            .with_detail("action", "evict")
            .with_detail("rejected", json!(["member-1"]));
        assert_eq!(event.binding.as_ref().unwrap().to_string(), "ns/b");
        assert_eq!(event.binding.as_ref().unwrap().uid.as_deref(), Some("u-1"));
        assert_eq!(event.cluster.as_deref(), Some("member-2"));
        assert_eq!(event.from.as_deref(), Some("Healthy"));
        assert_eq!(event.to.as_deref(), Some("Unhealthy"));
        assert_eq!(event.class, Some(FailureClass::Infrastructure));
        assert_eq!(
            event.details,
            json!({"action": "evict", "rejected": ["member-1"]})
        );
    }

    #[test]
    fn record_json_is_flat_and_omits_absent_fields() {
        let at = DateTime::from_timestamp_micros(1_800_000_000_000_001).unwrap();
        let record = LedgerRecord {
            id: 7,
            event: LedgerEvent::new(EventKind::ClusterTransition, at)
                .with_cluster("member-1")
                .with_transition("Ready", "NotReady"),
        };
        let value = serde_json::to_value(&record).unwrap();
        assert_eq!(
            value,
            json!({
                "id": 7,
                "at": "2027-01-15T08:00:00.000001Z",
                "kind": "ClusterTransition",
                "cluster": "member-1",
                "from": "Ready",
                "to": "NotReady",
                "details": {}
            })
        );
        let back: LedgerRecord = serde_json::from_value(value).unwrap();
        assert_eq!(back, record);
    }
}
