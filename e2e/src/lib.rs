//! `lifeboat-e2e`: the local fleet of real Kubernetes control planes (one hub, N members) on
//! loopback, with kwok playing GPU nodes and pods, fault injection, and the harness the e2e
//! test binaries share.

pub mod error;
pub mod faults;
pub mod fleet;
pub mod harness;
pub mod http;
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

/// The machine's 1-minute load average (`/proc/loadavg`), printed with benchmark figures: other
/// builds on a shared machine skew them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}
