//! The hub's event ledger: the append-only timeline of dispatches, health transitions, cluster
//! transitions, decisions, evictions and placements, for history queries, the dashboard and
//! audits. The Kubernetes objects stay the source of truth; the ledger is the record of what
//! happened to them.
//!
//! - [`LedgerEvent`] (pure): what the hub records; [`LedgerRecord`]: what a query returns.
//! - [`Ledger`]: the database (SQLite file by default, PostgreSQL by URL), its migrations, the
//!   direct append and the two history queries.
//! - [`LedgerWriter`]: the batched writer the hub's loops record through, with its metrics
//!   ([`LedgerMetrics`]).
//!
//! The hub's feed into the ledger (which of its changes become events, and only while it leads)
//! is the hub's own (`lifeboat_hub::ledger::LedgerFeed` and each loop's `record` module); `lifeboatctl history` reads through
//! [`Ledger`]. See README.md for the tests.

mod error;
mod event;
mod metrics;
mod store;
mod writer;

pub use error::{Backend, LedgerError};
pub use event::{BindingRef, EventKind, LedgerEvent, LedgerRecord};
pub use metrics::LedgerMetrics;
pub use store::{DEFAULT_DATABASE_URL, Ledger, LedgerPool, LedgerQuery};
pub use writer::{LedgerWriter, LedgerWriterTask, WriterConfig};
