//! The event ledger as the hub uses it: the ledger itself (events, the database, the batched
//! writer, its metrics) is the `lifeboat-ledger` crate, re-exported here so `crate::ledger::…`
//! names it. [`LedgerFeed`] hands events to the writer only while this process leads, so a
//! standby records nothing. Each loop turns its own transitions into ledger events in its own
//! module (`work::record`, `status::record`, `clusters::record`, `failover::record`); the
//! wiring (`process`) connects them to one feed.

pub use lifeboat_ledger::*;

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use lifeboat_api::protocol::WorkKey;
use tokio::sync::watch;

use crate::leadership::LeaderState;

/// A Kubernetes time as the ledger's.
pub fn ledger_time(time: &Time) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(time.0.as_microsecond()).unwrap_or(DateTime::UNIX_EPOCH)
}

/// The binding `key`, with its UID when known (an unknown UID is left out rather than stored
/// empty).
pub fn binding_ref(key: &WorkKey, uid: &str) -> BindingRef {
    let binding = BindingRef::new(&key.namespace, &key.name);
    if uid.is_empty() {
        binding
    } else {
        binding.with_uid(uid)
    }
}

/// Hands the hub's events to the ledger writer while this process leads.
#[derive(Clone)]
pub struct LedgerFeed {
    writer: LedgerWriter,
    leading: watch::Receiver<LeaderState>,
}

impl LedgerFeed {
    pub fn new(writer: LedgerWriter, leading: watch::Receiver<LeaderState>) -> LedgerFeed {
        LedgerFeed { writer, leading }
    }

    fn leads(&self) -> bool {
        self.leading.borrow().is_leader
    }

    /// Queues `event` if this process leads; never waits (a full queue drops it, counted and
    /// logged by the writer).
    pub fn record_now(&self, event: LedgerEvent) {
        if self.leads() {
            let _ = self.writer.try_record(event);
        }
    }

    /// Queues `event` if this process leads, waiting briefly for room (see
    /// [`LedgerWriter::record`]).
    pub async fn record(&self, event: LedgerEvent) {
        if self.leads() {
            let _ = self.writer.record(event).await;
        }
    }
}
