//! Sandbox behaviour: restricted libraries, limits that survive pcall, clean globals, caching,
//! bounded values on the way out of Lua (results, `kube` helper arguments, error messages).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{HealthState, InterpretError, Interpreter, Limit, Limits, Runtime, RuntimeConfig};
use serde_json::{Value, json};

fn widget() -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "status": {"ready": true}})
}

fn indent(script: &str) -> String {
    script.lines().map(|l| format!("        {l}\n")).collect()
}

fn customization(name: &str, health_script: &str) -> String {
    customization_of(name, "healthInterpretation", health_script)
}

fn customization_of(name: &str, field: &str, script: &str) -> String {
    format!(
        "apiVersion: config.lifeboat.dev/v1alpha1\nkind: ResourceInterpreterCustomization\nmetadata:\n  name: {name}\nspec:\n  target:\n    apiVersion: example.com/v1\n    kind: Widget\n  customizations:\n    {field}:\n      luaScript: |\n{}",
        indent(script)
    )
}

/// Small limits so hostile scripts are stopped quickly.
fn small_limits() -> Limits {
    Limits {
        instructions: 2_000_000,
        memory_bytes: 4 * 1024 * 1024,
        wall_clock: Duration::from_secs(2),
        ..Limits::default()
    }
}

fn interpreter_with(limits: Limits, pool_size: usize, script: &str) -> Interpreter {
    let runtime = Arc::new(Runtime::new(RuntimeConfig { limits, pool_size }));
    let mut interpreter = Interpreter::new(runtime);
    interpreter
        .add_yaml(&customization("hostile", script))
        .unwrap();
    interpreter
}

/// A second customization on the same runtime that must keep working after a hostile one.
fn healthy_after(runtime: &Arc<Runtime>) {
    let mut good = Interpreter::new(runtime.clone());
    good.add_yaml(&customization(
        "good",
        "function InterpretHealth(obj) return obj.status.ready end",
    ))
    .unwrap();
    let health = good.interpret_health(&widget()).unwrap().unwrap();
    assert_eq!(health.state, HealthState::Healthy);
}

fn assert_limit(script: &str, expected: Limit) {
    assert_limit_one_of(script, &[expected]);
}

fn assert_limit_one_of(script: &str, accepted: &[Limit]) {
    // Pool of one: the next evaluation reuses the very state the hostile script ran on.
    let interpreter = interpreter_with(small_limits(), 1, script);
    let started = Instant::now();
    let err = interpreter.interpret_health(&widget()).unwrap_err();
    let expected = err
        .limit()
        .unwrap_or_else(|| panic!("{script}: not stopped by a limit: {err}"));
    assert!(accepted.contains(&expected), "{script}: {err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    // The same state runs the next evaluation normally, twice.
    healthy_after(interpreter.runtime());
    healthy_after(interpreter.runtime());
    // And the hostile script is stopped again, not poisoned for ever or let through.
    assert_eq!(
        interpreter.interpret_health(&widget()).unwrap_err().limit(),
        Some(expected)
    );
}

#[test]
fn infinite_loop_is_stopped_by_the_instruction_budget() {
    assert_limit(
        "function InterpretHealth(obj)\n  while true do end\nend",
        Limit::Instructions,
    );
}

#[test]
fn unbounded_allocation_is_stopped_by_the_memory_limit() {
    assert_limit(
        "function InterpretHealth(obj)\n  local t = {}\n  local i = 0\n  while true do i = i + 1; t[i] = {i, i, i} end\nend",
        Limit::Memory,
    );
}

#[test]
fn huge_string_rep_is_stopped_by_the_memory_limit() {
    assert_limit(
        "function InterpretHealth(obj)\n  local s = string.rep('x', 1024 * 1024 * 1024)\n  return #s > 0\nend",
        Limit::Memory,
    );
}

#[test]
fn huge_string_by_concatenation_is_stopped_by_the_memory_limit() {
    assert_limit(
        "function InterpretHealth(obj)\n  local s = 'x'\n  while true do s = s .. s end\nend",
        Limit::Memory,
    );
}

#[test]
fn unbounded_recursion_is_stopped() {
    let interpreter = interpreter_with(
        small_limits(),
        1,
        "local function f(n) return 1 + f(n + 1) end\nfunction InterpretHealth(obj) return f(1) > 0 end",
    );
    let err = interpreter.interpret_health(&widget()).unwrap_err();
    // Either the Lua stack limit ("stack overflow") or the memory limit stops it first.
    let text = err.to_string();
    assert!(
        text.contains("stack overflow") || err.limit() == Some(Limit::Memory),
        "{text}"
    );
    healthy_after(interpreter.runtime());
}

#[test]
fn pcall_cannot_swallow_the_instruction_limit() {
    assert_limit(
        "function InterpretHealth(obj)\n  while true do pcall(function() while true do end end) end\nend",
        Limit::Instructions,
    );
}

#[test]
fn pcall_cannot_swallow_the_memory_limit() {
    assert_limit(
        "function InterpretHealth(obj)\n  local keep = {}\n  while true do\n    local ok = pcall(function() local s = 'x'; while true do s = s .. s; keep[#keep+1] = s end end)\n  end\nend",
        Limit::Memory,
    );
}

#[test]
fn xpcall_handler_cannot_swallow_the_limit() {
    assert_limit(
        "function InterpretHealth(obj)\n  while true do xpcall(function() while true do end end, function(e) return false end) end\nend",
        Limit::Instructions,
    );
}

#[test]
fn pcall_catching_recursion_errors_is_stopped_by_the_budget() {
    // Each deep recursion costs stack memory and instructions: whichever runs out first.
    assert_limit_one_of(
        "local function f() return f() + 1 end\nfunction InterpretHealth(obj)\n  while true do pcall(f) end\nend",
        &[Limit::Instructions, Limit::Memory],
    );
}

#[test]
fn wall_clock_limit_stops_slow_scripts() {
    let limits = Limits {
        instructions: u64::MAX / 2,
        memory_bytes: 4 * 1024 * 1024,
        wall_clock: Duration::from_millis(50),
        ..Limits::default()
    };
    let interpreter = interpreter_with(
        limits,
        1,
        "function InterpretHealth(obj)\n  while true do end\nend",
    );
    let started = Instant::now();
    let err = interpreter.interpret_health(&widget()).unwrap_err();
    assert_eq!(err.limit(), Some(Limit::WallClock), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    healthy_after(interpreter.runtime());
}

#[test]
fn globals_do_not_leak_between_evaluations() {
    let interpreter = interpreter_with(
        Limits::default(),
        1,
        "counter = (counter or 0) + 1\nfunction InterpretHealth(obj)\n  seen = (seen or 0) + 1\n  return {healthy = counter == 1 and seen == 1, reason = tostring(counter) .. '/' .. tostring(seen)}\nend",
    );
    for _ in 0..3 {
        let health = interpreter.interpret_health(&widget()).unwrap().unwrap();
        assert_eq!(health.state, HealthState::Healthy, "{:?}", health.reason);
    }
}

#[test]
fn libraries_are_read_only_across_evaluations() {
    let interpreter = interpreter_with(
        Limits::default(),
        1,
        "function InterpretHealth(obj)\n  local ok = pcall(function() string.upper = nil end)\n  local ok2 = pcall(function() _G.string.x = 1 end)\n  return string.upper('a') == 'A' and not ok and not ok2\nend",
    );
    for _ in 0..2 {
        assert_eq!(
            interpreter
                .interpret_health(&widget())
                .unwrap()
                .unwrap()
                .state,
            HealthState::Healthy
        );
    }
}

#[test]
fn dangerous_functions_are_unavailable() {
    for call in [
        "io.open('/etc/passwd')",
        "debug.getinfo(1)",
        "load('return 1')",
        "loadstring('return 1')",
        "dofile('/etc/passwd')",
        "require('os')",
        "setmetatable({}, {})",
        "getmetatable('')",
        "rawset({}, 1, 1)",
        "os.execute('true')",
        "os.exit(1)",
        "collectgarbage()",
        "string.dump(function() end)",
    ] {
        let script = format!("function InterpretHealth(obj)\n  {call}\n  return true\nend");
        let interpreter = interpreter_with(Limits::default(), 1, &script);
        let err = interpreter.interpret_health(&widget()).unwrap_err();
        assert!(
            matches!(err, InterpretError::Evaluation { .. }),
            "{call}: {err}"
        );
    }
    let interpreter = interpreter_with(
        Limits::default(),
        1,
        "function InterpretHealth(obj)\n  return type(os.time()) == 'number' and type(os.date('!%Y')) == 'string' and unpack({true})\nend",
    );
    assert_eq!(
        interpreter
            .interpret_health(&widget())
            .unwrap()
            .unwrap()
            .state,
        HealthState::Healthy
    );
}

#[test]
fn compile_errors_name_the_script_operation_and_line() {
    let runtime = Arc::new(Runtime::new(RuntimeConfig::default()));
    let mut interpreter = Interpreter::new(runtime);
    let err = interpreter
        .add_yaml(&customization(
            "broken",
            "function InterpretHealth(obj)\n  return obj.status.ready ==\nend",
        ))
        .unwrap_err()
        .to_string();
    assert!(err.contains("broken"), "{err}");
    assert!(err.contains("InterpretHealth"), "{err}");
    assert!(err.contains(":3:"), "{err}");
}

#[test]
fn duplicate_operations_for_one_target_are_rejected() {
    let runtime = Arc::new(Runtime::new(RuntimeConfig::default()));
    let mut interpreter = Interpreter::new(runtime);
    interpreter
        .add_yaml(&customization(
            "first",
            "function InterpretHealth(obj) return true end",
        ))
        .unwrap();
    let err = interpreter
        .add_yaml(&customization(
            "second",
            "function InterpretHealth(obj) return false end",
        ))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("second") && err.contains("first") && err.contains("InterpretHealth"),
        "{err}"
    );
}

#[test]
fn runtime_errors_and_wrong_results_are_errors_for_that_call_only() {
    let interpreter = interpreter_with(
        Limits::default(),
        1,
        "function InterpretHealth(obj)\n  if obj.metadata.name == 'boom' then error('kaboom') end\n  if obj.metadata.name == 'nil' then return nil end\n  return true\nend",
    );
    let mut boom = widget();
    boom["metadata"]["name"] = json!("boom");
    let err = interpreter.interpret_health(&boom).unwrap_err().to_string();
    assert!(err.contains("kaboom") && err.contains(":2:"), "{err}");
    let mut nil = widget();
    nil["metadata"]["name"] = json!("nil");
    let err = interpreter.interpret_health(&nil).unwrap_err().to_string();
    assert!(err.contains("boolean"), "{err}");
    assert_eq!(
        interpreter
            .interpret_health(&widget())
            .unwrap()
            .unwrap()
            .state,
        HealthState::Healthy
    );
}

#[test]
fn pool_reuses_states_and_threads_share_it() {
    let interpreter = Arc::new(interpreter_with(
        Limits::default(),
        2,
        "function InterpretHealth(obj) return obj.status.ready end",
    ));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let interpreter = interpreter.clone();
            std::thread::spawn(move || {
                for _ in 0..50 {
                    let h = interpreter.interpret_health(&widget()).unwrap().unwrap();
                    assert_eq!(h.state, HealthState::Healthy);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    let (idle, bytes) = interpreter.runtime().idle_memory();
    assert!((1..=2).contains(&idle), "idle states: {idle}");
    assert!(bytes > 0);
}

#[test]
fn scripts_are_compiled_once_per_state() {
    let interpreter = interpreter_with(
        Limits::default(),
        1,
        "function InterpretHealth(obj) return obj.status.ready end",
    );
    // Loading compiled the script once (to check it); evaluations reuse that chunk.
    let cached = |i: &Interpreter| {
        i.runtime()
            .with_sandbox(|s| Ok(s.cached_scripts()))
            .unwrap()
    };
    assert_eq!(cached(&interpreter), 1);
    for _ in 0..5 {
        interpreter.interpret_health(&widget()).unwrap();
    }
    assert_eq!(cached(&interpreter), 1);
    healthy_after(interpreter.runtime());
    assert_eq!(
        cached(&interpreter),
        2,
        "a second script gets its own chunk"
    );
}

// ---- Values leaving Lua are bounded (issue 7) ----

/// A ReflectStatus customization: its result is converted to JSON whatever its shape.
fn status_interpreter(limits: Limits, script: &str) -> Interpreter {
    let runtime = Arc::new(Runtime::new(RuntimeConfig {
        limits,
        pool_size: 1,
    }));
    let mut interpreter = Interpreter::new(runtime);
    interpreter
        .add_yaml(&customization_of("hostile", "statusReflection", script))
        .unwrap();
    interpreter
}

/// The result of `script` (a ReflectStatus body) trips `expected`, quickly, with a message that
/// names the limit; the state then runs a good script, and the hostile one is stopped again.
fn assert_result_limit(limits: Limits, input: &Value, script: &str, expected: Limit) {
    let interpreter = status_interpreter(
        limits,
        &format!("function ReflectStatus(obj)\n{}\nend", script),
    );
    for _ in 0..2 {
        let started = Instant::now();
        let err = interpreter.reflect_status(input).unwrap_err();
        assert_eq!(err.limit(), Some(expected), "{script}: {err}");
        assert!(
            err.to_string()
                .contains(&format!("(limit {})", expected.name())),
            "{err}"
        );
        // Bounded work: an unbounded expansion would not finish at all.
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "took {:?}",
            started.elapsed()
        );
        healthy_after(interpreter.runtime());
    }
}

/// A Deployment-sized object: about 150 JSON values.
fn big_object() -> Value {
    let containers: Vec<Value> = (0..6)
        .map(|i| {
            json!({"name": format!("c{i}"), "image": "registry.example/app:1.2.3",
                   "args": ["--port", "8080", "--verbose"],
                   "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                   "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}})
        })
        .collect();
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "labels": {"a": "1"}},
           "spec": {"template": {"spec": {"containers": containers}}}, "status": {"ready": true}})
}

/// Limits for the result tests: a node bound small enough that unoptimised test builds reach
/// it quickly, and a wall clock that a loaded machine does not reach first.
fn node_limits() -> Limits {
    Limits {
        result_nodes: 100_000,
        ..generous_clock()
    }
}

fn generous_clock() -> Limits {
    Limits {
        wall_clock: Duration::from_secs(30),
        ..Limits::default()
    }
}

#[test]
fn shared_references_in_a_result_are_bounded() {
    // 64 levels of {t, t}: a few kilobytes in Lua, 2^64 values as JSON.
    assert_result_limit(
        node_limits(),
        &widget(),
        "local t = {}\nfor i = 1, 64 do t = {t, t} end\nreturn {expanded = t}",
        Limit::ResultNodes,
    );
}

#[test]
fn a_shared_reference_bomb_stops_at_the_node_limit_not_at_the_clock() {
    // The default limits: 1,000,000 nodes and 1 s. Expanding the bomb up to the node limit
    // took longer than the wall clock in a debug build (every hostile evaluation then held a
    // thread for a second); its size is now known before anything is expanded.
    let interpreter = status_interpreter(
        Limits::default(),
        "function ReflectStatus(obj)\n  local t = {}\n  for i = 1, 64 do t = {t, t} end\n  return {expanded = t}\nend",
    );
    for _ in 0..3 {
        let err = interpreter.reflect_status(&widget()).unwrap_err();
        assert_eq!(err.limit(), Some(Limit::ResultNodes), "{err}");
        assert!(
            err.to_string()
                .contains("result exceeds 1,000,000 nodes (limit result_nodes)"),
            "{err}"
        );
    }
}

#[test]
fn the_input_object_returned_many_times_is_bounded() {
    // 10,000 references to the (lazy, never read) input: charged per copy before any copy is made.
    assert_result_limit(
        node_limits(),
        &big_object(),
        "local copies = {}\nfor i = 1, 10000 do copies[i] = obj end\nreturn {copies = copies}",
        Limit::ResultNodes,
    );
    // The same with the input read first (materialized tables, converted node by node).
    assert_result_limit(
        node_limits(),
        &big_object(),
        "local n = #obj.spec.template.spec.containers\nlocal copies = {}\nfor i = 1, 10000 do copies[i] = obj end\nreturn {copies = copies}",
        Limit::ResultNodes,
    );
}

#[test]
fn deep_results_are_bounded() {
    assert_result_limit(
        generous_clock(),
        &widget(),
        "local t = {}\nfor i = 1, 300 do t = {t} end\nreturn {deep = t}",
        Limit::ResultDepth,
    );
    // A table that contains itself ends the same way.
    assert_result_limit(
        generous_clock(),
        &widget(),
        "local t = {}\nt.self = t\nreturn t",
        Limit::ResultDepth,
    );
}

#[test]
fn wide_results_are_bounded() {
    assert_result_limit(
        node_limits(),
        &widget(),
        "local t = {}\nfor i = 1, 200000 do t[i] = i end\nreturn {wide = t}",
        Limit::ResultNodes,
    );
}

#[test]
fn large_strings_repeated_in_a_result_are_bounded() {
    // 1 MB in Lua, 100 MB as JSON.
    assert_result_limit(
        generous_clock(),
        &widget(),
        "local s = string.rep('x', 1000000)\nlocal t = {}\nfor i = 1, 100 do t[i] = s end\nreturn {strings = t}",
        Limit::ResultBytes,
    );
}

#[test]
fn the_wall_clock_covers_the_conversion_of_the_result() {
    let limits = Limits {
        wall_clock: Duration::from_millis(20),
        result_nodes: u64::MAX / 2,
        result_bytes: u64::MAX / 2,
        ..Limits::default()
    };
    // Built in microseconds, 2^23 values to convert.
    assert_result_limit(
        limits,
        &widget(),
        "local t = {}\nfor i = 1, 22 do t = {t, t} end\nreturn {expanded = t}",
        Limit::WallClock,
    );
}

#[test]
fn results_within_the_limits_are_unchanged() {
    let interpreter = status_interpreter(
        Limits::default(),
        "function ReflectStatus(obj)\n  local t = {}\n  for i = 1, 3 do t[i] = {n = i, tags = {'a', 'b'}} end\n  return {items = t, spec = obj.spec}\nend",
    );
    let status = interpreter.reflect_status(&widget()).unwrap().unwrap();
    assert_eq!(status["items"][2], json!({"n": 3, "tags": ["a", "b"]}));
    assert_eq!(status["spec"], Value::Null);
}

#[test]
fn kube_helper_arguments_are_bounded() {
    let limits = Limits {
        result_nodes: 10_000,
        ..Limits::default()
    };
    // A pod template with shared references: stopped at the node bound, with the limit named.
    let interpreter = status_interpreter(
        limits,
        "local kube = require('kube')\nfunction ReflectStatus(obj)\n  local t = {}\n  for i = 1, 40 do t = {t, t} end\n  local ok, err = pcall(kube.accuratePodRequirements, {spec = {containers = t}})\n  return {ok = ok, err = err}\nend",
    );
    let status = interpreter.reflect_status(&widget()).unwrap().unwrap();
    assert_eq!(status["ok"], json!(false));
    let err = status["err"].as_str().unwrap();
    assert!(
        err.contains("accuratePodRequirements") && err.contains("(limit result_nodes)"),
        "{err}"
    );
    // Quantity and namespace strings are refused by length before they are copied.
    let interpreter = status_interpreter(
        Limits::default(),
        "local kube = require('kube')\nfunction ReflectStatus(obj)\n  local huge = string.rep('1', 10000000)\n  local a, e1 = pcall(kube.resourceAdd, huge)\n  local b, e2 = pcall(kube.getResourceQuantity, huge)\n  local c, e3 = pcall(kube.getPodDependencies, {spec = {}}, huge)\n  return {a = a, b = b, c = c, e1 = e1, e2 = e2, e3 = e3}\nend",
    );
    let status = interpreter.reflect_status(&widget()).unwrap().unwrap();
    for (ok, err) in [("a", "e1"), ("b", "e2"), ("c", "e3")] {
        assert_eq!(status[ok], json!(false));
        let err = status[err].as_str().unwrap();
        assert!(err.contains("10000000 bytes") && err.len() < 200, "{err}");
    }
}

#[test]
fn error_messages_are_truncated_in_lua() {
    let interpreter = interpreter_with(
        Limits::default(),
        1,
        "function InterpretHealth(obj)\n  if obj.metadata.name == 'table' then error({}) end\n  error(string.rep('x', 10000000))\nend",
    );
    let err = interpreter
        .interpret_health(&widget())
        .unwrap_err()
        .to_string();
    assert!(err.len() < 4096 + 200, "{} bytes", err.len());
    assert!(
        err.ends_with("... (truncated)"),
        "{}",
        &err[err.len() - 40..]
    );
    let mut table = widget();
    table["metadata"]["name"] = json!("table");
    let err = interpreter
        .interpret_health(&table)
        .unwrap_err()
        .to_string();
    assert!(err.contains("(error object is a table value)"), "{err}");
    healthy_after(interpreter.runtime());
}

#[test]
fn memory_stays_bounded_during_a_long_c_call() {
    // One C call each, allocating through Lua's allocator: stopped at the memory limit inside
    // the call, not after it.
    assert_limit(
        "function InterpretHealth(obj)\n  local s = string.rep('x', 100000)\n  local t = {}\n  for i = 1, 1000 do t[i] = s end\n  return #table.concat(t) > 0\nend",
        Limit::Memory,
    );
    assert_limit(
        "function InterpretHealth(obj)\n  local s = string.rep('x', 100000)\n  return #string.gsub(s, 'x', string.rep('y', 1000)) > 0\nend",
        Limit::Memory,
    );
    assert_limit(
        "function InterpretHealth(obj)\n  return #string.rep('x', 100000, string.rep(',', 1000)) > 0\nend",
        Limit::Memory,
    );
}
