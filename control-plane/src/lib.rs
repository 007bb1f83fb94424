//! The Lifeboat hub: users apply workload templates and propagation policies to the hub's
//! kube-apiserver; the hub binds each template to member clusters (a `ResourceBinding`), hands
//! the work to each cluster's agent over the agent API, folds what the agents report into the
//! binding's status and the template's, and (the failover issue) moves work off clusters where
//! it stays unhealthy.
//!
//! Pure, IO-free modules: [`work_store`] (desired work per cluster, resumable by revision),
//! [`status`] (one report → the binding's per-cluster status item and conditions). The seam
//! between the agent API and the status processor is [`intake`]; between the processor and the
//! binder, [`handoff`].
//!
//! IO edges: [`agentapi`] (the agents' HTTPS API: registration, heartbeats, work streams,
//! status reports), [`clusters`] (cluster health from the agents' Leases) and
//! [`cluster_removal`] (a deleted Cluster's agent stopped before the Cluster goes). [`leadership`]
//! says whether this process acts. [`ledger`] is the append-only event timeline (sqlx: SQLite or
//! PostgreSQL). [`hub`] runs it all as one process (the `lifeboat-hub` binary).

pub mod admission;
pub mod agentapi;
pub mod binder;
pub mod cluster_removal;
pub mod clusters;
pub mod detector;
pub mod dispatch;
pub mod failover;
pub mod failover_phase;
pub mod failover_record;
pub mod fencer;
pub mod handoff;
pub mod hub;
pub mod intake;
pub mod interpreter_events;
pub mod interpreters;
pub mod lanes;
pub mod leadership;
pub mod ledger;
pub mod manual_reset;
pub mod placement;
pub mod processor;
pub mod prune;
pub mod recovery;
pub mod status;
pub mod template_status;
pub mod templates;
#[cfg(test)]
mod test_metrics;
pub mod work_store;
