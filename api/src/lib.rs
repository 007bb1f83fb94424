//! Lifeboat API types.
//!
//! # AppWrapper API
//!
//! [`appwrapper`] holds the `workload.codeflare.dev/v1beta2` AppWrapper, compatible field for
//! field with the upstream AppWrapper operator so existing YAML and status readers keep working,
//! plus one backwards-compatible extension, `status.transitions`. Next to the types live the
//! pure helpers the member agent's controller and webhook call: podSet paths and inference,
//! create/update validation, pod-template injection and Autopilot anti-affinities. None of them
//! does IO; each is unit-tested by feeding JSON.
//!
//! [`legacy`] converts MCAD-era AppWrappers (`spec.resources.GenericItems`) to v1beta2 and says
//! which settings did not carry over; `lifeboatctl convert` is its command-line front end.
//!
//! The CRD YAML in `crds/` is generated from these types by the `crdgen` binary.

pub mod appwrapper;
pub mod health;
pub mod legacy;
pub mod quantity;
pub mod serde_helpers;
