//! The versions of AppWrappers this agent has just written, so that a reconcile that starts on a
//! cached copy older than its own last write is skipped instead of run. Run, it would compute
//! from a stale status, and its status write, conditional on that stale resourceVersion, would
//! come back 409: a wasted round trip and a 50 ms requeue, many of them in a burst of failures
//! (the pod's, the Job's and the AppWrapper's own watch events all ask for a reconcile within
//! milliseconds of the first write). The watch event of the new version triggers the reconcile
//! that matters.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::index::AwKey;

/// Per AppWrapper: the resourceVersion a successful write replaced (the one the reconcile read).
#[derive(Debug, Default)]
pub struct WrittenVersions {
    superseded: Mutex<HashMap<AwKey, String>>,
}

impl WrittenVersions {
    /// A write of `key` computed from `read` succeeded: `read` is now known to be stale.
    pub fn wrote(&self, key: &AwKey, read: Option<&str>) {
        let Some(read) = read else {
            return;
        };
        let mut superseded = self.superseded.lock().unwrap_or_else(|e| e.into_inner());
        // Several writes in one reconcile: the copy in the cache is the first one's base.
        superseded
            .entry(key.clone())
            .or_insert_with(|| read.to_string());
    }

    /// Whether the cached copy at `version` is one this agent already wrote over. A copy at any
    /// other version means the cache has moved on: the entry is dropped.
    pub fn is_stale(&self, key: &AwKey, version: Option<&str>) -> bool {
        let mut superseded = self.superseded.lock().unwrap_or_else(|e| e.into_inner());
        match (superseded.get(key), version) {
            (Some(old), Some(v)) if old == v => true,
            (Some(_), _) => {
                superseded.remove(key);
                false
            }
            (None, _) => false,
        }
    }

    /// The reconcile that wrote is done with `key` (a later write starts a new entry).
    pub fn settled(&self, key: &AwKey) {
        self.superseded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    pub fn len(&self) -> usize {
        self.superseded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_older_than_our_write_is_stale_until_the_cache_moves_on() {
        let written = WrittenVersions::default();
        let key = AwKey::new("ns", "a");
        assert!(!written.is_stale(&key, Some("10")));
        written.wrote(&key, Some("10"));
        // A second write in the same reconcile keeps the first base.
        written.wrote(&key, Some("11"));
        assert!(written.is_stale(&key, Some("10")));
        assert!(written.is_stale(&key, Some("10")));
        // Other AppWrappers are not affected.
        assert!(!written.is_stale(&AwKey::new("other", "a"), Some("10")));
        // The cache caught up (or somebody else wrote): run, and forget the entry.
        assert!(!written.is_stale(&key, Some("12")));
        assert!(written.is_empty());
        assert!(!written.is_stale(&key, Some("10")));
    }

    #[test]
    fn unknown_versions_never_skip() {
        let written = WrittenVersions::default();
        let key = AwKey::new("ns", "a");
        written.wrote(&key, None);
        assert!(written.is_empty());
        written.wrote(&key, Some("3"));
        assert!(!written.is_stale(&key, None));
        assert!(written.is_empty());
        written.wrote(&key, Some("3"));
        written.settled(&key);
        assert!(!written.is_stale(&key, Some("3")));
    }
}
