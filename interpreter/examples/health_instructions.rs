//! Runs InterpretHealth N times on one of the benchmark objects with the built-in interpreters,
//! for counting instructions with valgrind, which a loaded shared machine does not disturb:
//!
//! ```text
//! cargo build --release -p lifeboat-interpreter --example health_instructions
//! valgrind --tool=cachegrind --cache-sim=no target/release/examples/health_instructions deployment 1000
//! valgrind --tool=cachegrind --cache-sim=no target/release/examples/health_instructions deployment 11000
//! ```
//!
//! The difference of the two totals (`I refs`) divided by 10,000 is the instructions per
//! evaluation, start-up excluded.

use std::sync::Arc;

use lifeboat_interpreter::{Interpreter, Runtime, RuntimeConfig, builtin};

#[path = "../benches/objects/mod.rs"]
mod objects;

fn main() {
    let mut args = std::env::args().skip(1);
    let object = match args.next().as_deref() {
        Some("deployment") => objects::deployment(),
        Some("appwrapper") => objects::appwrapper(),
        _ => {
            eprintln!("usage: health_instructions deployment|appwrapper EVALUATIONS");
            std::process::exit(2);
        }
    };
    let evaluations: usize = match args.next().map(|n| n.parse()) {
        Some(Ok(n)) => n,
        _ => {
            eprintln!("usage: health_instructions deployment|appwrapper EVALUATIONS");
            std::process::exit(2);
        }
    };
    let runtime = Arc::new(Runtime::new(RuntimeConfig {
        pool_size: 1,
        ..RuntimeConfig::default()
    }));
    let mut interpreter = Interpreter::new(runtime);
    if let Err(e) = builtin::load(&mut interpreter) {
        eprintln!("cannot load the built-in interpreters: {e}");
        std::process::exit(1);
    }
    for _ in 0..evaluations {
        if let Err(e) = interpreter.interpret_health(&object) {
            eprintln!("evaluation failed: {e}");
            std::process::exit(1);
        }
    }
}
