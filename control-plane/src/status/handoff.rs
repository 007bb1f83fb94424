//! The hand-off of a binding's new status from the status processor to the binder (a failover
//! is one binding write). The binder decides on the processor's newest items at
//! once ([`crate::status::processor::StatusState::newest_items`]) rather than after they are written
//! and seen again through the binding watch; the processor holds that binding's status write
//! back meanwhile, because the binder's spec write is guarded by the binding's
//! resourceVersion, which a status write landing first would change (a conflict, and the
//! decision made again). The status write follows the binder's (it is not an input of the
//! work), at the latest [`HOLD_AT_MOST`] after it was held.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use lifeboat_api::protocol::WorkKey;
use tokio::sync::Notify;

/// A held status write goes out after this long even if the binder is not done with the
/// binding (a slow or stuck decision never keeps the status from the API for long).
pub const HOLD_AT_MOST: Duration = Duration::from_secs(5);

/// What the binder answers the processor: whether it takes the binding now.
pub trait Decider: Send + Sync {
    /// The processor's items of `key` changed; `true`: queued for a decision on them.
    fn status_changed(&self, key: &WorkKey) -> bool;
}

struct Hold {
    /// Holds taken so far (a decision ends only the holds it saw begin).
    count: u64,
    released: Arc<Notify>,
}

/// Shared by the processor (holds, waits) and the binder (decides, releases).
#[derive(Default)]
pub struct Handoff {
    holds: Mutex<HashMap<WorkKey, Hold>>,
    decider: OnceLock<Weak<dyn Decider>>,
}

impl Handoff {
    pub fn new() -> Arc<Handoff> {
        Arc::new(Handoff::default())
    }

    /// The binder (held weakly: the hand-off never keeps it alive).
    pub fn set_decider(&self, decider: Weak<dyn Decider>) {
        let _ = self.decider.set(decider);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<WorkKey, Hold>> {
        self.holds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The processor folded new items of `key` in: hands them to the binder, and holds the
    /// status write when the binder takes them (the hold begins before the binder can end it).
    pub fn status_changed(&self, key: &WorkKey) {
        let Some(decider) = self.decider.get().and_then(Weak::upgrade) else {
            return;
        };
        let taken = {
            let mut holds = self.lock();
            let hold = holds.entry(key.clone()).or_insert_with(|| Hold {
                count: 0,
                released: Arc::new(Notify::new()),
            });
            hold.count += 1;
            hold.count
        };
        if !decider.status_changed(key) {
            self.done(key, taken);
        }
    }

    /// The binder starts a decision on `key`: what it is deciding on (pass it to
    /// [`Handoff::done`]).
    pub fn deciding(&self, key: &WorkKey) -> u64 {
        self.lock().get(key).map_or(0, |h| h.count)
    }

    /// The binder's decision that began at `seen` is written (or came to nothing): the holds
    /// taken before it end. A hold taken since stays for the decision that follows.
    pub fn done(&self, key: &WorkKey, seen: u64) {
        let mut holds = self.lock();
        if holds.get(key).is_some_and(|h| h.count <= seen)
            && let Some(hold) = holds.remove(key)
        {
            hold.released.notify_waiters();
        }
    }

    /// Whether a status write of `key` is held now.
    pub fn held(&self, key: &WorkKey) -> bool {
        self.lock().contains_key(key)
    }

    /// Waits until `key`'s status write is no longer held, at most `at_most`.
    pub async fn wait(&self, key: &WorkKey, at_most: Duration) {
        let Some(released) = self.lock().get(key).map(|h| h.released.clone()) else {
            return;
        };
        let notified = released.notified();
        let mut notified = std::pin::pin!(notified);
        notified.as_mut().enable();
        // Released between the look-up and `enable`: nothing wakes the waiter any more.
        let still = self
            .lock()
            .get(key)
            .is_some_and(|h| Arc::ptr_eq(&h.released, &released));
        if still {
            let _ = tokio::time::timeout(at_most, notified).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Binder {
        takes: AtomicBool,
        queued: Mutex<Vec<WorkKey>>,
    }

    impl Decider for Binder {
        fn status_changed(&self, key: &WorkKey) -> bool {
            self.queued.lock().unwrap().push(key.clone());
            self.takes.load(Ordering::SeqCst)
        }
    }

    fn key(name: &str) -> WorkKey {
        WorkKey {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn binder(takes: bool) -> (Arc<Handoff>, Arc<Binder>) {
        let handoff = Handoff::new();
        let binder = Arc::new(Binder {
            takes: AtomicBool::new(takes),
            queued: Mutex::new(Vec::new()),
        });
        let weak: Weak<Binder> = Arc::downgrade(&binder);
        handoff.set_decider(weak);
        (handoff, binder)
    }

    #[tokio::test(start_paused = true)]
    async fn a_status_write_waits_for_the_decision_on_it() {
        let (handoff, binder) = binder(true);
        handoff.status_changed(&key("a"));
        assert_eq!(*binder.queued.lock().unwrap(), vec![key("a")]);
        assert!(handoff.held(&key("a")));
        let seen = handoff.deciding(&key("a"));
        let waiter = {
            let handoff = handoff.clone();
            tokio::spawn(async move {
                let start = tokio::time::Instant::now();
                handoff.wait(&key("a"), HOLD_AT_MOST).await;
                start.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiter.is_finished());
        handoff.done(&key("a"), seen);
        assert!(!handoff.held(&key("a")));
        assert_eq!(waiter.await.unwrap(), Duration::from_millis(30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_during_a_decision_stays_held_for_the_next_one() {
        let (handoff, _binder) = binder(true);
        handoff.status_changed(&key("a"));
        let first = handoff.deciding(&key("a"));
        handoff.status_changed(&key("a"));
        handoff.done(&key("a"), first);
        assert!(
            handoff.held(&key("a")),
            "the newer items are not decided yet"
        );
        let second = handoff.deciding(&key("a"));
        handoff.done(&key("a"), second);
        assert!(!handoff.held(&key("a")));
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_held_when_the_binder_does_not_take_it_or_is_gone() {
        let (handoff, binder) = binder(false);
        handoff.status_changed(&key("a"));
        assert!(!handoff.held(&key("a")));
        drop(binder);
        handoff.status_changed(&key("b"));
        assert!(!handoff.held(&key("b")));
        // and waiting for a write nobody holds returns at once
        handoff.wait(&key("b"), HOLD_AT_MOST).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_never_lasts_longer_than_its_bound() {
        let (handoff, _binder) = binder(true);
        handoff.status_changed(&key("a"));
        let start = tokio::time::Instant::now();
        handoff.wait(&key("a"), HOLD_AT_MOST).await;
        assert_eq!(start.elapsed(), HOLD_AT_MOST);
    }
}
