//! Label selector matching (`metav1.LabelSelector`) as Kubernetes does it: `matchLabels` and
//! every `matchExpressions` term must hold; `In` / `NotIn` / `Exists` / `DoesNotExist`. Used for
//! policies' resource selectors (templates' labels) and cluster affinities (clusters' labels).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Why a selector is invalid (the apiserver would have refused it in a Pod; in a CRD field it
/// is only checked here).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error(
        "matchExpressions[{index}]: operator {operator:?} is not In, NotIn, Exists or DoesNotExist"
    )]
    Operator { index: usize, operator: String },
    #[error("matchExpressions[{index}]: operator {operator} needs at least one value")]
    NoValues { index: usize, operator: String },
    #[error("matchExpressions[{index}]: operator {operator} takes no values")]
    UnexpectedValues { index: usize, operator: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A validated selector, ready to match many label sets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

impl Selector {
    /// Compiles a selector. An empty selector matches everything.
    pub fn compile(selector: &LabelSelector) -> Result<Selector, SelectorError> {
        let mut requirements = Vec::new();
        if let Some(labels) = &selector.match_labels {
            for (k, v) in labels {
                requirements.push(Requirement::Equals(k.clone(), v.clone()));
            }
        }
        for (index, expr) in selector.match_expressions.iter().flatten().enumerate() {
            let values = expr.values.clone().unwrap_or_default();
            let key = expr.key.clone();
            let requirement = match expr.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(SelectorError::NoValues {
                        index,
                        operator: expr.operator.clone(),
                    });
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(SelectorError::UnexpectedValues {
                        index,
                        operator: expr.operator.clone(),
                    });
                }
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                other => {
                    return Err(SelectorError::Operator {
                        index,
                        operator: other.to_string(),
                    });
                }
            };
            requirements.push(requirement);
        }
        Ok(Selector { requirements })
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }

    /// True for the empty selector (matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn selector(v: serde_json::Value) -> Result<Selector, SelectorError> {
        Selector::compile(&serde_json::from_value(v).unwrap())
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_operator_matches_as_kubernetes_does() {
        let s = selector(json!({
            "matchLabels": {"team": "ml"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["gpu", "tpu"]},
                {"key": "env", "operator": "NotIn", "values": ["dev"]},
                {"key": "owner", "operator": "Exists"},
                {"key": "legacy", "operator": "DoesNotExist"}
            ]
        }))
        .unwrap();
        assert!(s.matches(&labels(&[("team", "ml"), ("tier", "gpu"), ("owner", "a")])));
        assert!(!s.matches(&labels(&[("team", "ml"), ("tier", "cpu"), ("owner", "a")])));
        assert!(!s.matches(&labels(&[
            ("team", "ml"),
            ("tier", "gpu"),
            ("owner", "a"),
            ("env", "dev")
        ])));
        assert!(!s.matches(&labels(&[("team", "ml"), ("tier", "gpu")])));
        assert!(!s.matches(&labels(&[
            ("team", "ml"),
            ("tier", "gpu"),
            ("owner", "a"),
            ("legacy", "1")
        ])));
        assert!(!s.matches(&labels(&[("tier", "gpu"), ("owner", "a")])));
        assert!(selector(json!({})).unwrap().matches(&BTreeMap::new()));
    }

    #[test]
    fn malformed_expressions_are_named() {
        let err =
            selector(json!({"matchExpressions": [{"key": "a", "operator": "In"}]})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "matchExpressions[0]: operator In needs at least one value"
        );
        assert!(
            selector(
                json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]})
            )
            .is_err()
        );
        assert!(
            selector(
                json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["1"]}]})
            )
            .is_err()
        );
    }
}
