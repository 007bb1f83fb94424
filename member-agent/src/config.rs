//! Operator configuration of the AppWrapper controller (same JSON keys as upstream's
//! `appwrapper-operator-config`), loaded from a YAML file; absent keys keep their defaults.

use std::time::Duration;

use lifeboat_api::appwrapper::autopilot::AutopilotConfig;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::duration;

/// Top-level configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OperatorConfig {
    pub appwrapper: AppWrapperConfig,
}

/// The `appwrapper` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AppWrapperConfig {
    /// `None` turns Autopilot support off.
    pub autopilot: Option<AutopilotConfig>,
    /// Check with a SubjectAccessReview that the user may create every wrapped kind.
    #[serde(rename = "userRBACAdmissionCheck")]
    pub user_rbac_admission_check: bool,
    pub fault_tolerance: FaultToleranceConfig,
    /// Set on pod templates that name no scheduler (empty: leave them alone).
    pub scheduler_name: String,
    /// Queue label added on create when the user sets none (empty: none).
    pub default_queue_name: String,
    /// Taint keys that announce a spot reclamation (the node goes away soon); default
    /// [`DEFAULT_RECLAMATION_TAINTS`].
    pub reclamation_taints: Vec<String>,
}

impl Default for AppWrapperConfig {
    fn default() -> Self {
        Self {
            autopilot: Some(AutopilotConfig::default()),
            user_rbac_admission_check: true,
            fault_tolerance: FaultToleranceConfig::default(),
            scheduler_name: String::new(),
            default_queue_name: String::new(),
            reclamation_taints: DEFAULT_RECLAMATION_TAINTS
                .iter()
                .map(|key| key.to_string())
                .collect(),
        }
    }
}

/// AWS Node Termination Handler, on an EC2 Spot interruption notice (two minutes ahead) when
/// its `taintNode` option is on: the `SpotInterruptionTaint` constant of its `pkg/node/node.go`
/// ("a taint used to make spot instance unschedulable").
pub const AWS_SPOT_INTERRUPTION_TAINT: &str = "aws-node-termination-handler/spot-itn";

/// Google's node termination handler for GKE nodes that cannot live-migrate (preemptible and
/// Spot VMs, VMs with GPUs): the taint its `--taint` flag documents
/// (`cloud.google.com/impending-node-termination::NoSchedule`, GoogleCloudPlatform
/// k8s-node-termination-handler `main.go`), placed when the GCE metadata server announces the
/// VM's termination.
pub const GKE_IMPENDING_TERMINATION_TAINT: &str = "cloud.google.com/impending-node-termination";

/// AKS node auto-drain: on a `Preempt` scheduled event (a Spot VM being evicted) or a
/// `Redeploy`, AKS cordons and drains the node, and the node "may receive a taint with
/// `remediator.kubernetes.azure.com/unschedulable`" (AKS documentation, "Node auto-drain").
/// Not `kubernetes.azure.com/scalesetpriority`: AKS puts that taint on every Spot node from its
/// creation, so it announces nothing.
pub const AKS_AUTO_DRAIN_TAINT: &str = "remediator.kubernetes.azure.com/unschedulable";

/// Default `reclamationTaints`: each key is set by the cloud or by the termination handler named
/// in its constant's documentation when the node is about to go away.
pub const DEFAULT_RECLAMATION_TAINTS: [&str; 3] = [
    AWS_SPOT_INTERRUPTION_TAINT,
    GKE_IMPENDING_TERMINATION_TAINT,
    AKS_AUTO_DRAIN_TAINT,
];

/// Fault-tolerance defaults (the seed's parameter table). JSON keys are upstream's, including
/// its renames; durations are Go nanosecond integers (upstream's encoding) or strings like "90s".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FaultToleranceConfig {
    #[serde(with = "go_duration")]
    pub admission_grace_period: Duration,
    #[serde(with = "go_duration")]
    pub warmup_grace_period: Duration,
    #[serde(with = "go_duration")]
    pub failure_grace_period: Duration,
    #[serde(rename = "resetPause", with = "go_duration")]
    pub retry_pause_period: Duration,
    pub retry_limit: i32,
    #[serde(rename = "deletionGracePeriod", with = "go_duration")]
    pub forceful_deletion_grace_period: Duration,
    #[serde(rename = "gracePeriodCeiling", with = "go_duration")]
    pub grace_period_maximum: Duration,
    #[serde(rename = "successTTLCeiling", with = "go_duration")]
    pub success_ttl: Duration,
}

impl Default for FaultToleranceConfig {
    fn default() -> Self {
        Self {
            admission_grace_period: Duration::from_secs(60),
            warmup_grace_period: Duration::from_secs(5 * 60),
            failure_grace_period: Duration::from_secs(60),
            retry_pause_period: Duration::from_secs(90),
            retry_limit: 3,
            forceful_deletion_grace_period: Duration::from_secs(10 * 60),
            grace_period_maximum: Duration::from_secs(24 * 3600),
            success_ttl: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// A configuration value that cannot work, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {field}: {reason}")]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

impl FaultToleranceConfig {
    /// Upstream's `ValidateAppWrapperConfig` rules, with the field named.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let ceiling = self.grace_period_maximum;
        let check = |field: &str, value: Duration| {
            if value > ceiling {
                Err(ConfigError {
                    field: format!("appwrapper.faultTolerance.{field}"),
                    reason: format!("{} exceeds gracePeriodCeiling {}", fmt(value), fmt(ceiling)),
                })
            } else {
                Ok(())
            }
        };
        check("deletionGracePeriod", self.forceful_deletion_grace_period)?;
        check("resetPause", self.retry_pause_period)?;
        check("failureGracePeriod", self.failure_grace_period)?;
        check("admissionGracePeriod", self.admission_grace_period)?;
        check("warmupGracePeriod", self.warmup_grace_period)?;
        if self.admission_grace_period > self.warmup_grace_period {
            return Err(ConfigError {
                field: "appwrapper.faultTolerance.admissionGracePeriod".into(),
                reason: format!(
                    "{} exceeds warmupGracePeriod {}",
                    fmt(self.admission_grace_period),
                    fmt(self.warmup_grace_period)
                ),
            });
        }
        if self.success_ttl.is_zero() {
            return Err(ConfigError {
                field: "appwrapper.faultTolerance.successTTLCeiling".into(),
                reason: "must be greater than 0".into(),
            });
        }
        if self.retry_limit < 0 {
            return Err(ConfigError {
                field: "appwrapper.faultTolerance.retryLimit".into(),
                reason: format!("{} is negative", self.retry_limit),
            });
        }
        Ok(())
    }
}

impl OperatorConfig {
    /// Parses YAML (or JSON) over the defaults and validates it.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let config: OperatorConfig = if text.trim().is_empty() {
            OperatorConfig::default()
        } else {
            serde_saphyr::from_str(text).map_err(|e| ConfigError {
                field: "config".into(),
                reason: e.to_string(),
            })?
        };
        config.appwrapper.fault_tolerance.validate()?;
        Ok(config)
    }
}

fn fmt(d: Duration) -> String {
    duration::GoDuration(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)).to_string()
}

/// Go `time.Duration` in JSON: nanoseconds as an integer, or (Lifeboat extension) a Go duration
/// string.
mod go_duration {
    use super::*;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Nanos(i64),
            Text(String),
        }
        let nanos = match Raw::deserialize(d)? {
            Raw::Nanos(n) => n,
            Raw::Text(t) => duration::parse(&t).map_err(serde::de::Error::custom)?.0,
        };
        if nanos < 0 {
            return Err(serde::de::Error::custom(format!(
                "negative duration {nanos}ns"
            )));
        }
        Ok(Duration::from_nanos(nanos as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_seed_table_and_validate() {
        let c = FaultToleranceConfig::default();
        assert_eq!(c.admission_grace_period, Duration::from_secs(60));
        assert_eq!(c.warmup_grace_period, Duration::from_secs(300));
        assert_eq!(c.retry_pause_period, Duration::from_secs(90));
        assert_eq!(c.retry_limit, 3);
        assert_eq!(c.forceful_deletion_grace_period, Duration::from_secs(600));
        assert_eq!(c.success_ttl, Duration::from_secs(7 * 86400));
        assert!(c.validate().is_ok());
        assert!(OperatorConfig::default().appwrapper.autopilot.is_some());
    }

    #[test]
    fn default_reclamation_taints_are_the_sourced_keys_only() {
        let keys = AppWrapperConfig::default().reclamation_taints;
        assert_eq!(
            keys,
            vec![
                "aws-node-termination-handler/spot-itn",
                "cloud.google.com/impending-node-termination",
                "remediator.kubernetes.azure.com/unschedulable",
            ]
        );
        // Neither the unsourced key of earlier versions nor AKS's permanent Spot taint.
        assert!(!keys.iter().any(|k| k.starts_with("kubernetes.azure.com/")));
        let custom =
            OperatorConfig::from_yaml("appwrapper:\n  reclamationTaints: [example.com/going]\n")
                .unwrap();
        assert_eq!(
            custom.appwrapper.reclamation_taints,
            vec!["example.com/going"]
        );
    }

    #[test]
    fn partial_yaml_overrides_defaults_with_both_duration_encodings() {
        let c = OperatorConfig::from_yaml(
            "appwrapper:\n  faultTolerance:\n    failureGracePeriod: 10000000000\n    resetPause: 5s\n    retryLimit: 1\n",
        )
        .unwrap();
        let ft = &c.appwrapper.fault_tolerance;
        assert_eq!(ft.failure_grace_period, Duration::from_secs(10));
        assert_eq!(ft.retry_pause_period, Duration::from_secs(5));
        assert_eq!(ft.retry_limit, 1);
        assert_eq!(ft.warmup_grace_period, Duration::from_secs(300));
    }

    #[test]
    fn upstream_validation_rules_name_the_field() {
        let one = Duration::from_secs(1);
        let ten = Duration::from_secs(10);
        type Mutation = Box<dyn Fn(&mut FaultToleranceConfig)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (
                Box::new(move |c| c.forceful_deletion_grace_period = ten),
                "deletionGracePeriod",
            ),
            (Box::new(move |c| c.retry_pause_period = ten), "resetPause"),
            (
                Box::new(move |c| c.failure_grace_period = ten),
                "failureGracePeriod",
            ),
            (
                Box::new(move |c| c.admission_grace_period = ten),
                "admissionGracePeriod",
            ),
            (
                Box::new(move |c| c.warmup_grace_period = ten),
                "warmupGracePeriod",
            ),
        ];
        for (mutate, field) in cases {
            let mut c = FaultToleranceConfig {
                grace_period_maximum: one,
                admission_grace_period: Duration::ZERO,
                warmup_grace_period: Duration::ZERO,
                failure_grace_period: Duration::ZERO,
                retry_pause_period: Duration::ZERO,
                forceful_deletion_grace_period: Duration::ZERO,
                ..Default::default()
            };
            mutate(&mut c);
            let err = c.validate().unwrap_err();
            assert!(err.field.ends_with(field), "{err}");
        }
        let c = FaultToleranceConfig {
            admission_grace_period: ten,
            warmup_grace_period: one,
            ..Default::default()
        };
        assert!(
            c.validate()
                .unwrap_err()
                .reason
                .contains("warmupGracePeriod")
        );
        let c = FaultToleranceConfig {
            success_ttl: Duration::ZERO,
            ..Default::default()
        };
        assert!(
            c.validate()
                .unwrap_err()
                .field
                .ends_with("successTTLCeiling")
        );
    }

    #[test]
    fn malformed_config_is_rejected_with_the_reason() {
        let err =
            OperatorConfig::from_yaml("appwrapper:\n  faultTolerance:\n    resetPause: soon\n")
                .unwrap_err();
        assert!(err.reason.contains("soon"), "{err}");
    }
}
