//! Asking for a manual in-place reset: the request's format is the contract between
//! `lifeboatctl reset` and the hub, so it lives in lifeboat-api ([`lifeboat_api::reset`]).

pub use lifeboat_api::reset::*;
