//! Queue wait: how long an AppWrapper waited from the first watch event that asked for its
//! reconcile to the start of that reconcile. Under a burst of failures this, not the reconcile
//! itself, is what grows first (the controller's concurrency, an earlier reconcile of the same
//! AppWrapper still running), so it is measured apart from the reconcile time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::index::AwKey;

/// Entries kept before old ones are dropped: an AppWrapper deleted before its queued reconcile
/// ran never takes its entry.
const PRUNE_ABOVE: usize = 10_000;
/// Age past which a waiting entry is taken for one whose reconcile will never run.
const STALE: Duration = Duration::from_secs(600);

/// The earliest trigger of each AppWrapper not yet served by a reconcile start.
#[derive(Debug, Default)]
pub struct QueueClock {
    pending: Mutex<HashMap<AwKey, Instant>>,
}

impl QueueClock {
    /// A watch asked for a reconcile of `key` at `at`. An earlier request still waiting wins.
    pub fn triggered(&self, key: AwKey, at: Instant) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if pending.len() >= PRUNE_ABOVE {
            pending.retain(|_, since| at.saturating_duration_since(*since) < STALE);
        }
        pending
            .entry(key)
            .and_modify(|since| *since = (*since).min(at))
            .or_insert(at);
    }

    /// A reconcile of `key` starts at `now`: how long its oldest trigger waited (`None` when it
    /// was not triggered by a watch, e.g. a requeue timer).
    pub fn started(&self, key: &AwKey, now: Instant) -> Option<Duration> {
        let since = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)?;
        Some(now.saturating_duration_since(since))
    }

    pub fn len(&self) -> usize {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_waiting_trigger_is_measured_once() {
        let clock = QueueClock::default();
        let t0 = Instant::now();
        let key = AwKey::new("ns", "a");
        clock.triggered(key.clone(), t0 + Duration::from_millis(5));
        clock.triggered(key.clone(), t0);
        clock.triggered(key.clone(), t0 + Duration::from_millis(9));
        assert_eq!(
            clock.started(&key, t0 + Duration::from_millis(30)),
            Some(Duration::from_millis(30))
        );
        // Served: a requeue timer that starts the next reconcile has no queue wait.
        assert_eq!(clock.started(&key, t0 + Duration::from_millis(40)), None);
        // A trigger during the reconcile waits for the next one.
        clock.triggered(key.clone(), t0 + Duration::from_millis(35));
        assert_eq!(
            clock.started(&key, t0 + Duration::from_millis(50)),
            Some(Duration::from_millis(15))
        );
        assert!(clock.is_empty());
    }

    #[test]
    fn appwrappers_wait_apart_and_stale_entries_are_pruned() {
        let clock = QueueClock::default();
        let t0 = Instant::now();
        clock.triggered(AwKey::new("ns", "a"), t0);
        clock.triggered(AwKey::new("other", "a"), t0 + Duration::from_millis(10));
        assert_eq!(
            clock.started(&AwKey::new("other", "a"), t0 + Duration::from_millis(10)),
            Some(Duration::ZERO)
        );
        assert_eq!(clock.len(), 1);
        // Fill up to the limit with entries of AppWrappers that never run; the next trigger,
        // long after, drops them but keeps its own.
        for i in 0..PRUNE_ABOVE {
            clock.triggered(AwKey::new("gone", format!("aw-{i}")), t0);
        }
        let later = t0 + STALE + Duration::from_secs(1);
        clock.triggered(AwKey::new("ns", "b"), later);
        assert_eq!(clock.len(), 1);
        assert_eq!(
            clock.started(&AwKey::new("ns", "b"), later),
            Some(Duration::ZERO)
        );
    }
}
