//! Readiness of a controller process: ready once every watch it started has synced its initial
//! list, so that nothing acts on (or reports from) a cache that has not seen the cluster yet.
//! Watches started later (a wrapped kind used for the first time) make the process unready
//! until they have synced too. A re-list after a watch error does not: the cache still holds the
//! last state and the watch catches up.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The watches a process waits for. Cloning shares the state.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    inner: Arc<Mutex<Pending>>,
}

#[derive(Debug, Default)]
struct Pending {
    next_id: u64,
    /// Watches that have not synced yet, by registration id.
    watches: BTreeMap<u64, String>,
}

/// The handle of one awaited watch: [`WatchSync::synced`] once its initial list is in the cache.
#[derive(Debug)]
pub struct WatchSync {
    readiness: Readiness,
    id: u64,
}

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a watch that must sync before the process is ready; `name` says which in
    /// [`Readiness::pending`].
    pub fn expect(&self, name: impl Into<String>) -> WatchSync {
        let mut pending = self.lock();
        let id = pending.next_id;
        pending.next_id += 1;
        pending.watches.insert(id, name.into());
        WatchSync {
            readiness: self.clone(),
            id,
        }
    }

    /// Names of the watches that have not synced yet, sorted.
    pub fn pending(&self) -> Vec<String> {
        let mut names: Vec<String> = self.lock().watches.values().cloned().collect();
        names.sort();
        names
    }

    pub fn is_ready(&self) -> bool {
        self.lock().watches.is_empty()
    }
}

impl WatchSync {
    /// The watch's initial list is in the cache. Idempotent.
    pub fn synced(&self) {
        self.readiness.lock().watches.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_every_registered_watch_has_synced() {
        let readiness = Readiness::new();
        // Nothing awaited: ready.
        assert!(readiness.is_ready());
        let pods = readiness.expect("pods");
        let nodes = readiness.expect("nodes");
        assert!(!readiness.is_ready());
        assert_eq!(readiness.pending(), ["nodes", "pods"]);
        pods.synced();
        pods.synced();
        assert_eq!(readiness.pending(), ["nodes"]);
        nodes.synced();
        assert!(readiness.is_ready());
        // A watch started later makes the process unready until it syncs.
        let jobs = readiness.clone().expect("batch/v1 Job");
        assert_eq!(readiness.pending(), ["batch/v1 Job"]);
        jobs.synced();
        assert!(readiness.is_ready());
    }

    #[test]
    fn two_watches_of_one_name_are_awaited_separately() {
        let readiness = Readiness::new();
        let first = readiness.expect("pods");
        let second = readiness.expect("pods");
        first.synced();
        assert_eq!(readiness.pending(), ["pods"]);
        second.synced();
        assert!(readiness.is_ready());
    }
}
