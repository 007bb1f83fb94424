//! The status processor's interpreting threads, shared between kinds so that one slow
//! customization cannot hold the others back.
//!
//! Every interpretation is a job in the lane of its object's kind (`apiVersion/kind`: the
//! customizations of a kind are the scripts its jobs run). Workers take jobs lane by lane in
//! turn (a lane with 10,000 queued jobs does not go before a lane with one), live reports before
//! re-evaluations. A lane is *trusted* while its jobs are fast: the moving average of its job
//! times is under `slow_after` (or, before any job of it finished, the submitter vouched for it:
//! the built-in interpreters) and none of its running jobs has been running longer. Jobs of the other lanes (new kinds, changed scripts, slow scripts) may hold at most
//! `workers - 1` workers at once, so one worker is always left to trusted lanes: a hostile
//! customization slows only its own kind, and a script that keeps hitting its time limit stays
//! demoted until its jobs are fast again. The scheduling is pure bookkeeping under one mutex;
//! [`Pool`] adds the threads.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A lane: the kind of the objects its jobs interpret.
pub type LaneKey = Arc<str>;

/// Which queue of a lane a job goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// A report an agent is waiting on.
    Live,
    /// A re-evaluation after customizations changed.
    Background,
}

type Job = Box<dyn FnOnce() + Send>;

/// Default for [`Pool::new`]'s `slow_after`: a job this long is not a normal interpretation (the
/// built-ins take tens of microseconds), and is far below the 1 s wall-clock limit.
pub const SLOW_AFTER: Duration = Duration::from_millis(100);

#[derive(Default)]
struct Lane {
    live: VecDeque<Job>,
    background: VecDeque<Job>,
    /// Start times of its running jobs.
    running: Vec<Instant>,
    /// Moving average of its job times (seconds); `None` until a job finished.
    average: Option<f64>,
    /// Trusted before any job finished (its scripts are the built-ins).
    vouched: bool,
}

impl Lane {
    fn queue(&mut self, priority: Priority) -> &mut VecDeque<Job> {
        match priority {
            Priority::Live => &mut self.live,
            Priority::Background => &mut self.background,
        }
    }

    fn trusted(&self, now: Instant, slow_after: Duration) -> bool {
        self.average
            .map_or(self.vouched, |a| a < slow_after.as_secs_f64())
            && self
                .running
                .iter()
                .all(|started| now.duration_since(*started) < slow_after)
    }
}

/// The lanes and the turn order: pure scheduling, driven by [`Pool`] and by unit tests.
pub struct Lanes {
    lanes: HashMap<LaneKey, Lane>,
    /// Lanes with queued jobs, in turn order.
    turn: VecDeque<LaneKey>,
    workers: usize,
    slow_after: Duration,
}

impl Lanes {
    pub fn new(workers: usize, slow_after: Duration) -> Lanes {
        Lanes {
            lanes: HashMap::new(),
            turn: VecDeque::new(),
            workers: workers.max(1),
            slow_after,
        }
    }

    /// Queues `job`; `vouched`: the lane is trusted before its first job ends.
    fn push(&mut self, lane: LaneKey, priority: Priority, vouched: bool, job: Job) {
        let entry = self.lanes.entry(lane.clone()).or_default();
        entry.vouched = vouched;
        entry.queue(priority).push_back(job);
        if !self.turn.contains(&lane) {
            self.turn.push_back(lane);
        }
    }

    /// Whether `lane`'s jobs may have to wait for a worker (it is not trusted).
    pub fn is_slow(&self, lane: &str, now: Instant) -> bool {
        self.lanes
            .get(lane)
            .is_none_or(|l| !l.trusted(now, self.slow_after))
    }

    /// Workers the untrusted lanes may hold at once.
    fn untrusted_cap(&self) -> usize {
        self.workers.saturating_sub(1).max(1)
    }

    /// The next job to run, if one may start now: live jobs before background ones, lanes in
    /// turn, an untrusted lane only while fewer than `workers - 1` untrusted jobs run.
    fn next(&mut self, now: Instant) -> Option<(LaneKey, Job)> {
        let untrusted_running: usize = self
            .lanes
            .values()
            .filter(|l| !l.trusted(now, self.slow_after))
            .map(|l| l.running.len())
            .sum();
        let may_run_untrusted = untrusted_running < self.untrusted_cap();
        for priority in [Priority::Live, Priority::Background] {
            for position in 0..self.turn.len() {
                let key = self.turn[position].clone();
                let Some(lane) = self.lanes.get_mut(&key) else {
                    continue;
                };
                if lane.queue(priority).is_empty()
                    || (!may_run_untrusted && !lane.trusted(now, self.slow_after))
                {
                    continue;
                }
                let Some(job) = lane.queue(priority).pop_front() else {
                    continue;
                };
                lane.running.push(now);
                self.turn.remove(position);
                if !(lane.live.is_empty() && lane.background.is_empty()) {
                    self.turn.push_back(key.clone());
                }
                return Some((key, job));
            }
        }
        None
    }

    /// A job of `lane` that started at `started` ended at `now`.
    fn finished(&mut self, lane: &str, started: Instant, now: Instant) {
        if let Some(l) = self.lanes.get_mut(lane) {
            if let Some(i) = l.running.iter().position(|s| *s == started) {
                l.running.swap_remove(i);
            }
            let took = now.duration_since(started).as_secs_f64();
            l.average = Some(match l.average {
                Some(average) => (average + took) / 2.0,
                None => took,
            });
        }
    }

    /// Forgets what is known of `lane`'s speed (its scripts changed): untrusted until its jobs
    /// are seen to be fast again, unless the next submitter vouches for it.
    pub fn forget(&mut self, lane: &str) {
        if let Some(l) = self.lanes.get_mut(lane) {
            l.average = None;
            l.vouched = false;
        }
    }

    /// Jobs of `lane` running now.
    pub fn running(&self, lane: &str) -> usize {
        self.lanes.get(lane).map_or(0, |l| l.running.len())
    }
}

struct Shared {
    lanes: Mutex<Lanes>,
    ready: Condvar,
    closed: std::sync::atomic::AtomicBool,
}

/// The interpreting threads.
pub struct Pool {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Pool {
    /// `workers` threads (at least 2, so that one is left to trusted lanes).
    pub fn new(workers: usize, slow_after: Duration) -> Pool {
        let workers = workers.max(2);
        let shared = Arc::new(Shared {
            lanes: Mutex::new(Lanes::new(workers, slow_after)),
            ready: Condvar::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
        });
        let threads = (0..workers)
            .filter_map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("interpreter-{i}"))
                    .spawn(move || work(&shared, slow_after))
                    .map_err(|e| tracing::error!(error = %e, "cannot start an interpreting thread"))
                    .ok()
            })
            .collect();
        Pool { shared, threads }
    }

    fn lanes(&self) -> std::sync::MutexGuard<'_, Lanes> {
        self.shared.lanes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job` in `lane`; `vouched`: the lane is trusted before its first job ends (its
    /// scripts are the built-ins).
    pub fn submit(
        &self,
        lane: LaneKey,
        priority: Priority,
        vouched: bool,
        job: impl FnOnce() + Send + 'static,
    ) {
        self.lanes().push(lane, priority, vouched, Box::new(job));
        self.shared.ready.notify_one();
    }

    pub fn is_slow(&self, lane: &str) -> bool {
        self.lanes().is_slow(lane, Instant::now())
    }

    pub fn forget(&self, lane: &str) {
        self.lanes().forget(lane);
    }

    pub fn running(&self, lane: &str) -> usize {
        self.lanes().running(lane)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared
            .closed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.shared.ready.notify_all();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn work(shared: &Shared, slow_after: Duration) {
    let mut lanes = shared.lanes.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if shared.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let now = Instant::now();
        let Some((lane, job)) = lanes.next(now) else {
            // A running job turning slow changes what may start: look again now and then.
            lanes = shared
                .ready
                .wait_timeout(lanes, slow_after)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|e| e.into_inner().0);
            continue;
        };
        drop(lanes);
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
            tracing::error!(lane = %lane, "an interpreting job panicked");
        }
        lanes = shared.lanes.lock().unwrap_or_else(|e| e.into_inner());
        lanes.finished(&lane, now, Instant::now());
        shared.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noop() -> Job {
        Box::new(|| {})
    }

    fn lane(name: &str) -> LaneKey {
        Arc::from(name)
    }

    #[test]
    fn lanes_take_turns_and_live_jobs_go_first() {
        let mut lanes = Lanes::new(4, SLOW_AFTER);
        let t0 = Instant::now();
        // make both lanes trusted
        for name in ["a", "b"] {
            lanes.push(lane(name), Priority::Live, false, noop());
            let (key, _) = lanes.next(t0).unwrap();
            lanes.finished(&key, t0, t0);
        }
        for _ in 0..3 {
            lanes.push(lane("a"), Priority::Live, false, noop());
        }
        lanes.push(lane("a"), Priority::Background, false, noop());
        lanes.push(lane("b"), Priority::Live, false, noop());
        let order: Vec<String> = std::iter::from_fn(|| lanes.next(t0))
            .map(|(k, _)| k.to_string())
            .collect();
        // a's second live job waits for b's turn; background last
        assert_eq!(order, ["a", "b", "a", "a", "a"]);
    }

    #[test]
    fn untrusted_lanes_leave_a_worker_to_trusted_ones() {
        let mut lanes = Lanes::new(2, SLOW_AFTER);
        let t0 = Instant::now();
        lanes.push(lane("fast"), Priority::Live, false, noop());
        let (key, _) = lanes.next(t0).unwrap();
        lanes.finished(&key, t0, t0 + Duration::from_micros(50));
        // a new customized kind's jobs: one may run, the second waits
        lanes.push(lane("hostile"), Priority::Live, false, noop());
        lanes.push(lane("hostile"), Priority::Live, false, noop());
        assert_eq!(&*lanes.next(t0).unwrap().0, "hostile");
        assert!(lanes.next(t0).is_none());
        // the trusted lane still gets the other worker, and so does a vouched-for new one
        lanes.push(lane("fast"), Priority::Live, false, noop());
        assert_eq!(&*lanes.next(t0).unwrap().0, "fast");
        lanes.push(lane("builtin"), Priority::Live, true, noop());
        assert!(!lanes.is_slow("builtin", t0));
        // a trusted lane whose job runs past slow_after is untrusted until it ends
        let later = t0 + SLOW_AFTER * 2;
        assert!(lanes.is_slow("fast", later));
        lanes.finished("fast", t0, t0 + Duration::from_micros(50));
        assert!(!lanes.is_slow("fast", later));
        // the hostile job took a second: its lane is demoted; forgetting makes it unknown
        lanes.finished("hostile", t0, t0 + Duration::from_secs(1));
        assert!(lanes.is_slow("hostile", later));
        lanes.forget("fast");
        assert!(lanes.is_slow("fast", later));
    }

    #[test]
    fn the_pool_runs_every_job() {
        let pool = Pool::new(2, SLOW_AFTER);
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..100 {
            let tx = tx.clone();
            let key = lane(if i % 2 == 0 { "a" } else { "b" });
            pool.submit(key, Priority::Live, false, move || {
                let _ = tx.send(i);
            });
        }
        let mut got: Vec<i32> = (0..100)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        got.sort();
        assert_eq!(got, (0..100).collect::<Vec<_>>());
    }
}
