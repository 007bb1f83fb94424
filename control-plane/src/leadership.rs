//! Which hub process acts. Two hub processes run; the one holding the leader Lease on the hub
//! cluster writes and serves the agents, the other (standby) refuses agent calls with a retry
//! hint naming the leader. The leader election itself feeds a [`LeaderState`] watch channel;
//! everything that must act only while leading (agent API, cluster health monitor) reads it.

use tokio::sync::watch;

/// This process's view of the leadership.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaderState {
    /// This process holds the leader Lease.
    pub is_leader: bool,
    /// The leader's agent API URL, when known (sent to agents by a standby).
    pub leader_url: Option<String>,
}

impl LeaderState {
    /// This process leads.
    pub fn leader() -> LeaderState {
        LeaderState {
            is_leader: true,
            leader_url: None,
        }
    }

    /// Another process leads (at `leader_url`, when known).
    pub fn standby(leader_url: Option<String>) -> LeaderState {
        LeaderState {
            is_leader: false,
            leader_url,
        }
    }
}

/// A leadership channel fixed at "this process leads" (a single hub, and tests). Keep the
/// sender alive for as long as the receivers are used: a closed channel reads as lost leadership.
pub fn always_leader() -> (watch::Sender<LeaderState>, watch::Receiver<LeaderState>) {
    watch::channel(LeaderState::leader())
}
