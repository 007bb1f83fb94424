//! `lifeboat-agent`: the Lifeboat member agent. Today it is the AppWrapper fault-tolerance
//! controller (`workload.codeflare.dev/v1beta2`) of one member cluster: the first level of fault
//! tolerance. Decision logic is pure (`machine`, `pods`, `params`, `node_health`); IO lives in
//! the controller and the webhook.

pub mod agent;
pub mod config;
pub mod controller;
/// Go duration syntax (its home is `lifeboat-runtime`).
pub use lifeboat_runtime::duration;
pub mod index;
pub mod install;
pub mod machine;
pub mod metrics;
pub mod node_health;
pub mod params;
pub mod pods;
pub mod uplink;
pub mod webhook;
