//! `Fleet::up` must not flake: two fleets come up at the same time, in two state dirs, while
//! every core is kept busy, several times in a row. Both compete for loopback ports the whole
//! time (and for the CPU, which stretches the window between picking a port and binding it).
//!
//! `LIFEBOAT_FLEET_UP_LOOPS` sets the number of rounds (default 3; each starts two small fleets).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lifeboat_e2e::fleet::{Fleet, FleetConfig, workspace_root};

const DEFAULT_ROUNDS: usize = 3;

fn config(name: &str) -> FleetConfig {
    let mut config = FleetConfig::new(workspace_root().join("target/e2e-fleets").join(name));
    config.members = 1;
    config.nodes_per_member = 1;
    config
}

/// Busy threads, one per core, until dropped.
struct CpuLoad {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl CpuLoad {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x: u64 = 1;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005));
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for CpuLoad {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_fleets_come_up_at_once_under_cpu_load_round_after_round() {
    let rounds = std::env::var("LIFEBOAT_FLEET_UP_LOOPS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEFAULT_ROUNDS);
    // Restarts on a taken port are logged as warnings: shown with --nocapture.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("warn,lifeboat_e2e=info,kube_client=off")
        .with_test_writer()
        .try_init();
    let _load = CpuLoad::start();
    for round in 1..=rounds {
        let started = Instant::now();
        let (a, b) = tokio::join!(
            Fleet::up(config("up-loop-a")),
            Fleet::up(config("up-loop-b")),
        );
        let (a, b) = match (a, b) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => panic!(
                "round {round}: fleet a: {:?}; fleet b: {:?}",
                a.err().map(|e| e.to_string()),
                b.err().map(|e| e.to_string())
            ),
        };
        for (name, fleet) in [("a", &a), ("b", &b)] {
            let status = fleet.status().await;
            assert_eq!(
                status.len(),
                2,
                "round {round}, fleet {name}: hub and one member"
            );
            for cluster in status {
                assert!(
                    cluster.ready,
                    "round {round}, fleet {name}: {} not ready: {}",
                    cluster.name, cluster.reason
                );
            }
        }
        // The two fleets share no port.
        let ports = |fleet: &Fleet| -> Vec<u16> {
            let state = fleet.snapshot();
            state
                .etcd
                .ports
                .iter()
                .chain(
                    state
                        .clusters
                        .iter()
                        .flat_map(|c| c.processes.iter().flat_map(|p| &p.ports)),
                )
                .copied()
                .collect()
        };
        let (ports_a, ports_b) = (ports(&a), ports(&b));
        assert_eq!(
            ports_a.len(),
            8,
            "etcd 2, apiservers 2, controller-managers 2, scheduler, kwok"
        );
        assert!(
            ports_a.iter().all(|p| !ports_b.contains(p)),
            "{ports_a:?} {ports_b:?}"
        );
        eprintln!(
            "round {round}: both fleets ready in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        a.teardown();
        b.teardown();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
