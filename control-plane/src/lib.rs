//! The Lifeboat hub: users apply workload templates and propagation policies to the hub's
//! kube-apiserver; the hub binds each template to member clusters (a `ResourceBinding`), hands
//! the work to each cluster's agent over the agent API, folds what the agents report into the
//! binding's status and the template's, and moves work off clusters where it stays unhealthy.
//!
//! One folder per concern, layered (a module imports only from its own folder and from the
//! layers below it; `tests/structure.rs` checks it, the README draws it):
//!
//! - [`process`]: runs it all as one process (the `lifeboat-hub` binary).
//! - [`admission`], [`agentapi`]: the IO edges that answer requests (the validating webhook; the
//!   agents' HTTPS API: registration, heartbeats, work streams, status reports).
//! - [`binding`]: templates → bindings (detector, binder, placement, template status).
//! - [`failover`]: what to do about an unhealthy placement (decide, the binder's phase, the
//!   record, manual resets, the hub's own fence).
//! - [`status`]: agents' reports → the binding's status (intake, processor, aggregation, the
//!   hand-off to the binder).
//! - [`clusters`]: cluster health from the agents' Leases, a deleted Cluster's removal, the
//!   recovery of a new leader.
//! - [`interpreters`]: the resource interpreters, their threads and their Events.
//! - [`work`]: the desired work of every cluster (dispatch, the work store, pruning).
//! - [`leadership`], [`ledger`]: shared below everything. The names shared with agents and
//!   `lifeboatctl` (Secrets, labels, Leases) are the contract and come from `lifeboat-api`; the
//!   caches, the work queue and the Kube error from `lifeboat-runtime`.

pub mod admission;
pub mod agentapi;
pub mod binding;
pub mod clusters;
pub mod failover;
pub mod interpreters;
pub mod leadership;
pub mod ledger;
pub mod process;
pub mod status;
#[cfg(test)]
mod test_metrics;
pub mod work;
