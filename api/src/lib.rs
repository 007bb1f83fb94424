//! Lifeboat API types.

pub mod appwrapper;
