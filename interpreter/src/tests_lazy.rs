//! Lazy arguments behave like plain tables: every way a script can look at an object sees the
//! same values as with eager conversion, and untouched parts come back unchanged.

use std::sync::Arc;

use crate::{HealthState, Interpreter, Runtime, RuntimeConfig};
use serde_json::{Value, json};

fn interpreter(field: &str, script: &str) -> Interpreter {
    let body: String = script.lines().map(|l| format!("        {l}\n")).collect();
    let yaml = format!(
        "apiVersion: config.lifeboat.dev/v1alpha1\nkind: ResourceInterpreterCustomization\nmetadata:\n  name: lazy\nspec:\n  target:\n    apiVersion: example.com/v1\n    kind: Widget\n  customizations:\n    {field}:\n      luaScript: |\n{body}"
    );
    let mut interpreter = Interpreter::new(Arc::new(Runtime::new(RuntimeConfig::default())));
    interpreter.add_yaml(&yaml).unwrap();
    interpreter
}

fn widget() -> Value {
    json!({
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "labels": {"a": "1", "b": "2"}, "annotations": {}},
        "spec": {
            "replicas": 3,
            "items": [1, null, 2, 3],
            "nested": {"deep": {"deeper": {"x": 1.5, "y": 2.0, "z": null}}},
            "empty": [],
            "template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "250m"}}}]}}
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}
    })
}

fn health(script: &str) -> HealthState {
    interpreter("healthInterpretation", script)
        .interpret_health(&widget())
        .unwrap()
        .unwrap()
        .state
}

#[test]
fn every_access_path_sees_the_values() {
    let checks = [
        "return obj.spec.replicas == 3 and math.type(obj.spec.replicas) == 'integer'",
        "return #obj.spec.items == 3 and obj.spec.items[2] == 2",
        "local n = 0 for _, v in ipairs(obj.spec.items) do n = n + v end return n == 6",
        "local n = 0 for k in pairs(obj.metadata.labels) do n = n + 1 end return n == 2",
        "return next(obj.metadata.labels) ~= nil and next(obj.metadata.annotations) == nil",
        "return next(obj.spec.empty) == nil and #obj.spec.empty == 0",
        "table.insert(obj.spec.items, 4) return #obj.spec.items == 4",
        "return table.concat(obj.spec.items, ',') == '1,2,3'",
        "local t = obj.spec.nested.deep.deeper return t.x == 1.5 and t.y == 2 and t.z == nil and tostring(t.y) == '2'",
        "return select('#', table.unpack(obj.spec.items)) == 3",
        "local k = require('kube') return k.accuratePodRequirements(obj.spec.template).resourceRequest.cpu == '250m'",
        "obj.spec.extra = 1 return obj.spec.extra == 1 and obj.spec.replicas == 3",
        "return obj.status.conditions[1].type == 'Ready' and obj.missing == nil",
    ];
    for check in checks {
        let script = format!("function InterpretHealth(obj)\n  {check}\nend");
        assert_eq!(health(&script), HealthState::Healthy, "{check}");
    }
}

#[test]
fn untouched_parts_come_back_as_lua_would_return_them() {
    let interpreter = interpreter(
        "replicaRevision",
        "function ReviseReplica(obj, replicas)\n  obj.spec.replicas = replicas\n  return obj\nend",
    );
    let revised = interpreter.revise_replica(&widget(), 7).unwrap().unwrap();
    let mut expected = widget();
    expected["spec"]["replicas"] = json!(7);
    // Nulls vanish (absent in Lua); 2.0 is an integer; empty object/list kept from the input.
    expected["spec"]["items"] = json!([1, 2, 3]);
    expected["spec"]["nested"]["deep"]["deeper"] = json!({"x": 1.5, "y": 2});
    assert_eq!(revised, expected);
}

#[test]
fn returning_an_argument_subtree_works_for_status() {
    let interpreter = interpreter(
        "statusReflection",
        "function ReflectStatus(obj)\n  return {conditions = obj.status.conditions, nested = obj.spec.nested}\nend",
    );
    let status = interpreter.reflect_status(&widget()).unwrap().unwrap();
    assert_eq!(
        status,
        json!({
            "conditions": [{"type": "Ready", "status": "True"}],
            "nested": {"deep": {"deeper": {"x": 1.5, "y": 2}}}
        })
    );
}
