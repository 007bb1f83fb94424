//! `lifeboat-agent`: the Lifeboat member agent. Without a hub it runs as a plain AppWrapper
//! controller for the one cluster its kubeconfig points at.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use lifeboat_agent::agent::{self, AgentOptions};
use lifeboat_agent::config::OperatorConfig;
use lifeboat_runtime::leader::{self, LeaseConfig};

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
    hub: lifeboat_agent::hub::HubArgs,
}

/// Leader election: with several replicas, the one holding the Lease reconciles; the others keep
/// their caches warm, serve the webhook, and take over when the lease lapses or is released.
#[derive(clap::Args)]
struct LeaderElectionArgs {
    /// Reconcile only while holding the Lease (`--leader-elect=false`: always, one replica).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "LIFEBOAT_LEADER_ELECT")]
    leader_elect: bool,
    /// Name of the Lease.
    #[arg(
        long,
        default_value = "lifeboat-agent",
        env = "LIFEBOAT_LEADER_ELECT_LEASE_NAME"
    )]
    leader_elect_lease_name: String,
    /// Namespace of the Lease (default: the kubeconfig context's, in a pod its own).
    #[arg(long, env = "LIFEBOAT_LEADER_ELECT_NAMESPACE")]
    leader_elect_namespace: Option<String>,
    /// This replica's identity in the Lease (default: hostname_pid).
    #[arg(long, env = "LIFEBOAT_LEADER_ELECT_IDENTITY")]
    leader_elect_identity: Option<String>,
    /// How long a standby respects a Lease whose holder stopped renewing (whole seconds).
    #[arg(long, default_value = "15s", value_parser = go_duration)]
    leader_elect_lease_duration: Duration,
    /// How long the leader keeps reconciling without renewing the Lease.
    #[arg(long, default_value = "10s", value_parser = go_duration)]
    leader_elect_renew_deadline: Duration,
    /// Time between tries to acquire or renew the Lease.
    #[arg(long, default_value = "2s", value_parser = go_duration)]
    leader_elect_retry_period: Duration,
}

impl LeaderElectionArgs {
    /// The Lease to campaign for, validated; errors name the flag.
    fn lease(&self) -> anyhow::Result<Option<LeaseConfig>> {
        if !self.leader_elect {
            return Ok(None);
        }
        let lease = LeaseConfig {
            name: self.leader_elect_lease_name.clone(),
            // Empty: the client's default namespace, filled in by the agent.
            namespace: self.leader_elect_namespace.clone().unwrap_or_default(),
            identity: self
                .leader_elect_identity
                .clone()
                .unwrap_or_else(leader::default_identity),
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        };
        let mut check = lease.clone();
        if check.namespace.is_empty() {
            check.namespace = "default".into();
        }
        check.validate().map_err(|e| {
            let flag = match e.field {
                "name" => "lease-name",
                "lease_duration" => "lease-duration",
                "renew_deadline" => "renew-deadline",
                "retry_period" => "retry-period",
                other => other,
            };
            anyhow::anyhow!("--leader-elect-{flag}: {}", e.reason)
        })?;
        Ok(Some(lease))
    }
}

/// A Go duration ("15s", "1m30s") as a flag value.
fn go_duration(text: &str) -> Result<Duration, String> {
    let nanos = lifeboat_agent::duration::parse(text)
        .map_err(|e| e.to_string())?
        .0;
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| format!("{text} is negative"))
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
        leader_election: args.leader_election.lease()?,
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

    fn parse(flags: &[&str]) -> anyhow::Result<Option<LeaseConfig>> {
        let argv = std::iter::once("lifeboat-agent").chain(flags.iter().copied());
        Args::try_parse_from(argv)?.leader_election.lease()
    }

    #[test]
    fn leader_election_is_on_by_default_with_kubernetes_timing() {
        let lease = parse(&[]).unwrap().expect("on by default");
        assert_eq!(lease.name, "lifeboat-agent");
        assert_eq!(
            lease.namespace, "",
            "the client's namespace, filled in at start"
        );
        assert_eq!(lease.lease_duration, Duration::from_secs(15));
        assert_eq!(lease.renew_deadline, Duration::from_secs(10));
        assert_eq!(lease.retry_period, Duration::from_secs(2));
        assert!(
            lease
                .identity
                .ends_with(&format!("_{}", std::process::id()))
        );
        assert!(parse(&["--leader-elect=false"]).unwrap().is_none());
        let custom = parse(&[
            "--leader-elect-lease-name",
            "agent-b",
            "--leader-elect-namespace",
            "lifeboat-system",
            "--leader-elect-identity",
            "pod-1",
            "--leader-elect-lease-duration",
            "8s",
            "--leader-elect-renew-deadline",
            "5s",
            "--leader-elect-retry-period",
            "1s",
        ])
        .unwrap()
        .expect("on");
        assert_eq!(
            (
                custom.name.as_str(),
                custom.namespace.as_str(),
                custom.identity.as_str()
            ),
            ("agent-b", "lifeboat-system", "pod-1")
        );
        assert_eq!(custom.lease_duration, Duration::from_secs(8));
    }

    #[test]
    fn bad_leader_election_flags_are_rejected_naming_the_flag() {
        let err = parse(&["--leader-elect-renew-deadline", "20s"]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--leader-elect-lease-duration:"),
            "{err}"
        );
        let err = parse(&["--leader-elect-retry-period", "9s"]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--leader-elect-renew-deadline:"),
            "{err}"
        );
        let err = parse(&["--leader-elect-lease-name", ""]).unwrap_err();
        assert!(
            err.to_string().starts_with("--leader-elect-lease-name:"),
            "{err}"
        );
        let err = parse(&["--leader-elect-retry-period", "soon"]).unwrap_err();
        assert!(
            err.to_string().contains("--leader-elect-retry-period"),
            "{err}"
        );
    }
}
