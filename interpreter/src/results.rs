//! Typed inputs and results of the operations, with Karmada's JSON field names.
//!
//! Equality follows Kubernetes' semantic equality where Karmada's conformance tests use it:
//! quantities compare by value, absent and empty lists or maps are the same.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use lifeboat_api::quantity::Quantity;
use lifeboat_api::serde_helpers::null_as_default;

/// Health state as the failover policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HealthState {
    Healthy,
    Unhealthy,
    Unknown,
}

/// What kind of failure made a workload unhealthy (shared with the agent and the hub).
pub use lifeboat_api::health::FailureClass;

/// The result of InterpretHealth. A Karmada script returns a boolean (no reason, no class); a
/// Lifeboat script may return `{healthy = bool|nil, reason = "...", class = "..."}`, where a
/// missing `healthy` means Unknown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub state: HealthState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<FailureClass>,
}

impl Health {
    pub fn from_bool(healthy: bool) -> Health {
        Health {
            state: if healthy {
                HealthState::Healthy
            } else {
                HealthState::Unhealthy
            },
            reason: None,
            class: None,
        }
    }

    /// Karmada's boolean, when the state is not Unknown.
    pub fn healthy(&self) -> Option<bool> {
        match self.state {
            HealthState::Healthy => Some(true),
            HealthState::Unhealthy => Some(false),
            HealthState::Unknown => None,
        }
    }

    /// Reads a health table (already converted to JSON).
    pub fn from_table(table: &Value) -> Result<Health, String> {
        let map = table
            .as_object()
            .ok_or_else(|| "health table must have named fields".to_string())?;
        let state = match map.get("healthy") {
            None | Some(Value::Null) => HealthState::Unknown,
            Some(Value::Bool(true)) => HealthState::Healthy,
            Some(Value::Bool(false)) => HealthState::Unhealthy,
            Some(other) => {
                return Err(format!(
                    "health field 'healthy' must be a boolean or nil, got {other}"
                ));
            }
        };
        let reason = match map.get("reason") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                return Err(format!(
                    "health field 'reason' must be a string, got {other}"
                ));
            }
        };
        let class = match map.get("class") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(FailureClass::parse(s).ok_or_else(|| {
                format!(
                    "health field 'class' must be Application, Infrastructure, Capacity or Unknown, got {s:?}"
                )
            })?),
            Some(other) => return Err(format!("health field 'class' must be a string, got {other}")),
        };
        Ok(Health {
            state,
            reason,
            class,
        })
    }
}

/// A map of resource names to quantities, compared by value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResourceList(pub BTreeMap<String, Quantity>);

impl Serialize for ResourceList {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(k, v)| (k, v.canonical())))
    }
}

impl<'de> Deserialize<'de> for ResourceList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw: Option<BTreeMap<String, Value>> = Option::deserialize(deserializer)?;
        let mut out = BTreeMap::new();
        for (name, value) in raw.unwrap_or_default() {
            if value.is_null() {
                continue;
            }
            let quantity = Quantity::from_json(&value).map_err(serde::de::Error::custom)?;
            out.insert(name, quantity);
        }
        Ok(ResourceList(out))
    }
}

impl ResourceList {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Toleration {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub key: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub operator: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub value: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub effect: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toleration_seconds: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SelectorRequirement {
    #[serde(default, deserialize_with = "null_as_default")]
    pub key: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub operator: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorTerm {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub match_expressions: Vec<SelectorRequirement>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub match_fields: Vec<SelectorRequirement>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelector {
    #[serde(default, deserialize_with = "null_as_default")]
    pub node_selector_terms: Vec<NodeSelectorTerm>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaim {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard_node_affinity: Option<NodeSelector>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub node_selector: BTreeMap<String, String>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tolerations: Vec<Toleration>,
}

/// What one replica needs (`GetReplicas`' second result).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaRequirements {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_claim: Option<NodeClaim>,
    #[serde(default, skip_serializing_if = "ResourceList::is_empty")]
    pub resource_request: ResourceList,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub namespace: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub priority_class_name: String,
}

/// Replica count and per-replica requirements (InterpretReplica).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplicaInterpretation {
    pub replica: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requires: Option<ReplicaRequirements>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentReplicaRequirements {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_claim: Option<NodeClaim>,
    #[serde(default, skip_serializing_if = "ResourceList::is_empty")]
    pub resource_request: ResourceList,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub priority_class_name: String,
}

/// One pod template of a multi-template workload (InterpretComponent).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Component {
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_requirements: Option<ComponentReplicaRequirements>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub match_labels: BTreeMap<String, String>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub match_expressions: Vec<SelectorRequirement>,
}

impl LabelSelector {
    fn validate(&self) -> Result<(), String> {
        for req in &self.match_expressions {
            if req.key.is_empty() {
                return Err("label selector requirement has an empty key".to_string());
            }
            match req.operator.as_str() {
                "In" | "NotIn" if req.values.is_empty() => {
                    return Err(format!(
                        "label selector operator {} on {:?} needs values",
                        req.operator, req.key
                    ));
                }
                "Exists" | "DoesNotExist" if !req.values.is_empty() => {
                    return Err(format!(
                        "label selector operator {} on {:?} takes no values",
                        req.operator, req.key
                    ));
                }
                "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
                other => return Err(format!("label selector operator {other:?} is not valid")),
            }
        }
        Ok(())
    }
}

/// An object a workload depends on (InterpretDependency).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DependentObjectReference {
    #[serde(default, deserialize_with = "null_as_default")]
    pub api_version: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub kind: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub namespace: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
}

impl DependentObjectReference {
    /// Karmada's checks: apiVersion and kind, and a name or a valid label selector.
    pub fn validate(&self) -> Result<(), String> {
        if self.api_version.is_empty() || self.kind.is_empty() {
            return Err("dependency missing required apiVersion or kind".to_string());
        }
        match &self.label_selector {
            None if self.name.is_empty() => {
                Err("dependency can not leave name and labelSelector all empty".to_string())
            }
            Some(selector) => selector.validate(),
            None => Ok(()),
        }
    }

    fn sort_key(&self) -> (&str, &str, &str, &str) {
        (&self.api_version, &self.kind, &self.namespace, &self.name)
    }
}

/// Sorts references by apiVersion, kind, namespace, name (Karmada's order).
pub fn sort_dependencies(dependencies: &mut [DependentObjectReference]) {
    dependencies.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
}

/// Sorts components by name.
pub fn sort_components(components: &mut [Component]) {
    components.sort_by(|a, b| a.name.cmp(&b.name));
}

/// The status one member cluster reported (an item of `statusItems`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AggregatedStatusItem {
    #[serde(default, deserialize_with = "null_as_default")]
    pub cluster_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "is_false"
    )]
    pub applied: bool,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub applied_message: String,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub health: String,
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn health_tables_carry_reason_and_class() {
        let h = Health::from_table(
            &json!({"healthy": false, "reason": "node lost", "class": "Infrastructure"}),
        )
        .unwrap();
        assert_eq!(h.state, HealthState::Unhealthy);
        assert_eq!(h.class, Some(FailureClass::Infrastructure));
        assert_eq!(h.reason.as_deref(), Some("node lost"));
        assert_eq!(
            Health::from_table(&json!({"reason": "pending"}))
                .unwrap()
                .state,
            HealthState::Unknown
        );
        assert!(Health::from_table(&json!({"healthy": false, "class": "Cosmic"})).is_err());
        assert!(Health::from_table(&json!({"healthy": "yes"})).is_err());
    }

    #[test]
    fn requirements_compare_quantities_by_value() {
        let a: ReplicaRequirements = serde_json::from_value(
            json!({"resourceRequest": {"cpu": 1, "memory": "1Gi"}, "namespace": ""}),
        )
        .unwrap();
        let b: ReplicaRequirements = serde_json::from_value(
            json!({"resourceRequest": {"cpu": "1000m", "memory": "1024Mi"}}),
        )
        .unwrap();
        assert_eq!(a, b);
        let c: ReplicaRequirements =
            serde_json::from_value(json!({"resourceRequest": {"cpu": "2"}})).unwrap();
        assert_ne!(a, c);
    }

    #[test]
    fn dependencies_are_validated() {
        let ok: DependentObjectReference =
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret", "name": "s"}))
                .unwrap();
        assert!(ok.validate().is_ok());
        let no_name: DependentObjectReference =
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret"})).unwrap();
        assert!(no_name.validate().is_err());
        let bad_selector: DependentObjectReference = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "labelSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}
        }))
        .unwrap();
        assert!(bad_selector.validate().is_err());
    }
}
