//! `lifeboatctl reset NAMESPACE/BINDING [--cluster C]`: asks the hub for one in-place reset of a
//! ResourceBinding's workload (its cluster's agent deletes and recreates it), by setting the
//! binding's `work.lifeboat.dev/reset-request` annotation to a fresh value
//! (`lifeboat_api::reset`). Without `--cluster`, the binding's single placement; a
//! binding placed on several clusters is refused with their names.

use std::process::ExitCode;

use anyhow::Context;
use lifeboat_api::binding::ANNOTATION_RESET_REQUEST;

use crate::bindings::{HubArgs, hub_client};
use crate::history::parse_binding;

#[derive(clap::Args)]
pub struct ResetArgs {
    /// NAMESPACE/NAME of the ResourceBinding (on the hub).
    binding: String,
    /// The cluster to reset in (one of the binding's `spec.clusters`). Default: its only one.
    #[arg(long)]
    cluster: Option<String>,
    #[command(flatten)]
    hub: HubArgs,
}

pub fn run(args: ResetArgs) -> anyhow::Result<ExitCode> {
    // Parse before connecting: bad input is reported without touching the hub.
    let (namespace, name) = parse_binding(&args.binding)?;
    if let Some(cluster) = &args.cluster {
        anyhow::ensure!(
            !cluster.is_empty() && !cluster.contains('/'),
            "--cluster: {cluster:?} is not a cluster name"
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let asked = runtime.block_on(async {
        let client = hub_client(&args.hub).await?;
        let asked =
            lifeboat_api::reset::request(&client, namespace, name, args.cluster.as_deref()).await?;
        anyhow::Ok(asked)
    })?;
    println!(
        "asked for an in-place reset of {namespace}/{name} in {} ({ANNOTATION_RESET_REQUEST}={})",
        asked.cluster, asked.value
    );
    Ok(ExitCode::SUCCESS)
}
