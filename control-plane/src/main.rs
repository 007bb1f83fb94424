//! `lifeboat-hub`: the Lifeboat hub. Users apply workloads and propagation policies to the hub
//! cluster; the hub places each on member clusters, hands the work to the members' agents and
//! shows the health of every placement.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use lifeboat_api::cluster::{HUB_LEASE_NAME, HUB_SYSTEM_NAMESPACE};
use lifeboat_hub::admission::{FailurePolicy, WebhookOptions};
use lifeboat_hub::agentapi::AgentApiConfig;
use lifeboat_hub::agentapi::server::ConnectionLimits;
use lifeboat_hub::clusters::health::ClusterHealthConfig;
use lifeboat_hub::ledger::DEFAULT_DATABASE_URL;
use lifeboat_hub::process::{self, AgentApiTls, HubOptions};
use lifeboat_runtime::leader::flags::LeaderElectionArgs;
use lifeboat_runtime::webhook::ClientConfigTarget;
use lifeboat_scheduler::SchedulerConfig;
use lifeboat_tls::PemFiles;

#[derive(Parser, Debug)]
#[command(
    name = "lifeboat-hub",
    version,
    about = "Lifeboat hub: places workloads on member clusters and shows their health"
)]
struct Args {
    /// Kubeconfig of the hub cluster (default: in-cluster, then ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Namespace of the agents' credentials, bootstrap tokens, Leases and the hub's own Lease.
    #[arg(long, default_value = HUB_SYSTEM_NAMESPACE, env = "LIFEBOAT_NAMESPACE")]
    namespace: String,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "127.0.0.1:9465")]
    metrics_bind: SocketAddr,
    /// Address of the agent API (HTTPS).
    #[arg(long, default_value = "0.0.0.0:9443")]
    agent_api_bind: SocketAddr,
    /// DNS names and IP addresses of the agent API's certificate when the hub issues it
    /// (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "lifeboat-hub,lifeboat-hub.lifeboat-system.svc,localhost,127.0.0.1"
    )]
    agent_api_names: Vec<String>,
    /// Secret (in --namespace) holding the CA the hub issues the agent API's certificate from.
    #[arg(long, default_value = "lifeboat-hub-ca")]
    agent_api_ca_secret: String,
    /// Serve this certificate (PEM) instead of issuing one; re-read when it changes.
    #[arg(long, requires = "agent_api_key_file")]
    agent_api_cert_file: Option<PathBuf>,
    /// Key of --agent-api-cert-file (PEM).
    #[arg(long, requires = "agent_api_cert_file")]
    agent_api_key_file: Option<PathBuf>,
    /// Agent API connections open at once, from every client together; more are closed as
    /// soon as they are accepted.
    #[arg(long, default_value_t = ConnectionLimits::default().max_total)]
    agent_api_max_connections: usize,
    /// Agent API connections open at once from one IP address. Agents of many clusters may
    /// come from one address (a NAT): each holds its work stream and one or two pooled request
    /// connections, so the default leaves room for a few hundred clusters behind one address.
    #[arg(long, default_value_t = ConnectionLimits::default().max_per_ip)]
    agent_api_max_connections_per_ip: usize,
    /// A client that has not completed its TLS handshake after this long is dropped (seconds).
    #[arg(long, default_value_t = ConnectionLimits::default().tls_handshake_timeout.as_secs())]
    agent_api_tls_handshake_timeout_seconds: u64,
    /// A request's header must have arrived in full this long after the hub started waiting for
    /// it, so it is also how long a kept-alive connection may sit idle between requests
    /// (seconds).
    #[arg(long, default_value_t = ConnectionLimits::default().header_read_timeout.as_secs())]
    agent_api_header_read_timeout_seconds: u64,
    /// A connection on which no byte moves either way for this long is closed (seconds); more
    /// than the work stream's bookmark interval (15 s), which keeps a live stream moving.
    #[arg(long, default_value_t = ConnectionLimits::default().idle_timeout.as_secs())]
    agent_api_idle_timeout_seconds: u64,
    /// A cluster whose agent has not renewed its Lease for this long is NotReady (seconds).
    #[arg(long, default_value_t = 40)]
    cluster_lease_seconds: u64,
    /// How often agents heartbeat (seconds).
    #[arg(long, default_value_t = 10)]
    heartbeat_seconds: u64,
    /// An agent that has not reached the hub for this long suspends its workloads whose cluster
    /// failover is `purgeMode: Directly`, and the hub recreates them elsewhere only once their
    /// cluster has not been Ready for this long (seconds). Agents must be started with the same
    /// period (`--fencing-period`): registration refuses another. A Cluster's
    /// `spec.fencingPeriodSeconds` overrides it for that cluster.
    #[arg(long, default_value_t = 60)]
    fencing_period_seconds: u64,
    /// A new leader waits at most this long for the agents of the Ready clusters to re-send
    /// their full state before it decides evictions and placements (seconds).
    #[arg(long, default_value_t = lifeboat_hub::process::DEFAULT_RECOVERY_TIMEOUT.as_secs())]
    recovery_timeout_seconds: u64,
    /// Templates bound in parallel. Each binding waits on two apiserver writes (spec, then
    /// status), so the workers, not the CPU, bound the binding rate: 4 gave about 20 bindings/s
    /// on the local fleet, 32 follows the create rate (BENCHMARKS.md, hub end to end).
    #[arg(long, default_value_t = 32)]
    binder_workers: usize,
    /// Binding status writes in parallel. A burst of failures waits on these writes before the
    /// binder decides (BENCHMARKS.md, failover): 32 halved the p99 wait of a 100-report burst
    /// against 8.
    #[arg(long, default_value_t = 32)]
    status_writers: usize,
    /// Bindings evicted per second from a lost or deleted cluster (cluster failover).
    #[arg(long, default_value_t = lifeboat_hub::binding::binder::DEFAULT_CLUSTER_EVICTION_RATE)]
    cluster_eviction_rate: f64,
    /// Scheduler plugins: `*` for all, `-Name` to disable one (Karmada's `--plugins`).
    #[arg(long, default_value = "*")]
    plugins: String,
    /// Score plugin weights, `Name=weight,...`.
    #[arg(long, default_value = "")]
    plugin_weights: String,
    /// Do not install or update the hub's CRDs at start.
    #[arg(long)]
    no_install_crds: bool,
    #[command(flatten)]
    leader_election: LeaderElectionArgs,
    /// The event ledger's database: `sqlite://PATH` (created when missing; relative to the
    /// working directory) or `postgres://USER:PASSWORD@HOST/DB`. Default: the SQLite file
    /// lifeboat-ledger.db in the working directory.
    #[arg(long, env = "LIFEBOAT_DATABASE_URL", default_value = DEFAULT_DATABASE_URL, hide_env_values = true)]
    database_url: String,
    /// Serve the ResourceInterpreterCustomization admission webhook (scripts that do not
    /// compile are refused) and register it; the apiserver calls it at https://HOST:PORT (a hub
    /// outside the cluster), e.g. 127.0.0.1. Its certificate is issued from the CA in
    /// --agent-api-ca-secret.
    #[arg(long = "webhook-url-host", value_name = "HOST")]
    webhook_url_host: Option<String>,
    /// Port in the webhook URL, when it differs from the bound port.
    #[arg(long = "webhook-url-port", value_name = "PORT")]
    webhook_url_port: Option<u16>,
    /// Serve and register the webhook; the apiserver calls it through this Service.
    #[arg(
        long = "webhook-service",
        value_name = "NAMESPACE/NAME:PORT",
        conflicts_with = "webhook_url_host"
    )]
    webhook_service: Option<String>,
    /// Address the webhook server listens on.
    #[arg(long = "webhook-bind", default_value = "0.0.0.0:9444")]
    webhook_bind: SocketAddr,
    /// What the apiserver does when no hub answers the webhook: Ignore (admit unchecked; a
    /// script that does not compile still shows at runtime) or Fail (refuse every change of a
    /// customization until a hub answers).
    #[arg(long = "webhook-failure-policy", default_value = "Ignore")]
    webhook_failure_policy: String,
    /// Name of the webhook's ValidatingWebhookConfiguration.
    #[arg(long = "webhook-configuration", default_value = lifeboat_hub::admission::CONFIGURATION)]
    webhook_configuration: String,
}

impl Args {
    fn options(&self) -> anyhow::Result<HubOptions> {
        let scheduler = SchedulerConfig::from_flags(&self.plugins, &self.plugin_weights)
            .context("--plugins / --plugin-weights")?;
        let agent_api_tls = match (&self.agent_api_cert_file, &self.agent_api_key_file) {
            (Some(cert), Some(key)) => AgentApiTls::Files(PemFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: None,
            }),
            _ => AgentApiTls::CaSecret {
                secret: self.agent_api_ca_secret.clone(),
                names: self.agent_api_names.clone(),
            },
        };
        anyhow::ensure!(
            self.cluster_eviction_rate.is_finite() && self.cluster_eviction_rate > 0.0,
            "--cluster-eviction-rate: must be a number greater than 0 (bindings per second)"
        );
        anyhow::ensure!(
            self.cluster_lease_seconds > 0,
            "--cluster-lease-seconds: must be greater than 0"
        );
        anyhow::ensure!(
            self.heartbeat_seconds > 0 && self.heartbeat_seconds < self.cluster_lease_seconds,
            "--heartbeat-seconds: must be greater than 0 and less than --cluster-lease-seconds ({})",
            self.cluster_lease_seconds
        );
        anyhow::ensure!(
            self.fencing_period_seconds > 0 && self.fencing_period_seconds <= i32::MAX as u64,
            "--fencing-period-seconds: must be greater than 0"
        );
        let connections = self.connection_limits()?;
        let lease_duration = Duration::from_secs(self.cluster_lease_seconds);
        let leader_election = self
            .leader_election
            .lease(HUB_LEASE_NAME, &self.namespace)?;
        let failure_policy: FailurePolicy = self
            .webhook_failure_policy
            .parse()
            .map_err(|e| anyhow::anyhow!("--webhook-failure-policy: {e}"))?;
        let webhook_target = match (&self.webhook_url_host, &self.webhook_service) {
            (Some(host), _) if host.trim().is_empty() => {
                anyhow::bail!("--webhook-url-host: must not be empty")
            }
            (Some(host), _) => Some(ClientConfigTarget::Url {
                host: host.clone(),
                port: self.webhook_url_port,
            }),
            (None, Some(service)) => Some(
                ClientConfigTarget::parse_service(service)
                    .map_err(|e| anyhow::anyhow!("--webhook-service: {e}"))?,
            ),
            (None, None) => None,
        };
        let webhook = webhook_target.map(|target| WebhookOptions {
            bind: self.webhook_bind,
            target,
            failure_policy,
            ca_secret: self.agent_api_ca_secret.clone(),
            configuration: self.webhook_configuration.clone(),
        });
        Ok(HubOptions {
            kubeconfig: self.kubeconfig.clone(),
            install_crds: !self.no_install_crds,
            metrics_bind: Some(self.metrics_bind),
            agent_api_bind: self.agent_api_bind,
            agent_api_tls,
            agent_api: AgentApiConfig {
                namespace: self.namespace.clone(),
                lease_duration,
                heartbeat_interval: Duration::from_secs(self.heartbeat_seconds),
                fencing_period: Duration::from_secs(self.fencing_period_seconds),
                connections,
                ..AgentApiConfig::default()
            },
            cluster_health: ClusterHealthConfig {
                namespace: self.namespace.clone(),
                lease_duration,
                ..ClusterHealthConfig::default()
            },
            leader_election,
            binder_workers: self.binder_workers,
            status_writers: self.status_writers,
            scheduler,
            cluster_eviction_rate: self.cluster_eviction_rate,
            database_url: self.database_url.clone(),
            recovery_timeout: Duration::from_secs(self.recovery_timeout_seconds),
            webhook,
        })
    }
}

impl Args {
    fn connection_limits(&self) -> anyhow::Result<ConnectionLimits> {
        anyhow::ensure!(
            self.agent_api_max_connections > 0,
            "--agent-api-max-connections: must be greater than 0"
        );
        anyhow::ensure!(
            self.agent_api_max_connections_per_ip > 0
                && self.agent_api_max_connections_per_ip <= self.agent_api_max_connections,
            "--agent-api-max-connections-per-ip: must be greater than 0 and at most \
             --agent-api-max-connections ({})",
            self.agent_api_max_connections
        );
        for (flag, seconds) in [
            (
                "--agent-api-tls-handshake-timeout-seconds",
                self.agent_api_tls_handshake_timeout_seconds,
            ),
            (
                "--agent-api-header-read-timeout-seconds",
                self.agent_api_header_read_timeout_seconds,
            ),
        ] {
            anyhow::ensure!(seconds > 0, "{flag}: must be greater than 0");
        }
        let bookmarks = AgentApiConfig::default().bookmark_interval.as_secs();
        anyhow::ensure!(
            self.agent_api_idle_timeout_seconds > bookmarks,
            "--agent-api-idle-timeout-seconds: must be more than the work stream's bookmark \
             interval ({bookmarks} s), or idle work streams are cut"
        );
        Ok(ConnectionLimits {
            max_total: self.agent_api_max_connections,
            max_per_ip: self.agent_api_max_connections_per_ip,
            tls_handshake_timeout: Duration::from_secs(
                self.agent_api_tls_handshake_timeout_seconds,
            ),
            header_read_timeout: Duration::from_secs(self.agent_api_header_read_timeout_seconds),
            idle_timeout: Duration::from_secs(self.agent_api_idle_timeout_seconds),
        })
    }
}

/// The hub's allocator: mimalloc. glibc's malloc cost the status processor about a quarter of
/// its time under a burst of changed reports (`malloc_consolidate`, `unlink_chunk`; BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube_client=warn,kube_runtime=warn".into()),
        )
        .init();
    let options = Args::parse().options()?;
    let shutdown =
        lifeboat_runtime::shutdown::on_signal().context("installing the SIGTERM handler")?;
    process::run(options, prometheus::Registry::new(), shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(flags: &[&str]) -> anyhow::Result<HubOptions> {
        let argv = std::iter::once("lifeboat-hub").chain(flags.iter().copied());
        Args::try_parse_from(argv)?.options()
    }

    #[test]
    fn defaults_lead_by_lease_and_issue_the_agent_api_certificate() {
        let o = options(&[]).unwrap();
        let lease = o.leader_election.expect("on by default");
        assert_eq!(lease.name, "lifeboat-hub");
        assert_eq!(lease.namespace, HUB_SYSTEM_NAMESPACE);
        assert!(
            matches!(o.agent_api_tls, AgentApiTls::CaSecret { ref secret, .. } if secret == "lifeboat-hub-ca")
        );
        assert_eq!(o.agent_api.lease_duration, Duration::from_secs(40));
        assert_eq!(o.agent_api.connections, ConnectionLimits::default());
        let tuned = options(&[
            "--agent-api-max-connections-per-ip",
            "8",
            "--agent-api-header-read-timeout-seconds",
            "5",
            "--agent-api-idle-timeout-seconds",
            "120",
        ])
        .unwrap()
        .agent_api
        .connections;
        assert_eq!(
            (
                tuned.max_per_ip,
                tuned.header_read_timeout,
                tuned.idle_timeout
            ),
            (8, Duration::from_secs(5), Duration::from_secs(120))
        );
        assert_eq!(o.database_url, "sqlite://lifeboat-ledger.db");
        assert_eq!(
            options(&["--database-url", "postgres://u:p@db/ledger"])
                .unwrap()
                .database_url,
            "postgres://u:p@db/ledger"
        );
        assert!(
            options(&["--leader-elect=false"])
                .unwrap()
                .leader_election
                .is_none()
        );
    }

    #[test]
    fn bad_flags_are_named() {
        let e = options(&["--heartbeat-seconds", "50"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--heartbeat-seconds"), "{e}");
        let e = options(&["--plugins", "NoSuchPlugin"]).unwrap_err();
        assert!(format!("{e:#}").contains("--plugins"), "{e:#}");
        assert!(
            options(&["--agent-api-cert-file", "/x"]).is_err(),
            "needs the key too"
        );
        for (flags, named) in [
            (
                &["--agent-api-max-connections-per-ip", "0"][..],
                "--agent-api-max-connections-per-ip",
            ),
            (
                &[
                    "--agent-api-max-connections",
                    "10",
                    "--agent-api-max-connections-per-ip",
                    "11",
                ][..],
                "--agent-api-max-connections-per-ip",
            ),
            (
                &["--agent-api-header-read-timeout-seconds", "0"][..],
                "--agent-api-header-read-timeout-seconds",
            ),
            (
                &["--agent-api-idle-timeout-seconds", "15"][..],
                "--agent-api-idle-timeout-seconds",
            ),
        ] {
            let e = options(flags).unwrap_err().to_string();
            assert!(e.contains(named), "{flags:?}: {e}");
        }
        let files =
            options(&["--agent-api-cert-file", "/c", "--agent-api-key-file", "/k"]).unwrap();
        assert!(matches!(files.agent_api_tls, AgentApiTls::Files(_)));
        let e = options(&[
            "--webhook-url-host",
            "127.0.0.1",
            "--webhook-failure-policy",
            "fail",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("--webhook-failure-policy"), "{e}");
        let e = options(&["--webhook-service", "hub:443"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--webhook-service"), "{e}");
    }

    #[test]
    fn the_webhook_is_served_when_a_way_to_reach_it_is_given() {
        assert!(options(&[]).unwrap().webhook.is_none());
        let o = options(&["--webhook-url-host", "127.0.0.1"]).unwrap();
        let webhook = o.webhook.unwrap();
        assert_eq!(webhook.failure_policy, FailurePolicy::Ignore);
        assert_eq!(webhook.bind.port(), 9444);
        let o = options(&[
            "--webhook-service",
            "lifeboat-system/lifeboat-hub-webhook:443",
            "--webhook-failure-policy",
            "Fail",
        ])
        .unwrap();
        let webhook = o.webhook.unwrap();
        assert_eq!(webhook.failure_policy, FailurePolicy::Fail);
        assert!(matches!(
            webhook.target,
            ClientConfigTarget::Service { port: 443, .. }
        ));
    }
}
