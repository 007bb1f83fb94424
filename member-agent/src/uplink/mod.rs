//! The agent's uplink to the hub (hub mode): the member agent as the hub's hands in one member
//! cluster, the agent side of the agent ↔ hub protocol (`lifeboat_api::protocol`). While this
//! replica leads, it
//!
//! - registers with a bootstrap token, keeps the cluster credential in a Secret of the member
//!   and registers again when the hub refuses it (`credential`); once the hub deletes the
//!   cluster, removes the hub's work and stays stopped until that Secret is deleted;
//! - heartbeats at the hub's interval, carrying the inventory (node groups with free capacity,
//!   resource summary, node health, API enablements) when it changed or every minute
//!   (`inventory`, pure; `observe` and `catalog` feed it);
//! - consumes the resumable work stream (`ndjson`, `work`, pure) and applies each work by
//!   server-side apply, adopting after a restart and removing what is no longer assigned
//!   (`applier`);
//! - reports each work's status in batches (`work_status`, pure; `reporter`);
//! - probes its member's kube-apiserver and tells the hub, in its heartbeats, when it has not
//!   answered for a bounded time (`member_api`).
//!
//! Decisions are pure and unit-tested; `client` (HTTPS), `credential`, `catalog`, `observe`,
//! `applier`, `reporter` and `session` are the IO around them.

pub mod applier;
pub mod args;
pub mod backoff;
pub mod catalog;
pub mod client;
pub mod credential;
pub mod fencer;
pub mod fencing;
pub mod inventory;
pub mod member_api;
pub mod metrics;
pub mod namespaces;
pub mod ndjson;
pub mod observe;
pub mod reporter;
pub mod reset;
pub mod session;
pub mod work;
pub mod work_status;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lifeboat_api::appwrapper::autopilot::AutopilotConfig;
use lifeboat_runtime::leader::Leadership;
use prometheus::Registry;

pub use args::HubArgs;
pub use credential::SecretRef;
pub use metrics::HubMetrics;

use crate::config::AppWrapperConfig;
use client::{ClientSetupError, HubClient};

/// How to reach the hub and who this cluster is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubOptions {
    /// Hub URLs (normalised: `https://host[:port]`), tried in order.
    pub urls: Vec<String>,
    /// CA of the hub's serving certificate (PEM); `None`: the platform's trust store.
    pub ca_file: Option<PathBuf>,
    pub bootstrap_token_file: PathBuf,
    pub fencing_period: Duration,
    pub provider: Option<String>,
    pub region: Option<String>,
    pub zone: Option<String>,
    /// Where the cluster credential is kept in the member.
    pub credential_secret: SecretRef,
    /// Whether (and how) to give the hub a fencing credential ([`fencer`]).
    pub fencing: FencingChoice,
    /// This replica in registrations and heartbeats (`None`: `hostname_pid`).
    pub identity: Option<String>,
    pub timing: HubTiming,
}

/// `--fencing-credential`, `--fencing-api-server`, `--fencing-api-ca-file`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FencingChoice {
    Off,
    /// `server`/`ca_file` `None`: those of the agent's own kubeconfig.
    On {
        server: Option<String>,
        ca_file: Option<PathBuf>,
    },
}

/// Default `--member-api-timeout`.
pub const DEFAULT_MEMBER_API_TIMEOUT: Duration = Duration::from_secs(2);

/// Timeouts and periods (defaults fit production; tests shorten them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubTiming {
    /// Deadline of every call (connect, answer, body), except reading the work stream.
    pub request_timeout: Duration,
    /// A work stream with no line (the hub sends bookmarks) for this long is reconnected.
    pub stream_idle_timeout: Duration,
    /// Longest wait between retries (reconnects, reports, applies).
    pub max_backoff: Duration,
    /// The inventory is sent at least this often.
    pub inventory_every: Duration,
    /// API discovery (enablements, kinds) is refreshed this often (one aggregated discovery
    /// call), so a CRD installed in the member reaches the hub's inventory within it.
    pub discovery_every: Duration,
    /// Works applied at once.
    pub apply_concurrency: usize,
    /// The member's kube-apiserver counts as unreachable once it has not answered the agent for
    /// this long (`--member-api-timeout`): the heartbeats then say so (`member_api`).
    pub member_api_timeout: Duration,
}

impl Default for HubTiming {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(10),
            stream_idle_timeout: Duration::from_secs(90),
            max_backoff: Duration::from_secs(10),
            inventory_every: Duration::from_secs(60),
            discovery_every: Duration::from_secs(60),
            apply_concurrency: 8,
            member_api_timeout: DEFAULT_MEMBER_API_TIMEOUT,
        }
    }
}

/// Why hub mode cannot start; names the flag where one is at fault.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("--cluster-name {name:?}: {reason}")]
    ClusterName { name: String, reason: &'static str },
    #[error("--hub-ca-file {path}: {source}")]
    ReadCa {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--fencing-api-ca-file {path}: {source}")]
    ReadFencingCa {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--fencing-api-server: {0}")]
    FencingServer(String),
    #[error(transparent)]
    Client(#[from] ClientSetupError),
    #[error("hub metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// Whether `name` is a DNS label (what the hub names clusters by).
pub fn check_cluster_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 63 {
        return Err("must be 1 to 63 characters");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err("must consist of lower case letters, digits and '-'");
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err("must start and end with a letter or digit");
    }
    Ok(())
}

/// Where the hub reaches this member with the fencing credential: the flags, else the agent's
/// own kubeconfig. In a pod without `--fencing-api-server` the agent's address of its apiserver
/// is the cluster-internal Service, which the hub cannot reach: no credential is given (said
/// once at start).
fn fencing_target(
    options: &HubOptions,
    member: &kube::Config,
    kubeconfig_given: bool,
) -> Result<Option<fencer::FencingTarget>, SetupError> {
    let FencingChoice::On { server, ca_file } = &options.fencing else {
        tracing::info!(
            "--fencing-credential=false: the hub gets no fencing credential; a Directly failover from this cluster waits for this agent or an operator"
        );
        return Ok(None);
    };
    let server = match server {
        Some(server) => server.clone(),
        None if kubeconfig_given => {
            let url = member.cluster_url.to_string();
            let url = url.trim_end_matches('/').to_string();
            if !url.starts_with("https://") {
                return Err(SetupError::FencingServer(format!(
                    "the kubeconfig's server {url} is not https://: give the member's address for the hub"
                )));
            }
            url
        }
        None => {
            tracing::warn!(
                "no --fencing-api-server (the agent runs in a pod): the hub gets no fencing credential; a Directly failover from this cluster waits for this agent or an operator"
            );
            return Ok(None);
        }
    };
    let certificate_authority = match ca_file {
        Some(path) => {
            std::fs::read_to_string(path).map_err(|source| SetupError::ReadFencingCa {
                path: path.display().to_string(),
                source,
            })?
        }
        None => member
            .root_cert
            .iter()
            .flatten()
            .map(|der| fencer::pem_of_der(der))
            .collect(),
    };
    Ok(Some(fencer::FencingTarget {
        server,
        certificate_authority,
        namespace: options.credential_secret.namespace.clone(),
    }))
}

/// Hub mode, ready to run.
pub struct HubMode {
    client: kube::Client,
    options: Arc<HubOptions>,
    cluster: String,
    hub: Arc<HubClient>,
    metrics: HubMetrics,
    autopilot: Option<AutopilotConfig>,
    reclamation_taints: Vec<String>,
    /// Where the hub reaches this member with the fencing credential (`None`: none is given).
    fencing: Option<fencer::FencingTarget>,
}

impl HubMode {
    /// Checks the options, reads the CA and registers the metrics in `registry`. `config`
    /// gives the Autopilot and spot reclamation settings the node health summary uses;
    /// `member` is the client configuration of the member (its server and CA are the fencing
    /// credential's defaults when `kubeconfig_given`).
    pub fn new(
        client: kube::Client,
        options: HubOptions,
        cluster: &str,
        config: &AppWrapperConfig,
        registry: &Registry,
        member: &kube::Config,
        kubeconfig_given: bool,
    ) -> Result<Self, SetupError> {
        check_cluster_name(cluster).map_err(|reason| SetupError::ClusterName {
            name: cluster.to_string(),
            reason,
        })?;
        let tls = match &options.ca_file {
            Some(path) => {
                let pem = std::fs::read(path).map_err(|source| SetupError::ReadCa {
                    path: path.display().to_string(),
                    source,
                })?;
                client::tls_config(Some((&path.display().to_string(), &pem)))?
            }
            None => client::tls_config(None)?,
        };
        let fencing = fencing_target(&options, member, kubeconfig_given)?;
        let metrics = HubMetrics::new(registry)?;
        let hub = HubClient::new(
            options.urls.clone(),
            tls,
            options.timing.request_timeout,
            metrics.clone(),
        )?;
        Ok(Self {
            client,
            options: Arc::new(options),
            cluster: cluster.to_string(),
            hub: Arc::new(hub),
            metrics,
            autopilot: config.autopilot.clone(),
            reclamation_taints: config.reclamation_taints.clone(),
            fencing,
        })
    }

    /// Runs hub mode while `leadership` says this replica leads, until `shutdown` resolves. A
    /// lost leadership drops everything at once (no call to the hub or the member after that
    /// point); a new term starts from the credential Secret and a full snapshot. Once the hub
    /// deleted this cluster, no term starts until the credential Secret is deleted.
    pub async fn run(
        self,
        mut leadership: Leadership,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => return,
                () = leadership.acquired() => {}
            }
            // A cluster the hub removed stays out until it is joined again.
            tokio::select! {
                biased;
                () = &mut shutdown => return,
                () = leadership.lost() => continue,
                () = self.until_joinable() => {}
            }
            tracing::info!(cluster = %self.cluster, hub = %self.hub.current_url(), "leading: hub mode starts");
            tokio::select! {
                biased;
                () = &mut shutdown => return,
                () = leadership.lost() => {
                    self.metrics.connected.set(0);
                    tracing::warn!("lost leadership: hub mode stopped; standing by");
                }
                // The next turn waits in `until_joinable` for the explicit act to join again.
                session::Stopped = session::run(&self) => {}
            }
        }
    }

    /// Returns once the credential Secret does not say the hub removed this cluster: at once
    /// normally; after a removal, once someone deleted the Secret (the explicit act to join
    /// again). Looks every [`REJOIN_POLL`]; a Secret it cannot read counts as removed (joining
    /// by mistake would register the cluster again).
    async fn until_joinable(&self) {
        let secret = &self.options.credential_secret;
        let mut said = false;
        loop {
            match credential::removed_from_hub(&self.client, secret).await {
                Ok(None) => {
                    self.metrics.removed.set(0);
                    if said {
                        tracing::info!(%secret, "the credential Secret is gone: joining the hub again");
                    }
                    return;
                }
                Ok(Some(at)) => {
                    self.metrics.removed.set(1);
                    if !said {
                        tracing::error!(cluster = %self.cluster, %secret, removed_at = %at,
                            "the hub removed this cluster: hub mode stays stopped; delete the Secret to join again");
                        said = true;
                    }
                }
                Err(e) => {
                    tracing::warn!(%secret, error = %e, "cannot read the credential Secret; hub mode waits")
                }
            }
            tokio::time::sleep(REJOIN_POLL).await;
        }
    }
}

/// How often a removed agent looks whether its credential Secret was deleted.
pub const REJOIN_POLL: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_names_are_dns_labels() {
        assert!(check_cluster_name("member-1").is_ok());
        for bad in ["", "Member", "-a", "a-", "a_b", &"x".repeat(64)] {
            assert!(check_cluster_name(bad).is_err(), "{bad} was accepted");
        }
    }
}
