//! Sandboxed, Karmada-compatible Lua resource interpreter.
//!
//! Runs `ResourceInterpreterCustomization` scripts (Karmada's `config.karmada.io/v1alpha1` or
//! `config.lifeboat.dev/v1alpha1`) unchanged on Lua 5.4, with per-evaluation limits, clean
//! globals for every call and a compiled-chunk cache per state. See the crate README for the
//! limits and the Lua 5.1 (gopher-lua) differences that remain.
//!
//! ```
//! use std::sync::Arc;
//! use lifeboat_interpreter::{Interpreter, Runtime, RuntimeConfig, HealthState};
//!
//! let mut interpreter = Interpreter::new(Arc::new(Runtime::new(RuntimeConfig::default())));
//! interpreter.add_yaml(r#"
//! apiVersion: config.lifeboat.dev/v1alpha1
//! kind: ResourceInterpreterCustomization
//! metadata: {name: example}
//! spec:
//!   target: {apiVersion: example.com/v1, kind: Widget}
//!   customizations:
//!     healthInterpretation:
//!       luaScript: |
//!         function InterpretHealth(obj) return obj.status.ready == true end
//! "#).unwrap();
//! let health = interpreter
//!     .interpret_health(&serde_json::json!({
//!         "apiVersion": "example.com/v1", "kind": "Widget", "status": {"ready": true}
//!     }))
//!     .unwrap()
//!     .unwrap();
//! assert_eq!(health.state, HealthState::Healthy);
//! ```

pub mod builtin;
pub mod convert;
pub mod customization;
pub mod empty;
pub mod error;
pub mod interpreter;
mod kube;
pub mod operation;
pub mod order;
pub mod pod;
pub mod results;
pub mod runtime;
pub mod sandbox;
pub mod yaml;

// Behaviour tests through the public API (in the library so `cargo test --lib` runs them).
#[cfg(test)]
mod tests_dialect;
#[cfg(test)]
mod tests_lazy;
#[cfg(test)]
mod tests_order;
#[cfg(test)]
mod tests_sandbox;

pub use customization::{CustomizationTarget, ResourceInterpreterCustomization};
pub use error::{CustomizationError, Exceeded, InterpretError, Limit, RunError};
pub use interpreter::Interpreter;
pub use lifeboat_api::quantity::Quantity;
pub use operation::Operation;
pub use results::{
    AggregatedStatusItem, Component, DependentObjectReference, FailureClass, Health, HealthState,
    ReplicaInterpretation, ReplicaRequirements,
};
pub use runtime::{Runtime, RuntimeConfig};
pub use sandbox::{Limits, Script};
