//! Lifeboat API types.
