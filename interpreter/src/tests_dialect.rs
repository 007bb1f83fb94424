//! The Lua 5.4 behaviours that differ from Karmada's gopher-lua (Lua 5.1) and that a real
//! Karmada script can run into, pinned down one test each (listed in the crate README).

use std::sync::Arc;

use crate::{Interpreter, Runtime, RuntimeConfig};
use serde_json::{Value, json};

/// Evaluates `expression` inside an InterpretStatus script and returns the `value` field.
fn eval(expression: &str) -> Value {
    let script = format!(
        "function ReflectStatus(obj)\n  local ok, value = pcall(function() return {expression} end)\n  if not ok then return {{error = value}} end\n  return {{value = value}}\nend"
    );
    let body: String = script.lines().map(|l| format!("        {l}\n")).collect();
    let yaml = format!(
        "apiVersion: config.lifeboat.dev/v1alpha1\nkind: ResourceInterpreterCustomization\nmetadata:\n  name: dialect\nspec:\n  target:\n    apiVersion: example.com/v1\n    kind: Widget\n  customizations:\n    statusReflection:\n      luaScript: |\n{body}"
    );
    let mut interpreter = Interpreter::new(Arc::new(Runtime::new(RuntimeConfig::default())));
    interpreter.add_yaml(&yaml).unwrap();
    let object = json!({"apiVersion": "example.com/v1", "kind": "Widget",
                        "spec": {"replicas": 4, "ratio": 0.5}});
    let status = interpreter.reflect_status(&object).unwrap().unwrap();
    status
        .get("value")
        .or(status.get("error"))
        .cloned()
        .unwrap_or(Value::Null)
}

fn error_of(expression: &str) -> String {
    let script_error = eval(&format!(
        "(function() local v = {expression}; return 'no error' end)()"
    ));
    script_error.as_str().unwrap_or_default().to_string()
}

#[test]
fn division_always_yields_a_float_that_prints_with_a_fraction() {
    // gopher-lua has only float64 and prints 4/2 as "2"; Lua 5.4 prints the float 2.0 as "2.0".
    assert_eq!(eval("tostring(obj.spec.replicas / 2)"), json!("2.0"));
    assert_eq!(eval("'x' .. obj.spec.replicas / 2"), json!("x2.0"));
    assert_eq!(eval("tostring(3.0)"), json!("3.0"));
    // Integers from JSON and integer arithmetic print as Karmada prints them.
    assert_eq!(eval("tostring(obj.spec.replicas + 1)"), json!("5"));
    assert_eq!(
        eval("tostring(math.floor(obj.spec.replicas / 3))"),
        json!("1")
    );
    // A float result converts back to JSON as an integer when it is integral.
    assert_eq!(eval("obj.spec.replicas / 2"), json!(2));
}

#[test]
fn integer_division_and_modulo_by_zero_raise() {
    // Lua 5.1 has no `//` (a Karmada script cannot contain it); in Lua 5.4 integer `//` and
    // `%` by zero are errors where gopher-lua's float arithmetic gives inf or nan.
    assert_eq!(eval("7 // 2"), json!(3));
    assert!(
        error_of("obj.spec.replicas % 0").contains("attempt to perform 'n%0'"),
        "{}",
        error_of("obj.spec.replicas % 0")
    );
    let err = error_of("obj.spec.replicas // 0");
    assert!(err.contains("attempt to divide by zero"), "{err}");
    // Float operands keep IEEE results, as in gopher-lua.
    assert_eq!(
        eval("obj.spec.ratio % 0 ~= obj.spec.ratio % 0"),
        json!(true)
    );
}

#[test]
fn string_format_integer_conversions_need_integral_numbers() {
    // C printf rules: %d takes a float only when it has an exact integer value.
    assert_eq!(
        eval("string.format('%d', obj.spec.replicas / 2)"),
        json!("2")
    );
    assert!(
        error_of("string.format('%d', obj.spec.ratio)")
            .contains("number has no integer representation")
    );
    assert_eq!(
        eval("string.format('%5.1f%%', obj.spec.ratio * 100)"),
        json!(" 50.0%")
    );
}

#[test]
fn goto_works_as_in_gopher_lua() {
    assert_eq!(
        eval(
            "(function() local n = 0 for i = 1, 5 do if i % 2 == 0 then goto continue end n = n + i ::continue:: end return n end)()"
        ),
        json!(9)
    );
}

#[test]
fn string_patterns_follow_lua_5_4() {
    // The patterns Karmada scripts use behave as in Lua 5.1.
    assert_eq!(
        eval("select(2, ('nvidia.com/gpu'):match('^([^/]+)/(.+)$'))"),
        json!("gpu")
    );
    assert_eq!(eval("('10Gi'):match('^(%d+)(%a*)$')"), json!("10"));
    assert_eq!(eval("(string.gsub('a-b-c', '%-', '_'))"), json!("a_b_c"));
    assert_eq!(
        eval("('THE (quick) fox'):find('%f[%a]%a+%f[%A]')"),
        json!(1)
    );
    // Lua 5.4 adds the %g class (printable except space), unknown to Lua 5.1.
    assert_eq!(eval("('  ab c'):match('%g+')"), json!("ab"));
    // gsub and rep are offered (Karmada's safe string library refuses them).
    assert_eq!(eval("string.rep('ab', 3, '-')"), json!("ab-ab-ab"));
}

#[test]
fn error_messages_use_lua_5_4_wording() {
    // A script that matches error text sees Lua 5.4's messages.
    assert!(
        error_of("obj.status.phase").contains("attempt to index a nil value (field 'status')"),
        "{}",
        error_of("obj.status.phase")
    );
}
