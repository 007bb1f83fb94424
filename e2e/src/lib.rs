//! The local fleet.
