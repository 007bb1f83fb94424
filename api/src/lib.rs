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
//! # Hub API
//!
//! [`cluster`] (`cluster.lifeboat.dev/v1alpha1` Cluster), [`policy`]
//! (`policy.lifeboat.dev/v1alpha1` PropagationPolicy and ClusterPropagationPolicy, Karmada's field
//! names), [`binding`] (`work.lifeboat.dev/v1alpha1` ResourceBinding) and [`config`]
//! (`config.lifeboat.dev/v1alpha1` ResourceInterpreterCustomization) are the hub's CRDs;
//! [`protocol`] holds the versioned JSON types of the agent ↔ hub API, [`fencing`] the names of
//! the fencing credential a member gives the hub, [`time`] the microsecond times tolerations
//! count from, [`stages`] the names of the failover stage events.
//!
//! The CRD YAML in `crds/` is generated from these types by the `crdgen` binary ([`crds`]).

pub mod appwrapper;
pub mod binding;
pub mod cluster;
pub mod config;
pub mod crds;
pub mod credentials;
pub mod fencing;
pub mod health;
pub mod legacy;
pub mod policy;
pub mod protocol;
pub mod quantity;
pub mod reset;
pub mod selector;
pub mod serde_helpers;
pub mod stages;
pub mod time;
