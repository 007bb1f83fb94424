//! The event ledger as the hub uses it: the ledger itself (events, the database, the batched
//! writer, its metrics) is the `lifeboat-ledger` crate, re-exported here so `crate::ledger::…`
//! names it; [`feed`] is the hub's side, the events its loops record while this process leads.

pub use lifeboat_ledger::*;

pub mod feed;

pub use feed::LedgerFeed;
