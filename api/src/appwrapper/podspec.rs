//! "Does this path name a PodTemplateSpec?" (reference §4.2 step 5): the value at the path must
//! be a map whose `spec` parses strictly as a core/v1 PodSpec.
//!
//! Strictness: k8s-openapi's deserialisers silently ignore unknown fields, so after parsing we
//! serialise the PodSpec back and compare the two JSON trees: a key present (and non-null) in the
//! input but absent from the round trip is a field k8s-openapi does not know, i.e. an unknown
//! field (typo or a field newer than v1.36). Like upstream's Go parse, missing required fields
//! (no `containers`, a container without `name`) are not parse errors: the apiserver rejects such
//! objects when the controller creates them.

use k8s_openapi::api::core::v1::PodSpec;
use serde_json::Value;

use super::path::{self, PathError, json_type};

/// Why a path does not name a PodTemplateSpec.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PodTemplateError {
    #[error(transparent)]
    Path(#[from] PathError),
    #[error("`{path}` is {found}, not a PodTemplateSpec map")]
    NotAMap { path: String, found: &'static str },
    #[error("`{path}` has no `spec`: not a PodTemplateSpec")]
    MissingSpec { path: String },
    #[error("`{path}.metadata` is {found}, not a map")]
    MetadataNotAMap { path: String, found: &'static str },
    #[error("`{path}.spec` does not parse as a v1.PodSpec: {reason}")]
    InvalidPodSpec { path: String, reason: String },
    #[error("`{path}.spec` does not parse as a v1.PodSpec: unknown field `{field}`")]
    UnknownField { path: String, field: String },
}

/// Checks that `path` names a PodTemplateSpec inside `template` and returns its parsed PodSpec.
pub fn pod_spec_at(template: &Value, path: &str) -> Result<PodSpec, PodTemplateError> {
    let value = path::get(template, path)?;
    let Value::Object(map) = value else {
        return Err(PodTemplateError::NotAMap {
            path: path.to_string(),
            found: json_type(value),
        });
    };
    if let Some(metadata) = map.get("metadata")
        && !metadata.is_object()
        && !metadata.is_null()
    {
        return Err(PodTemplateError::MetadataNotAMap {
            path: path.to_string(),
            found: json_type(metadata),
        });
    }
    let Some(spec) = map.get("spec") else {
        return Err(PodTemplateError::MissingSpec {
            path: path.to_string(),
        });
    };
    parse_pod_spec_strict(spec).map_err(|err| match err {
        StrictError::Parse(reason) => PodTemplateError::InvalidPodSpec {
            path: path.to_string(),
            reason,
        },
        StrictError::Unknown(field) => PodTemplateError::UnknownField {
            path: path.to_string(),
            field,
        },
    })
}

enum StrictError {
    Parse(String),
    Unknown(String),
}

fn parse_pod_spec_strict(spec: &Value) -> Result<PodSpec, StrictError> {
    if !spec.is_object() {
        return Err(StrictError::Parse(format!(
            "it is {}, not a map",
            json_type(spec)
        )));
    }
    let parsed: PodSpec =
        serde_json::from_value(spec.clone()).map_err(|e| StrictError::Parse(e.to_string()))?;
    let round_trip =
        serde_json::to_value(&parsed).map_err(|e| StrictError::Parse(e.to_string()))?;
    if let Some(field) = first_unknown_field(spec, &round_trip, String::new()) {
        return Err(StrictError::Unknown(field));
    }
    Ok(parsed)
}

/// The first key (as a dotted path relative to `spec`) present in `input` but not in `known`.
fn first_unknown_field(input: &Value, known: &Value, at: String) -> Option<String> {
    match (input, known) {
        (Value::Object(input), Value::Object(known)) => {
            for (key, value) in input {
                if value.is_null() {
                    continue;
                }
                let here = if at.is_empty() {
                    key.clone()
                } else {
                    format!("{at}.{key}")
                };
                match known.get(key) {
                    None => return Some(here),
                    Some(known_value) => {
                        if let Some(found) = first_unknown_field(value, known_value, here) {
                            return Some(found);
                        }
                    }
                }
            }
            None
        }
        (Value::Array(input), Value::Array(known)) => input
            .iter()
            .zip(known)
            .enumerate()
            .find_map(|(i, (a, b))| first_unknown_field(a, b, format!("{at}[{i}]"))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(pod_template: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "spec": {"replicas": 1, "template": pod_template}})
    }

    fn good_template() -> Value {
        json!({"metadata": {"labels": {"app": "x"}}, "spec": {
            "containers": [{"name": "c", "image": "busybox",
                "resources": {"requests": {"cpu": 1, "memory": "1Gi"}},
                "ports": [{"containerPort": 80}]}],
            "restartPolicy": "Never"}})
    }

    #[test]
    fn accepts_a_pod_template() {
        let spec = pod_spec_at(&deployment(good_template()), "template.spec.template").unwrap();
        assert_eq!(spec.containers[0].name, "c");
        // a Pod is its own template
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c"}]}});
        assert!(pod_spec_at(&pod, "template").is_ok());
    }

    #[test]
    fn rejects_what_is_not_a_pod_template() {
        let t = deployment(good_template());
        assert!(matches!(
            pod_spec_at(&t, "template.spec.missing"),
            Err(PodTemplateError::Path(_))
        ));
        assert!(matches!(
            pod_spec_at(&t, ""),
            Err(PodTemplateError::Path(_))
        ));
        assert!(matches!(
            pod_spec_at(&t, "template.spec.template.metadata"),
            Err(PodTemplateError::MissingSpec { .. })
        ));
        assert!(matches!(
            pod_spec_at(&t, "template.spec.replicas"),
            Err(PodTemplateError::NotAMap { .. })
        ));
        // a map with a `spec` that is not a PodSpec
        let nested = json!({"apiVersion": "x/v1", "kind": "X", "spec": {"spec": {"replicas": 1}}});
        assert!(matches!(
            pod_spec_at(&nested, "template.spec"),
            Err(PodTemplateError::UnknownField { .. })
        ));
        let scalar_spec = json!({"apiVersion": "x/v1", "kind": "X", "spec": {"spec": 3}});
        assert!(matches!(
            pod_spec_at(&scalar_spec, "template.spec"),
            Err(PodTemplateError::InvalidPodSpec { .. })
        ));
    }

    #[test]
    fn rejects_unknown_fields_anywhere_in_the_spec() {
        let mut t = good_template();
        t["spec"]["containerz"] = json!([]);
        let err = pod_spec_at(&deployment(t), "template.spec.template").unwrap_err();
        assert_eq!(
            err,
            PodTemplateError::UnknownField {
                path: "template.spec.template".into(),
                field: "containerz".into()
            }
        );
        let mut t = good_template();
        t["spec"]["containers"][0]["resources"]["request"] = json!({"cpu": 1});
        let err = pod_spec_at(&deployment(t), "template.spec.template").unwrap_err();
        assert_eq!(
            err.to_string(),
            "`template.spec.template.spec` does not parse as a v1.PodSpec: unknown field \
             `containers[0].resources.request`"
        );
    }

    #[test]
    fn nulls_are_not_unknown_fields() {
        let mut t = good_template();
        t["spec"]["nodeSelector"] = Value::Null;
        assert!(pod_spec_at(&deployment(t), "template.spec.template").is_ok());
    }

    #[test]
    fn type_errors_are_reported() {
        let mut t = good_template();
        t["spec"]["containers"] = json!("busybox");
        assert!(matches!(
            pod_spec_at(&deployment(t), "template.spec.template"),
            Err(PodTemplateError::InvalidPodSpec { .. })
        ));
        let mut t = good_template();
        t["metadata"] = json!([1]);
        assert!(matches!(
            pod_spec_at(&deployment(t), "template.spec.template"),
            Err(PodTemplateError::MetadataNotAMap { .. })
        ));
    }
}
