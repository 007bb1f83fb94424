//! A work queue with client-go's guarantees (`k8s.io/client-go/util/workqueue`): a key waits in
//! the queue at most once however often it is added, and is never handed to two workers at once
//! (a key added while it is being processed is queued again when it is [`done`](WorkQueue::done)).
//!
//! Delayed adds ([`WorkQueue::add_after`]) keep one due time per key: the earliest wins. A later
//! due time for a key that already has one is dropped, an earlier one replaces it, and an
//! immediate [`add`](WorkQueue::add) (due now) cancels it. No task is spawned per add: the
//! workers waiting in [`next`](WorkQueue::next) sleep until the earliest due time, so what a
//! queue holds is bounded by its distinct keys, however many adds it gets.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

struct Inner<K> {
    ready: VecDeque<K>,
    queued: HashSet<K>,
    active: HashSet<K>,
    /// Added while active: queued again by `done`.
    again: HashSet<K>,
    /// Delayed keys by due time (the sequence number orders equal due times).
    delayed: BTreeMap<(Instant, u64), K>,
    /// Each delayed key's entry in `delayed`.
    due: HashMap<K, (Instant, u64)>,
    next_seq: u64,
    closed: bool,
}

impl<K: Hash + Eq + Clone> Inner<K> {
    /// Queues `key` now; true when a worker should be woken.
    fn add(&mut self, key: K) -> bool {
        if self.closed {
            return false;
        }
        if let Some(entry) = self.due.remove(&key) {
            self.delayed.remove(&entry);
        }
        if self.active.contains(&key) {
            self.again.insert(key);
            return false;
        }
        if self.queued.insert(key.clone()) {
            self.ready.push_back(key);
            return true;
        }
        false
    }

    /// Records a delayed add; true when it is the queue's new earliest due time.
    fn add_at(&mut self, key: K, at: Instant) -> bool {
        if self.closed || self.queued.contains(&key) || self.again.contains(&key) {
            // Already due now.
            return false;
        }
        if let Some(&entry) = self.due.get(&key) {
            if entry.0 <= at {
                return false;
            }
            self.delayed.remove(&entry);
        }
        let entry = (at, self.next_seq);
        self.next_seq += 1;
        self.delayed.insert(entry, key.clone());
        self.due.insert(key, entry);
        self.delayed.first_key_value().map(|(e, _)| *e) == Some(entry)
    }

    /// Queues the delayed keys due by `now`; true when any was queued.
    fn promote(&mut self, now: Instant) -> bool {
        let mut woke = false;
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.due.remove(&key);
            woke |= self.add(key);
        }
        woke
    }

    fn earliest(&self) -> Option<Instant> {
        self.delayed.first_key_value().map(|((at, _), _)| *at)
    }
}

/// A de-duplicating work queue with delayed adds (see the module). Cloning shares the queue.
pub struct WorkQueue<K> {
    inner: Arc<Mutex<Inner<K>>>,
    notify: Arc<Notify>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        WorkQueue {
            inner: self.inner.clone(),
            notify: self.notify.clone(),
        }
    }
}

impl<K: Hash + Eq + Clone + Send + 'static> Default for WorkQueue<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Hash + Eq + Clone + Send + 'static> WorkQueue<K> {
    pub fn new() -> WorkQueue<K> {
        WorkQueue {
            inner: Arc::new(Mutex::new(Inner {
                ready: VecDeque::new(),
                queued: HashSet::new(),
                active: HashSet::new(),
                again: HashSet::new(),
                delayed: BTreeMap::new(),
                due: HashMap::new(),
                next_seq: 0,
                closed: false,
            })),
            notify: Arc::new(Notify::new()),
        }
    }

    /// The state, with the delayed keys that are due queued.
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K>> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.promote(Instant::now()) {
            self.notify.notify_one();
        }
        inner
    }

    /// Queues `key` unless it is already waiting; cancels its delayed add, if any (now is the
    /// earliest due time).
    pub fn add(&self, key: K) {
        if self.lock().add(key) {
            self.notify.notify_one();
        }
    }

    /// Queues `key` after `delay` (a retry, or a timer such as a toleration). One due time per
    /// key: the earliest wins, so this does nothing when `key` is queued or already due sooner.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            self.add(key);
            return;
        }
        if self.lock().add_at(key, Instant::now() + delay) {
            // A worker sleeping until a later due time sleeps until this one instead.
            self.notify.notify_one();
        }
    }

    /// The next key to process (marked active), or `None` once the queue is closed.
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            let earliest = {
                let mut inner = self.lock();
                if inner.closed {
                    return None;
                }
                if let Some(key) = inner.ready.pop_front() {
                    inner.queued.remove(&key);
                    inner.active.insert(key.clone());
                    if !inner.ready.is_empty() {
                        // Wake another worker for the rest.
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
                inner.earliest()
            };
            match earliest {
                Some(at) => {
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Marks `key` processed; if it was added meanwhile it is queued again.
    pub fn done(&self, key: &K) {
        let woke = {
            let mut inner = self.lock();
            inner.active.remove(key);
            inner.again.remove(key) && inner.add(key.clone())
        };
        if woke {
            self.notify.notify_one();
        }
    }

    /// Keys waiting (not counting those being processed or not due yet).
    pub fn len(&self) -> usize {
        self.lock().ready.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys waiting for a delayed add's due time.
    pub fn delayed(&self) -> usize {
        self.lock().due.len()
    }

    /// Nothing waits and nothing is being processed (delayed adds not yet due not counted).
    pub fn is_idle(&self) -> bool {
        let inner = self.lock();
        inner.ready.is_empty() && inner.active.is_empty()
    }

    /// Stops the queue: `next` returns `None` from now on, and adds are dropped.
    pub fn close(&self) {
        {
            let mut inner = self.lock();
            inner.closed = true;
            inner.delayed.clear();
            inner.due.clear();
        }
        self.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keys_are_deduplicated_and_never_processed_twice_at_once() {
        let q: WorkQueue<&str> = WorkQueue::new();
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.len(), 2);
        let a = q.next().await.unwrap();
        assert_eq!(a, "a");
        // added while being processed: not handed out again until done
        q.add("a");
        assert_eq!(q.next().await, Some("b"));
        assert!(q.is_empty());
        q.done(&"a");
        assert_eq!(q.next().await, Some("a"));
        q.done(&"a");
        q.done(&"b");
        assert!(q.is_empty());
        assert!(q.is_idle());
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_worker_does_not_get_a_key_being_processed() {
        let q: WorkQueue<u32> = WorkQueue::new();
        q.add(1);
        assert_eq!(q.next().await, Some(1));
        q.add(1);
        let second = tokio::spawn({
            let q = q.clone();
            async move { q.next().await }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(
            !second.is_finished(),
            "handed to a second worker while active"
        );
        q.done(&1);
        assert_eq!(second.await.unwrap(), Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_keys_arrive_after_the_delay() {
        let q: WorkQueue<u32> = WorkQueue::new();
        let start = Instant::now();
        q.add_after(7, Duration::from_secs(30));
        tokio::task::yield_now().await;
        assert!(q.is_empty());
        assert_eq!(q.delayed(), 1);
        assert_eq!(q.next().await, Some(7));
        assert_eq!(start.elapsed(), Duration::from_secs(30));
        assert_eq!(q.delayed(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_earliest_due_time_wins() {
        let q: WorkQueue<u32> = WorkQueue::new();
        let start = Instant::now();
        q.add_after(1, Duration::from_secs(30));
        q.add_after(1, Duration::from_secs(5));
        q.add_after(1, Duration::from_secs(60));
        assert_eq!(q.delayed(), 1);
        assert_eq!(q.next().await, Some(1));
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        q.done(&1);
        // Neither the 30 s nor the 60 s add comes back.
        let again = tokio::time::timeout(Duration::from_secs(120), q.next()).await;
        assert!(again.is_err(), "a later delayed add was kept: {again:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_immediate_add_cancels_a_delayed_one() {
        let q: WorkQueue<u32> = WorkQueue::new();
        q.add_after(1, Duration::from_secs(5));
        q.add(1);
        assert_eq!(q.delayed(), 0);
        assert_eq!(q.next().await, Some(1));
        q.done(&1);
        // A delayed add of a queued key is already due sooner.
        q.add(2);
        q.add_after(2, Duration::from_secs(5));
        assert_eq!(q.delayed(), 0);
        assert_eq!(q.next().await, Some(2));
        q.done(&2);
        assert!(
            tokio::time::timeout(Duration::from_secs(60), q.next())
                .await
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_while_processing_is_queued_again_when_done() {
        let q: WorkQueue<u32> = WorkQueue::new();
        q.add(1);
        assert_eq!(q.next().await, Some(1));
        // A retry asked for by the reconcile itself, before it is done.
        q.add_after(1, Duration::from_secs(2));
        let start = Instant::now();
        q.done(&1);
        assert!(q.is_idle());
        assert_eq!(q.next().await, Some(1));
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        // Due while still being processed: handed out once done, not before.
        q.add_after(1, Duration::from_secs(1));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(q.is_empty());
        assert!(!q.is_idle());
        q.done(&1);
        assert_eq!(q.len(), 1);
        assert_eq!(q.next().await, Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn many_delayed_adds_hold_one_entry_per_key_and_spawn_nothing() {
        let q: WorkQueue<u32> = WorkQueue::new();
        let metrics = tokio::runtime::Handle::current().metrics();
        let tasks_before = metrics.num_alive_tasks();
        // Each add is due sooner than the one before: every add of a key replaces its timer.
        for i in 0..100_000u64 {
            q.add_after((i % 3) as u32, Duration::from_millis(100_000 - i));
        }
        assert_eq!(q.delayed(), 3);
        assert_eq!(metrics.num_alive_tasks(), tasks_before);
        {
            let inner = q.inner.lock().unwrap();
            assert_eq!(inner.delayed.len(), 3);
            assert_eq!(inner.due.len(), 3);
        }
        let start = Instant::now();
        let mut got = Vec::new();
        for _ in 0..3 {
            let key = q.next().await.unwrap();
            got.push(key);
            q.done(&key);
        }
        // Each key's last add: 99 999 (key 0, 1 ms), 99 998 (key 2, 2 ms), 99 997 (key 1, 3 ms).
        assert_eq!(got, [0, 2, 1]);
        assert_eq!(start.elapsed(), Duration::from_millis(3));
        assert!(
            tokio::time::timeout(Duration::from_secs(10), q.next())
                .await
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_sleeping_worker_wakes_for_an_earlier_delayed_add() {
        let q: WorkQueue<u32> = WorkQueue::new();
        q.add_after(1, Duration::from_secs(60));
        let worker = tokio::spawn({
            let q = q.clone();
            async move { (q.next().await, Instant::now()) }
        });
        tokio::task::yield_now().await;
        let start = Instant::now();
        q.add_after(2, Duration::from_secs(1));
        let (key, at) = worker.await.unwrap();
        assert_eq!(key, Some(2));
        assert_eq!(at - start, Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_closed_queue_ends_its_workers() {
        let q: WorkQueue<u32> = WorkQueue::new();
        let worker = tokio::spawn({
            let q = q.clone();
            async move { q.next().await }
        });
        tokio::task::yield_now().await;
        q.close();
        assert_eq!(worker.await.unwrap(), None);
    }
}
