//! The status processor's interpreting under customizations (issue 18 parts 6 and 7), in this
//! process, no apiserver: the processor's decision core ([`StatusState`]) and its engine
//! ([`Engine`]: the lanes' threads, deferral of slow items, re-evaluation on a change) with the
//! real interpreters (built-ins plus customizations).
//!
//! `--hostile`: five hostile customizations (kinds `example.com/v1 Hostile0..4`) and one
//! unrelated AppWrapper. Each round, a batch from cluster m1 with one report of each hostile
//! kind and a batch from m2 with the AppWrapper's report arrive at the same instant, the
//! hostile one first; the figure is the time from their arrival to the AppWrapper's health being
//! decided (its item in the processor's state). `--script bomb` (default): the hostile
//! ReflectStatus returns a result made of shared references (`{t, t}` 64 times); `--script
//! spin`: the hostile InterpretHealth loops until the wall clock (1 s) stops it. `--sequential`:
//! the processor's loop before the lanes (`StatusState::process`: the batch's interpretations
//! all done, then the next batch). `--runs` rounds (5), each with new objects.
//!
//! `--reinterpret`: `--bindings` (10,000) AppWrappers on `--clusters` (10) clusters, reported
//! and interpreted; then a customization of AppWrappers is applied: the figure is the time until
//! every binding's last object is interpreted again and folded in. Meanwhile a stream of reports
//! goes on (`--rate` batches/s of 100 changed AppWrapper objects, 20 by default), and its batch
//! latencies (arrival to folded in) are shown against the same stream with no change going on.
//!
//!   cargo bench -p lifeboat-hub --bench interpreting -- --hostile [--sequential] [--script spin]
//!   cargo bench -p lifeboat-hub --bench interpreting -- --reinterpret [--bindings 10000]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use lifeboat_api::binding::ResourceHealth;
use lifeboat_api::protocol::{ObservedObject, StatusReport, Work, WorkKey, WorkStatus};
use lifeboat_hub::interpreters::Interpreters;
use lifeboat_hub::interpreters::lanes::{Pool, SLOW_AFTER};
use lifeboat_hub::status::intake::StatusBatch;
use lifeboat_hub::status::processor::{Engine, StatusState};
use lifeboat_hub::work::store::WorkStore;
use lifeboat_interpreter::{Runtime, RuntimeConfig};
use serde_json::{Value, json};

struct Args {
    hostile: bool,
    reinterpret: bool,
    sequential: bool,
    spin: bool,
    runs: usize,
    bindings: usize,
    clusters: usize,
    rate: u64,
}

fn args() -> Result<Args, String> {
    let mut parsed = Args {
        hostile: false,
        reinterpret: false,
        sequential: false,
        spin: false,
        runs: 5,
        bindings: 10_000,
        clusters: 10,
        rate: 20,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut number = |name: &str| {
            it.next()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match arg.as_str() {
            "--hostile" => parsed.hostile = true,
            "--reinterpret" => parsed.reinterpret = true,
            "--sequential" => parsed.sequential = true,
            "--runs" => parsed.runs = number("--runs")? as usize,
            "--bindings" => parsed.bindings = number("--bindings")? as usize,
            "--clusters" => parsed.clusters = number("--clusters")?.max(1) as usize,
            "--rate" => parsed.rate = number("--rate")?.max(1),
            "--script" => match it.next().as_deref() {
                Some("bomb") => parsed.spin = false,
                Some("spin") => parsed.spin = true,
                other => return Err(format!("--script: bomb or spin, got {other:?}")),
            },
            // cargo bench passes --bench.
            _ => {}
        }
    }
    if parsed.hostile == parsed.reinterpret {
        return Err("give --hostile or --reinterpret".into());
    }
    Ok(parsed)
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Reports are stamped with a counter (replay screening needs each newer than the last).
fn stamp(n: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + n).unwrap_or_default())
}

fn customization(name: &str, api_version: &str, kind: &str, scripts: Value) -> Value {
    json!({
        "apiVersion": "config.lifeboat.dev/v1alpha1",
        "kind": "ResourceInterpreterCustomization",
        "metadata": {"name": name},
        "spec": {"target": {"apiVersion": api_version, "kind": kind}, "customizations": scripts}
    })
}

fn layered(runtime: &Arc<Runtime>, customizations: &[Value]) -> Result<Interpreters, String> {
    let builtin = Interpreters::builtin(runtime.clone()).map_err(|e| e.to_string())?;
    let objects = customizations
        .iter()
        .map(|c| serde_json::from_value(c.clone()).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let (layered, rejected) = Interpreters::layered(builtin, &objects);
    if !rejected.is_empty() {
        return Err(format!("rejected: {rejected:?}"));
    }
    Ok(layered)
}

fn appwrapper(name: &str, round: usize) -> Value {
    json!({
        "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
        "metadata": {"name": name, "namespace": "bench", "generation": 1,
                     "annotations": {"round": round.to_string()}},
        "spec": {"components": []},
        "status": {"phase": "Running", "conditions": [
            {"type": "PodsReady", "status": "True", "reason": "x", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    })
}

fn report(key: &WorkKey, n: i64, object: &Value) -> Result<WorkStatus, String> {
    Ok(WorkStatus {
        key: key.clone(),
        binding_uid: format!("uid-{}", key.name),
        revision: 1,
        applied: true,
        applied_message: None,
        observed: Some(ObservedObject::from_value(object).map_err(|e| e.to_string())?),
        observed_at: stamp(n),
        reset_generation: None,
        fenced: false,
        gone: false,
    })
}

fn work(store: &WorkStore, cluster: &str, name: &str) -> WorkKey {
    let key = WorkKey {
        namespace: "bench".into(),
        name: name.into(),
    };
    store.upsert(
        cluster,
        Work {
            key: key.clone(),
            binding_uid: format!("uid-{name}"),
            manifest: json!({}),
            ..Default::default()
        },
    );
    key
}

fn batch(cluster: &str, items: Vec<WorkStatus>) -> StatusBatch {
    StatusBatch::from_agent(cluster.into(), StatusReport { items, full: false })
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn hostile(args: &Args) -> Result<(), String> {
    let runtime = Arc::new(Runtime::new(RuntimeConfig::default()));
    let scripts = if args.spin {
        json!({"healthInterpretation": {"luaScript": "function InterpretHealth(obj) while true do end end"}})
    } else {
        json!({"statusReflection": {"luaScript": "function ReflectStatus(obj)\n  local t = {}\n  for i = 1, 64 do t = {t, t} end\n  return {expanded = t}\nend"}})
    };
    let customizations: Vec<Value> = (0..5)
        .map(|i| {
            customization(
                &format!("hostile-{i}"),
                "example.com/v1",
                &format!("Hostile{i}"),
                scripts.clone(),
            )
        })
        .collect();
    let interpreters = Arc::new(layered(&runtime, &customizations)?);
    let store = WorkStore::new("bench");
    let hostile_keys: Vec<WorkKey> = (0..5)
        .map(|i| work(&store, "m1", &format!("hostile-{i}")))
        .collect();
    let aw = work(&store, "m2", "train");
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| e.to_string())?;
    let state = Arc::new(Mutex::new(StatusState::default()));
    let mut engine = Engine::new(
        state.clone(),
        Arc::new(Pool::new(threads(), SLOW_AFTER)),
        interpreters.clone(),
        SLOW_AFTER,
    );
    let mut latencies = Vec::new();
    for round in 0..args.runs {
        let n = round as i64 + 1;
        let hostile_batch = batch(
            "m1",
            hostile_keys
                .iter()
                .enumerate()
                .map(|(i, k)| {
                    report(
                        k,
                        n,
                        &json!({"apiVersion": "example.com/v1", "kind": format!("Hostile{i}"),
                                "metadata": {"name": k.name, "namespace": "bench"},
                                "status": {"round": round}}),
                    )
                })
                .collect::<Result<_, _>>()?,
        );
        let aw_batch = batch("m2", vec![report(&aw, n, &appwrapper("train", round))?]);
        let arrived = Instant::now();
        let decided = if args.sequential {
            let mut s = state.lock().map_err(|e| e.to_string())?;
            s.process(&hostile_batch, &store, |_| None, &interpreters, &now());
            s.process(&aw_batch, &store, |_| None, &interpreters, &now());
            arrived.elapsed()
        } else {
            tokio.block_on(async {
                engine
                    .batch(
                        Arc::new(hostile_batch),
                        &store,
                        |_| None,
                        &interpreters,
                        &now(),
                    )
                    .await;
                engine
                    .batch(Arc::new(aw_batch), &store, |_| None, &interpreters, &now())
                    .await;
            });
            arrived.elapsed()
        };
        let health = state
            .lock()
            .map_err(|e| e.to_string())?
            .items(&aw)
            .first()
            .map(|i| i.health);
        if health != Some(ResourceHealth::Healthy) {
            return Err(format!("round {round}: the AppWrapper is {health:?}"));
        }
        println!(
            "round {round}: the AppWrapper's health decided {:.3} s after its report arrived",
            decided.as_secs_f64()
        );
        latencies.push(decided.as_secs_f64());
        if !args.sequential {
            // Let the hostile evaluations of this round end before the next (each round
            // measures a fresh arrival, not a backlog).
            tokio.block_on(async {
                let deadline = Instant::now() + Duration::from_secs(30);
                while engine_pending(&state, &hostile_keys) && Instant::now() < deadline {
                    if let Ok(Some(done)) =
                        tokio::time::timeout(Duration::from_millis(100), engine.next_done()).await
                    {
                        engine.late(done, &now());
                    }
                }
            });
        }
    }
    latencies.sort_by(f64::total_cmp);
    println!(
        "hostile ({}, {}): AppWrapper decided after median {:.3} s, max {:.3} s over {} rounds",
        if args.spin { "spin" } else { "bomb" },
        if args.sequential {
            "sequential"
        } else {
            "lanes"
        },
        quantile(&latencies, 0.5),
        latencies.last().copied().unwrap_or(f64::NAN),
        latencies.len()
    );
    Ok(())
}

/// Whether some hostile item has not been folded in for the last round yet.
fn engine_pending(state: &Arc<Mutex<StatusState>>, keys: &[WorkKey]) -> bool {
    let state = state.lock().unwrap_or_else(|e| e.into_inner());
    keys.iter().any(|k| state.pending(k))
}

fn reinterpret(args: &Args) -> Result<(), String> {
    let runtime = Arc::new(Runtime::new(RuntimeConfig::default()));
    let plain = Arc::new(layered(&runtime, &[])?);
    let changed = Arc::new(layered(
        &runtime,
        &[customization(
            "appwrapper-health",
            "workload.codeflare.dev/v1beta2",
            "AppWrapper",
            json!({"healthInterpretation": {"luaScript": "function InterpretHealth(obj)\n  return obj.status ~= nil and obj.status.phase == 'Running'\nend"}}),
        )],
    )?);
    let store = WorkStore::new("bench");
    let clusters: Vec<String> = (0..args.clusters).map(|c| format!("gpu-{c:03}")).collect();
    let keys: Vec<(String, WorkKey)> = (0..args.bindings)
        .map(|i| {
            let cluster = clusters[i % clusters.len()].clone();
            let key = work(&store, &cluster, &format!("aw-{i:05}"));
            (cluster, key)
        })
        .collect();
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| e.to_string())?;
    let state = Arc::new(Mutex::new(StatusState::default()));
    let mut engine = Engine::new(
        state,
        Arc::new(Pool::new(threads(), SLOW_AFTER)),
        plain.clone(),
        SLOW_AFTER,
    );
    // Every binding reported and interpreted once.
    let started = Instant::now();
    tokio.block_on(async {
        for cluster in &clusters {
            let items: Vec<WorkStatus> = keys
                .iter()
                .filter(|(c, _)| c == cluster)
                .map(|(_, k)| report(k, 1, &appwrapper(&k.name, 0)))
                .collect::<Result<_, _>>()?;
            for chunk in items.chunks(500) {
                engine
                    .batch(
                        Arc::new(batch(cluster, chunk.to_vec())),
                        &store,
                        |_| None,
                        &plain,
                        &now(),
                    )
                    .await;
            }
        }
        Ok::<(), String>(())
    })?;
    println!(
        "{} bindings on {} clusters reported and interpreted in {:.2} s",
        keys.len(),
        clusters.len(),
        started.elapsed().as_secs_f64()
    );
    // The stream of reports meanwhile: 100 changed objects per batch, `rate` per second.
    let stream = |engine: &mut Engine,
                  with_change: bool,
                  round: &mut usize|
     -> Result<(f64, Vec<f64>), String> {
        tokio.block_on(async {
            let interpreters = if with_change { changed.clone() } else { plain.clone() };
            let started = Instant::now();
            let expected = if with_change {
                engine.interpreters_changed(changed.clone())
            } else {
                0
            };
            let mut folded = 0usize;
            let mut latencies = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(1000 / args.rate));
            let mut next = 0usize;
            let mut reinterpreted_after = None;
            // At least 2 s of stream; with the change, until every re-evaluation came.
            while started.elapsed() < Duration::from_secs(2) || folded < expected {
                tokio::select! {
                    biased;
                    _ = tick.tick() => {
                        *round += 1;
                        let cluster = &clusters[next % clusters.len()];
                        let items: Vec<WorkStatus> = keys
                            .iter()
                            .filter(|(c, _)| c == cluster)
                            .skip((next / clusters.len()) * 100 % (keys.len() / clusters.len()).max(1))
                            .take(100)
                            .map(|(_, k)| report(k, 1 + *round as i64, &appwrapper(&k.name, *round)))
                            .collect::<Result<_, _>>()?;
                        next += 1;
                        let arrived = Instant::now();
                        let p = engine
                            .batch(Arc::new(batch(cluster, items)), &store, |_| None, &interpreters, &now())
                            .await;
                        folded += p.reevaluated;
                        latencies.push(arrived.elapsed().as_secs_f64());
                    }
                    Some(done) = engine.next_done() => {
                        folded += engine.late(done, &now()).reevaluated;
                    }
                }
                if folded >= expected && expected > 0 && reinterpreted_after.is_none() {
                    reinterpreted_after = Some(started.elapsed().as_secs_f64());
                }
            }
            latencies.sort_by(f64::total_cmp);
            Ok((reinterpreted_after.unwrap_or(0.0), latencies))
        })
    };
    let mut round = 0usize;
    let (_, baseline) = stream(&mut engine, false, &mut round)?;
    let (took, during) = stream(&mut engine, true, &mut round)?;
    println!(
        "re-interpreting {} bindings after a customization change: {:.2} s",
        keys.len(),
        took
    );
    println!(
        "report batches (100 changed AppWrappers, {}/s) arrival to folded in: without a change p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} batches); during the re-evaluation p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} batches)",
        args.rate,
        quantile(&baseline, 0.5) * 1e3,
        quantile(&baseline, 0.99) * 1e3,
        baseline.last().copied().unwrap_or(f64::NAN) * 1e3,
        baseline.len(),
        quantile(&during, 0.5) * 1e3,
        quantile(&during, 0.99) * 1e3,
        during.last().copied().unwrap_or(f64::NAN) * 1e3,
        during.len(),
    );
    Ok(())
}

fn main() {
    let result = args().and_then(|args| {
        println!("{} cores", threads());
        if args.hostile {
            hostile(&args)
        } else {
            reinterpret(&args)
        }
    });
    if let Err(e) = result {
        eprintln!("interpreting bench: {e}");
        std::process::exit(1);
    }
}
