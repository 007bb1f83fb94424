//! Reconcile slots, handed out by priority (issue 20). The controller runs at most `concurrency`
//! reconciles at once; when more are waiting, those that may notice a failure (the AppWrapper is
//! Running, or not yet) go before clean-up work (resets, suspends, deletion), each class first
//! come, first served. Under a burst of failures the clean-up of the first failures (deletes and
//! their follow-up reconciles, several per AppWrapper) otherwise fills the slots while later
//! failures wait to be noticed at all; kube's own scheduler hands its slots out in no order.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Which waiters a free slot goes to first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// May notice a failure or start the workload: Running, and the phases before it.
    Detect = 0,
    /// Clean-up: Resetting, Suspending, Failed, Succeeded, deletion.
    CleanUp = 1,
}

#[derive(Debug)]
struct State {
    free: usize,
    waiting: [VecDeque<oneshot::Sender<Permit>>; 2],
}

/// A fixed number of slots; see the module.
#[derive(Debug)]
pub struct Slots {
    state: Mutex<State>,
}

/// One slot, given back (to the next waiter, or as free) when dropped.
#[derive(Debug)]
pub struct Permit {
    slots: Arc<Slots>,
}

impl Slots {
    /// `count` slots (at least one).
    pub fn new(count: usize) -> Arc<Slots> {
        Arc::new(Slots {
            state: Mutex::new(State {
                free: count.max(1),
                waiting: [VecDeque::new(), VecDeque::new()],
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a slot. A waiter dropped before it gets one takes nothing.
    pub async fn acquire(self: &Arc<Self>, priority: Priority) -> Permit {
        let rx = {
            let mut state = self.lock();
            if state.free > 0 {
                state.free -= 1;
                return Permit {
                    slots: self.clone(),
                };
            }
            let (tx, rx) = oneshot::channel();
            state.waiting[priority as usize].push_back(tx);
            rx
        };
        match rx.await {
            Ok(permit) => permit,
            // Never: a sender is only dropped after sending, and `self` outlives the wait.
            Err(_) => Box::pin(self.acquire(priority)).await,
        }
    }

    /// Slots free now.
    pub fn free(&self) -> usize {
        self.lock().free
    }

    /// Hands a released slot to the first waiter by priority, or makes it free.
    fn release(self: &Arc<Self>) {
        loop {
            let next = {
                let mut state = self.lock();
                let next = state.waiting.iter_mut().find_map(|q| q.pop_front());
                if next.is_none() {
                    state.free += 1;
                }
                next
            };
            let Some(tx) = next else { return };
            match tx.send(Permit {
                slots: self.clone(),
            }) {
                Ok(()) => return,
                // That waiter is gone: the slot goes to the next one, without a second release.
                Err(permit) => std::mem::forget(permit),
            }
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.slots.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn detection_goes_before_clean_up_and_each_class_in_order() {
        let slots = Slots::new(1);
        let held = slots.acquire(Priority::CleanUp).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (name, priority) in [
            ("clean-1", Priority::CleanUp),
            ("detect-1", Priority::Detect),
            ("clean-2", Priority::CleanUp),
            ("detect-2", Priority::Detect),
        ] {
            let (slots, order) = (slots.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = slots.acquire(priority).await;
                order.lock().unwrap().push(name);
            }));
            // Each waiter queued before the next one asks.
            tokio::task::yield_now().await;
        }
        drop(held);
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(
            *order.lock().unwrap(),
            ["detect-1", "detect-2", "clean-1", "clean-2"]
        );
        assert_eq!(slots.free(), 1);
    }

    #[tokio::test]
    async fn a_waiter_that_gave_up_takes_no_slot() {
        let slots = Slots::new(1);
        let held = slots.acquire(Priority::Detect).await;
        let gave_up =
            tokio::time::timeout(Duration::from_millis(10), slots.acquire(Priority::Detect)).await;
        assert!(gave_up.is_err(), "no slot was free");
        drop(held);
        assert_eq!(
            slots.free(),
            1,
            "the slot came back instead of going to nobody"
        );
        let a = slots.acquire(Priority::CleanUp).await;
        assert_eq!(slots.free(), 0);
        drop(a);
        assert_eq!(slots.free(), 1);
    }
}
