//! Warning Events `InterpreterError` on a binding whose object a customization's script fails
//! on, naming the customization, the operation and the error.
//!
//! A broken script fails on every object of its kind, every time it runs, so the Events are
//! gated ([`EventGate`], pure): one per binding per distinct failure (customization, operation
//! and message), the last few remembered per binding, and at most a burst then a steady rate
//! overall; what the gate drops is counted. The binding's `Healthy` condition carries the
//! failure regardless, so a dropped Event loses no information.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use lifeboat_api::protocol::WorkKey;
use tokio::sync::mpsc;

use super::Failure;

/// A script that failed on a binding's object in one cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct FailureNotice {
    pub key: WorkKey,
    pub binding_uid: String,
    pub cluster: String,
    pub failure: Failure,
}

/// Reason of the Events.
pub const REASON: &str = "InterpreterError";
/// Distinct failures remembered per binding.
const REMEMBERED_PER_BINDING: usize = 8;
/// Events posted at once before the rate applies.
pub const BURST: u32 = 20;
/// Events per second after the burst.
pub const PER_SECOND: f64 = 2.0;
/// Longest note (the events.k8s.io API refuses notes over 1 kB).
const MAX_NOTE_BYTES: usize = 1000;

/// Which failures become Events.
pub struct EventGate {
    seen: HashMap<WorkKey, VecDeque<u64>>,
    tokens: f64,
    refilled: Instant,
    hasher: foldhash::fast::FixedState,
}

impl EventGate {
    pub fn new(now: Instant) -> EventGate {
        EventGate {
            seen: HashMap::new(),
            tokens: f64::from(BURST),
            refilled: now,
            hasher: foldhash::fast::FixedState::default(),
        }
    }

    /// Whether `notice` is posted: a failure not posted for its binding before, within the
    /// rate. A failure refused for the rate is not remembered, so it may be posted later.
    pub fn admit(&mut self, notice: &FailureNotice, now: Instant) -> Admitted {
        let digest = self.hasher.hash_one((
            &notice.binding_uid,
            &notice.failure.customization,
            notice.failure.operation.name(),
            &notice.failure.message,
        ));
        let seen = self.seen.entry(notice.key.clone()).or_default();
        if seen.contains(&digest) {
            return Admitted::Repeated;
        }
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * PER_SECOND).min(f64::from(BURST));
        self.refilled = now;
        if self.tokens < 1.0 {
            return Admitted::RateLimited;
        }
        self.tokens -= 1.0;
        if seen.len() == REMEMBERED_PER_BINDING {
            seen.pop_front();
        }
        seen.push_back(digest);
        Admitted::Yes
    }

    /// Forgets a binding (deleted).
    pub fn forget(&mut self, key: &WorkKey) {
        self.seen.remove(key);
    }
}

/// What [`EventGate::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    Yes,
    /// Posted for this binding before.
    Repeated,
    /// Over the rate: dropped.
    RateLimited,
}

/// The Event for a failure.
pub fn event(notice: &FailureNotice) -> Event {
    let mut note = format!("{} (cluster {})", notice.failure.message, notice.cluster);
    if note.len() > MAX_NOTE_BYTES {
        let mut end = MAX_NOTE_BYTES;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push('…');
    }
    Event {
        type_: EventType::Warning,
        reason: REASON.into(),
        note: Some(note),
        action: "Interpret".into(),
        secondary: None,
    }
}

fn binding_reference(notice: &FailureNotice) -> ObjectReference {
    ObjectReference {
        api_version: Some("work.lifeboat.dev/v1alpha1".into()),
        kind: Some("ResourceBinding".into()),
        namespace: Some(notice.key.namespace.clone()),
        name: Some(notice.key.name.clone()),
        uid: Some(notice.binding_uid.clone()),
        ..Default::default()
    }
}

/// Posts the admitted failures as Events until the channel closes.
pub async fn run(
    client: kube::Client,
    mut notices: mpsc::UnboundedReceiver<FailureNotice>,
    dropped: prometheus::IntCounter,
) {
    let reporter = Reporter {
        controller: "lifeboat-hub".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let mut gate = EventGate::new(Instant::now());
    while let Some(notice) = notices.recv().await {
        match gate.admit(&notice, Instant::now()) {
            Admitted::Yes => {}
            Admitted::Repeated => continue,
            Admitted::RateLimited => {
                dropped.inc();
                continue;
            }
        }
        // A recorder of its own each time: a shared one folds later Events of the same reason
        // on the same object into the first one's series, keeping the first note.
        let recorder = Recorder::new(client.clone(), reporter.clone());
        if let Err(error) = recorder
            .publish(&event(&notice), &binding_reference(&notice))
            .await
        {
            tracing::warn!(%error, binding = %notice.key, "publishing an InterpreterError Event failed");
        }
    }
}

/// How long after the burst the next Event may go.
pub fn refill_interval() -> Duration {
    Duration::from_secs_f64(1.0 / PER_SECOND)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpreters::Failure;
    use lifeboat_interpreter::Operation;

    fn notice(name: &str, message: &str) -> FailureNotice {
        FailureNotice {
            key: WorkKey {
                namespace: "ml".into(),
                name: name.into(),
            },
            binding_uid: format!("uid-{name}"),
            cluster: "m1".into(),
            failure: Failure {
                customization: "broken".into(),
                operation: Operation::InterpretHealth,
                message: message.into(),
                limit: None,
            },
        }
    }

    #[test]
    fn one_event_per_binding_per_distinct_failure_within_the_rate() {
        let t0 = Instant::now();
        let mut gate = EventGate::new(t0);
        assert_eq!(gate.admit(&notice("a", "boom"), t0), Admitted::Yes);
        assert_eq!(gate.admit(&notice("a", "boom"), t0), Admitted::Repeated);
        assert_eq!(gate.admit(&notice("a", "bang"), t0), Admitted::Yes);
        // a broken script on many bindings: the burst, then the rate
        let admitted = (0..1000)
            .filter(|i| gate.admit(&notice(&format!("b{i}"), "boom"), t0) == Admitted::Yes)
            .count();
        assert_eq!(admitted, BURST as usize - 2);
        assert_eq!(
            gate.admit(&notice("late", "boom"), t0),
            Admitted::RateLimited
        );
        // refused for the rate: not remembered, posted once a token is back
        assert_eq!(
            gate.admit(&notice("late", "boom"), t0 + refill_interval()),
            Admitted::Yes
        );
        gate.forget(&notice("a", "").key);
        assert_eq!(
            gate.admit(&notice("a", "boom"), t0 + refill_interval() * 3),
            Admitted::Yes
        );
    }

    #[test]
    fn the_event_names_the_customization_the_error_and_the_cluster() {
        let e = event(&notice(
            "a",
            "customization broken failed in InterpretHealth: boom",
        ));
        assert_eq!(e.reason, REASON);
        assert_eq!(e.type_, EventType::Warning);
        assert_eq!(
            e.note.as_deref(),
            Some("customization broken failed in InterpretHealth: boom (cluster m1)")
        );
        let long = event(&notice("a", &"x".repeat(5000)));
        assert!(long.note.unwrap().len() <= MAX_NOTE_BYTES + '…'.len_utf8());
    }
}
