//! `lifeboatctl reset NAMESPACE/BINDING [--cluster C]`: asks the hub for one in-place reset of a
//! ResourceBinding's workload (its cluster's agent deletes and recreates it), by setting the
//! binding's `work.lifeboat.dev/reset-request` annotation to a fresh value
//! (its format: `lifeboat_api::reset`). Without `--cluster`, the binding's single placement; a
//! binding placed on several clusters is refused with their names.

use std::process::ExitCode;

use anyhow::Context;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use lifeboat_api::binding::{ANNOTATION_RESET_REQUEST, ResourceBinding};
use lifeboat_api::reset::{ManualResetError, choose_cluster, request_value};
use lifeboat_runtime::kube_error::KubeError;

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
        let asked = request(&client, namespace, name, args.cluster.as_deref()).await?;
        anyhow::Ok(asked)
    })?;
    println!(
        "asked for an in-place reset of {namespace}/{name} in {} ({ANNOTATION_RESET_REQUEST}={})",
        asked.cluster, asked.value
    );
    Ok(ExitCode::SUCCESS)
}

/// Why a reset could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    #[error("ResourceBinding {binding} not found")]
    NotFound { binding: String },
    #[error(transparent)]
    Placement(#[from] ManualResetError),
    #[error("ResourceBinding {binding}: {}: {source}", source.context())]
    Kube {
        binding: String,
        #[source]
        source: KubeError,
    },
    #[error("no random numbers for the request's nonce")]
    Random,
}

/// What was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requested {
    pub cluster: String,
    /// The annotation's value.
    pub value: String,
}

/// Asks the hub for one in-place reset of binding `namespace/name` in `cluster` (or its single
/// placement): reads the binding, sets the annotation to a fresh value.
pub async fn request(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    cluster: Option<&str>,
) -> Result<Requested, ResetError> {
    let label = format!("{namespace}/{name}");
    let kube_error = |context| {
        let binding = label.clone();
        move |source| ResetError::Kube {
            binding,
            source: KubeError::new(context, source),
        }
    };
    let api: Api<ResourceBinding> = Api::namespaced(client.clone(), namespace);
    let binding = api
        .get_opt(name)
        .await
        .map_err(kube_error("reading it"))?
        .ok_or_else(|| ResetError::NotFound {
            binding: label.clone(),
        })?;
    let cluster = choose_cluster(&binding, cluster)?;
    let mut random = [0u8; 4];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random)
        .map_err(|_| ResetError::Random)?;
    let value = request_value(&cluster, Timestamp::now(), random);
    let patch = serde_json::json!({"metadata": {"annotations": {ANNOTATION_RESET_REQUEST: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kube_error("setting the reset-request annotation"))?;
    Ok(Requested { cluster, value })
}

#[cfg(test)]
mod tests;
