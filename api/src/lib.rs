//! Lifeboat API types.

pub mod appwrapper;
pub mod quantity;
