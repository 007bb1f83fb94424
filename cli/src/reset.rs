//! `lifeboatctl reset NAMESPACE/BINDING [--cluster C]`: asks the hub for one in-place reset of a
//! ResourceBinding's workload (its cluster's agent deletes and recreates it), by setting the
//! binding's `work.lifeboat.dev/reset-request` annotation to a fresh value
//! (`lifeboat_hub::manual_reset`). Without `--cluster`, the binding's single placement; a
//! binding placed on several clusters is refused with their names.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use lifeboat_api::binding::ANNOTATION_RESET_REQUEST;

use crate::history::parse_binding;

#[derive(clap::Args)]
pub struct ResetArgs {
    /// NAMESPACE/NAME of the ResourceBinding (on the hub).
    binding: String,
    /// The cluster to reset in (one of the binding's `spec.clusters`). Default: its only one.
    #[arg(long)]
    cluster: Option<String>,
    /// The hub's kubeconfig. Default: `$KUBECONFIG`, else `~/.kube/config`, else in-cluster.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
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
        let client = client(args.kubeconfig.as_deref()).await?;
        let asked =
            lifeboat_hub::manual_reset::request(&client, namespace, name, args.cluster.as_deref())
                .await?;
        anyhow::Ok(asked)
    })?;
    println!(
        "asked for an in-place reset of {namespace}/{name} in {} ({ANNOTATION_RESET_REQUEST}={})",
        asked.cluster, asked.value
    );
    Ok(ExitCode::SUCCESS)
}

/// A client for the hub: the kubeconfig given, else kube's usual lookup.
async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "no kubeconfig found ($KUBECONFIG, ~/.kube/config, in-cluster); give --kubeconfig",
        )?,
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}
