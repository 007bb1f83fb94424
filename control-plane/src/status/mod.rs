//! Agents' status reports → the binding's status: the [`intake`] from the agent API, the
//! [`processor`] that interprets and folds them in, the pure [`aggregate`] (one report → the
//! binding's per-cluster item and conditions), and the [`handoff`] of new status to the binder.

pub mod aggregate;
pub mod handoff;
pub mod intake;
pub mod processor;
pub mod record;
