//! The hub end to end on a local fleet: templates applied to the hub apiserver until every
//! ResourceBinding is `Scheduled=True`, and the hub's memory per binding.
//!
//! The real hub runs in this process (`lifeboat_hub::process::run`, the binary's defaults: 32 binder
//! workers unless `--binder-workers N`, 8 status writers, a SQLite ledger under `target/`) against the fleet's hub
//! apiserver. The clusters are simulated agents (`support/sim_agent.rs`) that speak the real agent
//! protocol over HTTPS: each registers with a bootstrap token, sends heartbeats with a GPU
//! inventory (nodes of 8 H100s) at the interval the hub asks for, and holds its work stream open,
//! counting the work it is handed. Besides them, the fleet's real members (3 unless
//! `--real-members N`; each 2 kwok nodes of 8 GPUs) run the real agent (`lifeboat_agent`, in this
//! process) in hub mode: they register with the same bootstrap token, and the AppWrappers placed
//! on them are applied there (the bench waits for each in its member). The figure runs from the
//! first create to the last binding scheduled.
//!
//! Templates are AppWrappers (one Job component, one pod asking for 1 GPU), selected by one
//! PropagationPolicy per run; a gang workload goes whole to one cluster, which the bench checks
//! on every binding. Creates run 16 at a time, as fast as the apiserver takes them; completion
//! is seen through a watch of the bindings (no polling).
//!
//!   cargo bench -p lifeboat-hub --bench hub_e2e -- --runs 3 [--templates 1000] [--clusters 100] [--real-members 3]
//!   cargo bench -p lifeboat-hub --bench hub_e2e -- --memory [--templates 10000] [--clusters 10]
//!
//! `--memory`: one run in a fresh process; the process's VmRSS (hub and simulated agents) once
//! the clusters are Ready and idle, and again once every binding is scheduled and its work has
//! reached its cluster's stream; the difference per binding.

#[path = "support/sim_agent.rs"]
mod sim_agent;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use lifeboat_api::binding::ResourceBinding;
use lifeboat_e2e::fleet::Fleet;
use lifeboat_e2e::process::cpu_seconds;
use serde_json::json;
use sim_agent::{
    BoxError, GPU_NODES, SETUP_TIMEOUT, appwrapper, appwrapper_resource, bootstrap,
    policy_resource, start_agents, start_hub, start_real_agents, until,
};

/// Creates in flight at once.
const CREATE_CONCURRENCY: usize = 16;
/// Every this many templates one goes to the real members (24 of 1,000: 8 one-GPU AppWrappers
/// per member, which has 16 GPUs; they are deleted after each run).
const REAL_MEMBER_EVERY: usize = 42;
const REAL_MEMBER_LABEL: &str = "bench.lifeboat.dev/real-member";

struct Args {
    runs: usize,
    templates: usize,
    clusters: usize,
    memory: bool,
    binder_workers: usize,
    real_members: usize,
}

fn args() -> Result<Args, String> {
    let mut parsed = Args {
        runs: 3,
        templates: 0,
        clusters: 0,
        memory: false,
        // The binary's default.
        binder_workers: 32,
        real_members: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .and_then(|v| v.parse::<usize>().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match arg.as_str() {
            "--runs" => parsed.runs = value("--runs")?,
            "--templates" => parsed.templates = value("--templates")?,
            "--clusters" => parsed.clusters = value("--clusters")?,
            "--memory" => parsed.memory = true,
            "--binder-workers" => parsed.binder_workers = value("--binder-workers")?,
            "--real-members" => parsed.real_members = value("--real-members")?,
            // cargo bench passes --bench; libtest-style filters are ignored.
            _ => {}
        }
    }
    let (templates, clusters) = if parsed.memory {
        (10_000, 10)
    } else {
        (1_000, 100)
    };
    if parsed.templates == 0 {
        parsed.templates = templates;
    }
    if parsed.clusters == 0 {
        parsed.clusters = clusters;
    }
    if parsed.memory {
        parsed.runs = 1;
        // The agents would share this process's resident set with the hub.
        parsed.real_members = 0;
    }
    if parsed.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    Ok(parsed)
}

/// The process's resident set (VmRSS), in KiB.
fn rss_kib() -> u64 {
    lifeboat_e2e::process::rss_bytes(std::process::id() as i32).unwrap_or(0) / 1024
}

fn scheduled(binding: &ResourceBinding) -> bool {
    binding.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Scheduled" && c.status == "True")
    })
}

struct RunFigures {
    creates_per_second: f64,
    bindings_per_second: f64,
    /// CPU seconds of the hub's kube-apiserver per template over the run.
    apiserver_cpu_per_template: f64,
    /// Bindings by the cluster each was placed on.
    placed: BTreeMap<String, usize>,
}

/// CPU seconds used so far by the fleet's processes, grouped: the hub's kube-apiserver, etcd,
/// the hub's other control-plane processes, the members' processes, and this process (the hub,
/// the agents and the creates).
#[derive(Default, Clone, Copy)]
struct CpuUse {
    hub_apiserver: f64,
    etcd: f64,
    hub_others: f64,
    members: f64,
    this_process: f64,
}

impl CpuUse {
    fn now(processes: &[(String, i32)]) -> CpuUse {
        let mut cpu = CpuUse {
            this_process: cpu_seconds(std::process::id() as i32).unwrap_or(0.0),
            ..CpuUse::default()
        };
        for (name, pid) in processes {
            let seconds = cpu_seconds(*pid).unwrap_or(0.0);
            match name.as_str() {
                "hub/kube-apiserver" => cpu.hub_apiserver += seconds,
                "etcd" => cpu.etcd += seconds,
                n if n.starts_with("hub/") => cpu.hub_others += seconds,
                _ => cpu.members += seconds,
            }
        }
        cpu
    }

    fn since(self, before: CpuUse) -> CpuUse {
        CpuUse {
            hub_apiserver: self.hub_apiserver - before.hub_apiserver,
            etcd: self.etcd - before.etcd,
            hub_others: self.hub_others - before.hub_others,
            members: self.members - before.members,
            this_process: self.this_process - before.this_process,
        }
    }
}

/// One run: a namespace, a policy, `templates` AppWrappers; timed from the first create to the
/// last binding Scheduled=True. `processes` are the fleet's, for the CPU each used in the run.
async fn run_once(
    hub: &kube::Client,
    run: usize,
    templates: usize,
    clusters: &str,
    members: &[String],
    processes: &[(String, i32)],
) -> Result<RunFigures, BoxError> {
    let namespace = format!("hub-e2e-{run}");
    support::ensure_namespace(hub, &namespace).await?;
    let policies: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &namespace, &policy_resource());
    let mut wanted = vec![(
        "gpu-training",
        json!({
            "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper"}]
        }),
    )];
    if !members.is_empty() {
        // The available-capacity score would put everything on the large simulated clusters:
        // a labelled share goes to the real members (a higher priority wins over the above).
        wanted.push((
            "real-members",
            json!({
                "priority": 1,
                "resourceSelectors": [{
                    "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
                    "labelSelector": {"matchLabels": {REAL_MEMBER_LABEL: "true"}}
                }],
                "placement": {"clusterAffinity": {"clusterNames": members}}
            }),
        ));
    }
    for (name, spec) in wanted {
        let policy: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "policy.lifeboat.dev/v1alpha1", "kind": "PropagationPolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec
        }))?;
        policies
            .patch(
                name,
                &PatchParams::apply("hub-e2e-bench").force(),
                &Patch::Apply(&policy),
            )
            .await?;
    }
    // The hub re-binds every template when a policy changes: let it see this one first.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The watch starts before the first create, so no binding is missed.
    let bindings: Api<ResourceBinding> = Api::namespaced(hub.clone(), &namespace);
    type Done = Result<(Instant, HashMap<String, String>), String>;
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<Done>();
    let watch = tokio::spawn(async move {
        let mut done = HashMap::new();
        let mut stream = std::pin::pin!(watcher(bindings, watcher::Config::default()));
        let result = loop {
            match stream.try_next().await {
                Ok(Some(watcher::Event::Apply(b) | watcher::Event::InitApply(b)))
                    if scheduled(&b) =>
                {
                    if b.spec.clusters.len() != 1 {
                        break Err(format!(
                            "binding {:?} placed on {} clusters, a gang goes to one",
                            b.metadata.name,
                            b.spec.clusters.len()
                        ));
                    }
                    done.insert(
                        b.metadata.name.clone().unwrap_or_default(),
                        b.spec.clusters[0].name.clone(),
                    );
                    if done.len() == templates {
                        break Ok((Instant::now(), done));
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => break Err("the watch ended".to_string()),
                Err(e) => eprintln!("binding watch: {e}; retrying"),
            }
        };
        let _ = done_tx.send(result);
    });
    // Let the watch's initial list complete.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let appwrappers: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &namespace, &appwrapper_resource());
    let objects = (0..templates)
        .map(|i| {
            let mut object = appwrapper(&namespace, &format!("train-{i:05}"))?;
            if !members.is_empty() && i % REAL_MEMBER_EVERY == 0 {
                object
                    .labels_mut()
                    .insert(REAL_MEMBER_LABEL.into(), "true".into());
            }
            Ok(object)
        })
        .collect::<Result<Vec<_>, serde_json::Error>>()?;
    let cpu_before = CpuUse::now(processes);
    let started = Instant::now();
    futures::stream::iter(objects)
        .map(|object| {
            let api = appwrappers.clone();
            async move { api.create(&PostParams::default(), &object).await }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    let created = started.elapsed().as_secs_f64();
    let (finished, placements) = tokio::time::timeout(SETUP_TIMEOUT, done_rx)
        .await
        .map_err(|_| format!("not every binding Scheduled within {SETUP_TIMEOUT:?}"))??
        .map_err(|e| -> BoxError { e.into() })?;
    let cpu = CpuUse::now(processes).since(cpu_before);
    watch.abort();
    let seconds = finished.duration_since(started).as_secs_f64();
    let mut placed = BTreeMap::new();
    for cluster in placements.into_values() {
        *placed.entry(cluster).or_insert(0) += 1;
    }
    let figures = RunFigures {
        creates_per_second: templates as f64 / created,
        bindings_per_second: templates as f64 / seconds,
        apiserver_cpu_per_template: cpu.hub_apiserver / templates as f64,
        placed,
    };
    println!(
        "run {run}: {templates} AppWrappers created in {created:.2} s ({:.0}/s); all {templates} bindings Scheduled=True {seconds:.2} s after the first create = {:.0} bindings/s ({clusters}; load average {})",
        figures.creates_per_second,
        figures.bindings_per_second,
        lifeboat_e2e::load_average()
    );
    let cores = cores();
    println!(
        "run {run}: CPU from the first create to the last Scheduled (and the moment it took to see it): hub kube-apiserver {:.2} s = {:.1} ms per template; this process (hub, agents, creates) {:.2} s; members' processes {:.2} s; etcd {:.2} s; the hub's other control-plane processes {:.2} s; {cores} cores x {seconds:.2} s = {:.2} s",
        cpu.hub_apiserver,
        1000.0 * figures.apiserver_cpu_per_template,
        cpu.this_process,
        cpu.members,
        cpu.etcd,
        cpu.hub_others,
        cores as f64 * seconds
    );
    Ok(figures)
}

async fn bench(fleet: &Fleet, args: &Args) -> Result<(), BoxError> {
    let client = fleet.client("hub").await?;
    // The hub keeps AppWrappers as templates: their CRD must be served there.
    sim_agent::ensure_appwrapper_crd(&client).await?;
    let binder_workers = args.binder_workers;
    let (url, registry) = start_hub(fleet, "hub-e2e-bench", |options| {
        options.binder_workers = binder_workers;
    })
    .await?;
    let endpoint = bootstrap(&client, &url).await?;

    let setup = Instant::now();
    let names: Vec<String> = (0..args.clusters).map(|c| format!("gpu-{c:03}")).collect();
    let members: Vec<String> = fleet
        .member_names()
        .into_iter()
        .take(args.real_members)
        .collect();
    let _real_agents = start_real_agents(fleet, &client, &url, &members, "hub-e2e-bench").await?;
    let agents = start_agents(&client, &endpoint, &names, None).await?;
    println!(
        "hub in process on {url} ({} binder workers); {} simulated clusters registered, heartbeating with {GPU_NODES} GPU nodes each, and {} real members ({}) with their agents, all Ready in {:.1} s",
        args.binder_workers,
        args.clusters,
        members.len(),
        members.join(", "),
        setup.elapsed().as_secs_f64()
    );
    let shape = format!(
        "{} simulated clusters + {} real members",
        args.clusters,
        members.len()
    );
    let upserts = || -> u64 {
        agents
            .iter()
            .map(|a| a.upserts.load(Ordering::Relaxed))
            .sum()
    };

    if args.memory {
        // Idle: the clusters are Ready, the hub's first pass is done.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let before = rss_kib();
        run_once(&client, 0, args.templates, &shape, &members, &fleet.pids()).await?;
        until("every work item on its cluster's stream", || async {
            let n = upserts();
            if n as usize >= args.templates {
                Ok(())
            } else {
                Err(format!("{n} of {}", args.templates))
            }
        })
        .await?;
        // Let the template status writes and the ledger settle.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let after = rss_kib();
        println!(
            "memory: VmRSS {:.1} MiB with {} Ready clusters and no bindings, {:.1} MiB with {} bindings scheduled and dispatched = {:.1} KiB per binding (hub and simulated agents in one process)",
            before as f64 / 1024.0,
            args.clusters,
            after as f64 / 1024.0,
            args.templates,
            after.saturating_sub(before) as f64 / args.templates as f64
        );
        return Ok(());
    }

    let mut bindings = Vec::new();
    let mut creates = Vec::new();
    let mut apiserver_cpu = Vec::new();
    for run in 1..=args.runs {
        let before = upserts();
        let figures = run_once(
            &client,
            run,
            args.templates,
            &shape,
            &members,
            &fleet.pids(),
        )
        .await?;
        let on_members: BTreeMap<&String, usize> = members
            .iter()
            .filter_map(|m| figures.placed.get(m).map(|n| (m, *n)))
            .collect();
        let on_simulated = args.templates - on_members.values().sum::<usize>();
        until("every work item on its cluster's stream", || async {
            let n = upserts() - before;
            if n as usize >= on_simulated {
                Ok(())
            } else {
                Err(format!("{n} of {on_simulated}"))
            }
        })
        .await?;
        for (member, placed) in &on_members {
            let api: Api<DynamicObject> = Api::namespaced_with(
                fleet.client(member).await?,
                &format!("hub-e2e-{run}"),
                &appwrapper_resource(),
            );
            until(
                "every AppWrapper placed on a real member applied there",
                || async {
                    let n = api
                        .list(&Default::default())
                        .await
                        .map_err(|e| e.to_string())?
                        .items
                        .len();
                    if n >= *placed {
                        Ok(())
                    } else {
                        Err(format!("{member}: {n} of {placed}"))
                    }
                },
            )
            .await?;
        }
        println!(
            "run {run}: placed on the real members: {}",
            if on_members.is_empty() {
                "none".to_string()
            } else {
                on_members
                    .iter()
                    .map(|(m, n)| format!("{m} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
        // The real members' GPUs are free again for the next run.
        let on_hub: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &format!("hub-e2e-{run}"),
            &appwrapper_resource(),
        );
        let labelled = ListParams::default().labels(&format!("{REAL_MEMBER_LABEL}=true"));
        on_hub
            .delete_collection(&DeleteParams::default(), &labelled)
            .await?;
        for member in on_members.keys() {
            let api: Api<DynamicObject> = Api::namespaced_with(
                fleet.client(member).await?,
                &format!("hub-e2e-{run}"),
                &appwrapper_resource(),
            );
            until("the real members' AppWrappers gone", || async {
                match api.list(&Default::default()).await {
                    Ok(l) if l.items.is_empty() => Ok(()),
                    Ok(l) => Err(format!("{member}: {} left", l.items.len())),
                    Err(e) => Err(e.to_string()),
                }
            })
            .await?;
        }
        bindings.push(figures.bindings_per_second);
        creates.push(figures.creates_per_second);
        apiserver_cpu.push(figures.apiserver_cpu_per_template);
    }
    bindings.sort_by(|a, b| a.total_cmp(b));
    creates.sort_by(|a, b| a.total_cmp(b));
    apiserver_cpu.sort_by(|a, b| a.total_cmp(b));
    let binder_runs = support::metric(&registry, "lifeboat_hub_binder_reconciles_total", &[]);
    println!(
        "templates to bindings Scheduled=True: median {:.0} bindings/s ({:.0} to {:.0}, {} runs of {} AppWrappers, {}); creates median {:.0}/s; target >= 200 bindings/s (Karmada about 22/s){}",
        bindings[bindings.len() / 2],
        bindings[0],
        bindings[bindings.len() - 1],
        bindings.len(),
        args.templates,
        shape,
        creates[creates.len() / 2],
        if binder_runs > 0.0 {
            format!("; {binder_runs:.0} binder reconciles")
        } else {
            String::new()
        }
    );
    // Every template costs the hub apiserver three writes (the create, the binding, its
    // status): what it spends per template bounds the rate whatever the hub does.
    let per_template = apiserver_cpu[apiserver_cpu.len() / 2];
    let cores = cores();
    println!(
        "hub kube-apiserver CPU per template: median {:.1} ms; with all {cores} cores to itself it could take at most {:.0} templates/s",
        1000.0 * per_template,
        cores as f64 / per_template.max(f64::EPSILON)
    );
    Ok(())
}

/// The hub binary's allocator, so the hub in this process runs as it does there.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // A fleet needs one member even when no real member takes part.
    let members = args.real_members.max(1);
    support::on_fleet_with(
        "hub-e2e-bench",
        |config| {
            config.members = members;
            config.nodes_per_member = 2;
            config.gpus_per_node = 8;
        },
        |fleet| async move { bench(&fleet, &args).await },
    )
}

/// The cores this machine gives the fleet and the bench (the CPU figures' denominator).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
