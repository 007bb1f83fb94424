//! The desired work of every member cluster: from a binding and its template to each cluster's
//! work ([`dispatch`], pure, with what the hub generated removed by [`prune`]), kept with
//! revisions for the agents' work streams ([`store`]); each change's ledger event ([`record`]).

pub mod dispatch;
pub mod prune;
pub mod record;
pub mod store;
