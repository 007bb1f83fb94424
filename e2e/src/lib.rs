//! `lifeboat-e2e`: the local fleet of real Kubernetes control planes (one hub, N members) on
//! loopback, with kwok playing GPU nodes and pods, fault injection, and the harness the e2e
//! test binaries share.

pub mod error;
pub mod faults;
pub mod fleet;
pub mod harness;
pub mod kubeconfig;
pub mod kubectl;
pub mod nodes;
pub mod partition;
pub mod pki;
pub mod ports;
pub mod process;
pub mod wait;

pub use error::{Error, Result};
pub use fleet::{ClusterStatus, Fleet, FleetConfig, FleetState, Role};
