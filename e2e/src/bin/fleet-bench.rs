//! `fleet-bench`: end-to-end figures of the local fleet (a benchmark, not a test).
//!
//! For each run: `Fleet::up` (hub + N members, binaries cached) timed to "every cluster ready";
//! then a GPU Job per member is run to completion; the peak resident memory (VmHWM) of every
//! fleet process is summed. Prints one line per run and a summary.
//!
//!   cargo run --release -p lifeboat-e2e --bin fleet-bench -- --runs 3

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, PostParams};
use lifeboat_e2e::fleet::{Fleet, FleetConfig, workspace_root};
use lifeboat_e2e::{process, wait};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long, default_value_t = 3)]
    members: usize,
    #[arg(long, default_value_t = 4)]
    nodes_per_member: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Runtime::new()?;
    let mut ready_times = Vec::new();
    let mut peaks = Vec::new();
    for run in 1..=args.runs {
        let mut config = FleetConfig::new(workspace_root().join("target/fleet-bench"));
        config.members = args.members;
        config.nodes_per_member = args.nodes_per_member;
        let started = Instant::now();
        let fleet = rt.block_on(Fleet::up(config)).context("fleet up")?;
        let ready = started.elapsed();
        rt.block_on(run_jobs(&fleet))?;
        let per_process: Vec<(String, u64)> = fleet
            .pids()
            .into_iter()
            .filter_map(|(name, pid)| process::peak_rss_bytes(pid).map(|b| (name, b)))
            .collect();
        let total: u64 = per_process.iter().map(|(_, b)| b).sum();
        println!(
            "run {run}: ready in {:.2}s, peak RSS of the fleet {:.0} MiB ({} processes)",
            ready.as_secs_f64(),
            total as f64 / 1048576.0,
            per_process.len()
        );
        if run == 1 {
            let mut sorted = per_process.clone();
            sorted.sort_by_key(|entry| std::cmp::Reverse(entry.1));
            for (name, bytes) in sorted.iter().take(6) {
                println!("    {name:<36} {:>6.0} MiB", *bytes as f64 / 1048576.0);
            }
        }
        ready_times.push(ready.as_secs_f64());
        peaks.push(total as f64 / 1048576.0);
        fleet.teardown();
    }
    ready_times.sort_by(f64::total_cmp);
    peaks.sort_by(f64::total_cmp);
    println!(
        "summary: {} runs, hub + {} members x {} nodes: ready median {:.2}s (min {:.2}s, max {:.2}s); peak RSS median {:.0} MiB (max {:.0} MiB)",
        args.runs,
        args.members,
        args.nodes_per_member,
        ready_times[ready_times.len() / 2],
        ready_times[0],
        ready_times[ready_times.len() - 1],
        peaks[peaks.len() / 2],
        peaks[peaks.len() - 1]
    );
    Ok(())
}

/// One 3-pod GPU Job per member, run to completion, so the memory figure includes real work.
async fn run_jobs(fleet: &Fleet) -> anyhow::Result<()> {
    for member in fleet.member_names() {
        let client = fleet.client(&member).await?;
        let jobs: Api<Job> = Api::namespaced(client, "default");
        let job: Job = serde_json::from_value(serde_json::json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "bench"},
            "spec": {"parallelism": 3, "completions": 3, "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", "sleep 1"],
                    "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}
        }))?;
        jobs.create(&PostParams::default(), &job).await?;
    }
    for member in fleet.member_names() {
        let jobs: Api<Job> = Api::namespaced(fleet.client(&member).await?, "default");
        wait::until("bench job complete", Duration::from_secs(120), || async {
            let job = jobs.get("bench").await.map_err(|e| e.to_string())?;
            match job.status.and_then(|s| s.succeeded) {
                Some(3) => Ok(()),
                other => Err(format!("succeeded {other:?}")),
            }
        })
        .await?;
    }
    Ok(())
}
