//! `config.lifeboat.dev/v1alpha1` ResourceInterpreterCustomization as a CRD on the hub: Lua
//! scripts that tell the hub how to read replicas, health and status of a kind. Karmada's schema
//! (`config.karmada.io/v1alpha1`), so Karmada customizations apply with only the group changed.
//! The hub watches them and applies changes without a restart; `lifeboat-interpreter` runs them.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "config.lifeboat.dev";
pub const VERSION: &str = "v1alpha1";

/// Lua customizations for one kind.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "config.lifeboat.dev",
    version = "v1alpha1",
    kind = "ResourceInterpreterCustomization",
    plural = "resourceinterpretercustomizations",
    singular = "resourceinterpretercustomization",
    shortname = "ric",
    derive = "PartialEq",
    doc = "ResourceInterpreterCustomization describes the configuration of a specific resource for the hub to get the structure (replicas, health, status) of that kind, as Lua scripts.",
    printcolumn(
        name = "Target-API-Version",
        type_ = "string",
        json_path = ".spec.target.apiVersion"
    ),
    printcolumn(
        name = "Target-Kind",
        type_ = "string",
        json_path = ".spec.target.kind"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ResourceInterpreterCustomizationSpec {
    /// CustomizationTarget represents the resource type that the customization applies to.
    pub target: CustomizationTarget,
    /// Customizations describe the interpretation rules.
    #[serde(default)]
    pub customizations: CustomizationRules,
}

/// The kind a customization is for.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomizationTarget {
    /// APIVersion represents the API version of the target resource.
    #[schemars(length(min = 1))]
    pub api_version: String,
    /// Kind represents the Kind of target resources.
    #[schemars(length(min = 1))]
    pub kind: String,
}

/// A Lua script holding a function of the operation's name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LuaScriptRule {
    /// LuaScript holds the Lua script that is used to interpret the resource.
    #[schemars(length(min = 1, max = 262144))]
    pub lua_script: String,
}

/// The rules, one per operation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomizationRules {
    /// Retain: `function Retain(desiredObj, observedObj)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<LuaScriptRule>,
    /// InterpretReplica: `function GetReplicas(desiredObj)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_resource: Option<LuaScriptRule>,
    /// InterpretComponent: `function GetComponents(desiredObj)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component_resource: Option<LuaScriptRule>,
    /// ReviseReplica: `function ReviseReplica(desiredObj, desiredReplica)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_revision: Option<LuaScriptRule>,
    /// InterpretStatus: `function ReflectStatus(observedObj)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_reflection: Option<LuaScriptRule>,
    /// AggregateStatus: `function AggregateStatus(desiredObj, statusItems)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_aggregation: Option<LuaScriptRule>,
    /// InterpretHealth: `function InterpretHealth(observedObj)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_interpretation: Option<LuaScriptRule>,
    /// InterpretDependency: `function GetDependencies(desiredObj)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependency_interpretation: Option<LuaScriptRule>,
}
