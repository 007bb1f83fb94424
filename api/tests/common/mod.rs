//! Shared test helpers: locating /work/shared-style test data and a small structural-schema
//! validator that mimics what the apiserver does with a CRD schema (type checks and pruning).

// Test helpers: panicking on broken fixtures is the point.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::PathBuf;

use serde_json::Value;

/// The shared design folder: `$LIFEBOAT_SHARED_DIR`, else `../shared` next to the repository.
pub fn shared_dir() -> PathBuf {
    match std::env::var_os("LIFEBOAT_SHARED_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"),
    }
}

/// Every `*.yaml` file of a testdata folder, sorted; fails loudly when there are none.
pub fn yaml_files(sub: &str) -> Vec<(String, String)> {
    let dir = shared_dir().join("testdata").join(sub);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| {
        panic!(
            "cannot read {} ({e}); set LIFEBOAT_SHARED_DIR to the shared folder",
            dir.display()
        )
    });
    let mut files: Vec<(String, String)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&p).unwrap();
            (name, text)
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no YAML files in {}", dir.display());
    files
}

/// The openAPIV3Schema of the generated AppWrapper CRD.
pub fn appwrapper_schema() -> Value {
    let crd = serde_json::to_value(lifeboat_api::appwrapper::crd::crd()).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// Checks `value` against a structural schema the way the apiserver would for the parts that
/// matter here: JSON types, required fields, and unknown fields (which the apiserver would
/// silently prune: a lost field). Returns every problem as `path: reason`.
pub fn schema_problems(schema: &Value, value: &Value, path: &str, problems: &mut Vec<String>) {
    if value.is_null() {
        // The apiserver prunes nulls of non-nullable fields; no type check.
        return;
    }
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        if !(value.is_string() || value.is_i64() || value.is_u64()) {
            problems.push(format!("{path}: expected int-or-string"));
        }
        return;
    }
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if schema.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true)) {
        for key in ["apiVersion", "kind"] {
            let named = value
                .get(key)
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty());
            if !named {
                problems.push(format!("{path}.{key}: required by the embedded resource"));
            }
        }
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let Some(map) = value.as_object() else {
                problems.push(format!("{path}: expected an object"));
                return;
            };
            if let Some(required) = schema.get("required").and_then(Value::as_array) {
                for r in required.iter().filter_map(Value::as_str) {
                    if !map.contains_key(r) {
                        problems.push(format!("{path}.{r}: required"));
                    }
                }
            }
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            for (k, v) in map {
                let child = format!("{path}.{k}");
                if let Some(p) = properties.and_then(|p| p.get(k)) {
                    schema_problems(p, v, &child, problems);
                } else if let Some(a) = additional.filter(|a| a.is_object()) {
                    schema_problems(a, v, &child, problems);
                } else {
                    let implicit =
                        path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&k.as_str());
                    if !preserve && !implicit {
                        problems.push(format!("{child}: unknown field (would be pruned)"));
                    }
                }
            }
        }
        Some("array") => {
            let Some(items) = value.as_array() else {
                problems.push(format!("{path}: expected an array"));
                return;
            };
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                && items.len() as u64 > max
            {
                problems.push(format!("{path}: more than {max} items"));
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    schema_problems(item_schema, item, &format!("{path}[{i}]"), problems);
                }
            }
        }
        Some("string") => {
            if !value.is_string() {
                problems.push(format!("{path}: expected a string, found {value}"));
            } else if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
                && !allowed.contains(value)
            {
                problems.push(format!("{path}: {value} is not one of {allowed:?}"));
            }
        }
        Some("integer") => {
            if !(value.is_i64() || value.is_u64()) {
                problems.push(format!("{path}: expected an integer, found {value}"));
            }
        }
        Some("boolean") => {
            if !value.is_boolean() {
                problems.push(format!("{path}: expected a boolean, found {value}"));
            }
        }
        Some(other) => problems.push(format!("{path}: unexpected schema type {other}")),
        None if preserve => {}
        None => problems.push(format!("{path}: schema node without a type")),
    }
}
