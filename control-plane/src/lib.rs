//! The Lifeboat hub: the multi-cluster failover control plane.
//!
//! So far it holds the event ledger ([`ledger`]); the detector, scheduling driver, agent API and
//! failover loops come next (see `ARCHITECTURE.md`).

pub mod ledger;
