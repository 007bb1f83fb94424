//! Which plugins run, and how much each score weighs.
//!
//! `--plugins` follows karmada-scheduler: a comma-separated list read left to right, where `*`
//! enables every in-tree plugin, `foo` enables `foo` and `-foo` disables it (`*,-foo`: all but
//! `foo`). The list covers filter and score plugins alike. Score weights are `Name=weight`
//! pairs (`AvailableCapacity=2,ClusterLocality=1`); every enabled score weighs 1 by default.

use std::collections::{BTreeMap, BTreeSet};

use crate::plugins::{FILTER_PLUGINS, SCORE_PLUGINS};

/// A `--plugins` or weights value the scheduler cannot use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{flag}: unknown plugin `{name}` (known: {known})")]
    UnknownPlugin {
        flag: &'static str,
        name: String,
        known: String,
    },
    #[error("{flag}: `{entry}` is not Name=weight")]
    MalformedWeight { flag: &'static str, entry: String },
    #[error("{flag}: weight of {name} must be between 0 and 1000, got `{value}`")]
    BadWeight {
        flag: &'static str,
        name: String,
        value: String,
    },
    #[error("{flag}: {name} is a filter plugin; only score plugins take weights")]
    NotAScore { flag: &'static str, name: String },
}

/// The enabled plugins and the score weights.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Enabled filter plugins (run in the fixed order of `FILTER_PLUGINS`).
    pub filters: BTreeSet<&'static str>,
    /// Enabled score plugins and their weights.
    pub scores: BTreeMap<&'static str, i64>,
}

impl Default for SchedulerConfig {
    /// Every in-tree plugin, every score weighing 1.
    fn default() -> SchedulerConfig {
        SchedulerConfig {
            filters: FILTER_PLUGINS.into_iter().collect(),
            scores: SCORE_PLUGINS.into_iter().map(|n| (n, 1)).collect(),
        }
    }
}

const PLUGINS_FLAG: &str = "--plugins";
const WEIGHTS_FLAG: &str = "--score-weights";

fn known() -> String {
    FILTER_PLUGINS
        .iter()
        .chain(SCORE_PLUGINS.iter())
        .copied()
        .collect::<Vec<_>>()
        .join(", ")
}

fn lookup(flag: &'static str, name: &str) -> Result<&'static str, ConfigError> {
    FILTER_PLUGINS
        .iter()
        .chain(SCORE_PLUGINS.iter())
        .find(|n| **n == name)
        .copied()
        .ok_or_else(|| ConfigError::UnknownPlugin {
            flag,
            name: name.to_string(),
            known: known(),
        })
}

impl SchedulerConfig {
    /// Builds the configuration from the two flag values (`"*"` and `""` give the default).
    pub fn from_flags(plugins: &str, weights: &str) -> Result<SchedulerConfig, ConfigError> {
        let enabled = Self::parse_plugins(plugins)?;
        let mut config = SchedulerConfig {
            filters: FILTER_PLUGINS
                .into_iter()
                .filter(|n| enabled.contains(n))
                .collect(),
            scores: SCORE_PLUGINS
                .into_iter()
                .filter(|n| enabled.contains(n))
                .map(|n| (n, 1))
                .collect(),
        };
        for (name, weight) in Self::parse_weights(weights)? {
            // A weight for a plugin `--plugins` disabled is accepted and has no effect.
            if let Some(w) = config.scores.get_mut(name) {
                *w = weight;
            }
        }
        Ok(config)
    }

    /// Karmada's `--plugins` list: the set of enabled plugin names.
    pub fn parse_plugins(spec: &str) -> Result<BTreeSet<&'static str>, ConfigError> {
        let mut enabled = BTreeSet::new();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if item == "*" {
                enabled.extend(FILTER_PLUGINS);
                enabled.extend(SCORE_PLUGINS);
            } else if let Some(name) = item.strip_prefix('-') {
                enabled.remove(lookup(PLUGINS_FLAG, name.trim())?);
            } else {
                enabled.insert(lookup(PLUGINS_FLAG, item)?);
            }
        }
        Ok(enabled)
    }

    /// `Name=weight` pairs for score plugins, weights 0..=1000 (0 turns a score off).
    pub fn parse_weights(spec: &str) -> Result<Vec<(&'static str, i64)>, ConfigError> {
        let mut out = Vec::new();
        for entry in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((name, value)) = entry.split_once('=') else {
                return Err(ConfigError::MalformedWeight {
                    flag: WEIGHTS_FLAG,
                    entry: entry.to_string(),
                });
            };
            let name = lookup(WEIGHTS_FLAG, name.trim())?;
            if !SCORE_PLUGINS.contains(&name) {
                return Err(ConfigError::NotAScore {
                    flag: WEIGHTS_FLAG,
                    name: name.to_string(),
                });
            }
            let weight = value
                .trim()
                .parse::<i64>()
                .ok()
                .filter(|w| (0..=1000).contains(w))
                .ok_or_else(|| ConfigError::BadWeight {
                    flag: WEIGHTS_FLAG,
                    name: name.to_string(),
                    value: value.trim().to_string(),
                })?;
            out.push((name, weight));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn karmada_plugin_lists() {
        let all = SchedulerConfig::from_flags("*", "").unwrap();
        assert_eq!(all, SchedulerConfig::default());
        assert_eq!(all.filters.len(), 6);
        assert_eq!(all.scores.len(), 3);

        let some = SchedulerConfig::from_flags("*,-GangFit,-ClusterLocality", "").unwrap();
        assert!(!some.filters.contains("GangFit"));
        assert!(!some.scores.contains_key("ClusterLocality"));
        assert_eq!(some.filters.len(), 5);

        let only = SchedulerConfig::from_flags("TaintToleration,ClusterLocality", "").unwrap();
        assert_eq!(
            only.filters.iter().copied().collect::<Vec<_>>(),
            ["TaintToleration"]
        );
        assert_eq!(
            only.scores.keys().copied().collect::<Vec<_>>(),
            ["ClusterLocality"]
        );

        assert!(
            SchedulerConfig::from_flags("", "")
                .unwrap()
                .filters
                .is_empty()
        );
    }

    #[test]
    fn weights() {
        let c = SchedulerConfig::from_flags("*", "AvailableCapacity=3, ClusterLocality=0").unwrap();
        assert_eq!(c.scores["AvailableCapacity"], 3);
        assert_eq!(c.scores["ClusterLocality"], 0);
        assert_eq!(c.scores["CapacityType"], 1);
    }

    #[test]
    fn bad_flags_say_what_is_wrong() {
        let err = SchedulerConfig::from_flags("*,-Nope", "").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--plugins: unknown plugin `Nope` (known: ClusterAffinity"),
            "{err}"
        );
        let err = SchedulerConfig::from_flags("*", "AvailableCapacity").unwrap_err();
        assert_eq!(
            err.to_string(),
            "--score-weights: `AvailableCapacity` is not Name=weight"
        );
        let err = SchedulerConfig::from_flags("*", "AvailableCapacity=-1").unwrap_err();
        assert!(matches!(err, ConfigError::BadWeight { .. }), "{err}");
        let err = SchedulerConfig::from_flags("*", "GangFit=2").unwrap_err();
        assert!(matches!(err, ConfigError::NotAScore { .. }), "{err}");
    }
}
