//! `custompodresources` → podSets: declared for kinds v1beta2 cannot infer, compared with the
//! template (pod count and per-pod requests) for the kinds it infers.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{FieldProblem, Warning};
use crate::appwrapper::podsets::{GroupVersionKind, effective_pod_sets};
use crate::appwrapper::{AppWrapperComponent, AppWrapperPodSet};
use crate::quantity::Quantity;

/// One `custompodresources` entry.
pub(super) struct CustomPodResources {
    replicas: i64,
    requests: BTreeMap<String, Value>,
}

/// The `custompodresources` list of one GenericItem.
pub(super) fn parse_custom_pod_resources(
    value: &Value,
    field: &str,
) -> Result<Vec<CustomPodResources>, FieldProblem> {
    let problem = |f: String, reason: &str| FieldProblem {
        field: f,
        reason: reason.to_string(),
    };
    let items = match value {
        Value::Null => return Ok(Vec::new()),
        Value::Array(items) => items,
        _ => return Err(problem(field.to_string(), "not a list")),
    };
    items
        .iter()
        .enumerate()
        .map(|(j, entry)| {
            let here = format!("{field}[{j}]");
            let Value::Object(entry) = entry else {
                return Err(problem(here, "not a map"));
            };
            let replicas = match entry.get("replicas") {
                Some(v) => v
                    .as_i64()
                    .ok_or_else(|| problem(format!("{here}.replicas"), "not an integer"))?,
                None => return Err(problem(format!("{here}.replicas"), "missing (required)")),
            };
            let requests = match entry.get("requests") {
                Some(Value::Object(r)) => r.clone().into_iter().collect(),
                None | Some(Value::Null) => BTreeMap::new(),
                Some(_) => return Err(problem(format!("{here}.requests"), "not a map")),
            };
            Ok(CustomPodResources { replicas, requests })
        })
        .collect()
}

/// Pod templates of a kind v1beta2 cannot infer, found as MCAD found them: maps whose
/// `spec.containers` is a list. Paths use the podSet grammar; keys that cannot be written in it
/// (containing `.` or `[`) are skipped.
fn find_pod_templates(value: &Value, path: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if map
                .get("spec")
                .and_then(|s| s.get("containers"))
                .is_some_and(Value::is_array)
            {
                out.push(path.to_string());
                return;
            }
            for (key, child) in map {
                // The wrapped object's own metadata and status hold no pod templates.
                if path == "template" && (key == "metadata" || key == "status") {
                    continue;
                }
                if key.is_empty() || key.contains(['.', '[', ']']) {
                    continue;
                }
                find_pod_templates(child, &format!("{path}.{key}"), out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                find_pod_templates(child, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// PodSets for a kind v1beta2 cannot infer, with replicas from the custompodresources.
pub(super) fn declare_pod_sets(
    template: &Value,
    gvk: &GroupVersionKind,
    custom: &[CustomPodResources],
    field: &str,
    warnings: &mut Vec<Warning>,
) -> Vec<AppWrapperPodSet> {
    let mut paths = Vec::new();
    find_pod_templates(template, "template", &mut paths);
    if paths.is_empty() {
        if !custom.is_empty() {
            warnings.push(Warning {
                field: format!("{field}.custompodresources"),
                reason: format!(
                    "dropped: no pod template found in the {gvk}, so no podSet can be declared \
                     and v1beta2 will not count its pods"
                ),
            });
        }
        return Vec::new();
    }
    let to_i32 = |n: i64| i32::try_from(n.max(0)).unwrap_or(i32::MAX);
    let replicas: Vec<i32> = if custom.len() == paths.len() {
        custom.iter().map(|c| to_i32(c.replicas)).collect()
    } else if paths.len() == 1 && !custom.is_empty() {
        vec![to_i32(custom.iter().map(|c| c.replicas).sum())]
    } else {
        warnings.push(Warning {
            field: format!("{field}.custompodresources"),
            reason: format!(
                "{} entries for {} pod templates in the {gvk} ({}): declared each podSet with 1 \
                 replica; check spec.components[].podSets[].replicas",
                custom.len(),
                paths.len(),
                paths.join(", ")
            ),
        });
        vec![1; paths.len()]
    };
    paths
        .into_iter()
        .zip(replicas)
        .map(|(path, replicas)| AppWrapperPodSet {
            replicas: Some(replicas),
            path,
            annotations: BTreeMap::new(),
        })
        .collect()
}

/// Warns when `custompodresources` (what MCAD dispatched by) disagree with the template (what
/// v1beta2 and Kueue use): the pod count, and the per-pod requests when entries pair up with
/// podSets one to one.
pub(super) fn compare_custom_pod_resources(
    component: &AppWrapperComponent,
    custom: &[CustomPodResources],
    field: &str,
    warnings: &mut Vec<Warning>,
) {
    if custom.is_empty() {
        return;
    }
    let field = format!("{field}.custompodresources");
    let pod_sets = effective_pod_sets(component);
    let template_pods: i64 = pod_sets
        .iter()
        .map(|p| i64::from(p.replicas_or_default().max(0)))
        .sum();
    let custom_pods: i64 = custom.iter().map(|c| c.replicas).sum();
    if !pod_sets.is_empty() && template_pods != custom_pods {
        warnings.push(Warning {
            field: field.clone(),
            reason: format!(
                "declare {custom_pods} pods in total but the template yields {template_pods}; v1beta2 \
                 expects and counts {template_pods}"
            ),
        });
    }
    if custom.len() != pod_sets.len() {
        if !pod_sets.is_empty() {
            warnings.push(Warning {
                field: field.clone(),
                reason: format!(
                    "{} entries for {} podSets: requests not compared with the template",
                    custom.len(),
                    pod_sets.len()
                ),
            });
        }
        return;
    }
    for (j, (entry, pod_set)) in custom.iter().zip(&pod_sets).enumerate() {
        let Ok(spec) = crate::appwrapper::path::get(&component.template, &pod_set.path)
            .map(|t| t.get("spec").cloned().unwrap_or(Value::Null))
        else {
            continue;
        };
        for (resource, quantity) in &entry.requests {
            let wanted = Quantity::from_json(quantity);
            let have = container_requests(&spec, resource);
            let same = match (&wanted, &have) {
                (Ok(w), Some(h)) => w == h,
                (Ok(w), None) => w.is_zero(),
                (Err(_), _) => false,
            };
            if !same {
                let have_text = have.map_or_else(
                    || "nothing".to_string(),
                    |_| describe_requests(&spec, resource),
                );
                warnings.push(Warning {
                    field: format!("{field}[{j}].requests[{resource}]"),
                    reason: format!(
                        "{quantity} per pod does not match the template, whose containers \
                         request {have_text}; MCAD dispatched by custompodresources, v1beta2 and \
                         Kueue use the template"
                    ),
                });
            }
        }
    }
}

/// Sum of the regular containers' requests for `resource` (None when no container requests it
/// or a value does not parse).
fn container_requests(pod_spec: &Value, resource: &str) -> Option<Quantity> {
    let containers = pod_spec.get("containers")?.as_array()?;
    let mut total: Option<Quantity> = None;
    for container in containers {
        if let Some(q) = container
            .pointer("/resources/requests")
            .and_then(|r| r.get(resource))
        {
            let q = Quantity::from_json(q).ok()?;
            total = Some(total.unwrap_or(Quantity::ZERO).saturating_add(q));
        }
    }
    total
}

fn describe_requests(pod_spec: &Value, resource: &str) -> String {
    let values: Vec<String> = pod_spec
        .get("containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| {
            c.pointer("/resources/requests")
                .and_then(|r| r.get(resource))
        })
        .map(|v| v.as_str().map_or_else(|| v.to_string(), String::from))
        .collect();
    values.join(" + ")
}

#[cfg(test)]
mod tests {
    use crate::legacy::convert;
    use crate::legacy::test_support::*;
    use serde_json::json;

    #[test]
    fn unknown_kinds_get_declared_podsets() {
        let lws = json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "l"}, "spec": {"replicas": 2, "leaderWorkerTemplate": {
                "leaderTemplate": {"metadata": {"labels": {"appwrapper.mcad.ibm.com": "x"}},
                    "spec": {"containers": [{"name": "l", "resources": {"requests": {"cpu": 1}}}]}},
                "workerTemplate": {"spec": {"containers": [{"name": "w",
                    "resources": {"requests": {"cpu": 2}}}]}}}}});
        let out = convert(&legacy(json!({"resources": {"GenericItems": [{
            "generictemplate": lws,
            "custompodresources": [
                {"replicas": 2, "requests": {"cpu": 1}},
                {"replicas": 4, "requests": {"cpu": "2000m"}}]}]}})))
        .unwrap();
        let pod_sets = &out.appwrapper.spec.components[0].declared_pod_sets;
        let got: Vec<_> = pod_sets
            .iter()
            .map(|p| (p.path.as_str(), p.replicas))
            .collect();
        assert_eq!(
            got,
            vec![
                ("template.spec.leaderWorkerTemplate.leaderTemplate", Some(2)),
                ("template.spec.leaderWorkerTemplate.workerTemplate", Some(4)),
            ]
        );
        assert!(out.warnings.is_empty(), "{:?}", out.warnings);
        let leader = &out.appwrapper.spec.components[0].template["spec"]["leaderWorkerTemplate"]["leaderTemplate"];
        assert!(leader["metadata"].get("labels").is_none());
    }

    #[test]
    fn custom_pod_resources_that_disagree_are_warned() {
        let out = convert(&legacy(json!({"resources": {"GenericItems": [{
            "generictemplate": pod("p"),
            "custompodresources": [{"replicas": 3, "requests": {"cpu": "500m",
                "nvidia.com/gpu": 8}}]}]}})))
        .unwrap();
        let fields: Vec<_> = out.warnings.iter().map(|w| w.field.as_str()).collect();
        assert_eq!(
            fields,
            vec![
                "spec.resources.GenericItems[0].custompodresources",
                "spec.resources.GenericItems[0].custompodresources[0].requests[nvidia.com/gpu]",
            ]
        );
        // podSets are inferred for a Pod, not declared
        assert!(
            out.appwrapper.spec.components[0]
                .declared_pod_sets
                .is_empty()
        );
    }
}
