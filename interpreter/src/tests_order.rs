//! Determinism (issue 11): `pairs`/`next` follow gopher-lua's order (positive integer keys
//! ascending, then other keys in insertion order), and nothing that varies per Lua state (the
//! string-hash seed, addresses, the random generator, the C sort's pivots) reaches a result.

use std::sync::Arc;
use std::time::Duration;

use crate::{AggregatedStatusItem, Interpreter, Limits, Runtime, RuntimeConfig};
use serde_json::{Value, json};

const EVALUATIONS: usize = 1000;
const THREADS: usize = 4;

fn customization(field: &str, script: &str) -> String {
    let body: String = script.lines().map(|l| format!("        {l}\n")).collect();
    format!(
        "apiVersion: config.lifeboat.dev/v1alpha1\nkind: ResourceInterpreterCustomization\nmetadata:\n  name: order\nspec:\n  target:\n    apiVersion: example.com/v1\n    kind: Widget\n  customizations:\n    {field}:\n      luaScript: |\n{body}"
    )
}

fn interpreter(runtime: &Arc<Runtime>, field: &str, script: &str) -> Interpreter {
    let mut interpreter = Interpreter::new(runtime.clone());
    interpreter.add_yaml(&customization(field, script)).unwrap();
    interpreter
}

/// Runs `evaluate` EVALUATIONS times: THREADS threads on a pool of THREADS states, and every
/// 100 evaluations a fresh runtime (new states, new hash seeds). Returns every result.
fn across_states<T: Send + 'static>(
    field: &'static str,
    script: &'static str,
    evaluate: impl Fn(&Interpreter) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let evaluate = Arc::new(evaluate);
    let mut results = Vec::with_capacity(EVALUATIONS);
    let mut states = 0;
    for _ in 0..EVALUATIONS / 100 {
        let runtime = Arc::new(Runtime::new(RuntimeConfig {
            pool_size: THREADS,
            // Not under test here; generous for unoptimised builds on a loaded machine.
            limits: Limits {
                wall_clock: Duration::from_secs(30),
                ..Limits::default()
            },
        }));
        let interpreter = Arc::new(interpreter(&runtime, field, script));
        let start = Arc::new(std::sync::Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let interpreter = interpreter.clone();
                let evaluate = evaluate.clone();
                let start = start.clone();
                std::thread::spawn(move || {
                    start.wait();
                    (0..100 / THREADS)
                        .map(|_| evaluate(&interpreter))
                        .collect::<Vec<T>>()
                })
            })
            .collect();
        for handle in handles {
            results.extend(handle.join().unwrap());
        }
        states += runtime.idle_memory().0;
    }
    assert_eq!(results.len(), EVALUATIONS);
    // At least one state per runtime (usually more: the threads overlap).
    assert!(
        states >= EVALUATIONS / 100,
        "only {states} states were used"
    );
    results
}

fn reason(interpreter: &Interpreter, object: &Value) -> String {
    interpreter
        .interpret_health(object)
        .unwrap()
        .unwrap()
        .reason
        .unwrap()
}

fn widget() -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})
}

/// Fills a table in a known order and returns its `pairs` walk (and a manual `next` walk).
const FILL_AND_WALK: &str = r#"
local function walk(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = tostring(k) end
  local manual, k = {}, next(t)
  while k ~= nil do manual[#manual + 1] = tostring(k); k = next(t, k) end
  assert(table.concat(keys, ",") == table.concat(manual, ","), "next and pairs disagree")
  return table.concat(keys, ",")
end
function InterpretHealth(obj)
  local filled = {}
  for _, k in ipairs({"zeta", "alpha", "mu", "beta", "omega", "kappa", "delta", "epsilon",
                      "gamma", "iota", "lambda", "theta", "eta", "nu", "xi", "rho"}) do
    filled[k] = true
  end
  local built = {zulu = 1, alpha = 2, mike = 3, [10] = 4, bravo = 5}
  built.yankee = 6
  built[2] = 7
  local mixed = {"a", "b", k = 1, [-1] = 2, [1.5] = 3}
  mixed[4] = "d"
  mixed[3] = "c"
  mixed.j = 4
  local readded = {a = 1, b = 2, c = 3}
  readded.a = nil
  readded.d = 4
  readded.a = 5
  -- A repeated name and a nil field; names before and after a computed key.
  local repeated = {b = 1, a = 2, b = 3, c = nil, d = 4}
  repeated.e = 5
  local key = "k" .. #filled
  local around = {y = 1, x = 2, y = 3, [key] = 4, [key] = 5, w = 6, x = 7}
  around.v = 8
  return {healthy = true, reason = walk(filled) .. "|" .. walk(built) .. "|" .. walk(mixed)
    .. "|" .. walk(readded) .. "|" .. walk(repeated) .. "|" .. walk(around)}
end
"#;

#[test]
fn tables_filled_by_a_script_iterate_in_insertion_order() {
    let expected = "zeta,alpha,mu,beta,omega,kappa,delta,epsilon,gamma,iota,lambda,theta,eta,nu,xi,rho\
        |2,10,zulu,alpha,mike,bravo,yankee\
        |1,2,3,4,k,-1,1.5,j\
        |a,b,c,d\
        |b,a,d,e\
        |y,x,k0,w,v";
    let results = across_states("healthInterpretation", FILL_AND_WALK, |i| {
        reason(i, &widget())
    });
    for result in &results {
        assert_eq!(result, expected);
    }
}

#[test]
fn input_objects_iterate_in_field_order_then_insertion_order() {
    // Small flat objects are converted at once, larger ones lazily: both keep the order.
    let script = r#"
function InterpretHealth(obj)
  local function walk(t)
    local keys = {}
    for k in pairs(t) do keys[#keys + 1] = k end
    return table.concat(keys, ",")
  end
  local labels = obj.metadata.labels
  labels.added = "1"
  labels.also = "2"
  return {healthy = true, reason = walk(labels) .. "|" .. walk(obj.spec.selector) .. "|" .. walk(obj)}
end
"#;
    let object = json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "labels": {"tier": "web", "app": "shop", "zone": "a", "team": "x"}},
        "spec": {"selector": {"role": "db", "env": {"name": "prod"}, "app": "shop", "b": 1, "a": 2,
                              "c": 3, "d": 4, "e": 5, "f": 6, "g": 7}}
    });
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    let expected = format!(
        "{},added,also|{}|{}",
        keys(&object["metadata"]["labels"]).join(","),
        keys(&object["spec"]["selector"]).join(","),
        keys(&object).join(",")
    );
    // serde_json keeps an object's fields sorted (the workspace does not enable
    // `preserve_order`): that is the field order a script sees.
    assert!(expected.starts_with("app,team,tier,zone,added,also|a,app,b,c"));
    let results = across_states("healthInterpretation", script, move |i| reason(i, &object));
    for result in &results {
        assert_eq!(result, &expected);
    }
}

#[test]
fn condition_aggregation_keeps_karmadas_order() {
    // The shape of the upstream customization from the issue: latest condition per type,
    // collected with pairs.
    let script = r#"
function AggregateStatus(desiredObj, statusItems)
  local latestByType = {}
  for i = 1, #statusItems do
    local status = statusItems[i].status
    for _, c in ipairs(status.conditions or {}) do
      local seen = latestByType[c.type]
      if seen == nil or c.lastTransitionTime > seen.lastTransitionTime then
        latestByType[c.type] = c
      end
    end
  end
  local conditions = {}
  for _, v in pairs(latestByType) do
    table.insert(conditions, v)
  end
  desiredObj.status = {conditions = conditions}
  return desiredObj
end
"#;
    let condition = |kind: &str, time: &str| json!({"type": kind, "status": "True", "lastTransitionTime": time});
    let items: Vec<AggregatedStatusItem> = serde_json::from_value(json!([
        {"clusterName": "m1", "status": {"conditions": [
            condition("Running", "2026-01-01T00:00:01Z"),
            condition("Available", "2026-01-01T00:00:02Z")]}},
        {"clusterName": "m2", "status": {"conditions": [
            condition("Available", "2026-01-01T00:00:05Z"),
            condition("Progressing", "2026-01-01T00:00:03Z")]}}
    ]))
    .unwrap();
    let expected = json!([
        condition("Running", "2026-01-01T00:00:01Z"),
        condition("Available", "2026-01-01T00:00:05Z"),
        condition("Progressing", "2026-01-01T00:00:03Z")
    ]);
    let results = across_states("statusAggregation", script, move |i| {
        i.aggregate_status(&widget(), Some(&items))
            .unwrap()
            .unwrap()
    });
    for result in &results {
        assert_eq!(result["status"]["conditions"], expected);
    }
}

#[test]
fn addresses_random_numbers_and_sorting_do_not_vary_per_state() {
    let script = r#"
function InterpretHealth(obj)
  local a, b = {}, function() end
  local texts = {tostring(a), tostring(b), tostring(a), string.format("%s %s", a, b)}
  local ok = pcall(string.format, "%p", a)
  local randoms = {}
  for i = 1, 5 do randoms[i] = math.random(1000000) end
  -- 300 elements, many ties: the C quicksort would randomise pivots.
  local items = {}
  for i = 1, 300 do items[i] = {key = i % 7, id = i} end
  table.sort(items, function(x, y) return x.key < y.key end)
  local order = {}
  for i = 1, 300 do order[i] = items[i].id end
  return {healthy = not ok, reason = table.concat(texts, ";") .. "|" .. table.concat(randoms, ",")
    .. "|" .. table.concat(order, ",")}
end
"#;
    let results = across_states("healthInterpretation", script, |i| {
        let health = i.interpret_health(&widget()).unwrap().unwrap();
        (health.healthy(), health.reason.unwrap())
    });
    let first = &results[0];
    assert_eq!(first.0, Some(true), "%p must be refused");
    assert!(
        first
            .1
            .starts_with("table: 0x00000001;function: 0x00000002;table: 0x00000001;"),
        "{}",
        first.1
    );
    // The stable sort keeps ties in input order.
    let order: Vec<u32> = first
        .1
        .rsplit('|')
        .next()
        .unwrap()
        .split(',')
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(&order[..3], &[7, 14, 21]);
    for result in &results {
        assert_eq!(result, first);
    }
}
