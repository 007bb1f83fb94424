//! The generated CRD is a structural schema the apiserver accepts, with upstream's names,
//! printer columns and embedded-resource template; and the committed file is fresh.

mod common;

use lifeboat_api::appwrapper::crd;
use serde_json::{Value, json};

/// Kubernetes structural-schema rules (the ones a derive can break): every node has a type
/// unless it preserves unknown fields or is int-or-string; no `$ref`/`anyOf`/`oneOf`/`allOf`/
/// `not`; `properties` and `additionalProperties` are exclusive; required fields are not
/// nullable; list-map keys are required in the items; embedded resources are objects that
/// preserve unknown fields.
fn structural_problems(node: &Value, path: &str, problems: &mut Vec<String>) {
    let Some(obj) = node.as_object() else {
        problems.push(format!("{path}: schema node is not an object"));
        return;
    };
    for banned in ["$ref", "anyOf", "oneOf", "allOf", "not", "uniqueItems"] {
        if obj.contains_key(banned) {
            problems.push(format!("{path}: uses `{banned}`"));
        }
    }
    let flag = |k: &str| obj.get(k) == Some(&Value::Bool(true));
    let preserve = flag("x-kubernetes-preserve-unknown-fields");
    if !obj.contains_key("type") && !preserve && !flag("x-kubernetes-int-or-string") {
        problems.push(format!("{path}: no type"));
    }
    if obj.contains_key("properties") && obj.contains_key("additionalProperties") {
        problems.push(format!("{path}: both properties and additionalProperties"));
    }
    if flag("x-kubernetes-embedded-resource")
        && (obj.get("type") != Some(&json!("object")) || !preserve)
    {
        problems.push(format!(
            "{path}: embedded resource must be an object preserving fields"
        ));
    }
    if let Some(required) = obj.get("required").and_then(Value::as_array) {
        for r in required.iter().filter_map(Value::as_str) {
            match obj.get("properties").and_then(|p| p.get(r)) {
                None => problems.push(format!("{path}.{r}: required but not a property")),
                Some(p) if p.get("nullable") == Some(&Value::Bool(true)) => {
                    problems.push(format!("{path}.{r}: required and nullable"))
                }
                Some(_) => {}
            }
        }
    }
    if obj.get("x-kubernetes-list-type") == Some(&json!("map")) {
        let keys = obj
            .get("x-kubernetes-list-map-keys")
            .and_then(Value::as_array);
        let item_required = obj
            .get("items")
            .and_then(|i| i.get("required"))
            .and_then(Value::as_array);
        match (keys, item_required) {
            (Some(keys), Some(required)) if keys.iter().all(|k| required.contains(k)) => {}
            _ => problems.push(format!(
                "{path}: list-map keys must be required in the items"
            )),
        }
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            structural_problems(v, &format!("{path}.{k}"), problems);
        }
    }
    if let Some(items) = obj.get("items") {
        structural_problems(items, &format!("{path}[]"), problems);
    }
    if let Some(additional) = obj.get("additionalProperties").filter(|a| a.is_object()) {
        structural_problems(additional, &format!("{path}{{}}"), problems);
    }
}

#[test]
fn schema_is_structural() {
    let schema = common::appwrapper_schema();
    let mut problems = Vec::new();
    structural_problems(&schema, "", &mut problems);
    assert!(problems.is_empty(), "{problems:#?}");
    // The root of a CRD schema must be a plain object schema.
    assert_eq!(schema["type"], "object");
    assert!(schema.get("nullable").is_none());
}

#[test]
fn names_scope_and_subresources_match_upstream() {
    let crd = serde_json::to_value(crd::crd()).unwrap();
    assert_eq!(
        crd["metadata"]["name"],
        "appwrappers.workload.codeflare.dev"
    );
    let spec = &crd["spec"];
    assert_eq!(spec["group"], "workload.codeflare.dev");
    assert_eq!(spec["scope"], "Namespaced");
    assert_eq!(spec["names"]["kind"], "AppWrapper");
    assert_eq!(spec["names"]["plural"], "appwrappers");
    assert_eq!(spec["names"]["singular"], "appwrapper");
    assert_eq!(spec["names"]["shortNames"], json!(["aw"]));
    let versions = spec["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 1);
    let v = &versions[0];
    assert_eq!(v["name"], "v1beta2");
    assert_eq!(v["served"], true);
    assert_eq!(v["storage"], true);
    assert_eq!(v["subresources"], json!({"status": {}}));
    let columns: Vec<(String, String)> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["jsonPath"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected = [
        ("Status", ".status.phase"),
        (
            "Quota Reserved",
            ".status.conditions[?(@.type==\"QuotaReserved\")].status",
        ),
        (
            "Resources Deployed",
            ".status.conditions[?(@.type==\"ResourcesDeployed\")].status",
        ),
        (
            "Unhealthy",
            ".status.conditions[?(@.type==\"Unhealthy\")].status",
        ),
        ("Retries", ".status.resettingCount"),
        ("Age", ".metadata.creationTimestamp"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(columns, expected);
}

#[test]
fn template_is_an_embedded_resource_and_fields_are_upstreams() {
    let schema = common::appwrapper_schema();
    let spec = &schema["properties"]["spec"];
    assert_eq!(spec["required"], json!(["components"]));
    let component = &spec["properties"]["components"]["items"];
    assert_eq!(
        component["properties"]["template"],
        json!({
            "description": "Template defines the Kubernetes resource for the Component.",
            "type": "object",
            "x-kubernetes-embedded-resource": true,
            "x-kubernetes-preserve-unknown-fields": true,
        })
    );
    assert_eq!(component["required"], json!(["template"]));
    let keys = |v: &Value| -> Vec<String> {
        v["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    };
    assert_eq!(
        keys(component),
        ["annotations", "podSetInfos", "podSets", "template"]
    );
    assert_eq!(
        keys(&component["properties"]["podSets"]["items"]),
        ["annotations", "path", "replicas"]
    );
    assert_eq!(
        keys(&component["properties"]["podSetInfos"]["items"]),
        [
            "annotations",
            "labels",
            "nodeSelector",
            "schedulingGates",
            "tolerations"
        ]
    );
    assert_eq!(keys(spec), ["components", "managedBy", "suspend"]);
    let status = &schema["properties"]["status"];
    assert_eq!(
        keys(status),
        [
            "componentStatus",
            "conditions",
            "phase",
            "resettingCount",
            "transitions"
        ]
    );
    assert_eq!(
        status["properties"]["phase"]["enum"],
        json!([
            "",
            "Suspended",
            "Resuming",
            "Running",
            "Resetting",
            "Suspending",
            "Succeeded",
            "Failed",
            "Terminating"
        ])
    );
    assert_eq!(
        status["properties"]["conditions"]["x-kubernetes-list-type"],
        "map"
    );
    assert_eq!(status["properties"]["transitions"]["maxItems"], 20);
    assert_eq!(
        keys(&status["properties"]["componentStatus"]["items"]),
        ["apiVersion", "conditions", "kind", "name", "podSets"]
    );
}

#[test]
fn a_status_written_by_the_controller_fits_the_schema() {
    let schema = common::appwrapper_schema();
    let object = json!({
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {"name": "x"},
        "spec": {"components": [{"template": {"apiVersion": "v1", "kind": "Pod"}}]},
        "status": {
            "phase": "Running",
            "resettingCount": 2,
            "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "Resuming",
                "message": "Suspend is false", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "componentStatus": [{"name": "p", "kind": "Pod", "apiVersion": "v1",
                "podSets": [{"path": "template", "replicas": 1}]}],
            "transitions": [{"time": "2026-01-01T00:00:00Z", "phase": "Running",
                "reason": "Running"}]
        }
    });
    let mut problems = Vec::new();
    common::schema_problems(&schema, &object, "", &mut problems);
    assert!(problems.is_empty(), "{problems:?}");
    let aw: lifeboat_api::appwrapper::AppWrapper = serde_json::from_value(object.clone()).unwrap();
    assert_eq!(serde_json::to_value(&aw).unwrap(), object);
}

#[test]
fn committed_crd_is_fresh() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(crd::CRD_FILE);
    let committed = std::fs::read_to_string(&file).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run `cargo run -q -p lifeboat-api --bin crdgen`",
            file.display()
        )
    });
    assert!(
        committed == crd::crd_yaml().unwrap(),
        "{} is stale: run `cargo run -q -p lifeboat-api --bin crdgen`",
        crd::CRD_FILE
    );
}
