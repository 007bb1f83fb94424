//! Sandbox behaviour: restricted libraries, limits that survive pcall, clean globals, caching.

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
    format!(
        "apiVersion: config.lifeboat.dev/v1alpha1\nkind: ResourceInterpreterCustomization\nmetadata:\n  name: {name}\nspec:\n  target:\n    apiVersion: example.com/v1\n    kind: Widget\n  customizations:\n    healthInterpretation:\n      luaScript: |\n{}",
        indent(health_script)
    )
}

/// Small limits so hostile scripts are stopped quickly.
fn small_limits() -> Limits {
    Limits {
        instructions: 2_000_000,
        memory_bytes: 4 * 1024 * 1024,
        wall_clock: Duration::from_secs(2),
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
