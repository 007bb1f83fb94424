//! End-to-end figures of the agent on the local fleet (a benchmark, not a test):
//!
//! 1. steady state: one member with N AppWrappers of P pods each, all Running; the agent (the
//!    release binary, a separate process) is sampled for CPU over a window and for memory;
//! 2. failure detection: a pod of F of those AppWrappers is failed; the latency from the pod
//!    being seen Failed to the AppWrapper's Unhealthy condition being seen True, both through
//!    watches of this process.
//!
//!   cargo bench -p lifeboat-agent --bench agent -- [--appwrappers 1000] [--pods 4]
//!       [--failures 100] [--window 60]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use lifeboat_api::appwrapper::AppWrapper;
use lifeboat_e2e::fleet::{Fleet, FleetConfig, workspace_root};
use lifeboat_e2e::{faults, process, wait};
use serde_json::json;

struct Args {
    appwrappers: usize,
    pods: usize,
    failures: usize,
    window: u64,
}

fn args() -> Args {
    let mut a = Args {
        appwrappers: 1000,
        pods: 4,
        failures: 100,
        window: 60,
    };
    let argv: Vec<String> = std::env::args().collect();
    let value = |name: &str| {
        argv.iter()
            .position(|x| x == name)
            .and_then(|i| argv.get(i + 1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    if let Some(v) = value("--appwrappers") {
        a.appwrappers = v as usize;
    }
    if let Some(v) = value("--pods") {
        a.pods = v as usize;
    }
    if let Some(v) = value("--failures") {
        a.failures = v as usize;
    }
    if let Some(v) = value("--window") {
        a.window = v;
    }
    a
}

/// CPU seconds (user + system) a process has used so far.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, utime 14, stime 15 (1-based in proc(5)).
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args = args();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let nodes = (args.appwrappers * args.pods).div_ceil(100).max(4);
    let mut config = FleetConfig::new(workspace_root().join("target/agent-bench"));
    config.members = 1;
    config.nodes_per_member = nodes;
    let started = Instant::now();
    let fleet = Fleet::up(config).await?;
    println!(
        "fleet: 1 member, {nodes} nodes, ready in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let cluster = "member-1";
    let client = fleet.client(cluster).await?;
    let log = fleet.state_dir().join("agent.log");
    let mut agent = std::process::Command::new(env!("CARGO_BIN_EXE_lifeboat-agent"))
        .arg("--kubeconfig")
        .arg(fleet.kubeconfig(cluster)?)
        .args(["--cluster-name", cluster, "--metrics-bind", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(log.with_extension("err"))?)
        .spawn()?;
    let result = bench(&fleet, &client, &args, agent.id()).await;
    let _ = agent.kill();
    let _ = agent.wait();
    fleet.teardown();
    result
}

async fn bench(
    _fleet: &Fleet,
    client: &kube::Client,
    args: &Args,
    agent_pid: u32,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let ns = "bench";
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), ns);
    wait::until(
        "default service account",
        Duration::from_secs(60),
        || async {
            sa.get_opt("default")
                .await
                .map_err(|e| e.to_string())?
                .ok_or("not yet".to_string())
        },
    )
    .await?;
    let api: Api<AppWrapper> = Api::namespaced(client.clone(), ns);
    let crds_ready = Instant::now();
    wait::until("AppWrapper CRD served", Duration::from_secs(60), || async {
        api.list(&ListParams::default().limit(1))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await?;
    let _ = crds_ready;

    // 1. N AppWrappers of P pods, all Running with PodsReady.
    let created = Instant::now();
    let mut creates = futures::stream::iter(0..args.appwrappers)
        .map(|i| {
            let api = api.clone();
            let pods = args.pods;
            async move {
                let aw: AppWrapper = serde_json::from_value(json!({
                    "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
                    // Long graces: creating thousands of pods takes the control plane minutes,
                    // and the failures injected below must not reset anything.
                    "metadata": {"name": format!("aw-{i}"), "annotations": {
                        "workload.codeflare.dev.appwrapper/admissionGracePeriodDuration": "1h",
                        "workload.codeflare.dev.appwrapper/warmupGracePeriodDuration": "1h",
                        "workload.codeflare.dev.appwrapper/failureGracePeriodDuration": "1h"}},
                    "spec": {"components": [{"template": {
                        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": format!("job-{i}")},
                        "spec": {"parallelism": pods, "completions": pods, "template": {"spec": {
                            "restartPolicy": "Never",
                            "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", "sleep infinity"],
                                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}}}}]}
                }))
                .map_err(|e| e.to_string())?;
                api.create(&PostParams::default(), &aw).await.map_err(|e| e.to_string())?;
                Ok::<_, String>(())
            }
        })
        .buffer_unordered(16);
    while let Some(r) = creates.next().await {
        r?;
    }
    println!(
        "created {} AppWrappers in {:.1}s",
        args.appwrappers,
        created.elapsed().as_secs_f64()
    );
    let ready_timeout = Duration::from_secs(60 + (args.appwrappers * args.pods) as u64 / 5);
    wait::until("all AppWrappers ready", ready_timeout, || async {
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let ready = list
            .items
            .iter()
            .filter(|aw| {
                aw.status
                    .as_ref()
                    .is_some_and(|s| s.condition("PodsReady").is_some_and(|c| c.status == "True"))
            })
            .count();
        if ready == args.appwrappers {
            Ok(())
        } else {
            tokio::time::sleep(Duration::from_secs(2)).await;
            Err(format!("{ready}/{} ready", args.appwrappers))
        }
    })
    .await?;
    println!(
        "{} AppWrappers x {} pods Running and PodsReady after {:.1}s",
        args.appwrappers,
        args.pods,
        created.elapsed().as_secs_f64()
    );
    // Settle, then sample the agent over the window.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let cpu0 = cpu_seconds(agent_pid).ok_or("agent gone")?;
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.window)).await;
    let cpu1 = cpu_seconds(agent_pid).ok_or("agent gone")?;
    let wall = t0.elapsed().as_secs_f64();
    let rss = process::rss_bytes(agent_pid as i32).unwrap_or(0) as f64 / 1048576.0;
    let hwm = process::peak_rss_bytes(agent_pid as i32).unwrap_or(0) as f64 / 1048576.0;
    println!(
        "steady state over {wall:.0}s: agent CPU {:.2}% of a core, RSS {rss:.0} MiB (peak {hwm:.0} MiB)",
        100.0 * (cpu1 - cpu0) / wall
    );

    // 2. Failure detection latency, through watches of this process.
    let pod_failed: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let unhealthy: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pf = pod_failed.clone();
    let pod_watch = tokio::spawn(async move {
        let mut stream = std::pin::pin!(
            watcher(pods_api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        while let Some(Ok(pod)) = stream.next().await {
            if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
                && let Some(aw) = pod
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("workload.codeflare.dev/appwrapper"))
            {
                pf.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(aw.clone())
                    .or_insert_with(Instant::now);
            }
        }
    });
    let uh = unhealthy.clone();
    let aw_api = api.clone();
    let aw_watch = tokio::spawn(async move {
        let mut stream = std::pin::pin!(
            watcher(aw_api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        while let Some(Ok(aw)) = stream.next().await {
            let is_unhealthy = aw
                .status
                .as_ref()
                .is_some_and(|s| s.condition("Unhealthy").is_some_and(|c| c.status == "True"));
            if is_unhealthy && let Some(name) = aw.metadata.name.clone() {
                uh.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(name)
                    .or_insert_with(Instant::now);
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let failures = args.failures.min(args.appwrappers);
    for i in 0..failures {
        let aw = format!("aw-{i}");
        let pods = pods_api_list(client, ns, &aw).await?;
        let pod = pods.first().ok_or("no pod")?;
        faults::fail_pod(client, ns, pod, 1).await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait::until(
        "every failure noticed",
        Duration::from_secs(120),
        || async {
            let seen = unhealthy.lock().unwrap_or_else(|e| e.into_inner()).len();
            if seen >= failures {
                Ok(())
            } else {
                Err(format!("{seen}/{failures}"))
            }
        },
    )
    .await?;
    pod_watch.abort();
    aw_watch.abort();
    let pod_failed = pod_failed.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let unhealthy = unhealthy.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut latencies: Vec<f64> = (0..failures)
        .filter_map(|i| {
            let name = format!("aw-{i}");
            let failed = pod_failed.get(&name)?;
            let noticed = unhealthy.get(&name)?;
            Some(noticed.saturating_duration_since(*failed).as_secs_f64())
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    println!(
        "pod Failed -> AppWrapper Unhealthy ({} failures, with {} AppWrappers present): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        latencies.len(),
        args.appwrappers,
        1000.0 * percentile(&latencies, 0.5),
        1000.0 * percentile(&latencies, 0.99),
        1000.0 * latencies.last().copied().unwrap_or(f64::NAN)
    );
    Ok(())
}

async fn pods_api_list(
    client: &kube::Client,
    ns: &str,
    aw: &str,
) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("workload.codeflare.dev/appwrapper={aw}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|p| p.metadata.name)
        .collect())
}
