//! Lifeboat member agent.
