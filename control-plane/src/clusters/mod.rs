//! The member clusters as the hub sees them: health from the agents' Leases ([`health`]), a
//! deleted Cluster's agent stopped before the Cluster goes ([`removal`]), and a new leader's
//! wait for every cluster's state ([`recovery`]).

pub mod health;
pub mod record;
pub mod recovery;
pub mod removal;
