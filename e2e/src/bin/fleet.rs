//! `fleet`: start, inspect, break and stop the local fleet of Kubernetes control planes.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use lifeboat_e2e::fleet::{
    self, ClusterStatus, Fleet, FleetConfig, LifeboatConfig, LifeboatProcess, LifeboatStatus,
};
use lifeboat_e2e::{faults, kubeconfig};

#[derive(Parser)]
#[command(
    name = "fleet",
    about = "The Lifeboat local fleet: one hub and N member Kubernetes control planes on loopback"
)]
struct Cli {
    /// Where the fleet keeps its state, certificates and logs (default: target/fleet).
    #[arg(long, global = true)]
    state_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct UpArgs {
    /// Number of member clusters.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// kwok nodes per member cluster.
    #[arg(long, default_value_t = 4)]
    nodes_per_member: usize,
    /// nvidia.com/gpu per node.
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// Seconds to wait for every cluster to become ready.
    #[arg(long, default_value_t = 180)]
    timeout: u64,
    /// Also run Lifeboat: the hub and an agent per member, registered with a bootstrap token
    /// (binaries from `cargo build -p lifeboat-hub -p lifeboat-agent`, or LIFEBOAT_BIN_DIR).
    #[arg(long)]
    lifeboat: bool,
    /// Hub replicas with --lifeboat (leader election: one acts, all serve the agent API).
    #[arg(long, default_value_t = 1, requires = "lifeboat")]
    hubs: usize,
    /// The hub's --cluster-lease-seconds with --lifeboat.
    #[arg(long, default_value_t = 40, requires = "lifeboat")]
    cluster_lease_seconds: u64,
    /// The hub's --heartbeat-seconds with --lifeboat.
    #[arg(long, default_value_t = 10, requires = "lifeboat")]
    heartbeat_seconds: u64,
    /// Agent replicas per member with --lifeboat (more than one: leader election, one acts).
    #[arg(long, default_value_t = 1, requires = "lifeboat")]
    agent_replicas: usize,
}

#[derive(Subcommand)]
enum Command {
    /// Start the fleet in the background and return once every cluster is ready.
    Up(UpArgs),
    /// Start the fleet, print its status, and keep it running until Ctrl-C; then tear it down.
    Run(UpArgs),
    /// Stop the fleet and remove everything `up` left behind.
    Down,
    /// Print each cluster's API address, kubeconfig, node count and readiness.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Fail a pod: its first container terminates with the given exit code.
    FailPod {
        #[arg(long)]
        cluster: String,
        #[arg(short = 'n', long, default_value = "default")]
        namespace: String,
        pod: String,
        #[arg(long)]
        exit_code: i32,
    },
    /// Make a node NotReady (or Ready again with --ready).
    NodeNotReady {
        #[arg(long)]
        cluster: String,
        node: String,
        /// Make the node Ready again instead.
        #[arg(long)]
        ready: bool,
    },
    /// Reclaim a spot node: taint it with a reclamation notice, then delete it after the notice.
    ReclaimSpot {
        #[arg(long)]
        cluster: String,
        node: String,
        /// Seconds between the notice and the node's deletion.
        #[arg(long, default_value_t = 30)]
        notice_seconds: u64,
    },
    /// Set a node's Autopilot GPU health label (autopilot.ibm.com/gpuhealth).
    GpuHealth {
        #[arg(long)]
        cluster: String,
        node: String,
        value: String,
    },
    /// Stop a cluster's kube-apiserver: the cluster refuses connections.
    StopApiserver { cluster: String },
    /// Start a stopped kube-apiserver again; the cluster comes back with its data.
    StartApiserver { cluster: String },
    /// Kill a Lifeboat process with SIGKILL: `hub` (replica 1), `hub-N`, a member's name (its
    /// agent, replica 1), or `MEMBER/agent-N` (agent replica N).
    KillLifeboat { process: String },
    /// Stop a Lifeboat process with SIGTERM (a hub hands its Lease over).
    StopLifeboat { process: String },
    /// Start a stopped or killed Lifeboat process again, on its ports.
    RestartLifeboat { process: String },
}

/// `hub` / `hub-2` / `member-1` / `member-1/agent-2` as a Lifeboat process.
fn lifeboat_process(name: &str) -> LifeboatProcess {
    if let Some((member, replica)) = name.split_once("/agent-")
        && let Ok(i) = replica.parse()
    {
        return LifeboatProcess::Agent(member.to_string(), i);
    }
    match name {
        "hub" => LifeboatProcess::Hub(1),
        _ => match name.strip_prefix("hub-").and_then(|i| i.parse().ok()) {
            Some(i) => LifeboatProcess::Hub(i),
            None => LifeboatProcess::agent(name),
        },
    }
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,kube_client=off,lifeboat_e2e=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let state_dir = cli.state_dir.unwrap_or_else(fleet::default_state_dir);
    let runtime = tokio::runtime::Runtime::new().context("starting tokio")?;
    runtime.block_on(run(cli.command, state_dir))
}

fn config(state_dir: PathBuf, args: &UpArgs) -> FleetConfig {
    let mut config = FleetConfig::new(state_dir);
    config.members = args.members;
    config.nodes_per_member = args.nodes_per_member;
    config.gpus_per_node = args.gpus_per_node;
    config.ready_timeout = Duration::from_secs(args.timeout);
    if args.lifeboat {
        config.lifeboat = Some(LifeboatConfig {
            hubs: args.hubs,
            cluster_lease_seconds: args.cluster_lease_seconds,
            heartbeat_seconds: args.heartbeat_seconds,
            agent_replicas: args.agent_replicas,
            bin_dir: None,
        });
    }
    config
}

async fn run(command: Command, state_dir: PathBuf) -> anyhow::Result<()> {
    match command {
        Command::Up(args) => {
            let started = std::time::Instant::now();
            let fleet = Fleet::up(config(state_dir.clone(), &args)).await?;
            print_status(&fleet.status().await);
            if let Some(lifeboat) = fleet.lifeboat_status().await {
                print_lifeboat(&lifeboat);
            }
            fleet.detach();
            eprintln!(
                "fleet ready in {:.1}s; stop it with `fleet down` (state in {})",
                started.elapsed().as_secs_f64(),
                state_dir.display()
            );
        }
        Command::Run(args) => {
            let started = std::time::Instant::now();
            let fleet = Fleet::up(config(state_dir, &args)).await?;
            eprintln!("fleet ready in {:.1}s", started.elapsed().as_secs_f64());
            print_status(&fleet.status().await);
            if let Some(lifeboat) = fleet.lifeboat_status().await {
                print_lifeboat(&lifeboat);
            }
            eprintln!("press Ctrl-C to stop the fleet");
            tokio::signal::ctrl_c()
                .await
                .context("waiting for Ctrl-C")?;
            eprintln!("stopping the fleet");
            fleet.teardown();
        }
        Command::Down => match Fleet::load(&state_dir) {
            Ok(fleet) => {
                fleet.down()?;
                eprintln!("fleet stopped and {} removed", state_dir.display());
            }
            Err(_) => {
                let stopped = fleet::cleanup_stale(&state_dir)?;
                eprintln!(
                    "no fleet state in {}; {stopped} stray processes stopped",
                    state_dir.display()
                );
            }
        },
        Command::Status { json } => {
            let fleet = Fleet::load(&state_dir)?;
            let status = fleet.status().await;
            let lifeboat = fleet.lifeboat_status().await;
            if json {
                let all = serde_json::json!({"clusters": status, "lifeboat": lifeboat});
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                print_status(&status);
                if let Some(lifeboat) = &lifeboat {
                    print_lifeboat(lifeboat);
                }
            }
            if status.iter().any(|s| !s.ready) || lifeboat.is_some_and(|l| !l.ready()) {
                std::process::exit(1);
            }
        }
        Command::FailPod {
            cluster,
            namespace,
            pod,
            exit_code,
        } => {
            let client = client(&state_dir, &cluster).await?;
            faults::fail_pod(&client, &namespace, &pod, exit_code).await?;
            eprintln!("pod {namespace}/{pod} in {cluster} fails with exit code {exit_code}");
        }
        Command::NodeNotReady {
            cluster,
            node,
            ready,
        } => {
            let client = client(&state_dir, &cluster).await?;
            faults::set_node_ready(&client, &node, ready).await?;
            eprintln!(
                "node {node} in {cluster} is now {}",
                if ready { "Ready" } else { "NotReady" }
            );
        }
        Command::ReclaimSpot {
            cluster,
            node,
            notice_seconds,
        } => {
            let client = client(&state_dir, &cluster).await?;
            eprintln!(
                "node {node} in {cluster}: reclamation notice, deletion in {notice_seconds}s"
            );
            faults::reclaim_spot_node(&client, &node, Duration::from_secs(notice_seconds)).await?;
            eprintln!("node {node} in {cluster} reclaimed (deleted)");
        }
        Command::GpuHealth {
            cluster,
            node,
            value,
        } => {
            let client = client(&state_dir, &cluster).await?;
            faults::set_gpu_health(&client, &node, &value).await?;
            eprintln!("node {node} in {cluster}: GPU health {value}");
        }
        Command::StopApiserver { cluster } => {
            Fleet::load(&state_dir)?.stop_apiserver(&cluster)?;
            eprintln!("kube-apiserver of {cluster} stopped");
        }
        Command::StartApiserver { cluster } => {
            Fleet::load(&state_dir)?.start_apiserver(&cluster).await?;
            eprintln!("kube-apiserver of {cluster} started and ready");
        }
        Command::KillLifeboat { process } => {
            let process = lifeboat_process(&process);
            Fleet::load(&state_dir)?.kill_lifeboat(&process)?;
            eprintln!("{process} killed (SIGKILL)");
        }
        Command::StopLifeboat { process } => {
            let process = lifeboat_process(&process);
            Fleet::load(&state_dir)?.stop_lifeboat(&process)?;
            eprintln!("{process} stopped");
        }
        Command::RestartLifeboat { process } => {
            let process = lifeboat_process(&process);
            Fleet::load(&state_dir)?.restart_lifeboat(&process).await?;
            eprintln!("{process} started and ready");
        }
    }
    Ok(())
}

async fn client(state_dir: &std::path::Path, cluster: &str) -> anyhow::Result<kube::Client> {
    let fleet = Fleet::load(state_dir)?;
    Ok(kubeconfig::client(&fleet.kubeconfig(cluster)?).await?)
}

fn print_status(status: &[ClusterStatus]) {
    println!(
        "{:<10} {:<7} {:<6} {:<6} {:<15} {:<25} KUBECONFIG",
        "CLUSTER", "ROLE", "READY", "NODES", "REGION", "API"
    );
    for s in status {
        println!(
            "{:<10} {:<7} {:<6} {:<6} {:<15} {:<25} {}",
            s.name,
            format!("{:?}", s.role).to_lowercase(),
            if s.ready { "yes" } else { "no" },
            format!("{}/{}", s.nodes_ready, s.nodes),
            s.region.as_deref().unwrap_or("-"),
            s.api_url,
            s.kubeconfig.display()
        );
        if !s.ready {
            println!("           not ready: {}", s.reason);
        }
    }
}

fn print_lifeboat(status: &LifeboatStatus) {
    println!();
    println!(
        "{:<10} {:<16} {:<8} {:<6} {:<13} LOG",
        "CLUSTER", "LIFEBOAT", "PID", "ALIVE", "PORTS"
    );
    for p in &status.processes {
        let ports: Vec<String> = p.ports.iter().map(u16::to_string).collect();
        println!(
            "{:<10} {:<16} {:<8} {:<6} {:<13} {}",
            p.cluster,
            p.component,
            if p.pid > 0 {
                p.pid.to_string()
            } else {
                "-".into()
            },
            if p.alive { "yes" } else { "no" },
            ports.join(","),
            p.log.display()
        );
    }
    println!(
        "agent API: {}; leader: {}",
        status.hub_urls.join(", "),
        status.leader.as_deref().unwrap_or("none")
    );
    if !status.error.is_empty() {
        println!("hub unreachable: {}", status.error);
        return;
    }
    println!("{:<10} {:<8} {:<22} TAINTS", "MEMBER", "READY", "REASON");
    for m in &status.members {
        println!(
            "{:<10} {:<8} {:<22} {}",
            m.name,
            m.ready,
            m.reason,
            if m.taints.is_empty() {
                "-".into()
            } else {
                m.taints.join(",")
            }
        );
    }
}
