//! `lifeboatctl join CLUSTER --hub-url URL`: mints a bootstrap token for member cluster CLUSTER
//! on the hub (a Secret of type `lifeboat.dev/bootstrap-token` in the hub's namespace, bound to
//! that cluster name and expiring after `--ttl`), writes the CA of the hub's agent API to
//! `--ca-out`, and prints the `helm install` of the agent chart that joins the member.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use lifeboat_api::cluster::HUB_SYSTEM_NAMESPACE;
use lifeboat_api::credentials::{
    BOOTSTRAP_CLUSTER_NAME_KEY, BOOTSTRAP_EXPIRATION_KEY, BOOTSTRAP_TOKEN_KEY,
    BOOTSTRAP_TOKEN_TYPE, fresh_token,
};

use crate::bindings::{HubArgs, hub_client};

#[derive(clap::Args)]
pub struct JoinArgs {
    /// Name of the member cluster (the Cluster the hub creates when its agent registers).
    cluster: String,
    /// The hub's agent API as the member reaches it (https://HOST:PORT).
    #[arg(long)]
    hub_url: String,
    /// The hub's namespace (its chart's release namespace).
    #[arg(long, default_value = HUB_SYSTEM_NAMESPACE)]
    namespace: String,
    /// Secret (in --namespace) of the CA the hub issues its agent-API certificate from.
    #[arg(long, default_value = "lifeboat-hub-ca")]
    ca_secret: String,
    /// Where to write that CA (PEM), for the agent chart's hub.ca.value.
    #[arg(long, default_value = "hub-ca.crt")]
    ca_out: PathBuf,
    /// How long the token may register the cluster (whole hours).
    #[arg(long, default_value_t = 24)]
    ttl_hours: u64,
    #[command(flatten)]
    hub: HubArgs,
}

pub fn run(args: JoinArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        is_dns_label(&args.cluster),
        "CLUSTER: {:?} is not a cluster name (a DNS label)",
        args.cluster
    );
    anyhow::ensure!(
        args.hub_url.starts_with("https://"),
        "--hub-url: {:?} is not an https:// URL",
        args.hub_url
    );
    anyhow::ensure!(args.ttl_hours > 0, "--ttl-hours: must be at least 1");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let token = fresh_token().map_err(|_| anyhow::anyhow!("no random bytes for the token"))?;
    let expiration = chrono::Utc::now() + Duration::from_secs(args.ttl_hours.saturating_mul(3600));
    let expiration = expiration.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let secret_name = runtime.block_on(async {
        let client = hub_client(&args.hub).await?;
        let secrets: Api<Secret> = Api::namespaced(client, &args.namespace);
        let ca = secrets
            .get(&args.ca_secret)
            .await
            .with_context(|| {
                format!(
                    "reading the hub's CA Secret {}/{}",
                    args.namespace, args.ca_secret
                )
            })?
            .data
            .and_then(|d| d.get("tls.crt").cloned())
            .with_context(|| {
                format!(
                    "Secret {}/{} has no tls.crt",
                    args.namespace, args.ca_secret
                )
            })?;
        std::fs::write(&args.ca_out, &ca.0)
            .with_context(|| format!("writing {}", args.ca_out.display()))?;
        let secret = Secret {
            metadata: ObjectMeta {
                generate_name: Some(format!("join-{}-", args.cluster)),
                ..Default::default()
            },
            type_: Some(BOOTSTRAP_TOKEN_TYPE.into()),
            data: Some(
                [
                    (BOOTSTRAP_TOKEN_KEY, token.as_str()),
                    (BOOTSTRAP_CLUSTER_NAME_KEY, args.cluster.as_str()),
                    (BOOTSTRAP_EXPIRATION_KEY, expiration.as_str()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
            ),
            ..Default::default()
        };
        let created = secrets
            .create(&PostParams::default(), &secret)
            .await
            .context("creating the bootstrap token Secret")?;
        anyhow::Ok(created.metadata.name.unwrap_or_default())
    })?;
    eprintln!(
        "bootstrap token {}/{secret_name} registers cluster {} until {expiration}; the hub's CA is in {}",
        args.namespace,
        args.cluster,
        args.ca_out.display()
    );
    println!(
        "helm install lifeboat-agent charts/lifeboat-agent --namespace lifeboat-system --create-namespace \
--set clusterName={} --set hub.url={} --set hub.bootstrapToken.value={token} --set-file hub.ca.value={}",
        args.cluster,
        args.hub_url,
        args.ca_out.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_names_are_dns_labels() {
        assert!(is_dns_label("gpu-east-1"));
        for bad in ["", "-a", "a-", "GPU", "a/b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad:?}");
        }
    }
}
