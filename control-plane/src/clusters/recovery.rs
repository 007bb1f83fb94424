//! Restart without losing state (`seeds/002_*`): a hub that starts leading is `Recovering`
//! until it has heard from every cluster that was Ready, and only then (`Running`) decides
//! evictions and placements.
//!
//! Every fact a decision needs is in the hub's objects (placements, eviction tasks and history,
//! each cluster's `unhealthySince`), but the health in a binding's status is as old as the last
//! report the previous leader wrote: a workload that recovered while no hub ran still reads
//! Unhealthy, and its toleration may look long over. So a new leader rebuilds the agents' work
//! from the bindings, opens the work streams, and waits until each cluster that was Ready has
//! re-sent its full state (the first report after a snapshot is `full`) or has lost its lease;
//! a cluster that is neither after the recovery timeout is given up on (logged), so a stuck
//! agent cannot hold the hub's decisions forever.
//!
//! [`Recovery`] is the pure part: fed cluster names and instants, unit-tested.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// What this hub process is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HubPhase {
    /// Another process leads.
    Standby,
    /// Leading, waiting for the agents' full state: no eviction or placement is decided.
    Recovering,
    /// Leading and deciding.
    Running,
}

impl HubPhase {
    pub const ALL: [HubPhase; 3] = [HubPhase::Standby, HubPhase::Recovering, HubPhase::Running];

    pub fn as_str(self) -> &'static str {
        match self {
            HubPhase::Standby => "Standby",
            HubPhase::Recovering => "Recovering",
            HubPhase::Running => "Running",
        }
    }
}

/// How a recovery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovered {
    /// Every cluster that was Ready re-sent its full state or lost its lease.
    Complete,
    /// The timeout passed; these clusters had neither re-sent their state nor lost their lease.
    TimedOut { waiting: Vec<String> },
}

/// The clusters a recovering hub waits for.
#[derive(Debug, Clone)]
pub struct Recovery {
    /// Ready when the recovery began, not yet heard from, not lost.
    waiting: BTreeSet<String>,
    deadline: Instant,
}

impl Recovery {
    /// Waits for the clusters that were `ready` at `now`, at most `timeout`.
    pub fn new(ready: impl IntoIterator<Item = String>, now: Instant, timeout: Duration) -> Self {
        Recovery {
            waiting: ready.into_iter().collect(),
            deadline: now + timeout,
        }
    }

    /// The cluster's agent re-sent its full state.
    pub fn full_report(&mut self, cluster: &str) {
        self.waiting.remove(cluster);
    }

    /// The cluster is no longer Ready (lease expired) or is gone: nothing more will come from
    /// it, and cluster failover takes it from here.
    pub fn lost(&mut self, cluster: &str) {
        self.waiting.remove(cluster);
    }

    /// The clusters still waited for, sorted.
    pub fn waiting(&self) -> Vec<String> {
        self.waiting.iter().cloned().collect()
    }

    /// When the wait ends at the latest.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// `Some` once the recovery is over at `now`.
    pub fn outcome(&self, now: Instant) -> Option<Recovered> {
        if self.waiting.is_empty() {
            Some(Recovered::Complete)
        } else if now >= self.deadline {
            Some(Recovered::TimedOut {
                waiting: self.waiting(),
            })
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(120);

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn complete_once_every_ready_cluster_reported_in_full_or_was_lost() {
        let t0 = Instant::now();
        let mut recovery = Recovery::new(names(&["a", "b", "c"]), t0, TIMEOUT);
        assert_eq!(recovery.outcome(t0), None);
        recovery.full_report("a");
        // A report from a cluster nobody waits for changes nothing.
        recovery.full_report("z");
        assert_eq!(recovery.waiting(), names(&["b", "c"]));
        assert_eq!(recovery.outcome(t0 + Duration::from_secs(5)), None);
        recovery.lost("b");
        assert_eq!(recovery.outcome(t0 + Duration::from_secs(6)), None);
        recovery.full_report("c");
        assert_eq!(
            recovery.outcome(t0 + Duration::from_secs(7)),
            Some(Recovered::Complete)
        );
    }

    #[test]
    fn no_ready_cluster_means_nothing_to_wait_for() {
        let t0 = Instant::now();
        let recovery = Recovery::new(Vec::new(), t0, TIMEOUT);
        assert_eq!(recovery.outcome(t0), Some(Recovered::Complete));
    }

    #[test]
    fn a_silent_cluster_holds_the_recovery_only_until_the_timeout() {
        let t0 = Instant::now();
        let mut recovery = Recovery::new(names(&["a", "b"]), t0, TIMEOUT);
        recovery.full_report("a");
        assert_eq!(
            recovery.outcome(t0 + TIMEOUT - Duration::from_millis(1)),
            None
        );
        assert_eq!(recovery.deadline(), t0 + TIMEOUT);
        assert_eq!(
            recovery.outcome(t0 + TIMEOUT),
            Some(Recovered::TimedOut {
                waiting: names(&["b"])
            })
        );
    }
}
