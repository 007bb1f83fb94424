//! `spec.resources.GenericItems` → `spec.components`: each `generictemplate` becomes a component
//! template without MCAD's placeholder labels; its podSets come from `podsets`.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::podsets::{compare_custom_pod_resources, declare_pod_sets, parse_custom_pod_resources};
use super::{FieldProblem, PLACEHOLDER_LABEL, PLACEHOLDER_NAMESPACE_LABEL, Warning};
use crate::appwrapper::AppWrapperComponent;
use crate::appwrapper::podsets::{GroupVersionKind, infer_pod_sets};

/// The components, one per GenericItem; problems make the document unconvertible.
pub(super) fn convert_resources(
    resources: &Value,
    warnings: &mut Vec<Warning>,
    problems: &mut Vec<FieldProblem>,
) -> Vec<AppWrapperComponent> {
    let Value::Object(resources) = resources else {
        problems.push(FieldProblem {
            field: "spec.resources".into(),
            reason: "not a map".into(),
        });
        return Vec::new();
    };
    for (key, value) in resources {
        match key.as_str() {
            "GenericItems" => {}
            "Items" if value.as_array().is_none_or(Vec::is_empty) => {}
            "Items" => problems.push(FieldProblem {
                field: "spec.resources.Items".into(),
                reason: "MCAD v1's deprecated Items list cannot be converted: move each template \
                         to GenericItems[].generictemplate"
                    .into(),
            }),
            other => warnings.push(Warning {
                field: format!("spec.resources.{other}"),
                reason: "dropped: unknown legacy field with no v1beta2 equivalent".into(),
            }),
        }
    }
    let items = match resources.get("GenericItems") {
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(Value::Array(_)) | None | Some(Value::Null) => {
            problems.push(FieldProblem {
                field: "spec.resources.GenericItems".into(),
                reason: "empty: a v1beta2 AppWrapper must wrap 1 to 8 pod specs".into(),
            });
            return Vec::new();
        }
        Some(_) => {
            problems.push(FieldProblem {
                field: "spec.resources.GenericItems".into(),
                reason: "not a list".into(),
            });
            return Vec::new();
        }
    };
    let mut components = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let field = format!("spec.resources.GenericItems[{i}]");
        match convert_item(item, &field, warnings) {
            Ok(component) => components.push(component),
            Err(problem) => problems.push(problem),
        }
    }
    components
}

/// One GenericItem: its template (placeholder labels stripped) and podSets.
fn convert_item(
    item: &Value,
    field: &str,
    warnings: &mut Vec<Warning>,
) -> Result<AppWrapperComponent, FieldProblem> {
    let problem = |f: String, reason: String| FieldProblem { field: f, reason };
    let Value::Object(item) = item else {
        return Err(problem(field.to_string(), "not a map".into()));
    };
    let template_field = format!("{field}.generictemplate");
    let mut template = match item.get("generictemplate") {
        Some(Value::Object(t)) if !t.is_empty() => Value::Object(t.clone()),
        Some(Value::Object(_)) | None | Some(Value::Null) => {
            return Err(problem(template_field, "missing or empty".into()));
        }
        Some(Value::String(s)) if s.is_empty() => {
            return Err(problem(template_field, "empty".into()));
        }
        Some(_) => {
            return Err(problem(
                template_field,
                "not a Kubernetes object (map)".into(),
            ));
        }
    };
    let Some(gvk) = GroupVersionKind::of(&template) else {
        return Err(problem(
            template_field,
            "the wrapped object needs a non-empty `apiVersion` and `kind`".into(),
        ));
    };
    strip_placeholder_labels(&mut template, &template_field, warnings);

    let mut custom = Vec::new();
    for (key, value) in item {
        let here = format!("{field}.{key}");
        match key.as_str() {
            "generictemplate" => {}
            "custompodresources" => custom = parse_custom_pod_resources(value, &here)?,
            "completionstatus" => warnings.push(Warning {
                field: here,
                reason: format!(
                    "dropped: v1beta2 decides completion from the pods (all Succeeded) and, for \
                     batch/v1 Job and PyTorchJob, the Failed condition; MCAD's keyword match \
                     `{}` has no equivalent",
                    value.as_str().unwrap_or_default()
                ),
            }),
            "replicas" | "minavailable" | "allocated" | "priority" | "priorityslope" => warnings
                .push(Warning {
                    field: here,
                    reason: "dropped: accepted but never implemented by MCAD".into(),
                }),
            _ => warnings.push(Warning {
                field: here,
                reason: "dropped: unknown legacy field with no v1beta2 equivalent".into(),
            }),
        }
    }

    let inferred = infer_pod_sets(&template);
    let declared = if inferred.is_empty() {
        declare_pod_sets(&template, &gvk, &custom, field, warnings)
    } else {
        Vec::new()
    };
    let component = AppWrapperComponent {
        annotations: BTreeMap::new(),
        declared_pod_sets: declared,
        pod_set_infos: Vec::new(),
        template,
    };
    compare_custom_pod_resources(&component, &custom, field, warnings);
    Ok(component)
}

/// Removes MCAD's placeholder labels from every `labels` map; warns when a selector still
/// matches on them (v1beta2 pods do not carry them, so such a selector would match nothing).
fn strip_placeholder_labels(value: &mut Value, path: &str, warnings: &mut Vec<Warning>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                let here = format!("{path}.{key}");
                if let Value::Object(inner) = child {
                    if key == "labels" {
                        inner.remove(PLACEHOLDER_LABEL);
                        inner.remove(PLACEHOLDER_NAMESPACE_LABEL);
                    } else if key == "matchLabels"
                        && (inner.contains_key(PLACEHOLDER_LABEL)
                            || inner.contains_key(PLACEHOLDER_NAMESPACE_LABEL))
                    {
                        warnings.push(Warning {
                            field: here.clone(),
                            reason: format!(
                                "selects on MCAD's `{PLACEHOLDER_LABEL}` label, which v1beta2 \
                                 pods do not carry: edit the selector and its pod template"
                            ),
                        });
                    }
                }
                strip_placeholder_labels(child, &here, warnings);
            }
            // Leave no `labels: {}` behind where the placeholder was the only label.
            if map
                .get("labels")
                .is_some_and(|l| l.as_object().is_some_and(Map::is_empty))
            {
                map.remove("labels");
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter_mut().enumerate() {
                strip_placeholder_labels(child, &format!("{path}[{i}]"), warnings);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use crate::legacy::convert;
    use crate::legacy::test_support::*;
    use serde_json::json;

    #[test]
    fn selectors_on_the_placeholder_are_warned() {
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d"}, "spec": {"replicas": 1,
                "selector": {"matchLabels": {"appwrapper.mcad.ibm.com": "placeholder", "app": "d"}},
                "template": {"metadata": {"labels": {"appwrapper.mcad.ibm.com": "placeholder",
                    "app": "d"}}, "spec": {"containers": [{"name": "c"}]}}}});
        let out = convert(&legacy(json!({"resources": {"GenericItems": [
            {"generictemplate": deployment}]}})))
        .unwrap();
        assert!(warned(
            &out,
            "spec.resources.GenericItems[0].generictemplate.spec.selector.matchLabels"
        ));
        let t = &out.appwrapper.spec.components[0].template;
        assert_eq!(
            t["spec"]["template"]["metadata"]["labels"],
            json!({"app": "d"})
        );
    }
}
