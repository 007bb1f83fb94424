//! `workload.codeflare.dev/v1beta2` AppWrapper: types, constants, CRD generation and the pure
//! decision helpers (podSet paths and inference, validation, pod-template injection, Autopilot).

pub mod autopilot;
pub mod constants;
pub mod crd;
pub mod inject;
pub mod labels;
pub mod path;
pub mod podsets;
pub mod podspec;
mod types;
pub mod validation;

pub use types::{
    AppWrapper, AppWrapperComponent, AppWrapperComponentStatus, AppWrapperPhase, AppWrapperPodSet,
    AppWrapperPodSetInfo, AppWrapperSpec, AppWrapperStatus, AppWrapperTransition, MAX_TRANSITIONS,
};
