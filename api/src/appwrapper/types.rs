//! The `workload.codeflare.dev/v1beta2` AppWrapper, field for field with upstream (reference §1),
//! plus the backwards-compatible `status.transitions` history.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodSchedulingGate, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

use crate::serde_helpers::null_as_default;

/// How many phase changes `status.transitions` keeps (MCAD v2 kept 20 too).
pub const MAX_TRANSITIONS: usize = 20;

/// Specification of an AppWrapper: the wrapped resources and the suspend switch Kueue toggles.
// Each printcolumn repeats `type_ = "string"`, which clippy mistakes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "workload.codeflare.dev",
    version = "v1beta2",
    kind = "AppWrapper",
    plural = "appwrappers",
    singular = "appwrapper",
    namespaced,
    shortname = "aw",
    status = "AppWrapperStatus",
    derive = "PartialEq",
    doc = "AppWrapper is the Schema for the appwrappers API",
    printcolumn(name = "Status", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Quota Reserved",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"QuotaReserved\")].status"
    ),
    printcolumn(
        name = "Resources Deployed",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"ResourcesDeployed\")].status"
    ),
    printcolumn(
        name = "Unhealthy",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Unhealthy\")].status"
    ),
    printcolumn(
        name = "Retries",
        type_ = "integer",
        json_path = ".status.resettingCount"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AppWrapperSpec {
    /// Components lists the components contained in the AppWrapper.
    #[serde(deserialize_with = "null_as_default")]
    pub components: Vec<AppWrapperComponent>,

    /// Suspend suspends the AppWrapper when set to true.
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_as_default"
    )]
    pub suspend: bool,

    /// ManagedBy is used to indicate the controller or entity that manages the AppWrapper.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_by: Option<String>,
}

/// One wrapped resource.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppWrapperComponent {
    /// Annotations is an unstructured key value map that may be used to store and retrieve
    /// arbitrary metadata about the Component to customize its treatment by the AppWrapper
    /// controller.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub annotations: BTreeMap<String, String>,

    /// DeclaredPodSets for the Component (optional for known PodCreating Kinds).
    #[serde(
        default,
        rename = "podSets",
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub declared_pod_sets: Vec<AppWrapperPodSet>,

    /// PodSetInfos assigned to the Component's PodSets by Kueue.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub pod_set_infos: Vec<AppWrapperPodSetInfo>,

    /// Template defines the Kubernetes resource for the Component.
    #[schemars(schema_with = "embedded_resource_schema")]
    pub template: serde_json::Value,
}

/// Where a PodTemplateSpec sits inside a component, and how many pods it yields.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppWrapperPodSet {
    /// Replicas is the number of pods that will be created using the PodSpecTemplate (absent
    /// means 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,

    /// Path is the path Component.Template to the PodTemplateSpec for this PodSet.
    pub path: String,

    /// Annotations is an unstructured key value map that may be used to store and retrieve
    /// arbitrary metadata about the PodSet to customize its treatment by the AppWrapper
    /// controller.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub annotations: BTreeMap<String, String>,
}

impl AppWrapperPodSet {
    /// The pod count of this podSet: `replicas`, 1 when absent (upstream `utils.Replicas`).
    pub fn replicas_or_default(&self) -> i32 {
        self.replicas.unwrap_or(1)
    }
}

/// What Kueue injects into the pod template of one podSet when it admits the workload.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppWrapperPodSetInfo {
    /// Annotations to be added to the PodSpecTemplate.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub annotations: BTreeMap<String, String>,
    /// Labels to be added to the PodSepcTemplate.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub labels: BTreeMap<String, String>,
    /// NodeSelectors to be added to the PodSpecTemplate.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations to be added to the PodSpecTemplate.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub tolerations: Vec<Toleration>,
    /// SchedulingGates to be added to the PodSpecTemplate.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub scheduling_gates: Vec<PodSchedulingGate>,
}

/// The phase of an AppWrapper. `Empty` (serialised `""`) is the phase before the first reconcile.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum AppWrapperPhase {
    // No doc comments on the variants: schemars would turn the enum into a `oneOf` of
    // described constants, which is not a structural schema.
    #[default]
    #[serde(rename = "")]
    Empty,
    Suspended,
    Resuming,
    Running,
    Resetting,
    Suspending,
    Succeeded,
    Failed,
    Terminating,
}

impl AppWrapperPhase {
    /// Every phase, in upstream order.
    pub const ALL: [AppWrapperPhase; 9] = [
        AppWrapperPhase::Empty,
        AppWrapperPhase::Suspended,
        AppWrapperPhase::Resuming,
        AppWrapperPhase::Running,
        AppWrapperPhase::Resetting,
        AppWrapperPhase::Suspending,
        AppWrapperPhase::Succeeded,
        AppWrapperPhase::Failed,
        AppWrapperPhase::Terminating,
    ];

    /// The wire name (`""` for Empty); phase names double as condition reasons.
    pub fn as_str(self) -> &'static str {
        match self {
            AppWrapperPhase::Empty => "",
            AppWrapperPhase::Suspended => "Suspended",
            AppWrapperPhase::Resuming => "Resuming",
            AppWrapperPhase::Running => "Running",
            AppWrapperPhase::Resetting => "Resetting",
            AppWrapperPhase::Suspending => "Suspending",
            AppWrapperPhase::Succeeded => "Succeeded",
            AppWrapperPhase::Failed => "Failed",
            AppWrapperPhase::Terminating => "Terminating",
        }
    }

    /// True for the phase before the first reconcile.
    pub fn is_empty(&self) -> bool {
        *self == AppWrapperPhase::Empty
    }
}

impl std::fmt::Display for AppWrapperPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Observed state of an AppWrapper.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppWrapperStatus {
    /// Phase of the AppWrapper object.
    #[serde(
        default,
        skip_serializing_if = "AppWrapperPhase::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub phase: AppWrapperPhase,

    /// Retries counts the number of times the AppWrapper has entered the Resetting Phase (the
    /// JSON name is `resettingCount`, as upstream).
    #[serde(
        default,
        rename = "resettingCount",
        skip_serializing_if = "is_zero",
        deserialize_with = "null_as_default"
    )]
    pub retries: i32,

    /// Conditions hold the latest available observations of the AppWrapper current state.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    #[schemars(schema_with = "crate::serde_helpers::conditions_schema")]
    pub conditions: Vec<Condition>,

    /// ComponentStatus parallels the Components array in the Spec and tracks the actually
    /// deployed resources.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub component_status: Vec<AppWrapperComponentStatus>,

    /// Transitions lists the last 20 phase changes, oldest first (Lifeboat extension; upstream
    /// tools ignore it).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    #[schemars(length(max = 20))]
    pub transitions: Vec<AppWrapperTransition>,
}

impl AppWrapperStatus {
    /// Appends a phase change to `transitions`, dropping the oldest beyond [`MAX_TRANSITIONS`].
    /// Does not touch `phase`: the caller sets it in the same status write.
    pub fn record_transition(
        &mut self,
        time: Time,
        phase: AppWrapperPhase,
        reason: impl Into<String>,
        message: Option<String>,
    ) {
        self.transitions.push(AppWrapperTransition {
            time,
            phase,
            reason: reason.into(),
            message,
        });
        if self.transitions.len() > MAX_TRANSITIONS {
            let excess = self.transitions.len() - MAX_TRANSITIONS;
            self.transitions.drain(..excess);
        }
    }

    /// The condition of the given type, if present.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

/// One recorded phase change.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppWrapperTransition {
    /// When the phase changed.
    pub time: Time,
    /// The phase entered.
    pub phase: AppWrapperPhase,
    /// Why, in CamelCase (a condition reason).
    pub reason: String,
    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// What was actually deployed for one component.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppWrapperComponentStatus {
    /// Name is the name of the Component.
    pub name: String,
    /// Kind is the Kind of the Component.
    pub kind: String,
    /// APIVersion is the APIVersion of the Component.
    pub api_version: String,
    /// PodSets is the validated PodSets for the Component (either from
    /// AppWrapperComponent.DeclaredPodSets or inferred by the controller).
    #[serde(default, deserialize_with = "null_as_default")]
    pub pod_sets: Vec<AppWrapperPodSet>,
    /// Conditions hold the latest available observations of the Component's current state.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    #[schemars(schema_with = "crate::serde_helpers::conditions_schema")]
    pub conditions: Vec<Condition>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// The wrapped object: any Kubernetes object. The apiserver checks `apiVersion`, `kind` and
/// `metadata` (embedded resource) and keeps every other field (preserve-unknown-fields).
fn embedded_resource_schema(_: &mut SchemaGenerator) -> Schema {
    schemars::json_schema!({
        "description": "Template defines the Kubernetes resource for the Component",
        "type": "object",
        "x-kubernetes-embedded-resource": true,
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    #[test]
    fn transitions_keep_the_last_twenty() {
        let mut status = AppWrapperStatus::default();
        for i in 0..25 {
            let time = Time(Timestamp::from_second(i).unwrap());
            status.record_transition(time, AppWrapperPhase::Running, format!("R{i}"), None);
        }
        assert_eq!(status.transitions.len(), MAX_TRANSITIONS);
        assert_eq!(status.transitions[0].reason, "R5");
        assert_eq!(status.transitions[19].reason, "R24");
    }

    #[test]
    fn phases_serialise_to_their_wire_names() {
        for phase in AppWrapperPhase::ALL {
            assert_eq!(serde_json::to_value(phase).unwrap(), json!(phase.as_str()));
            assert_eq!(phase.to_string(), phase.as_str());
        }
        // the Empty phase and a zero retry count are omitted, as upstream's omitempty
        let status = AppWrapperStatus::default();
        assert_eq!(serde_json::to_value(&status).unwrap(), json!({}));
        let status: AppWrapperStatus =
            serde_json::from_value(json!({"phase": "", "resettingCount": 3})).unwrap();
        assert_eq!(status.phase, AppWrapperPhase::Empty);
        assert_eq!(status.retries, 3);
        assert!(serde_json::from_value::<AppWrapperStatus>(json!({"phase": "Bogus"})).is_err());
    }

    #[test]
    fn nulls_read_as_absent() {
        let spec: AppWrapperSpec = serde_json::from_value(json!({
            "components": [{"template": {"apiVersion": "v1", "kind": "Pod"},
                "podSets": null, "annotations": null}],
            "suspend": null}))
        .unwrap();
        assert!(spec.components[0].declared_pod_sets.is_empty());
        assert!(!spec.suspend);
    }
}
