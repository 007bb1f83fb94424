//! A work queue with client-go's guarantees: a key waits in the queue at most once however
//! often it is added, and is never processed by two workers at once (a key added while it is
//! being processed is processed again afterwards).

use std::collections::{HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

struct Inner<K> {
    ready: VecDeque<K>,
    queued: HashSet<K>,
    active: HashSet<K>,
    /// Added while active: queued again by `done`.
    again: HashSet<K>,
    closed: bool,
}

/// A deduplicating work queue.
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
                closed: false,
            })),
            notify: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `key` unless it is already waiting.
    pub fn add(&self, key: K) {
        let mut inner = self.lock();
        if inner.closed {
            return;
        }
        if inner.active.contains(&key) {
            inner.again.insert(key);
            return;
        }
        if inner.queued.insert(key.clone()) {
            inner.ready.push_back(key);
            drop(inner);
            self.notify.notify_one();
        }
    }

    /// Queues `key` after `delay` (a retry, or a timer such as a toleration).
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            self.add(key);
            return;
        }
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            queue.add(key);
        });
    }

    /// The next key to process (marked active), or `None` once the queue is closed.
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            {
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
            }
            notified.await;
        }
    }

    /// Marks `key` processed; if it was added meanwhile it is queued again.
    pub fn done(&self, key: &K) {
        let again = {
            let mut inner = self.lock();
            inner.active.remove(key);
            inner.again.remove(key)
        };
        if again {
            self.add(key.clone());
        }
    }

    /// Keys waiting (not counting those being processed).
    pub fn len(&self) -> usize {
        self.lock().ready.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Nothing waits and nothing is being processed (delayed adds not counted).
    pub fn is_idle(&self) -> bool {
        let inner = self.lock();
        inner.ready.is_empty() && inner.active.is_empty()
    }

    /// Stops the queue: `next` returns `None` from now on.
    pub fn close(&self) {
        self.lock().closed = true;
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
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_keys_arrive_after_the_delay() {
        let q: WorkQueue<u32> = WorkQueue::new();
        q.add_after(7, Duration::from_secs(30));
        tokio::task::yield_now().await;
        assert!(q.is_empty());
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert_eq!(q.next().await, Some(7));
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
