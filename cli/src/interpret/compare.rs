//! Comparison of expected and actual results, per result key, as Karmada's third-party test
//! runner does it: semantic for requirements, components and dependencies (sorted), object
//! equality with `{{EXCLUDE}}` for objects, exact JSON for the rest.

use std::collections::HashSet;

use lifeboat_interpreter::results::{sort_components, sort_dependencies};
use lifeboat_interpreter::{Component, DependentObjectReference, Health, ReplicaRequirements};
use serde_json::Value;

/// The placeholder that removes a field from both sides of an object comparison.
pub const EXCLUDE: &str = "{{EXCLUDE}}";

/// A result an operation produced, under its output key.
#[derive(Debug, Clone)]
pub enum Actual {
    /// `healthy`, `replica`, `status`: exact JSON.
    Exact(Value),
    /// `retained`, `revised`, `aggregatedStatus`: objects, `{{EXCLUDE}}` honoured.
    Object(Value),
    Requires(Option<ReplicaRequirements>),
    Components(Option<Vec<Component>>),
    Dependencies(Vec<DependentObjectReference>),
    Health(Health),
}

impl Actual {
    /// The result as JSON, for failure messages and the single-operation output.
    pub fn to_json(&self) -> Value {
        let result = match self {
            Actual::Exact(v) | Actual::Object(v) => Ok(v.clone()),
            Actual::Requires(r) => serde_json::to_value(r),
            Actual::Components(c) => serde_json::to_value(c),
            Actual::Dependencies(d) => serde_json::to_value(d),
            Actual::Health(h) => serde_json::to_value(h),
        };
        result.unwrap_or_else(|e| Value::String(format!("<unprintable: {e}>")))
    }
}

/// JSON equality where numbers compare by value (Karmada marshals expected numbers as float64).
pub fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i == j,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_equal(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_equal(v, w)))
        }
        _ => a == b,
    }
}

fn path_key(path: &[String]) -> String {
    path.join(".")
}

/// First pass: removes `{{EXCLUDE}}` fields from the expected object and records their paths.
fn collect_excluded(
    value: &Value,
    path: &mut Vec<String>,
    excluded: &mut HashSet<String>,
) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = serde_json::Map::new();
            for (key, child) in map {
                path.push(key.clone());
                if child.as_str() == Some(EXCLUDE) {
                    excluded.insert(path_key(path));
                } else {
                    out.insert(key.clone(), collect_excluded(child, path, excluded));
                }
                path.pop();
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, child)| {
                    path.push(i.to_string());
                    let v = collect_excluded(child, path, excluded);
                    path.pop();
                    v
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Second pass: removes the recorded paths from the actual object.
fn remove_excluded(value: &Value, path: &mut Vec<String>, excluded: &HashSet<String>) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = serde_json::Map::new();
            for (key, child) in map {
                path.push(key.clone());
                if !excluded.contains(&path_key(path)) {
                    out.insert(key.clone(), remove_excluded(child, path, excluded));
                }
                path.pop();
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, child)| {
                    path.push(i.to_string());
                    let v = remove_excluded(child, path, excluded);
                    path.pop();
                    v
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Compares an expected output value with an actual result. `Err` explains a mismatch.
pub fn compare(expected: &Value, actual: &Actual) -> Result<(), String> {
    let mismatch = || {
        Err(format!(
            "expected {}, got {}",
            compact(expected),
            compact(&actual.to_json())
        ))
    };
    match actual {
        Actual::Exact(value) => match first_difference(expected, value, "") {
            None => Ok(()),
            Some(difference) if expected.is_object() => Err(difference),
            Some(_) => mismatch(),
        },
        Actual::Object(value) => {
            if !expected.is_object() {
                return Err(format!(
                    "expected output is not an object: {}",
                    compact(expected)
                ));
            }
            let mut excluded = HashSet::new();
            let expected = collect_excluded(expected, &mut Vec::new(), &mut excluded);
            let value = remove_excluded(value, &mut Vec::new(), &excluded);
            match first_difference(&expected, &value, "") {
                None => Ok(()),
                Some(difference) => Err(difference),
            }
        }
        Actual::Requires(value) => {
            // `requires: null`: the script must return no requirements.
            let expected: Option<ReplicaRequirements> = serde_json::from_value(expected.clone())
                .map_err(|e| format!("expected requires is not ReplicaRequirements: {e}"))?;
            if *value == expected {
                Ok(())
            } else {
                mismatch()
            }
        }
        Actual::Components(value) => {
            let mut expected: Vec<Component> = serde_json::from_value(expected.clone())
                .map_err(|e| format!("expected components are not a component list: {e}"))?;
            sort_components(&mut expected);
            let mut got = value.clone().unwrap_or_default();
            sort_components(&mut got);
            if got == expected { Ok(()) } else { mismatch() }
        }
        Actual::Dependencies(value) => {
            let mut expected: Vec<DependentObjectReference> =
                serde_json::from_value(expected.clone())
                    .map_err(|e| format!("expected dependencies are not a dependency list: {e}"))?;
            sort_dependencies(&mut expected);
            let mut got = value.clone();
            sort_dependencies(&mut got);
            if got == expected { Ok(()) } else { mismatch() }
        }
        Actual::Health(health) => {
            let expected: Health = serde_json::from_value(expected.clone())
                .map_err(|e| format!("expected health is not {{state, reason, class}}: {e}"))?;
            if *health == expected {
                Ok(())
            } else {
                mismatch()
            }
        }
    }
}

/// The first place where two JSON values differ, as `path: expected X, got Y`.
pub fn first_difference(expected: &Value, actual: &Value, path: &str) -> Option<String> {
    let here = if path.is_empty() { "." } else { path };
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (key, ev) in e {
                match a.get(key) {
                    None => {
                        return Some(format!(
                            "{path}.{key}: expected {}, got nothing",
                            compact(ev)
                        ));
                    }
                    Some(av) => {
                        if let Some(d) = first_difference(ev, av, &format!("{path}.{key}")) {
                            return Some(d);
                        }
                    }
                }
            }
            a.iter()
                .find(|(key, _)| !e.contains_key(*key))
                .map(|(key, av)| format!("{path}.{key}: expected nothing, got {}", compact(av)))
        }
        (Value::Array(e), Value::Array(a)) if e.len() == a.len() => e
            .iter()
            .zip(a)
            .enumerate()
            .find_map(|(i, (ev, av))| first_difference(ev, av, &format!("{path}[{i}]"))),
        _ if json_equal(expected, actual) => None,
        _ => Some(format!(
            "{here}: expected {}, got {}",
            compact(expected),
            compact(actual)
        )),
    }
}

/// One-line JSON for reports, cut when very long.
pub fn compact(value: &Value) -> String {
    let text = value.to_string();
    if text.len() > 600 {
        let mut end = 600;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &text[..end])
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_compare_by_value_and_nulls_matter() {
        assert!(json_equal(
            &json!({"a": 2.0, "b": [1]}),
            &json!({"a": 2, "b": [1.0]})
        ));
        assert!(!json_equal(&json!({"a": null}), &json!({})));
        assert!(!json_equal(&json!({"a": []}), &json!({"a": {}})));
    }

    #[test]
    fn exclude_removes_paths_from_both_sides() {
        let expected =
            json!({"status": {"conditions": [{"type": "Ready", "lastTransitionTime": EXCLUDE}]}});
        let actual = Actual::Object(
            json!({"status": {"conditions": [{"type": "Ready", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
        );
        assert!(compare(&expected, &actual).is_ok());
        let other = Actual::Object(
            json!({"status": {"conditions": [{"type": "NotReady", "lastTransitionTime": "x"}]}}),
        );
        assert!(compare(&expected, &other).is_err());
    }

    #[test]
    fn dependencies_and_components_ignore_order() {
        let expected = json!([{"apiVersion": "v1", "kind": "Secret", "name": "b"}, {"apiVersion": "v1", "kind": "ConfigMap", "name": "a"}]);
        let actual = Actual::Dependencies(
            serde_json::from_value(json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "a"}, {"apiVersion": "v1", "kind": "Secret", "name": "b"}]))
                .unwrap(),
        );
        assert!(compare(&expected, &actual).is_ok());
        let expected = json!([{"name": "w", "replicas": 2, "replicaRequirements": {"resourceRequest": {"cpu": "1000m"}}}, {"name": "m", "replicas": 1}]);
        let actual = Actual::Components(Some(
            serde_json::from_value(json!([{"name": "m", "replicas": 1}, {"name": "w", "replicas": 2, "replicaRequirements": {"resourceRequest": {"cpu": 1}}}]))
                .unwrap(),
        ));
        assert!(compare(&expected, &actual).is_ok());
    }

    #[test]
    fn missing_requirements_do_not_match_expected_ones() {
        assert!(
            compare(
                &json!({"resourceRequest": {"cpu": "1"}}),
                &Actual::Requires(None)
            )
            .is_err()
        );
    }

    #[test]
    fn null_requires_expects_no_requirements() {
        assert!(compare(&Value::Null, &Actual::Requires(None)).is_ok());
        let some: ReplicaRequirements =
            serde_json::from_value(json!({"resourceRequest": {"cpu": "1"}})).unwrap();
        let err = compare(&Value::Null, &Actual::Requires(Some(some))).unwrap_err();
        assert!(err.contains("expected null"), "{err}");
    }
}
