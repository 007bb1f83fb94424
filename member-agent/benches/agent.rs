//! End-to-end figures of the agent on the local fleet (a benchmark, not a test):
//!
//! 1. steady state: one member with N AppWrappers of P pods each, all Running; the agent (the
//!    release binary, a separate process) is sampled for CPU over a window and for memory
//!    (skipped with `--window 0`);
//! 2. failure detection, one at a time: a pod of F of those AppWrappers is failed, 200 ms apart;
//! 3. failure detection in a burst: a pod of each of B further AppWrappers is failed at once (all
//!    the patches issued concurrently, as a reclaimed spot node or a rack losing power would).
//!    These AppWrappers are reset for real (issue 20): their Job has `backoffLimit: 0` and the
//!    AppWrapper a 1 h `retryPauseDuration`, so the failed pod fails the Job, the AppWrapper goes
//!    Running -> Resetting and its reset deletes the Job (and so its pod) on the API server; the
//!    report adds pod Failed -> Resetting and -> the reset's deletion done (ResourcesDeployed
//!    False). Their `failureGracePeriodDuration` is `--burst-failure-grace` seconds (default 0:
//!    reset at the pod's failure; with 3600 the reset waits for the Job controller to mark the
//!    Job Failed, which the report times too).
//!
//! The latency is taken from the pod being seen Failed to the AppWrapper's Unhealthy condition
//! being seen True, both through watches of this process. A negative figure (the condition seen
//! before the pod's own event reached this process) is reported as it is, and counted. After
//! each phase the agent's own histograms (queue wait and reconcile time) are read from its
//! `/metrics`, so the report says where the time went.
//!
//!   cargo bench -p lifeboat-agent --bench agent -- [--appwrappers 1000] [--pods 4]
//!       [--failures 100] [--burst 0] [--window 60] [--burst-failure-grace 0]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use lifeboat_api::appwrapper::constants::APPWRAPPER_LABEL;
use lifeboat_api::appwrapper::{AppWrapper, AppWrapperPhase};
use lifeboat_e2e::fleet::{Fleet, FleetConfig, workspace_root};
use lifeboat_e2e::process::cpu_seconds;
use lifeboat_e2e::{faults, load_average, process, wait};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    appwrappers: usize,
    pods: usize,
    failures: usize,
    burst: usize,
    window: u64,
    /// `failureGracePeriodDuration` of the burst's AppWrappers, in seconds.
    burst_failure_grace: u64,
}

fn args() -> Args {
    let mut a = Args {
        appwrappers: 1000,
        pods: 4,
        failures: 100,
        burst: 0,
        window: 60,
        burst_failure_grace: 0,
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
    if let Some(v) = value("--burst") {
        a.burst = v as usize;
    }
    if let Some(v) = value("--window") {
        a.window = v;
    }
    if let Some(v) = value("--burst-failure-grace") {
        a.burst_failure_grace = v;
    }
    a
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn main() -> Result<(), BoxError> {
    let args = args();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> Result<(), BoxError> {
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
    let metrics: SocketAddr = ([127, 0, 0, 1], lifeboat_e2e::ports::free_port()?).into();
    // AGENT_BENCH_BIN runs another build of the agent (e.g. a "before" for comparison).
    let binary = std::env::var("AGENT_BENCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_lifeboat-agent").to_string());
    println!("agent: {binary}");
    let mut agent = std::process::Command::new(binary)
        .arg("--kubeconfig")
        .arg(fleet.kubeconfig(cluster)?)
        .args(["--cluster-name", cluster, "--metrics-bind"])
        .arg(metrics.to_string())
        // The agent's log filter: `warn` unless AGENT_BENCH_LOG says otherwise (e.g.
        // `info,lifeboat_agent=debug` to see each reconcile and its queue wait).
        .env(
            "RUST_LOG",
            std::env::var("AGENT_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(log.with_extension("err"))?)
        .spawn()?;
    let result = bench(&client, &args, agent.id(), metrics).await;
    let _ = agent.kill();
    let _ = agent.wait();
    fleet.teardown();
    result
}

async fn bench(
    client: &kube::Client,
    args: &Args,
    agent_pid: u32,
    metrics: SocketAddr,
) -> Result<(), BoxError> {
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
    wait::until("AppWrapper CRD served", Duration::from_secs(60), || async {
        api.list(&ListParams::default().limit(1))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await?;

    // 1. N AppWrappers of P pods, all Running with PodsReady.
    let created = Instant::now();
    let mut creates = futures::stream::iter(0..args.appwrappers)
        .map(|i| {
            let api = api.clone();
            let pods = args.pods;
            // The burst's AppWrappers (after the one-at-a-time ones) are reset for real: their
            // Job has no retries of its own, so one failed pod fails it and the AppWrapper goes
            // Running -> Resetting, deleting the Job (and so its pods), then pauses an hour.
            let resets = i >= args.failures;
            let backoff_limit = if resets { 0 } else { 6 };
            // The burst's: reset at the pod's failure (grace 0, the default), or only once the
            // Job controller says the Job failed (a grace longer than that takes).
            let failure_grace = if resets {
                format!("{}s", args.burst_failure_grace)
            } else {
                "1h".to_string()
            };
            async move {
                let aw: AppWrapper = serde_json::from_value(json!({
                    "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
                    // Long graces: creating thousands of pods takes the control plane minutes,
                    // and the failures injected below must not reset anything by a grace.
                    "metadata": {"name": format!("aw-{i}"), "annotations": {
                        "workload.codeflare.dev.appwrapper/admissionGracePeriodDuration": "1h",
                        "workload.codeflare.dev.appwrapper/warmupGracePeriodDuration": "1h",
                        "workload.codeflare.dev.appwrapper/failureGracePeriodDuration": failure_grace,
                        "workload.codeflare.dev.appwrapper/retryPauseDuration": "1h"}},
                    "spec": {"components": [{"template": {
                        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": format!("job-{i}")},
                        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": backoff_limit, "template": {"spec": {
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
    if args.window > 0 {
        let cpu0 = cpu_seconds(agent_pid as i32).ok_or("agent gone")?;
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_secs(args.window)).await;
        let cpu1 = cpu_seconds(agent_pid as i32).ok_or("agent gone")?;
        let wall = t0.elapsed().as_secs_f64();
        let rss = process::rss_bytes(agent_pid as i32).unwrap_or(0) as f64 / 1048576.0;
        let hwm = process::peak_rss_bytes(agent_pid as i32).unwrap_or(0) as f64 / 1048576.0;
        println!(
            "steady state over {wall:.0}s: agent CPU {:.2}% of a core, RSS {rss:.0} MiB (peak {hwm:.0} MiB)",
            100.0 * (cpu1 - cpu0) / wall
        );
    }

    // 2. and 3. Failure detection latency, through watches of this process.
    let seen = Seen::watch(client, ns).await?;
    let failures = args.failures.min(args.appwrappers);
    if failures > 0 {
        let names: Vec<String> = (0..failures).map(|i| format!("aw-{i}")).collect();
        let pods = running_pods(client, ns).await?;
        let before = scrape(metrics).await;
        for name in &names {
            let pod = pods
                .get(name)
                .ok_or_else(|| format!("no running pod of {name}"))?;
            faults::fail_pod(client, ns, pod, 1).await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        seen.wait_for(&names).await?;
        let after = scrape(metrics).await;
        seen.report(
            &format!(
                "one at a time, 200 ms apart, {} AppWrappers present; load average {}",
                args.appwrappers,
                load_average()
            ),
            &names,
        );
        report_agent(&before, &after);
    }
    let burst = args.burst.min(args.appwrappers - failures);
    if burst > 0 {
        let names: Vec<String> = (failures..failures + burst)
            .map(|i| format!("aw-{i}"))
            .collect();
        let pods = running_pods(client, ns).await?;
        let targets: Vec<&String> = names
            .iter()
            .map(|name| {
                pods.get(name)
                    .ok_or_else(|| format!("no running pod of {name}"))
            })
            .collect::<Result<_, _>>()?;
        let before = scrape(metrics).await;
        let server_before = scrape_apiserver(client).await;
        let t0 = Instant::now();
        // Every patch in flight at once: the burst is as tight as the API server allows.
        let results = futures::future::join_all(
            targets
                .iter()
                .map(|pod| faults::fail_pod(client, ns, pod, 1)),
        )
        .await;
        let issued = t0.elapsed();
        for r in results {
            r?;
        }
        seen.wait_for(&names).await?;
        let all_noticed = t0.elapsed();
        Seen::wait_for_in(&seen.resetting, "Resetting", &names).await?;
        Seen::wait_for_in(&seen.reset_done, "reset (Job deleted)", &names).await?;
        let all_reset = t0.elapsed();
        let after = scrape(metrics).await;
        let server_after = scrape_apiserver(client).await;
        let spread = seen.pod_failed_spread(&names);
        println!(
            "burst of {burst}: the {burst} fail patches returned within {:.0} ms; the pods were seen Failed over {:.0} ms; the last Unhealthy seen {:.0} ms after the first patch; machine load average (1 min) {}",
            issued.as_secs_f64() * 1000.0,
            spread.as_secs_f64() * 1000.0,
            all_noticed.as_secs_f64() * 1000.0,
            load_average(),
        );
        let what = format!(
            "burst of {burst} at once, {} AppWrappers present",
            args.appwrappers
        );
        seen.report(&what, &names);
        let (failed, job) = (&seen.pod_failed, &seen.job_failed);
        for (later, to, earlier, from) in [
            (
                &seen.job_failure_target,
                "Job FailureTarget (Job controller)",
                failed,
                "pod Failed",
            ),
            (job, "Job Failed (Job controller)", failed, "pod Failed"),
            (
                &seen.resetting,
                "AppWrapper Resetting",
                failed,
                "pod Failed",
            ),
            (&seen.resetting, "AppWrapper Resetting", job, "Job Failed"),
            (
                &seen.reset_done,
                "reset deleted its Job (ResourcesDeployed False)",
                failed,
                "pod Failed",
            ),
        ] {
            Seen::report_between(later, to, earlier, from, &what, &names);
        }
        println!(
            "burst of {burst}: every reset's deletion done {:.0} ms after the first patch",
            all_reset.as_secs_f64() * 1000.0
        );
        report_agent(&before, &after);
        report_apiserver(&server_before, &server_after);
    }
    Ok(())
}

type Instants = Arc<Mutex<HashMap<String, Instant>>>;

/// When this process saw each AppWrapper's first failed pod, its Unhealthy condition, its phase
/// Resetting, and its reset's deletion done (Resetting with ResourcesDeployed False).
struct Seen {
    pod_failed: Instants,
    unhealthy: Instants,
    resetting: Instants,
    reset_done: Instants,
    /// The Job controller's FailureTarget and Failed conditions on the wrapped Job.
    job_failure_target: Instants,
    job_failed: Instants,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn first_seen(map: &Instants, name: &str) {
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    if !map.contains_key(name) {
        map.insert(name.to_string(), Instant::now());
    }
}

impl Drop for Seen {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Feeds `on_object` every object a watch reports; counts the watches that completed their list.
fn spawn_watch<K>(
    api: Api<K>,
    synced: Arc<AtomicUsize>,
    mut on_object: impl FnMut(K) + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::InitDone) => {
                    synced.fetch_add(1, Ordering::SeqCst);
                }
                Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) => on_object(obj),
                Ok(_) => {}
                Err(e) => eprintln!("benchmark watch: {e}"),
            }
        }
    })
}

impl Seen {
    async fn watch(client: &kube::Client, ns: &str) -> Result<Self, BoxError> {
        let pod_failed: Instants = Arc::default();
        let unhealthy: Instants = Arc::default();
        let resetting: Instants = Arc::default();
        let reset_done: Instants = Arc::default();
        let job_failure_target: Instants = Arc::default();
        let job_failed: Instants = Arc::default();
        let synced = Arc::new(AtomicUsize::new(0));
        let (jt, jf) = (job_failure_target.clone(), job_failed.clone());
        let jobs = spawn_watch(
            Api::<Job>::namespaced(client.clone(), ns),
            synced.clone(),
            move |job: Job| {
                let Some(aw) = job
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(APPWRAPPER_LABEL))
                else {
                    return;
                };
                let conditions = job.status.and_then(|s| s.conditions).unwrap_or_default();
                for c in conditions.iter().filter(|c| c.status == "True") {
                    match c.type_.as_str() {
                        "FailureTarget" => first_seen(&jt, aw),
                        "Failed" => first_seen(&jf, aw),
                        _ => {}
                    }
                }
            },
        );

        let pf = pod_failed.clone();
        let pods = spawn_watch(
            Api::<Pod>::namespaced(client.clone(), ns),
            synced.clone(),
            move |pod: Pod| {
                if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
                    && let Some(aw) = pod
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(APPWRAPPER_LABEL))
                {
                    pf.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(aw.clone())
                        .or_insert_with(Instant::now);
                }
            },
        );
        let (uh, rs, rd) = (unhealthy.clone(), resetting.clone(), reset_done.clone());
        let appwrappers = spawn_watch(
            Api::<AppWrapper>::namespaced(client.clone(), ns),
            synced.clone(),
            move |aw: AppWrapper| {
                let (Some(name), Some(status)) = (aw.metadata.name.as_deref(), aw.status.as_ref())
                else {
                    return;
                };
                let is = |type_: &str, value: &str| {
                    status.condition(type_).is_some_and(|c| c.status == value)
                };
                if is("Unhealthy", "True") {
                    first_seen(&uh, name);
                }
                if status.phase == AppWrapperPhase::Resetting {
                    first_seen(&rs, name);
                    if is("ResourcesDeployed", "False") {
                        first_seen(&rd, name);
                    }
                }
            },
        );
        let seen = Seen {
            pod_failed,
            unhealthy,
            resetting,
            reset_done,
            job_failure_target,
            job_failed,
            tasks: vec![pods, appwrappers, jobs],
        };
        wait::until(
            "benchmark watches listed",
            Duration::from_secs(60),
            || async {
                match synced.load(Ordering::SeqCst) {
                    3.. => Ok(()),
                    n => Err(format!("{n}/3 watches listed")),
                }
            },
        )
        .await?;
        Ok(seen)
    }

    /// Waits until each of `names` was seen in `map` (`what` names the state).
    async fn wait_for_in(map: &Instants, what: &str, names: &[String]) -> Result<(), BoxError> {
        wait::until(
            &format!("every AppWrapper {what}"),
            Duration::from_secs(300),
            || async {
                let map = map.lock().unwrap_or_else(|e| e.into_inner());
                let seen = names.iter().filter(|n| map.contains_key(*n)).count();
                if seen == names.len() {
                    Ok(())
                } else {
                    Err(format!("{seen}/{} {what}", names.len()))
                }
            },
        )
        .await?;
        Ok(())
    }

    async fn wait_for(&self, names: &[String]) -> Result<(), BoxError> {
        Self::wait_for_in(&self.unhealthy, "Unhealthy", names).await
    }

    /// From the first to the last of these pods seen Failed.
    fn pod_failed_spread(&self, names: &[String]) -> Duration {
        let pod_failed = self.pod_failed.lock().unwrap_or_else(|e| e.into_inner());
        let times: Vec<Instant> = names
            .iter()
            .filter_map(|n| pod_failed.get(n))
            .copied()
            .collect();
        match (times.iter().min(), times.iter().max()) {
            (Some(first), Some(last)) => last.duration_since(*first),
            _ => Duration::ZERO,
        }
    }

    /// Prints the latency from pod Failed to Unhealthy, negative gaps included.
    fn report(&self, what: &str, names: &[String]) {
        Self::report_between(
            &self.unhealthy,
            "AppWrapper Unhealthy",
            &self.pod_failed,
            "pod Failed",
            what,
            names,
        );
    }

    /// Prints the latency from the state of `earlier` (`from` names it) to the state of `later`
    /// (`to`), negative gaps included.
    fn report_between(
        later: &Instants,
        to: &str,
        earlier: &Instants,
        from: &str,
        what: &str,
        names: &[String],
    ) {
        let pod_failed = earlier.lock().unwrap_or_else(|e| e.into_inner());
        let unhealthy = later.lock().unwrap_or_else(|e| e.into_inner());
        let mut latencies: Vec<f64> = Vec::with_capacity(names.len());
        let mut unmatched = 0;
        for name in names {
            match (pod_failed.get(name), unhealthy.get(name)) {
                (Some(failed), Some(noticed)) => latencies.push(signed_seconds(*failed, *noticed)),
                _ => unmatched += 1,
            }
        }
        latencies.sort_by(f64::total_cmp);
        let negative = latencies.iter().filter(|l| **l < 0.0).count();
        let ms = |p: f64| 1000.0 * percentile(&latencies, p);
        println!(
            "{from} -> {to} ({what}; {} failures): p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms, min {:.0} ms; {negative} negative (seen before the pod's Failed event){}",
            latencies.len(),
            ms(0.5),
            ms(0.9),
            ms(0.99),
            ms(1.0),
            ms(0.0),
            if unmatched > 0 {
                format!("; {unmatched} without both states seen")
            } else {
                String::new()
            }
        );
    }
}

/// `later - earlier` in seconds, negative when `later` came first.
fn signed_seconds(earlier: Instant, later: Instant) -> f64 {
    match later.checked_duration_since(earlier) {
        Some(d) => d.as_secs_f64(),
        None => -earlier.duration_since(later).as_secs_f64(),
    }
}

/// The first Running pod of each AppWrapper in `ns`, by AppWrapper name.
async fn running_pods(
    client: &kube::Client,
    ns: &str,
) -> Result<HashMap<String, String>, BoxError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(APPWRAPPER_LABEL))
        .await?;
    let mut by_appwrapper: HashMap<String, String> = HashMap::new();
    for pod in list.items {
        if pod.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running") {
            continue;
        }
        let aw = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(APPWRAPPER_LABEL))
            .cloned();
        if let (Some(aw), Some(name)) = (aw, pod.metadata.name) {
            by_appwrapper.entry(aw).or_insert(name);
        }
    }
    Ok(by_appwrapper)
}

/// One Prometheus histogram read from the text format: cumulative counts by upper bound, sum.
#[derive(Debug, Default, Clone)]
struct Histogram {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

/// The agent's metrics at one moment: histograms and counters, keyed by name and labels
/// (`le` excluded), e.g. `lifeboat_agent_api_request_duration_seconds{request="status"}`.
#[derive(Debug, Default)]
struct Scrape {
    histograms: HashMap<String, Histogram>,
    counters: HashMap<String, f64>,
}

/// `name{labels}` without the `le` label, and the `le` bound if there was one.
fn series_key(name: &str, labels: &str) -> (String, Option<f64>) {
    let mut le = None;
    let kept: Vec<&str> = labels
        .split(',')
        .filter(|kv| !kv.is_empty())
        .filter(|kv| match kv.strip_prefix("le=\"") {
            Some(v) => {
                le = v.trim_end_matches('"').parse::<f64>().ok();
                false
            }
            None => true,
        })
        .collect();
    if kept.is_empty() {
        (name.to_string(), le)
    } else {
        (format!("{name}{{{}}}", kept.join(",")), le)
    }
}

/// The agent's metrics now (empty when /metrics cannot be read).
async fn scrape(addr: SocketAddr) -> Scrape {
    let text = match http_get(addr, "/metrics").await {
        Ok(text) => text,
        Err(e) => {
            eprintln!("reading the agent's /metrics: {e}");
            return Scrape::default();
        }
    };
    parse_metrics(&text)
}

/// The API server's own metrics now, to tell its time from the agent's.
async fn scrape_apiserver(client: &kube::Client) -> Scrape {
    let request = match http::Request::get("/metrics").body(Vec::new()) {
        Ok(r) => r,
        Err(_) => return Scrape::default(),
    };
    match client.request_text(request).await {
        Ok(text) => parse_metrics(&text),
        Err(e) => {
            eprintln!("reading the API server's /metrics: {e}");
            Scrape::default()
        }
    }
}

/// Histograms and counters of a Prometheus text exposition.
fn parse_metrics(text: &str) -> Scrape {
    let mut out = Scrape::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if let Some(base) = name.strip_suffix("_bucket") {
            let (key, le) = series_key(base, labels);
            if let Some(le) = le {
                out.histograms
                    .entry(key)
                    .or_default()
                    .buckets
                    .push((le, value));
            }
        } else if let Some(base) = name.strip_suffix("_sum") {
            out.histograms
                .entry(series_key(base, labels).0)
                .or_default()
                .sum = value;
        } else if let Some(base) = name.strip_suffix("_count") {
            out.histograms
                .entry(series_key(base, labels).0)
                .or_default()
                .count = value;
        } else {
            out.counters.insert(series_key(name, labels).0, value);
        }
    }
    out
}

async fn http_get(addr: SocketAddr, path: &str) -> Result<String, BoxError> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default())
}

impl Histogram {
    /// The observations between two scrapes.
    fn since(&self, before: Option<&Histogram>) -> Histogram {
        let Some(before) = before else {
            return self.clone();
        };
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|(le, n)| {
                    let old = before
                        .buckets
                        .iter()
                        .find(|(l, _)| l == le)
                        .map_or(0.0, |(_, n)| *n);
                    (*le, n - old)
                })
                .collect(),
            sum: self.sum - before.sum,
            count: self.count - before.count,
        }
    }

    /// Upper bound of the bucket that holds the `p` quantile.
    fn quantile_bound(&self, p: f64) -> f64 {
        let rank = (self.count * p).ceil();
        self.buckets
            .iter()
            .find(|(_, n)| *n >= rank)
            .map_or(f64::INFINITY, |(le, _)| *le)
    }
}

/// Prints, for the reconciles between two scrapes, how long they waited and how long they ran,
/// what their API requests took, and how many were skipped or failed.
fn report_agent(before: &Scrape, after: &Scrape) {
    let mut histograms: Vec<(String, String)> = vec![
        (
            "lifeboat_agent_reconcile_queue_wait_seconds".into(),
            "queue wait".into(),
        ),
        (
            "lifeboat_agent_reconcile_duration_seconds".into(),
            "reconcile time".into(),
        ),
    ];
    let mut requests: Vec<&String> = after
        .histograms
        .keys()
        .filter(|k| k.starts_with("lifeboat_agent_api_request_duration_seconds{"))
        .collect();
    requests.sort();
    for key in requests {
        let request = key
            .split_once("request=\"")
            .map_or(key.as_str(), |(_, r)| r.trim_end_matches("\"}"));
        histograms.push((key.clone(), format!("API {request}")));
    }
    for (name, what) in &histograms {
        let Some(now) = after.histograms.get(name) else {
            println!("  agent {what}: not reported ({name})");
            continue;
        };
        let h = now.since(before.histograms.get(name));
        if h.count == 0.0 {
            continue;
        }
        let bound = |p: f64| match h.quantile_bound(p) {
            b if b.is_finite() => format!("<= {:.0} ms", b * 1000.0),
            _ => "above the largest bucket".to_string(),
        };
        println!(
            "  agent {what} over {} observations: mean {:.1} ms, p50 {}, p99 {}",
            h.count,
            1000.0 * h.sum / h.count,
            bound(0.5),
            bound(0.99),
        );
    }
    let mut counters: Vec<(&String, f64)> = after
        .counters
        .iter()
        .filter(|(k, _)| {
            k.starts_with("lifeboat_agent_reconciles_")
                || k.starts_with("lifeboat_agent_reconcile_errors_total")
        })
        .map(|(k, v)| (k, v - before.counters.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect();
    counters.sort_by(|a, b| a.0.cmp(b.0));
    for (name, delta) in counters {
        println!("  agent {name}: +{delta}");
    }
}

/// Prints how long the API server itself took over the AppWrapper status writes between two
/// scrapes (its `apiserver_request_duration_seconds`, from reading the request to the response).
fn report_apiserver(before: &Scrape, after: &Scrape) {
    for (key, now) in &after.histograms {
        if !(key.starts_with("apiserver_request_duration_seconds{")
            && key.contains("resource=\"appwrappers\"")
            && key.contains("subresource=\"status\"")
            && key.contains("verb=\"PATCH\""))
        {
            continue;
        }
        let h = now.since(before.histograms.get(key));
        if h.count == 0.0 {
            continue;
        }
        let bound = |p: f64| match h.quantile_bound(p) {
            b if b.is_finite() => format!("<= {:.0} ms", b * 1000.0),
            _ => "above the largest bucket".to_string(),
        };
        println!(
            "  API server, AppWrapper status PATCH over {} requests: mean {:.1} ms, p50 {}, p99 {}",
            h.count,
            1000.0 * h.sum / h.count,
            bound(0.5),
            bound(0.99),
        );
    }
}
