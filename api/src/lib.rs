//! Lifeboat API types.

pub mod appwrapper;
pub mod legacy;
pub mod quantity;
