//! The leader-election flags of every Lifeboat binary (feature `clap`): the same names, Go
//! duration syntax and validation for the agent and the hub, as Kubernetes components take them
//! (`--leader-elect`, `--leader-elect-lease-duration`, ...). Each binary supplies its own Lease
//! name and namespace defaults.

use std::time::Duration;

use super::{LeaseConfig, default_identity};

/// Leader election: with several replicas, the one holding the Lease acts; the others keep their
/// caches warm and take over when the lease lapses or is released.
#[derive(Debug, Clone, clap::Args)]
pub struct LeaderElectionArgs {
    /// Act only while holding the Lease (`--leader-elect=false`: always, one replica).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "LIFEBOAT_LEADER_ELECT")]
    pub leader_elect: bool,
    /// Name of the Lease (default: the binary's name).
    #[arg(long, env = "LIFEBOAT_LEADER_ELECT_LEASE_NAME")]
    pub leader_elect_lease_name: Option<String>,
    /// Namespace of the Lease (default: the agent's kubeconfig namespace, the hub's --namespace).
    #[arg(long, env = "LIFEBOAT_LEADER_ELECT_NAMESPACE")]
    pub leader_elect_namespace: Option<String>,
    /// This replica's identity in the Lease (default: $POD_NAME, else hostname_pid).
    #[arg(long, env = "LIFEBOAT_LEADER_ELECT_IDENTITY")]
    pub leader_elect_identity: Option<String>,
    /// How long a standby respects a Lease whose holder stopped renewing (whole seconds).
    #[arg(long, default_value = "15s", value_parser = go_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps acting without renewing the Lease.
    #[arg(long, default_value = "10s", value_parser = go_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// Time between tries to acquire or renew the Lease.
    #[arg(long, default_value = "2s", value_parser = go_duration)]
    pub leader_elect_retry_period: Duration,
}

/// A leader-election flag that cannot work, naming the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--leader-elect-{flag}: {reason}")]
pub struct FlagError {
    /// The flag's suffix after `--leader-elect-`.
    pub flag: &'static str,
    pub reason: String,
}

impl LeaderElectionArgs {
    /// The Lease to campaign for (None with `--leader-elect=false`), validated. An empty
    /// `default_namespace` leaves the namespace empty for the caller to fill in from its client.
    pub fn lease(
        &self,
        default_name: &str,
        default_namespace: &str,
    ) -> Result<Option<LeaseConfig>, FlagError> {
        if !self.leader_elect {
            return Ok(None);
        }
        let identity = self
            .leader_elect_identity
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok().filter(|n| !n.is_empty()))
            .unwrap_or_else(default_identity);
        let lease = LeaseConfig {
            name: self
                .leader_elect_lease_name
                .clone()
                .unwrap_or_else(|| default_name.to_owned()),
            namespace: self
                .leader_elect_namespace
                .clone()
                .unwrap_or_else(|| default_namespace.to_owned()),
            identity,
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        };
        let mut check = lease.clone();
        if check.namespace.is_empty() && self.leader_elect_namespace.is_none() {
            // Filled in later from the client; any name passes here.
            check.namespace = "default".into();
        }
        check.validate().map_err(|e| FlagError {
            flag: match e.field {
                "name" => "lease-name",
                "lease_duration" => "lease-duration",
                "renew_deadline" => "renew-deadline",
                "retry_period" => "retry-period",
                other => other,
            },
            reason: e.reason,
        })?;
        Ok(Some(lease))
    }
}

/// A Go duration ("15s", "1m30s") as a flag value; negative durations are refused.
pub fn go_duration(text: &str) -> Result<Duration, String> {
    let nanos = crate::duration::parse(text).map_err(|e| e.to_string())?.0;
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| format!("{text} is negative"))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        leader_election: LeaderElectionArgs,
    }

    fn parse(flags: &[&str]) -> Result<Option<LeaseConfig>, String> {
        let argv = std::iter::once("binary").chain(flags.iter().copied());
        let args = Args::try_parse_from(argv).map_err(|e| e.to_string())?;
        args.leader_election
            .lease("lifeboat-test", "")
            .map_err(|e| e.to_string())
    }

    #[test]
    fn on_by_default_with_kubernetes_timing_and_the_binarys_lease_name() {
        let lease = parse(&[]).unwrap().expect("on by default");
        assert_eq!(lease.name, "lifeboat-test");
        assert_eq!(lease.namespace, "", "filled in from the client");
        assert_eq!(lease.lease_duration, Duration::from_secs(15));
        assert_eq!(lease.renew_deadline, Duration::from_secs(10));
        assert_eq!(lease.retry_period, Duration::from_secs(2));
        assert!(!lease.identity.is_empty());
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
        assert_eq!(custom.renew_deadline, Duration::from_secs(5));
        assert_eq!(custom.retry_period, Duration::from_secs(1));
    }

    #[test]
    fn bad_flags_are_rejected_naming_the_flag() {
        let err = parse(&["--leader-elect-renew-deadline", "20s"]).unwrap_err();
        assert!(err.starts_with("--leader-elect-lease-duration:"), "{err}");
        let err = parse(&["--leader-elect-retry-period", "9s"]).unwrap_err();
        assert!(err.starts_with("--leader-elect-renew-deadline:"), "{err}");
        let err = parse(&["--leader-elect-lease-name", ""]).unwrap_err();
        assert!(err.starts_with("--leader-elect-lease-name:"), "{err}");
        let err = parse(&["--leader-elect-namespace", ""]).unwrap_err();
        assert!(err.starts_with("--leader-elect-namespace:"), "{err}");
        let err = parse(&["--leader-elect-retry-period", "soon"]).unwrap_err();
        assert!(err.contains("--leader-elect-retry-period"), "{err}");
        let err = parse(&["--leader-elect-lease-duration=-5s"]).unwrap_err();
        assert!(err.contains("negative"), "{err}");
    }
}
