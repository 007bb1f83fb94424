//! The desired work of every member cluster, with revisions, so an agent's work stream can resume
//! where it left off (only what changed is resent) and a new leader term starts a new epoch (the
//! agent then receives the full set).
//!
//! The store is derived state: the hub rebuilds it from bindings and templates at start, so it
//! holds no fact that is not in the hub's objects. Each cluster has its own revision counter;
//! every upsert that changes a work item and every removal takes the next revision. Removals
//! leave a tombstone so that a resuming agent learns about them; tombstones older than the
//! compaction point are dropped, and a cursor older than that point gets a full snapshot.
//!
//! Work withdrawn for a `Directly` eviction is also remembered as a purge the hub waits for
//! ([`WorkStore::withdraw_for_purge`]): its Delete asks the agent to confirm the copy gone, a
//! snapshot repeats that Delete (an agent that restarted confirms the absence again), and the
//! agent API takes a gone report only for such a purge, from that cluster, under that binding
//! UID. The binder records purges from the bindings' eviction tasks, so a new leader term has
//! them again after its first pass.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use lifeboat_api::protocol::{Cursor, Work, WorkEvent, WorkKey};
use tokio::sync::watch;

/// How many tombstones a cluster keeps before the oldest are compacted away.
pub const DEFAULT_TOMBSTONE_LIMIT: usize = 10_000;

/// What an agent must be sent to catch up from its cursor.
#[derive(Debug, Clone, PartialEq)]
pub struct Changes {
    /// The agent must drop its view: a full snapshot follows (new epoch, no cursor, or a
    /// cursor older than the compaction point).
    pub reset: bool,
    /// Upserts and deletes in revision order (for a reset: every current work item).
    pub events: Vec<WorkEvent>,
    /// The revision the agent is at once it has applied `events`.
    pub revision: i64,
}

#[derive(Debug, Clone)]
struct Entry {
    revision: i64,
    work: Arc<Work>,
}

/// A removal: its revision and the binding UID of the work removed.
#[derive(Debug, Clone)]
struct Tombstone {
    revision: i64,
    binding_uid: String,
}

/// Withdrawn work the hub waits to hear is gone.
#[derive(Debug, Clone)]
struct Purge {
    binding_uid: String,
    /// The revision of the withdrawal (of its Delete).
    revision: i64,
}

#[derive(Debug, Default)]
struct ClusterWork {
    revision: i64,
    items: BTreeMap<WorkKey, Entry>,
    /// Removed key → its removal.
    tombstones: BTreeMap<WorkKey, Tombstone>,
    /// Changes at or below this revision may have lost their tombstones.
    compacted: i64,
    /// Withdrawn key → the purge the hub waits for (never compacted: one per pending
    /// `Directly` eviction).
    purges: BTreeMap<WorkKey, Purge>,
}

impl ClusterWork {
    /// The Delete event of a removed key: it asks for the gone report while a purge of the
    /// same binding is awaited.
    fn delete_event(&self, key: &WorkKey, revision: i64, binding_uid: &str) -> WorkEvent {
        WorkEvent::Delete {
            key: key.clone(),
            revision,
            binding_uid: binding_uid.to_string(),
            confirm_gone: self
                .purges
                .get(key)
                .is_some_and(|p| p.binding_uid == binding_uid),
        }
    }
}

struct ClusterSlot {
    work: Mutex<ClusterWork>,
    revision: watch::Sender<i64>,
}

impl ClusterSlot {
    fn new() -> Self {
        ClusterSlot {
            work: Mutex::new(ClusterWork::default()),
            revision: watch::channel(0).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ClusterWork> {
        self.work.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A change of one cluster's desired work, as the store made it (for the ledger).
#[derive(Debug, Clone, PartialEq)]
pub enum WorkChange {
    /// New or changed work sent to `cluster` (`work.revision` is the revision it took).
    /// `reset_asked`: the work carries a reset request it did not carry before.
    Dispatched {
        cluster: String,
        work: Arc<Work>,
        reset_asked: bool,
    },
    /// Work taken off `cluster` at `revision`.
    Withdrawn {
        cluster: String,
        key: WorkKey,
        binding_uid: String,
        revision: i64,
    },
}

/// Sees every change the store makes, after the cluster's lock is released.
pub type WorkObserver = Box<dyn Fn(WorkChange) + Send + Sync>;

/// Desired work per cluster.
pub struct WorkStore {
    epoch: String,
    tombstone_limit: usize,
    clusters: RwLock<HashMap<String, Arc<ClusterSlot>>>,
    /// False until the hub has dispatched every binding once: an agent must not receive a
    /// full snapshot before then, or it would remove work that is merely not loaded yet.
    ready: watch::Sender<bool>,
    observer: OnceLock<WorkObserver>,
}

impl WorkStore {
    /// A new, empty store for a leader term identified by `epoch`.
    pub fn new(epoch: impl Into<String>) -> WorkStore {
        WorkStore {
            epoch: epoch.into(),
            tombstone_limit: DEFAULT_TOMBSTONE_LIMIT,
            clusters: RwLock::new(HashMap::new()),
            ready: watch::channel(false).0,
            observer: OnceLock::new(),
        }
    }

    /// Hands every later change to `observer` (one observer per store; a second is refused and
    /// handed back).
    pub fn observe(&self, observer: WorkObserver) -> Result<(), WorkObserver> {
        self.observer.set(observer)
    }

    fn notify(&self, change: impl FnOnce() -> WorkChange) {
        if let Some(observer) = self.observer.get() {
            observer(change());
        }
    }

    /// Keep at most `limit` tombstones per cluster.
    pub fn with_tombstone_limit(mut self, limit: usize) -> WorkStore {
        self.tombstone_limit = limit.max(1);
        self
    }

    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    /// Marks the store complete: every binding has been dispatched once.
    pub fn mark_ready(&self) {
        self.ready.send_replace(true);
    }

    /// Whether the store is complete (work streams may send snapshots).
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until the store is complete.
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|ready| *ready).await;
    }

    fn slot(&self, cluster: &str) -> Arc<ClusterSlot> {
        if let Some(slot) = self
            .clusters
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(cluster)
        {
            return slot.clone();
        }
        self.clusters
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(cluster.to_string())
            .or_insert_with(|| Arc::new(ClusterSlot::new()))
            .clone()
    }

    fn existing_slot(&self, cluster: &str) -> Option<Arc<ClusterSlot>> {
        self.clusters
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(cluster)
            .cloned()
    }

    /// Sets the work `work.key` of `cluster`. Returns the new revision, or `None` when the work
    /// is unchanged (same binding UID, manifest, purge mode and reset request): an agent is
    /// never sent a no-op.
    pub fn upsert(&self, cluster: &str, mut work: Work) -> Option<i64> {
        let slot = self.slot(cluster);
        let revision = {
            let mut state = slot.lock();
            let current = state.items.get(&work.key);
            if let Some(current) = current {
                let same = current.work.binding_uid == work.binding_uid
                    && current.work.manifest == work.manifest
                    && current.work.purge_mode == work.purge_mode
                    && current.work.reset == work.reset;
                if same {
                    return None;
                }
            }
            let reset_asked =
                work.reset.is_some() && current.is_none_or(|c| c.work.reset != work.reset);
            state.revision += 1;
            let revision = state.revision;
            work.revision = revision;
            state.tombstones.remove(&work.key);
            // Assigned here again: its copy is wanted, not awaited gone.
            state.purges.remove(&work.key);
            let work = Arc::new(work);
            state.items.insert(
                work.key.clone(),
                Entry {
                    revision,
                    work: work.clone(),
                },
            );
            (revision, work, reset_asked)
        };
        let (revision, work, reset_asked) = revision;
        slot.revision.send_replace(revision);
        self.notify(|| WorkChange::Dispatched {
            cluster: cluster.to_string(),
            work,
            reset_asked,
        });
        Some(revision)
    }

    /// Removes the work `key` from `cluster`. Returns the new revision, or `None` when it was
    /// not assigned there.
    pub fn remove(&self, cluster: &str, key: &WorkKey) -> Option<i64> {
        let slot = self.existing_slot(cluster)?;
        let revision = {
            let mut state = slot.lock();
            let removed = state.items.remove(key)?;
            state.revision += 1;
            let revision = state.revision;
            let binding_uid = removed.work.binding_uid.clone();
            state.tombstones.insert(
                key.clone(),
                Tombstone {
                    revision,
                    binding_uid: binding_uid.clone(),
                },
            );
            let limit = self.tombstone_limit;
            if state.tombstones.len() > limit {
                compact(&mut state, limit);
            }
            (revision, binding_uid)
        };
        let (revision, binding_uid) = revision;
        slot.revision.send_replace(revision);
        self.notify(|| WorkChange::Withdrawn {
            cluster: cluster.to_string(),
            key: key.clone(),
            binding_uid,
            revision,
        });
        Some(revision)
    }

    /// Withdraws the work `key` of binding `binding_uid` from `cluster` and waits for its agent
    /// to report the copy gone (a `Directly` eviction): the work is removed if assigned, and
    /// the Delete the agent is sent asks for the gone report. Idempotent: returns the new
    /// revision, or `None` when that purge was already awaited and nothing was assigned.
    /// Nothing assigned (a new leader term): the purge still takes a revision, so an agent
    /// resuming in this epoch is sent the Delete too.
    pub fn withdraw_for_purge(
        &self,
        cluster: &str,
        key: &WorkKey,
        binding_uid: &str,
    ) -> Option<i64> {
        let slot = self.slot(cluster);
        let (revision, removed) = {
            let mut state = slot.lock();
            let awaited = state
                .purges
                .get(key)
                .is_some_and(|p| p.binding_uid == binding_uid);
            if awaited && !state.items.contains_key(key) {
                return None;
            }
            let removed = state.items.remove(key);
            state.revision += 1;
            let revision = state.revision;
            state.tombstones.insert(
                key.clone(),
                Tombstone {
                    revision,
                    binding_uid: binding_uid.to_string(),
                },
            );
            state.purges.insert(
                key.clone(),
                Purge {
                    binding_uid: binding_uid.to_string(),
                    revision,
                },
            );
            let limit = self.tombstone_limit;
            if state.tombstones.len() > limit {
                compact(&mut state, limit);
            }
            (revision, removed)
        };
        slot.revision.send_replace(revision);
        if let Some(removed) = removed {
            self.notify(|| WorkChange::Withdrawn {
                cluster: cluster.to_string(),
                key: key.clone(),
                binding_uid: removed.work.binding_uid.clone(),
                revision,
            });
        }
        Some(revision)
    }

    /// The hub no longer waits for the copy of `key` in `cluster` to be reported gone (it was,
    /// its cluster was fenced, or the eviction is over): a later gone report is refused.
    pub fn settle_purge(&self, cluster: &str, key: &WorkKey) {
        if let Some(slot) = self.existing_slot(cluster) {
            slot.lock().purges.remove(key);
        }
    }

    /// The binding UID whose copy of `key` the hub waits to hear is gone from `cluster`.
    pub fn awaited_purge(&self, cluster: &str, key: &WorkKey) -> Option<String> {
        let slot = self.existing_slot(cluster)?;
        let state = slot.lock();
        state.purges.get(key).map(|p| p.binding_uid.clone())
    }

    /// The work `key` as assigned to `cluster`, if it is.
    pub fn get(&self, cluster: &str, key: &WorkKey) -> Option<Arc<Work>> {
        let slot = self.existing_slot(cluster)?;
        let state = slot.lock();
        state.items.get(key).map(|e| e.work.clone())
    }

    /// The keys assigned to `cluster`.
    pub fn keys(&self, cluster: &str) -> Vec<WorkKey> {
        match self.existing_slot(cluster) {
            Some(slot) => slot.lock().items.keys().cloned().collect(),
            None => Vec::new(),
        }
    }

    /// How many work items are assigned to `cluster`.
    pub fn len(&self, cluster: &str) -> usize {
        self.existing_slot(cluster)
            .map(|slot| slot.lock().items.len())
            .unwrap_or(0)
    }

    /// How many work items the store holds over all clusters.
    pub fn total(&self) -> usize {
        self.clusters
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|slot| slot.lock().items.len())
            .sum()
    }

    /// The clusters that have (or had) work in this epoch.
    pub fn clusters(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .clusters
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// The current revision of `cluster`.
    pub fn revision(&self, cluster: &str) -> i64 {
        self.existing_slot(cluster)
            .map(|slot| slot.lock().revision)
            .unwrap_or(0)
    }

    /// A receiver that sees every new revision of `cluster` (for the work stream to wait on).
    pub fn subscribe(&self, cluster: &str) -> watch::Receiver<i64> {
        self.slot(cluster).revision.subscribe()
    }

    /// What an agent at `cursor` must receive to catch up with `cluster`.
    pub fn changes_since(&self, cluster: &str, cursor: Option<&Cursor>) -> Changes {
        let slot = self.slot(cluster);
        let state = slot.lock();
        let resume_from = cursor
            .filter(|c| c.epoch == self.epoch)
            .filter(|c| c.revision >= state.compacted && c.revision <= state.revision)
            .map(|c| c.revision);
        match resume_from {
            Some(since) => {
                let mut changed: Vec<(i64, WorkEvent)> = state
                    .items
                    .values()
                    .filter(|e| e.revision > since)
                    .map(|e| {
                        (
                            e.revision,
                            WorkEvent::Upsert {
                                work: Box::new((*e.work).clone()),
                            },
                        )
                    })
                    .chain(
                        state
                            .tombstones
                            .iter()
                            .filter(|(_, t)| t.revision > since)
                            .map(|(key, t)| {
                                (
                                    t.revision,
                                    state.delete_event(key, t.revision, &t.binding_uid),
                                )
                            }),
                    )
                    .collect();
                changed.sort_by_key(|(rev, _)| *rev);
                Changes {
                    reset: false,
                    events: changed.into_iter().map(|(_, ev)| ev).collect(),
                    revision: state.revision,
                }
            }
            // The full set, then the awaited purges (the agent confirms each copy gone, also
            // one it removed before a restart).
            None => Changes {
                reset: true,
                events: state
                    .items
                    .values()
                    .map(|e| WorkEvent::Upsert {
                        work: Box::new((*e.work).clone()),
                    })
                    .chain(
                        state
                            .purges
                            .iter()
                            .map(|(key, p)| state.delete_event(key, p.revision, &p.binding_uid)),
                    )
                    .collect(),
                revision: state.revision,
            },
        }
    }
}

/// Drops the oldest tombstones until `limit` remain, moving the compaction point past them.
fn compact(state: &mut ClusterWork, limit: usize) {
    let mut by_revision: Vec<(i64, WorkKey)> = state
        .tombstones
        .iter()
        .map(|(k, t)| (t.revision, k.clone()))
        .collect();
    by_revision.sort();
    let excess = by_revision.len().saturating_sub(limit);
    for (rev, key) in by_revision.into_iter().take(excess) {
        state.tombstones.remove(&key);
        state.compacted = state.compacted.max(rev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn work(name: &str, replicas: i64) -> Work {
        Work {
            key: WorkKey {
                namespace: "ml".into(),
                name: name.into(),
            },
            binding_uid: format!("uid-{name}"),
            revision: 0,
            manifest: json!({"kind": "Deployment", "spec": {"replicas": replicas}}),
            purge_mode: None,
            reset: None,
        }
    }

    fn key(name: &str) -> WorkKey {
        work(name, 0).key
    }

    fn names(changes: &Changes) -> Vec<String> {
        changes
            .events
            .iter()
            .map(|e| match e {
                WorkEvent::Upsert { work } => format!("+{}@{}", work.key.name, work.revision),
                WorkEvent::Delete {
                    key,
                    revision,
                    confirm_gone,
                    ..
                } => {
                    let confirm = if *confirm_gone { "?" } else { "" };
                    format!("-{}@{revision}{confirm}", key.name)
                }
                other => format!("{other:?}"),
            })
            .collect()
    }

    /// Observes `store`, keeping what `line` makes of each change.
    fn observed<T: Send + 'static>(
        store: &WorkStore,
        line: impl Fn(WorkChange) -> Option<T> + Send + Sync + 'static,
    ) -> Arc<Mutex<Vec<T>>> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        assert!(
            store
                .observe(Box::new(move |change| {
                    if let Some(line) = line(change) {
                        sink.lock().unwrap().push(line);
                    }
                }))
                .is_ok()
        );
        seen
    }

    #[test]
    fn a_new_reset_request_is_flagged_once() {
        use lifeboat_api::protocol::ResetRequest;
        let store = WorkStore::new("e1");
        let seen = observed(&store, |change| match change {
            WorkChange::Dispatched { reset_asked, .. } => Some(reset_asked),
            WorkChange::Withdrawn { .. } => None,
        });
        let reset = |generation| {
            Some(ResetRequest {
                generation,
                pause_seconds: 0,
            })
        };
        store.upsert("m1", work("a", 1));
        let mut with_reset = work("a", 1);
        with_reset.reset = reset(1);
        store.upsert("m1", with_reset.clone());
        // The template changes: the same reset rides along, asked before.
        with_reset.manifest = json!({"kind": "Deployment", "spec": {"replicas": 2}});
        store.upsert("m1", with_reset.clone());
        with_reset.reset = reset(2);
        store.upsert("m1", with_reset.clone());
        assert_eq!(*seen.lock().unwrap(), [false, true, false, true]);
    }

    #[test]
    fn the_observer_sees_each_change_once_and_no_no_ops() {
        let store = WorkStore::new("e1");
        let seen = observed(&store, |change| {
            Some(match change {
                WorkChange::Dispatched { cluster, work, .. } => {
                    format!(
                        "+{cluster}/{}@{} {}",
                        work.key.name, work.revision, work.binding_uid
                    )
                }
                WorkChange::Withdrawn {
                    cluster,
                    key,
                    binding_uid,
                    revision,
                } => format!("-{cluster}/{}@{revision} {binding_uid}", key.name),
            })
        });
        assert!(store.observe(Box::new(|_| {})).is_err(), "one observer");
        store.upsert("m1", work("a", 1));
        store.upsert("m1", work("a", 1)); // unchanged: no event
        store.upsert("m1", work("a", 2));
        store.upsert("m2", work("a", 2));
        store.remove("m1", &key("a"));
        store.remove("m1", &key("a")); // not there any more: no event
        // withdrawn for a purge: seen when it was assigned there, not otherwise
        store.withdraw_for_purge("m2", &key("a"), "uid-a");
        store.withdraw_for_purge("m3", &key("a"), "uid-a");
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "+m1/a@1 uid-a",
                "+m1/a@2 uid-a",
                "+m2/a@1 uid-a",
                "-m1/a@3 uid-a",
                "-m2/a@2 uid-a"
            ]
        );
    }

    #[test]
    fn unchanged_work_takes_no_revision() {
        let store = WorkStore::new("e1");
        assert_eq!(store.upsert("m1", work("a", 1)), Some(1));
        assert_eq!(store.upsert("m1", work("a", 1)), None);
        assert_eq!(store.upsert("m1", work("a", 2)), Some(2));
        assert_eq!(store.get("m1", &key("a")).unwrap().revision, 2);
        assert_eq!(store.remove("m1", &key("missing")), None);
        assert_eq!(store.remove("other", &key("a")), None);
    }

    #[test]
    fn a_resuming_agent_gets_only_what_changed_in_revision_order() {
        let store = WorkStore::new("e1");
        store.upsert("m1", work("a", 1));
        store.upsert("m1", work("b", 1));
        store.upsert("m1", work("c", 1));
        let cursor = Cursor {
            epoch: "e1".into(),
            revision: 3,
        };
        store.upsert("m1", work("b", 2));
        store.remove("m1", &key("a"));
        store.upsert("m1", work("a", 5));
        store.remove("m1", &key("c"));
        let changes = store.changes_since("m1", Some(&cursor));
        assert!(!changes.reset);
        assert_eq!(names(&changes), ["+b@4", "+a@6", "-c@7"]);
        assert_eq!(changes.revision, 7);
        // caught up: nothing more
        let cursor = Cursor {
            epoch: "e1".into(),
            revision: 7,
        };
        let changes = store.changes_since("m1", Some(&cursor));
        assert!(changes.events.is_empty() && !changes.reset);
    }

    #[test]
    fn another_epoch_or_no_cursor_gets_the_full_set() {
        let store = WorkStore::new("e2");
        store.upsert("m1", work("a", 1));
        store.upsert("m1", work("b", 1));
        store.remove("m1", &key("a"));
        for cursor in [
            None,
            Some(Cursor {
                epoch: "e1".into(),
                revision: 1,
            }),
            // a revision from the future of this epoch cannot be trusted either
            Some(Cursor {
                epoch: "e2".into(),
                revision: 99,
            }),
        ] {
            let changes = store.changes_since("m1", cursor.as_ref());
            assert!(changes.reset);
            assert_eq!(names(&changes), ["+b@2"]);
            assert_eq!(changes.revision, 3);
        }
    }

    #[test]
    fn a_cursor_older_than_compaction_gets_the_full_set() {
        let store = WorkStore::new("e1").with_tombstone_limit(2);
        for name in ["a", "b", "c", "d"] {
            store.upsert("m1", work(name, 1));
        }
        let old = Cursor {
            epoch: "e1".into(),
            revision: 4,
        };
        for name in ["a", "b", "c"] {
            store.remove("m1", &key(name));
        }
        // the tombstone of "a" (revision 5) was compacted away: resuming from 4 would miss it
        let changes = store.changes_since("m1", Some(&old));
        assert!(changes.reset);
        assert_eq!(names(&changes), ["+d@4"]);
        // a cursor at or after the compaction point still resumes
        let recent = Cursor {
            epoch: "e1".into(),
            revision: 5,
        };
        let changes = store.changes_since("m1", Some(&recent));
        assert!(!changes.reset);
        assert_eq!(names(&changes), ["-b@6", "-c@7"]);
    }

    #[test]
    fn a_purge_asks_the_agent_to_confirm_the_copy_gone_until_settled() {
        let store = WorkStore::new("e1");
        store.upsert("m1", work("a", 1));
        store.upsert("m1", work("b", 1));
        let cursor = Cursor {
            epoch: "e1".into(),
            revision: 2,
        };
        assert_eq!(store.withdraw_for_purge("m1", &key("a"), "uid-a"), Some(3));
        assert_eq!(store.get("m1", &key("a")), None);
        // again (the binder dispatches the binding again): nothing new
        assert_eq!(store.withdraw_for_purge("m1", &key("a"), "uid-a"), None);
        store.remove("m1", &key("b"));
        assert_eq!(
            store.awaited_purge("m1", &key("a")).as_deref(),
            Some("uid-a")
        );
        assert_eq!(store.awaited_purge("m1", &key("b")), None);
        assert_eq!(store.awaited_purge("m2", &key("a")), None);
        // resuming: the purge's Delete asks for the gone report, a plain removal does not
        let changes = store.changes_since("m1", Some(&cursor));
        assert_eq!(names(&changes), ["-a@3?", "-b@4"]);
        let uids: Vec<&str> = changes
            .events
            .iter()
            .filter_map(|e| match e {
                WorkEvent::Delete { binding_uid, .. } => Some(binding_uid.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(uids, ["uid-a", "uid-b"]);
        // a snapshot repeats the awaited purge after the full set
        assert_eq!(names(&store.changes_since("m1", None)), ["-a@3?"]);
        // settled: no longer asked for, in a snapshot or a resume
        store.settle_purge("m1", &key("a"));
        assert_eq!(store.awaited_purge("m1", &key("a")), None);
        assert!(store.changes_since("m1", None).events.is_empty());
        assert_eq!(
            names(&store.changes_since("m1", Some(&cursor))),
            ["-a@3", "-b@4"]
        );
    }

    #[test]
    fn a_purge_in_a_new_term_takes_a_revision_and_a_new_assignment_cancels_it() {
        // A new leader term: nothing assigned, the binding's task says the purge is awaited.
        let store = WorkStore::new("e2");
        assert_eq!(store.withdraw_for_purge("m1", &key("a"), "uid-a"), Some(1));
        let changes = store.changes_since("m1", None);
        assert!(changes.reset);
        assert_eq!(names(&changes), ["-a@1?"]);
        let cursor = Cursor {
            epoch: "e2".into(),
            revision: 0,
        };
        assert_eq!(names(&store.changes_since("m1", Some(&cursor))), ["-a@1?"]);
        // another binding of the same name is a new purge
        assert_eq!(
            store.withdraw_for_purge("m1", &key("a"), "uid-new"),
            Some(2)
        );
        assert_eq!(
            store.awaited_purge("m1", &key("a")).as_deref(),
            Some("uid-new")
        );
        // assigned again: its copy is wanted, no longer awaited gone
        store.upsert("m1", work("a", 1));
        assert_eq!(store.awaited_purge("m1", &key("a")), None);
        assert_eq!(names(&store.changes_since("m1", None)), ["+a@3"]);
    }

    #[tokio::test]
    async fn readiness_is_awaited() {
        let store = Arc::new(WorkStore::new("e1"));
        assert!(!store.is_ready());
        let waiter = tokio::spawn({
            let store = store.clone();
            async move { store.wait_ready().await }
        });
        store.mark_ready();
        waiter.await.unwrap();
        assert!(store.is_ready());
    }

    #[tokio::test]
    async fn subscribers_see_new_revisions() {
        let store = WorkStore::new("e1");
        let mut rx = store.subscribe("m1");
        assert_eq!(*rx.borrow_and_update(), 0);
        store.upsert("m1", work("a", 1));
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), 1);
        assert_eq!(store.keys("m1"), vec![key("a")]);
        assert_eq!(store.total(), 1);
        assert_eq!(store.clusters(), vec!["m1".to_string()]);
    }
}
