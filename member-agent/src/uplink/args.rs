//! Command-line flags of hub mode, to `#[command(flatten)]` into the agent's CLI. Hub mode runs
//! when `--hub-url` is given (`--cluster-name` is the agent's existing flag).

use std::path::PathBuf;
use std::time::Duration;

use super::client::normalize_url;
use super::credential::SecretRef;
use super::{FencingChoice, HubOptions};

/// Default `--credential-secret`.
pub const DEFAULT_CREDENTIAL_SECRET: &str = "lifeboat-system/lifeboat-hub-credential";

/// Each argument has an id prefixed `hub-`: the agent flattens several argument structs into
/// one command, and clap needs ids unique across them (the webhook has a `ca_file` too).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct HubArgs {
    /// The hub's agent API (https://HOST:PORT); repeat or separate with commas to give standbys:
    /// they are tried in order, and a standby's 503 naming the leader moves to it.
    #[arg(
        id = "hub-url",
        long = "hub-url",
        env = "LIFEBOAT_HUB_URL",
        value_name = "URL",
        value_delimiter = ','
    )]
    pub urls: Vec<String>,

    /// CA certificate(s) that sign the hub's serving certificate (PEM); default: the platform's
    /// trust store.
    #[arg(
        id = "hub-ca-file",
        long = "hub-ca-file",
        env = "LIFEBOAT_HUB_CA_FILE",
        value_name = "FILE"
    )]
    pub ca_file: Option<PathBuf>,

    /// File holding the bootstrap token the agent registers with (and registers again with when
    /// the hub refuses the cluster credential).
    #[arg(
        id = "hub-bootstrap-token-file",
        long = "bootstrap-token-file",
        env = "LIFEBOAT_HUB_BOOTSTRAP_TOKEN_FILE",
        value_name = "FILE"
    )]
    pub bootstrap_token_file: Option<PathBuf>,

    /// How long the agent may lose the hub before it suspends workloads whose purge mode is
    /// Directly (whole seconds; sent at registration, must match the hub's setting).
    #[arg(
        id = "hub-fencing-period",
        long = "fencing-period",
        env = "LIFEBOAT_HUB_FENCING_PERIOD",
        default_value = "60s",
        value_name = "DURATION"
    )]
    pub fencing_period: String,

    /// How long the member's kube-apiserver may not answer the agent before its heartbeats tell
    /// the hub, which marks the cluster not Ready (and fails its workloads over).
    #[arg(
        id = "hub-member-api-timeout",
        long = "member-api-timeout",
        env = "LIFEBOAT_HUB_MEMBER_API_TIMEOUT",
        default_value = "2s",
        value_name = "DURATION"
    )]
    pub member_api_timeout: String,

    /// Recorded on the Cluster the hub creates at the first registration.
    #[arg(id = "hub-provider", long = "provider", env = "LIFEBOAT_HUB_PROVIDER")]
    pub provider: Option<String>,
    /// Recorded on the Cluster the hub creates at the first registration.
    #[arg(id = "hub-region", long = "region", env = "LIFEBOAT_HUB_REGION")]
    pub region: Option<String>,
    /// Recorded on the Cluster the hub creates at the first registration.
    #[arg(id = "hub-zone", long = "zone", env = "LIFEBOAT_HUB_ZONE")]
    pub zone: Option<String>,

    /// Secret in the member that keeps the cluster credential, so a restart reuses it.
    #[arg(
        id = "hub-credential-secret",
        long = "credential-secret",
        env = "LIFEBOAT_HUB_CREDENTIAL_SECRET",
        default_value = DEFAULT_CREDENTIAL_SECRET,
        value_name = "NAMESPACE/NAME"
    )]
    pub credential_secret: String,

    /// Give the hub a fencing credential: a token of the ServiceAccount `lifeboat-fencer` that
    /// may only delete objects Lifeboat placed, so the hub can stop a `Directly` workload here
    /// itself when this agent is dead or cut off (otherwise such a failover waits for this
    /// agent or an operator's `lifeboatctl confirm-purge`).
    #[arg(
        id = "hub-fencing-credential",
        long = "fencing-credential",
        env = "LIFEBOAT_HUB_FENCING_CREDENTIAL",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub fencing_credential: bool,

    /// This member's kube-apiserver as the hub reaches it (https://HOST:PORT); default: the
    /// server of `--kubeconfig` (required in a pod, where the agent's own address of the
    /// apiserver is the cluster-internal Service).
    #[arg(
        id = "hub-fencing-api-server",
        long = "fencing-api-server",
        env = "LIFEBOAT_HUB_FENCING_API_SERVER",
        value_name = "URL"
    )]
    pub fencing_api_server: Option<String>,

    /// PEM CA bundle of `--fencing-api-server`; default: the CA of `--kubeconfig` (or of the
    /// in-cluster configuration).
    #[arg(
        id = "hub-fencing-api-ca-file",
        long = "fencing-api-ca-file",
        env = "LIFEBOAT_HUB_FENCING_API_CA_FILE",
        value_name = "FILE"
    )]
    pub fencing_api_ca_file: Option<PathBuf>,
}

/// A flag value that cannot work, naming the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag}: {reason}")]
pub struct ArgsError {
    pub flag: &'static str,
    pub reason: String,
}

impl HubArgs {
    /// Hub mode's options, or `None` without `--hub-url` (standalone mode).
    pub fn options(&self) -> Result<Option<HubOptions>, ArgsError> {
        let fail = |flag, reason: String| ArgsError { flag, reason };
        let urls: Vec<String> = self
            .urls
            .iter()
            .map(|u| u.trim())
            .filter(|u| !u.is_empty())
            .map(|u| normalize_url(u).map_err(|r| fail("--hub-url", r)))
            .collect::<Result<_, _>>()?;
        if urls.is_empty() {
            for (flag, given) in [
                ("--hub-ca-file", self.ca_file.is_some()),
                (
                    "--bootstrap-token-file",
                    self.bootstrap_token_file.is_some(),
                ),
            ] {
                if given {
                    return Err(fail(flag, "needs --hub-url".into()));
                }
            }
            return Ok(None);
        }
        let bootstrap_token_file = self.bootstrap_token_file.clone().ok_or_else(|| {
            fail(
                "--bootstrap-token-file",
                "required with --hub-url (the agent registers with it)".into(),
            )
        })?;
        let nanos = crate::duration::parse(&self.fencing_period)
            .map_err(|e| fail("--fencing-period", e.to_string()))?
            .0;
        if nanos <= 0 || nanos % 1_000_000_000 != 0 {
            return Err(fail(
                "--fencing-period",
                format!(
                    "{} is not a positive whole number of seconds",
                    self.fencing_period
                ),
            ));
        }
        let fencing_period = Duration::from_secs((nanos / 1_000_000_000) as u64);
        let member_api_timeout = crate::duration::parse(&self.member_api_timeout)
            .ok()
            .filter(|d| d.0 > 0)
            .map(|d| d.as_std())
            .ok_or_else(|| {
                fail(
                    "--member-api-timeout",
                    format!("{} is not a positive duration", self.member_api_timeout),
                )
            })?;
        let credential_secret = SecretRef::parse(&self.credential_secret)
            .map_err(|r| fail("--credential-secret", r))?;
        let fencing = if !self.fencing_credential {
            for (flag, given) in [
                ("--fencing-api-server", self.fencing_api_server.is_some()),
                ("--fencing-api-ca-file", self.fencing_api_ca_file.is_some()),
            ] {
                if given {
                    return Err(fail(flag, "needs --fencing-credential=true".into()));
                }
            }
            FencingChoice::Off
        } else {
            let server = self
                .fencing_api_server
                .as_deref()
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| {
                    if s.starts_with("https://") && s.len() > "https://".len() {
                        Ok(s.trim_end_matches('/').to_string())
                    } else {
                        Err(fail(
                            "--fencing-api-server",
                            format!("{s:?} is not an https:// URL"),
                        ))
                    }
                })
                .transpose()?;
            FencingChoice::On {
                server,
                ca_file: self.fencing_api_ca_file.clone(),
            }
        };
        let topology = |v: &Option<String>| {
            v.as_ref()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        };
        Ok(Some(HubOptions {
            urls,
            ca_file: self.ca_file.clone(),
            bootstrap_token_file,
            fencing_period,
            provider: topology(&self.provider),
            region: topology(&self.region),
            zone: topology(&self.zone),
            credential_secret,
            fencing,
            identity: None,
            timing: super::HubTiming {
                member_api_timeout,
                ..Default::default()
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        hub: HubArgs,
    }

    fn parse(flags: &[&str]) -> Result<Option<HubOptions>, String> {
        let argv = std::iter::once("agent").chain(flags.iter().copied());
        Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .hub
            .options()
            .map_err(|e| e.to_string())
    }

    /// The agent's command flattens these with the webhook's flags: ids must not collide
    /// (clap checks in debug builds when the command is built).
    #[derive(Parser)]
    struct Agent {
        #[command(flatten)]
        hub: HubArgs,
        #[command(flatten)]
        webhook: crate::webhook::WebhookArgs,
    }

    #[test]
    fn flattens_beside_the_webhook_flags() {
        use clap::CommandFactory;
        Agent::command().debug_assert();
        let agent = Agent::try_parse_from([
            "agent",
            "--hub-url",
            "https://hub",
            "--hub-ca-file",
            "hub-ca.pem",
        ])
        .expect("parses");
        assert_eq!(agent.hub.ca_file, Some(PathBuf::from("hub-ca.pem")));
        assert_eq!(
            agent.webhook.ca_file, None,
            "--hub-ca-file is not the webhook's CA"
        );
    }

    #[test]
    fn without_a_hub_url_the_agent_is_standalone() {
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(
            parse(&["--bootstrap-token-file", "t"]),
            Err("--bootstrap-token-file: needs --hub-url".into())
        );
    }

    #[test]
    fn hub_flags_become_options() {
        let options = parse(&[
            "--hub-url",
            "https://hub-a:8443/,https://hub-b:8443",
            "--hub-url",
            "https://hub-c:8443",
            "--bootstrap-token-file",
            "/etc/lifeboat/token",
            "--fencing-period",
            "2m",
            "--region",
            "us-east-1",
            "--zone",
            " ",
            "--credential-secret",
            "ops/hub-cred",
            "--member-api-timeout",
            "45s",
        ])
        .expect("valid")
        .expect("hub mode");
        assert_eq!(
            options.urls,
            [
                "https://hub-a:8443",
                "https://hub-b:8443",
                "https://hub-c:8443"
            ]
        );
        assert_eq!(options.fencing_period, Duration::from_secs(120));
        assert_eq!(options.region.as_deref(), Some("us-east-1"));
        assert_eq!(options.zone, None);
        assert_eq!(options.credential_secret.to_string(), "ops/hub-cred");
        assert_eq!(options.timing.member_api_timeout, Duration::from_secs(45));
        let defaults = parse(&["--hub-url", "https://hub", "--bootstrap-token-file", "t"])
            .expect("valid")
            .expect("hub mode");
        assert_eq!(defaults.fencing_period, Duration::from_secs(60));
        assert_eq!(
            defaults.timing.member_api_timeout,
            super::super::DEFAULT_MEMBER_API_TIMEOUT
        );
        assert_eq!(
            defaults.credential_secret.to_string(),
            DEFAULT_CREDENTIAL_SECRET
        );
    }

    #[test]
    fn bad_values_name_their_flag() {
        let base = ["--hub-url", "https://hub", "--bootstrap-token-file", "t"];
        let with = |extra: &[&str]| {
            let mut flags = base.to_vec();
            flags.extend_from_slice(extra);
            parse(&flags).unwrap_err()
        };
        assert!(
            parse(&["--hub-url", "http://hub", "--bootstrap-token-file", "t"])
                .unwrap_err()
                .starts_with("--hub-url: \"http://hub\" must be an https:// URL"),
        );
        assert_eq!(
            parse(&["--hub-url", "https://hub"]).unwrap_err(),
            "--bootstrap-token-file: required with --hub-url (the agent registers with it)"
        );
        assert!(
            with(&["--fencing-period", "1500ms"]).starts_with("--fencing-period: 1500ms is not")
        );
        assert!(with(&["--fencing-period", "0s"]).starts_with("--fencing-period:"));
        assert!(with(&["--fencing-period", "soon"]).starts_with("--fencing-period:"));
        assert!(with(&["--credential-secret", "nope"]).starts_with("--credential-secret:"));
        for bad in ["0s", "soon"] {
            assert!(
                with(&["--member-api-timeout", bad]).starts_with("--member-api-timeout:"),
                "{bad}"
            );
        }
    }
}
