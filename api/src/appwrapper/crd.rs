//! The AppWrapper CustomResourceDefinition, generated from the Rust types.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// Where the generated CRD is committed, relative to the repository root.
pub const CRD_FILE: &str = "crds/workload.codeflare.dev_appwrappers.yaml";

/// The AppWrapper CRD as an object.
pub fn crd() -> CustomResourceDefinition {
    crate::crds::appwrapper().crd
}

/// The AppWrapper CRD as the YAML committed in `crds/` (with a generated-file header).
pub fn crd_yaml() -> Result<String, serde_saphyr::SerializeError> {
    crate::crds::appwrapper().yaml()
}
