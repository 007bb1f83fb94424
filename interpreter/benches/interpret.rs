//! Criterion benchmarks: InterpretHealth on an AppWrapper and on a Deployment with the built-in
//! interpreters (JSON -> Lua conversion included), a Karmada-style re-parse baseline, and the
//! memory of a pool of 8 states under load.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use lifeboat_interpreter::sandbox::Arg;
use lifeboat_interpreter::{
    Interpreter, Operation, ResourceInterpreterCustomization, Runtime, RuntimeConfig, Script,
    builtin,
};

mod objects;
use objects::{appwrapper, deployment};

fn builtin_interpreter(pool_size: usize) -> Interpreter {
    let runtime = Arc::new(Runtime::new(RuntimeConfig {
        pool_size,
        ..RuntimeConfig::default()
    }));
    let mut interpreter = Interpreter::new(runtime);
    builtin::load(&mut interpreter).expect("built-in interpreters load");
    interpreter
}

fn health(c: &mut Criterion) {
    let interpreter = builtin_interpreter(1);
    let mut group = c.benchmark_group("interpret_health");
    group.throughput(Throughput::Elements(1));
    for (name, object) in [("deployment", deployment()), ("appwrapper", appwrapper())] {
        assert!(
            interpreter
                .interpret_health(&object)
                .expect("health")
                .is_some()
        );
        group.bench_function(name, |b| {
            b.iter(|| {
                interpreter
                    .interpret_health(black_box(&object))
                    .expect("health")
            })
        });
    }
    group.finish();
}

/// The Deployment health script, through the sandbox directly: compiled once (Lifeboat) versus
/// compiled on every call (Karmada's cost model, karmada#7597).
fn cached_vs_reparse(c: &mut Criterion) {
    let customization =
        ResourceInterpreterCustomization::parse_documents(builtin::CUSTOMIZATIONS[1].1)
            .expect("deployment customization")
            .remove(0);
    let source = customization
        .spec
        .customizations
        .script(Operation::InterpretHealth)
        .expect("health script")
        .to_string();
    let runtime = Runtime::new(RuntimeConfig::default());
    let deployment = deployment();
    let evaluate = |script: &Script| {
        runtime
            .with_sandbox(|sandbox| {
                sandbox.evaluate(
                    script,
                    "InterpretHealth",
                    &[Arg::Object(&deployment)],
                    |_, results, _| Ok(results.len()),
                )
            })
            .expect("evaluation")
    };
    let mut group = c.benchmark_group("deployment_health_script");
    group.throughput(Throughput::Elements(1));
    let cached = Script::new("cached", source.clone());
    group.bench_function("compiled_once", |b| b.iter(|| evaluate(black_box(&cached))));
    group.bench_function("compiled_every_call", |b| {
        b.iter(|| evaluate(&Script::new("reparsed", black_box(source.as_str()))))
    });
    group.finish();
}

/// Resident memory of this process (Linux), for the pool measurement.
fn resident_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Memory of a pool of 8 states after 8 threads evaluated both kinds concurrently.
fn pool_memory(c: &mut Criterion) {
    let rss_before = resident_kib();
    let interpreter = Arc::new(builtin_interpreter(8));
    let objects = Arc::new([deployment(), appwrapper()]);
    let run_load = |iterations: usize| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let interpreter = interpreter.clone();
                let objects = objects.clone();
                std::thread::spawn(move || {
                    for i in 0..iterations {
                        let object = &objects[i % 2];
                        interpreter.interpret_health(object).expect("health");
                        interpreter.reflect_status(object).expect("status");
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.join().expect("worker thread");
        }
    };
    run_load(20_000);
    let (idle, bytes) = interpreter.runtime().idle_memory();
    println!(
        "pool_memory: {idle} idle Lua states hold {bytes} bytes ({:.1} KiB per state); process RSS {:?} KiB before the pool, {:?} KiB after 8 threads x 20000 x (health + status)",
        bytes as f64 / 1024.0 / idle.max(1) as f64,
        rss_before,
        resident_kib()
    );
    let mut group = c.benchmark_group("pool8_under_load");
    group.sample_size(10);
    group.throughput(Throughput::Elements(8 * 2 * 1000));
    group.bench_function("8_threads_x_1000_health_and_status", |b| {
        b.iter(|| run_load(1000))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(5));
    targets = health, cached_vs_reparse, pool_memory
}
criterion_main!(benches);
