//! `lifeboat-agent`: the Lifeboat member agent. Without a hub it runs as a plain AppWrapper
//! controller for the one cluster its kubeconfig points at.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use lifeboat_agent::agent::{self, AgentOptions};
use lifeboat_agent::config::OperatorConfig;
use lifeboat_runtime::leader::flags::LeaderElectionArgs;

/// The agent's Lease (in the kubeconfig context's namespace unless a flag names one).
const AGENT_LEASE_NAME: &str = "lifeboat-agent";

#[derive(Parser)]
#[command(
    name = "lifeboat-agent",
    version,
    about = "Lifeboat member agent: the AppWrapper fault-tolerance controller"
)]
struct Args {
    /// Kubeconfig of the member cluster (default: in-cluster, then ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Operator configuration (YAML, upstream's appwrapper-operator-config keys).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Name of this cluster in logs and spans.
    #[arg(long, default_value = "member")]
    cluster_name: String,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "127.0.0.1:9464")]
    metrics_bind: SocketAddr,
    /// AppWrappers reconciled in parallel.
    #[arg(long, default_value_t = 16)]
    concurrency: u16,
    /// Do not install or update the AppWrapper CRD at start.
    #[arg(long)]
    no_install_crd: bool,
    #[command(flatten)]
    webhook: lifeboat_agent::webhook::WebhookArgs,
    #[command(flatten)]
    leader_election: LeaderElectionArgs,
    #[command(flatten)]
    hub: lifeboat_agent::uplink::HubArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube_client=warn,kube_runtime=warn".into()),
        )
        .init();
    let args = Args::parse();
    let config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            OperatorConfig::from_yaml(&text).with_context(|| format!("in {}", path.display()))?
        }
        None => OperatorConfig::default(),
    };
    let options = AgentOptions {
        kubeconfig: args.kubeconfig,
        config,
        cluster: args.cluster_name,
        metrics_bind: Some(args.metrics_bind),
        concurrency: args.concurrency,
        install_crd: !args.no_install_crd,
        webhook: args.webhook.config()?,
        leader_election: args.leader_election.lease(AGENT_LEASE_NAME, "")?,
        hub: args.hub.options()?,
    };
    let shutdown =
        lifeboat_runtime::shutdown::on_signal().context("installing the SIGTERM handler")?;
    agent::run(options, prometheus::Registry::new(), shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_lease_is_named_for_the_agent() {
        let args = Args::try_parse_from(["lifeboat-agent"]).unwrap();
        let lease = args
            .leader_election
            .lease(AGENT_LEASE_NAME, "")
            .unwrap()
            .expect("on by default");
        assert_eq!(lease.name, "lifeboat-agent");
        assert_eq!(
            lease.namespace, "",
            "the client's namespace, filled in at start"
        );
    }
}
