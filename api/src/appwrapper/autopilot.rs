//! Autopilot integration (reference §3): the operator configuration, node anti-affinity
//! injection into pod templates that request a monitored resource, and the checks the node
//! monitor and the NoExecute migration use.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PodSpec, Taint};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::quantity::Quantity;

use super::path::json_type;

/// Taint effects as spelled in the configuration.
pub mod effects {
    /// Never schedule there, and move running pods away.
    pub const NO_EXECUTE: &str = "NoExecute";
    /// Never schedule there.
    pub const NO_SCHEDULE: &str = "NoSchedule";
    /// Avoid scheduling there.
    pub const PREFER_NO_SCHEDULE: &str = "PreferNoSchedule";
}

/// The label Autopilot puts on nodes to grade GPU health.
pub const GPU_HEALTH_LABEL: &str = "autopilot.ibm.com/gpuhealth";

/// Operator-level Autopilot configuration (`appwrapper.autopilot` in the operator config; same
/// JSON keys as upstream). Absent keys take upstream's defaults.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct AutopilotConfig {
    /// Inject node anti-affinities into pods that request a monitored resource.
    pub inject_anti_affinities: bool,
    /// Watch node labels and migrate running pods off NoExecute nodes.
    pub monitor_nodes: bool,
    /// Resource name → node labels (in taint shape) that mark that resource unhealthy. The
    /// effect says what to do: NoExecute (avoid and migrate), NoSchedule (avoid),
    /// PreferNoSchedule (prefer to avoid).
    pub resource_taints: BTreeMap<String, Vec<Taint>>,
    /// Weight of the injected preferred term; upstream uses 1 when unset.
    pub prefer_no_schedule_weight: Option<i32>,
}

impl Default for AutopilotConfig {
    /// Upstream's defaults: `nvidia.com/gpu` → `autopilot.ibm.com/gpuhealth` WARN
    /// PreferNoSchedule, TESTING NoSchedule, EVICT NoExecute; inject and monitor; weight 50.
    fn default() -> Self {
        let taint = |value: &str, effect: &str| Taint {
            key: GPU_HEALTH_LABEL.to_string(),
            value: Some(value.to_string()),
            effect: effect.to_string(),
            time_added: None,
        };
        AutopilotConfig {
            inject_anti_affinities: true,
            monitor_nodes: true,
            resource_taints: BTreeMap::from([(
                "nvidia.com/gpu".to_string(),
                vec![
                    taint("WARN", effects::PREFER_NO_SCHEDULE),
                    taint("TESTING", effects::NO_SCHEDULE),
                    taint("EVICT", effects::NO_EXECUTE),
                ],
            )]),
            prefer_no_schedule_weight: Some(50),
        }
    }
}

/// Why anti-affinities could not be injected (upstream only logs these; so should the caller).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot inject Autopilot anti-affinity: `{field}` is {found}, not {expected}")]
pub struct AffinityError {
    /// Field path, starting at the pod template's `spec`.
    pub field: String,
    /// What was found there.
    pub found: &'static str,
    /// What was expected.
    pub expected: &'static str,
}

/// Adds Autopilot node anti-affinities to a pod spec (JSON) that requests, in any container or
/// init container, a non-zero amount of a resource listed in `resource_taints` (reference §3.3):
/// - NoExecute and NoSchedule labels, grouped by key, become `key NotIn [values]` appended to
///   every existing required nodeSelectorTerm (one term is created if there is none; terms are
///   ORed, so each must exclude the unhealthy nodes);
/// - PreferNoSchedule labels become one preferred term with `prefer_no_schedule_weight`.
///
/// Keys are emitted in sorted order and values in configuration order, without duplicates.
/// Pods that request none of the resources are left untouched. Returns whether it changed
/// anything.
pub fn inject_anti_affinities(
    pod_spec: &mut Value,
    config: &AutopilotConfig,
) -> Result<bool, AffinityError> {
    if !config.inject_anti_affinities {
        return Ok(false);
    }
    let mut required: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut preferred: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (resource, taints) in &config.resource_taints {
        if !requests_resource(pod_spec, resource, true) {
            continue;
        }
        for taint in taints {
            let target = match taint.effect.as_str() {
                effects::NO_EXECUTE | effects::NO_SCHEDULE => &mut required,
                effects::PREFER_NO_SCHEDULE => &mut preferred,
                _ => continue,
            };
            let values = target.entry(taint.key.as_str()).or_default();
            let value = taint.value.as_deref().unwrap_or("");
            if !values.contains(&value) {
                values.push(value);
            }
        }
    }
    if required.is_empty() && preferred.is_empty() {
        return Ok(false);
    }
    let node_affinity = object_at(pod_spec, &["affinity", "nodeAffinity"])?;
    if !required.is_empty() {
        let expressions = not_in(&required);
        let selector = child_object(
            node_affinity,
            "requiredDuringSchedulingIgnoredDuringExecution",
            "spec.affinity.nodeAffinity",
        )?;
        let terms = child_array(
            selector,
            "nodeSelectorTerms",
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
        )?;
        if terms.is_empty() {
            terms.push(json!({}));
        }
        for (i, term) in terms.iter_mut().enumerate() {
            let field = format!(
                "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.\
                 nodeSelectorTerms[{i}]"
            );
            let Value::Object(term) = term else {
                return Err(AffinityError {
                    field,
                    found: json_type(term),
                    expected: "a map",
                });
            };
            child_array(term, "matchExpressions", &field)?.extend(expressions.iter().cloned());
        }
    }
    if !preferred.is_empty() {
        let weight = config.prefer_no_schedule_weight.unwrap_or(1);
        let terms = child_array(
            node_affinity,
            "preferredDuringSchedulingIgnoredDuringExecution",
            "spec.affinity.nodeAffinity",
        )?;
        terms.push(json!({
            "weight": weight,
            "preference": {"matchExpressions": not_in(&preferred)},
        }));
    }
    Ok(true)
}

fn not_in(groups: &BTreeMap<&str, Vec<&str>>) -> Vec<Value> {
    groups
        .iter()
        .map(|(key, values)| json!({"key": key, "operator": "NotIn", "values": values}))
        .collect()
}

/// `pod_spec.a.b…` as an object, creating missing (or null) levels.
fn object_at<'v>(
    pod_spec: &'v mut Value,
    keys: &[&str],
) -> Result<&'v mut Map<String, Value>, AffinityError> {
    let found = json_type(pod_spec);
    let mut cursor = match pod_spec {
        Value::Object(map) => map,
        _ => {
            return Err(AffinityError {
                field: "spec".into(),
                found,
                expected: "a map",
            });
        }
    };
    let mut field = String::from("spec");
    for key in keys {
        cursor = child_object(cursor, key, &field)?;
        field.push('.');
        field.push_str(key);
    }
    Ok(cursor)
}

fn child_object<'v>(
    parent: &'v mut Map<String, Value>,
    key: &str,
    parent_field: &str,
) -> Result<&'v mut Map<String, Value>, AffinityError> {
    let slot = parent.entry(key.to_string()).or_insert(Value::Null);
    if slot.is_null() {
        *slot = Value::Object(Map::new());
    }
    match slot {
        Value::Object(map) => Ok(map),
        other => Err(AffinityError {
            field: format!("{parent_field}.{key}"),
            found: json_type(other),
            expected: "a map",
        }),
    }
}

fn child_array<'v>(
    parent: &'v mut Map<String, Value>,
    key: &str,
    parent_field: &str,
) -> Result<&'v mut Vec<Value>, AffinityError> {
    let slot = parent.entry(key.to_string()).or_insert(Value::Null);
    if slot.is_null() {
        *slot = Value::Array(Vec::new());
    }
    match slot {
        Value::Array(items) => Ok(items),
        other => Err(AffinityError {
            field: format!("{parent_field}.{key}"),
            found: json_type(other),
            expected: "an array",
        }),
    }
}

/// True when a container (or, with `include_init_containers`, an init container) of a pod spec
/// (JSON) has a non-zero limit or request for `resource`. Values may be integers or quantity
/// strings; unparseable values count as no request, as upstream.
pub fn requests_resource(pod_spec: &Value, resource: &str, include_init_containers: bool) -> bool {
    let lists: &[&str] = if include_init_containers {
        &["containers", "initContainers"]
    } else {
        &["containers"]
    };
    lists.iter().any(|list| {
        pod_spec
            .get(list)
            .and_then(Value::as_array)
            .is_some_and(|containers| {
                containers.iter().any(|container| {
                    ["limits", "requests"].iter().any(|kind| {
                        container
                            .get("resources")
                            .and_then(|r| r.get(kind))
                            .and_then(|l| l.get(resource))
                            .and_then(|q| Quantity::from_json(q).ok())
                            .is_some_and(|q| !q.is_zero())
                    })
                })
            })
    })
}

/// Typed form of [`requests_resource`] over regular containers only: the NoExecute migration
/// check looks at what running containers use, not at init containers (reference §3.4).
pub fn pod_uses_resource(pod_spec: &PodSpec, resource: &str) -> bool {
    pod_spec.containers.iter().any(|container| {
        container.resources.as_ref().is_some_and(|r| {
            [&r.limits, &r.requests].into_iter().any(|list| {
                list.as_ref()
                    .and_then(|l| l.get(resource))
                    .and_then(|q| Quantity::parse(&q.0).ok())
                    .is_some_and(|q| !q.is_zero())
            })
        })
    })
}

/// The monitored resources a node's labels flag NoExecute: a label whose key and value equal
/// one of the resource's NoExecute entries (Autopilot uses labels, not real taints).
pub fn no_execute_resources(
    node_labels: &BTreeMap<String, String>,
    config: &AutopilotConfig,
) -> BTreeSet<String> {
    config
        .resource_taints
        .iter()
        .filter(|(_, taints)| {
            taints.iter().any(|t| {
                t.effect == effects::NO_EXECUTE
                    && node_labels.get(&t.key).map(String::as_str)
                        == Some(t.value.as_deref().unwrap_or(""))
            })
        })
        .map(|(resource, _)| resource.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu_pod_spec(gpus: Value) -> Value {
        json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": 1}, "limits": {"nvidia.com/gpu": gpus}}}]})
    }

    #[test]
    fn defaults_match_upstream() {
        let cfg = AutopilotConfig::default();
        assert!(cfg.inject_anti_affinities && cfg.monitor_nodes);
        assert_eq!(cfg.prefer_no_schedule_weight, Some(50));
        let gpu = &cfg.resource_taints["nvidia.com/gpu"];
        let triples: Vec<_> = gpu
            .iter()
            .map(|t| (t.key.as_str(), t.value.as_deref(), t.effect.as_str()))
            .collect();
        assert_eq!(
            triples,
            vec![
                (GPU_HEALTH_LABEL, Some("WARN"), "PreferNoSchedule"),
                (GPU_HEALTH_LABEL, Some("TESTING"), "NoSchedule"),
                (GPU_HEALTH_LABEL, Some("EVICT"), "NoExecute"),
            ]
        );
        // partial configuration keeps the other defaults
        let partial: AutopilotConfig =
            serde_json::from_value(json!({"monitorNodes": false})).unwrap();
        assert!(!partial.monitor_nodes);
        assert_eq!(partial.resource_taints, cfg.resource_taints);
    }

    #[test]
    fn default_config_on_a_gpu_pod() {
        let mut spec = gpu_pod_spec(json!("4"));
        assert!(inject_anti_affinities(&mut spec, &AutopilotConfig::default()).unwrap());
        assert_eq!(
            spec["affinity"],
            json!({"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": GPU_HEALTH_LABEL, "operator": "NotIn",
                        "values": ["TESTING", "EVICT"]}]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 50, "preference": {"matchExpressions": [
                        {"key": GPU_HEALTH_LABEL, "operator": "NotIn", "values": ["WARN"]}]}}]
            }})
        );
    }

    #[test]
    fn zero_or_absent_requests_are_untouched() {
        for spec in [
            gpu_pod_spec(json!(0)),
            gpu_pod_spec(json!("0")),
            gpu_pod_spec(json!("garbage")),
            json!({"containers": [{"name": "c"}]}),
        ] {
            let mut injected = spec.clone();
            assert!(!inject_anti_affinities(&mut injected, &AutopilotConfig::default()).unwrap());
            assert_eq!(injected, spec);
        }
        let disabled = AutopilotConfig {
            inject_anti_affinities: false,
            ..Default::default()
        };
        let mut spec = gpu_pod_spec(json!(1));
        assert!(!inject_anti_affinities(&mut spec, &disabled).unwrap());
        assert!(spec.get("affinity").is_none());
    }

    #[test]
    fn init_containers_count_for_injection_but_not_for_migration() {
        let spec = json!({"containers": [{"name": "c"}], "initContainers": [
            {"name": "i", "resources": {"requests": {"nvidia.com/gpu": 1}}}]});
        assert!(requests_resource(&spec, "nvidia.com/gpu", true));
        assert!(!requests_resource(&spec, "nvidia.com/gpu", false));
        let typed: PodSpec = serde_json::from_value(spec).unwrap();
        assert!(!pod_uses_resource(&typed, "nvidia.com/gpu"));
        let typed: PodSpec = serde_json::from_value(gpu_pod_spec(json!(2))).unwrap();
        assert!(pod_uses_resource(&typed, "nvidia.com/gpu"));
        assert!(!pod_uses_resource(&typed, "example.com/fpga"));
    }

    #[test]
    fn malformed_affinity_is_an_error_not_a_panic() {
        let mut spec = gpu_pod_spec(json!(1));
        spec["affinity"] = json!({"nodeAffinity": "yes"});
        let err = inject_anti_affinities(&mut spec, &AutopilotConfig::default()).unwrap_err();
        assert_eq!(err.field, "spec.affinity.nodeAffinity");
        let mut spec = gpu_pod_spec(json!(1));
        spec["affinity"] = json!([]);
        let err = inject_anti_affinities(&mut spec, &AutopilotConfig::default()).unwrap_err();
        assert_eq!(err.field, "spec.affinity");
    }

    #[test]
    fn node_labels_flag_no_execute_resources() {
        let cfg = AutopilotConfig::default();
        let labels = |v: &str| BTreeMap::from([(GPU_HEALTH_LABEL.to_string(), v.to_string())]);
        assert_eq!(
            no_execute_resources(&labels("EVICT"), &cfg),
            BTreeSet::from(["nvidia.com/gpu".to_string()])
        );
        assert!(no_execute_resources(&labels("WARN"), &cfg).is_empty());
        assert!(no_execute_resources(&labels("TESTING"), &cfg).is_empty());
        assert!(no_execute_resources(&BTreeMap::new(), &cfg).is_empty());
    }
}
