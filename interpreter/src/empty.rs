//! Karmada's repair of empty Lua tables in results (pure JSON, no Lua).
//!
//! An empty Lua table cannot tell an empty object from an empty list, so it is encoded as `[]`.
//! Karmada then repairs the result: a whole result of `[]` becomes `{}` when an object is expected;
//! a nested `[]` becomes `{}` when some reference object (the inputs of Retain and ReviseReplica)
//! has an empty object at the same path, stays `[]` when a reference has an empty list there, and
//! is deleted otherwise. Paths ignore list indices. Real scripts depend on this (for example a
//! ReflectStatus that builds `conditions = {}` and expects it to vanish).

use std::collections::HashSet;

use serde_json::Value;

/// Applies the repair to a converted Lua result.
pub fn repair_empty_tables(result: Value, object_expected: bool, references: &[&Value]) -> Value {
    if matches!(&result, Value::Array(items) if items.is_empty()) {
        return if object_expected {
            Value::Object(Default::default())
        } else {
            result
        };
    }
    let mut empty_lists = HashSet::new();
    let mut empty_objects = HashSet::new();
    for reference in references {
        collect_empty_paths(
            reference,
            &mut String::new(),
            &mut empty_lists,
            &mut empty_objects,
        );
    }
    let mut result = result;
    if empty_lists.is_empty() && empty_objects.is_empty() {
        // No reference says keep or make an object anywhere: every nested `[]` goes, and no
        // path needs to be built to tell.
        delete_nested_empty_lists(&mut result);
    } else {
        repair(
            &mut result,
            &mut String::new(),
            &empty_lists,
            &empty_objects,
        );
    }
    result
}

/// [`repair`] when every decision is [`Fix::Delete`].
fn delete_nested_empty_lists(value: &mut Value) {
    let is_empty_list = |v: &Value| matches!(v, Value::Array(items) if items.is_empty());
    match value {
        Value::Object(map) => {
            map.retain(|_, child| !is_empty_list(child));
            map.values_mut().for_each(delete_nested_empty_lists);
        }
        Value::Array(items) => {
            items.retain(|child| !is_empty_list(child));
            items.iter_mut().for_each(delete_nested_empty_lists);
        }
        _ => {}
    }
}

fn child_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn collect_empty_paths(
    value: &Value,
    path: &mut String,
    empty_lists: &mut HashSet<String>,
    empty_objects: &mut HashSet<String>,
) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let mut child_path = child_path(path, key);
                record_or_descend(child, &mut child_path, empty_lists, empty_objects);
            }
        }
        Value::Array(items) => {
            // List elements share their list's path.
            for child in items {
                record_or_descend(child, path, empty_lists, empty_objects);
            }
        }
        _ => {}
    }
}

fn record_or_descend(
    child: &Value,
    path: &mut String,
    empty_lists: &mut HashSet<String>,
    empty_objects: &mut HashSet<String>,
) {
    match child {
        Value::Array(items) if items.is_empty() => {
            empty_lists.insert(path.clone());
        }
        Value::Object(map) if map.is_empty() => {
            empty_objects.insert(path.clone());
        }
        Value::Array(_) | Value::Object(_) => {
            collect_empty_paths(child, path, empty_lists, empty_objects)
        }
        _ => {}
    }
}

enum Fix {
    Keep,
    Object,
    Delete,
}

fn decide(path: &str, empty_lists: &HashSet<String>, empty_objects: &HashSet<String>) -> Fix {
    if empty_objects.contains(path) {
        Fix::Object
    } else if empty_lists.contains(path) {
        Fix::Keep
    } else {
        Fix::Delete
    }
}

fn repair(
    value: &mut Value,
    path: &mut String,
    empty_lists: &HashSet<String>,
    empty_objects: &HashSet<String>,
) {
    match value {
        Value::Object(map) => {
            let mut deletions = Vec::new();
            for (key, child) in map.iter_mut() {
                let mut child_path = child_path(path, key);
                if matches!(child, Value::Array(items) if items.is_empty()) {
                    match decide(&child_path, empty_lists, empty_objects) {
                        Fix::Keep => {}
                        Fix::Object => *child = Value::Object(Default::default()),
                        Fix::Delete => deletions.push(key.clone()),
                    }
                } else if child.is_array() || child.is_object() {
                    repair(child, &mut child_path, empty_lists, empty_objects);
                }
            }
            for key in deletions {
                map.remove(&key);
            }
        }
        Value::Array(items) => {
            let mut index = 0;
            items.retain_mut(|child| {
                index += 1;
                if matches!(child, Value::Array(inner) if inner.is_empty()) {
                    match decide(path, empty_lists, empty_objects) {
                        Fix::Keep => true,
                        Fix::Object => {
                            *child = Value::Object(Default::default());
                            true
                        }
                        Fix::Delete => false,
                    }
                } else {
                    if child.is_array() || child.is_object() {
                        repair(child, path, empty_lists, empty_objects);
                    }
                    true
                }
            });
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn whole_empty_result_becomes_object_when_object_expected() {
        assert_eq!(repair_empty_tables(json!([]), true, &[]), json!({}));
        assert_eq!(repair_empty_tables(json!([]), false, &[]), json!([]));
    }

    #[test]
    fn nested_empty_tables_without_references_are_deleted() {
        let result = json!({"status": {"conditions": [], "replicas": 2}, "list": [[], 1]});
        assert_eq!(
            repair_empty_tables(result, true, &[]),
            json!({"status": {"replicas": 2}, "list": [1]})
        );
    }

    #[test]
    fn without_references_the_short_path_repairs_as_the_general_one() {
        let cases = [
            json!({"status": {"conditions": [], "replicas": 2}, "list": [[], 1]}),
            json!({"a": [[[]], {"b": []}, []], "c": {"d": {"e": []}}, "f": "x"}),
            json!([[], {"x": []}, [[], 2]]),
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}),
        ];
        for case in cases {
            let mut general = case.clone();
            repair(
                &mut general,
                &mut String::new(),
                &HashSet::new(),
                &HashSet::new(),
            );
            let mut short = case.clone();
            delete_nested_empty_lists(&mut short);
            assert_eq!(short, general, "{case}");
        }
    }

    #[test]
    fn references_decide_object_or_list() {
        let reference = json!({
            "spec": {"selector": {}, "ports": [], "containers": [{"args": [], "env": {}}]}
        });
        let result = json!({
            "spec": {"selector": [], "ports": [], "extra": [], "containers": [{"args": [], "env": []}]}
        });
        assert_eq!(
            repair_empty_tables(result, true, &[&reference]),
            json!({"spec": {"selector": {}, "ports": [], "containers": [{"args": [], "env": {}}]}})
        );
    }
}
