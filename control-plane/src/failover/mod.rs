//! Failover: what to do about a placement that stays unhealthy. The pure decision
//! ([`decide`]), the binder's failover phase over a binding's desired spec ([`phase`]), what a
//! decision leaves besides the binding ([`record`]: ledger, Events, metrics), and the hub's own
//! fence for a dead cluster's old copy ([`fencer`]). A manual reset is asked for by annotating
//! the binding; the annotation's format is the contract with `lifeboatctl reset`, so it lives in
//! `lifeboat_api::reset`, and `decide` serves it.

pub mod decide;
pub mod fencer;
pub mod phase;
pub mod record;

// What the binder's pass carries of a failover decision.
pub use decide::{AppliedReset, Blocked, Eviction, TaskChange};
