//! Selectors compiled once per request: cluster affinity (names, exclusions, label and field
//! selectors), tolerations, and the node claim of a pod template.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use lifeboat_api::policy::ClusterAffinity;

use crate::request::RequestError;
use crate::snapshot::{ClusterSnapshot, ClusterTaint};

/// The operator of a label requirement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operator {
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
    /// Node selectors only: the label value, an integer, is greater / less than this.
    Gt(i64),
    Lt(i64),
}

/// One requirement of a selector: `key <operator> values`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
}

impl Requirement {
    /// Kubernetes label selector semantics: `In` needs the label, `NotIn` matches a missing
    /// label, `Gt`/`Lt` need an integer value.
    pub fn matches(&self, value: Option<&str>) -> bool {
        match (&self.operator, value) {
            (Operator::In(values), Some(v)) => values.iter().any(|x| x == v),
            (Operator::In(_), None) => false,
            (Operator::NotIn(values), Some(v)) => !values.iter().any(|x| x == v),
            (Operator::NotIn(_), None) => true,
            (Operator::Exists, v) => v.is_some(),
            (Operator::DoesNotExist, v) => v.is_none(),
            (Operator::Gt(bound), Some(v)) => v.parse::<i64>().is_ok_and(|n| n > *bound),
            (Operator::Lt(bound), Some(v)) => v.parse::<i64>().is_ok_and(|n| n < *bound),
            (Operator::Gt(_) | Operator::Lt(_), None) => false,
        }
    }

    fn compile(
        field: &str,
        key: &str,
        operator: &str,
        values: Option<&Vec<String>>,
        allow_numeric: bool,
    ) -> Result<Requirement, RequestError> {
        let values = values.cloned().unwrap_or_default();
        let need_values = |values: Vec<String>| {
            if values.is_empty() {
                Err(RequestError::new(
                    format!("{field}.values"),
                    format!("must be non-empty for operator {operator}"),
                ))
            } else {
                Ok(values)
            }
        };
        let no_values = |values: &Vec<String>| {
            if values.is_empty() {
                Ok(())
            } else {
                Err(RequestError::new(
                    format!("{field}.values"),
                    format!("must be empty for operator {operator}"),
                ))
            }
        };
        let single_integer = |values: Vec<String>| -> Result<i64, RequestError> {
            match values.as_slice() {
                [one] => one.parse::<i64>().map_err(|_| {
                    RequestError::new(
                        format!("{field}.values"),
                        format!("`{one}` is not an integer (operator {operator})"),
                    )
                }),
                _ => Err(RequestError::new(
                    format!("{field}.values"),
                    format!("must hold exactly one integer for operator {operator}"),
                )),
            }
        };
        let operator = match operator {
            "In" => Operator::In(need_values(values)?),
            "NotIn" => Operator::NotIn(need_values(values)?),
            "Exists" => {
                no_values(&values)?;
                Operator::Exists
            }
            "DoesNotExist" => {
                no_values(&values)?;
                Operator::DoesNotExist
            }
            "Gt" if allow_numeric => Operator::Gt(single_integer(values)?),
            "Lt" if allow_numeric => Operator::Lt(single_integer(values)?),
            other => {
                let allowed = if allow_numeric {
                    "In, NotIn, Exists, DoesNotExist, Gt or Lt"
                } else {
                    "In, NotIn, Exists or DoesNotExist"
                };
                return Err(RequestError::new(
                    format!("{field}.operator"),
                    format!("unknown operator `{other}` (expected {allowed})"),
                ));
            }
        };
        Ok(Requirement {
            key: key.to_string(),
            operator,
        })
    }
}

/// A compiled Kubernetes label selector (matchLabels and matchExpressions, all ANDed; an
/// empty selector matches everything).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelMatcher {
    pub requirements: Vec<Requirement>,
}

impl LabelMatcher {
    pub fn compile(field: &str, selector: &LabelSelector) -> Result<LabelMatcher, RequestError> {
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            requirements.push(Requirement {
                key: key.clone(),
                operator: Operator::In(vec![value.clone()]),
            });
        }
        for (i, expr) in selector.match_expressions.iter().flatten().enumerate() {
            requirements.push(Requirement::compile(
                &format!("{field}.matchExpressions[{i}]"),
                &expr.key,
                &expr.operator,
                expr.values.as_ref(),
                false,
            )?);
        }
        Ok(LabelMatcher { requirements })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements
            .iter()
            .all(|r| r.matches(labels.get(&r.key).map(String::as_str)))
    }
}

/// Which cluster field a field selector reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterField {
    Provider,
    Region,
    Zone,
}

impl ClusterField {
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterField::Provider => "provider",
            ClusterField::Region => "region",
            ClusterField::Zone => "zone",
        }
    }

    pub fn of(self, cluster: &ClusterSnapshot) -> Option<&str> {
        match self {
            ClusterField::Provider => cluster.provider.as_deref(),
            ClusterField::Region => cluster.region.as_deref(),
            ClusterField::Zone => cluster.zone.as_deref(),
        }
    }
}

/// A compiled `ClusterAffinity`: every given term must match.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AffinityMatcher {
    pub cluster_names: Vec<String>,
    pub excluded: Vec<String>,
    pub labels: Option<LabelMatcher>,
    pub fields: Vec<(ClusterField, Requirement)>,
}

/// Why a cluster does not match an affinity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AffinityMismatch {
    NotInClusterNames,
    Excluded,
    Labels,
    Field(ClusterField),
}

impl AffinityMismatch {
    /// The reason, for the cluster that did not match.
    pub fn describe(self, cluster: &ClusterSnapshot) -> String {
        match self {
            AffinityMismatch::NotInClusterNames => "not in clusterAffinity.clusterNames".into(),
            AffinityMismatch::Excluded => "listed in clusterAffinity.exclude".into(),
            AffinityMismatch::Labels => {
                "cluster labels do not match clusterAffinity.labelSelector".into()
            }
            AffinityMismatch::Field(field) => match field.of(cluster) {
                Some(value) => format!(
                    "{} `{value}` does not match clusterAffinity.fieldSelector",
                    field.as_str()
                ),
                None => format!(
                    "no {} set, which clusterAffinity.fieldSelector needs",
                    field.as_str()
                ),
            },
        }
    }
}

impl AffinityMatcher {
    pub fn compile(
        field: &str,
        affinity: &ClusterAffinity,
    ) -> Result<AffinityMatcher, RequestError> {
        let labels = affinity
            .label_selector
            .as_ref()
            .map(|s| LabelMatcher::compile(&format!("{field}.labelSelector"), s))
            .transpose()?;
        let mut fields = Vec::new();
        for (i, expr) in affinity
            .field_selector
            .iter()
            .flat_map(|s| s.match_expressions.iter())
            .enumerate()
        {
            let path = format!("{field}.fieldSelector.matchExpressions[{i}]");
            let cluster_field = match expr.key.as_str() {
                "provider" => ClusterField::Provider,
                "region" => ClusterField::Region,
                "zone" => ClusterField::Zone,
                other => {
                    return Err(RequestError::new(
                        format!("{path}.key"),
                        format!("`{other}` is not one of provider, region, zone"),
                    ));
                }
            };
            if expr.operator != "In" && expr.operator != "NotIn" {
                return Err(RequestError::new(
                    format!("{path}.operator"),
                    format!("`{}` is not In or NotIn", expr.operator),
                ));
            }
            fields.push((
                cluster_field,
                Requirement::compile(
                    &path,
                    &expr.key,
                    &expr.operator,
                    expr.values.as_ref(),
                    false,
                )?,
            ));
        }
        Ok(AffinityMatcher {
            cluster_names: affinity.cluster_names.clone(),
            excluded: affinity.excluded_clusters.clone(),
            labels,
            fields,
        })
    }

    pub fn check(&self, cluster: &ClusterSnapshot) -> Result<(), AffinityMismatch> {
        let name: &str = &cluster.name;
        if self.excluded.iter().any(|n| n == name) {
            return Err(AffinityMismatch::Excluded);
        }
        if !self.cluster_names.is_empty() && !self.cluster_names.iter().any(|n| n == name) {
            return Err(AffinityMismatch::NotInClusterNames);
        }
        if let Some(labels) = &self.labels
            && !labels.matches(&cluster.labels)
        {
            return Err(AffinityMismatch::Labels);
        }
        for (field, requirement) in &self.fields {
            if !requirement.matches(field.of(cluster)) {
                return Err(AffinityMismatch::Field(*field));
            }
        }
        Ok(())
    }

    pub fn matches(&self, cluster: &ClusterSnapshot) -> bool {
        self.check(cluster).is_ok()
    }
}

/// A compiled cluster toleration (`Equal` or `Exists`; Lt/Gt are refused, as the API does).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TolerationMatcher {
    key: Option<String>,
    effect: Option<String>,
    /// `None`: Exists; `Some(value)`: Equal.
    value: Option<String>,
}

impl TolerationMatcher {
    pub fn compile(
        field: &str,
        toleration: &Toleration,
    ) -> Result<TolerationMatcher, RequestError> {
        let key = toleration.key.clone().filter(|k| !k.is_empty());
        let value = match toleration.operator.as_deref().unwrap_or("Equal") {
            "" | "Equal" => Some(toleration.value.clone().unwrap_or_default()),
            "Exists" => {
                if toleration.value.as_deref().is_some_and(|v| !v.is_empty()) {
                    return Err(RequestError::new(
                        format!("{field}.value"),
                        "must be empty when operator is Exists",
                    ));
                }
                None
            }
            other => {
                return Err(RequestError::new(
                    format!("{field}.operator"),
                    format!("`{other}` is not supported for cluster tolerations (Equal or Exists)"),
                ));
            }
        };
        if key.is_none() && value.is_some() {
            return Err(RequestError::new(
                format!("{field}.operator"),
                "must be Exists when key is empty",
            ));
        }
        Ok(TolerationMatcher {
            key,
            effect: toleration.effect.clone().filter(|e| !e.is_empty()),
            value,
        })
    }

    /// Kubernetes' `ToleratesTaint`.
    pub fn tolerates(&self, taint: &ClusterTaint) -> bool {
        if let Some(effect) = &self.effect
            && effect != taint.effect.as_str()
        {
            return false;
        }
        if let Some(key) = &self.key
            && key != &taint.key
        {
            return false;
        }
        match &self.value {
            None => true,
            Some(value) => value == &taint.value,
        }
    }
}

/// The node constraints of a pod template (nodeSelector and required node affinity), checked
/// against the labels a node group reports. Node groups report a small, fixed set of labels
/// (zone, GPU product), so a requirement on a key the group does not report cannot be decided
/// here and is left to the member's kube-scheduler: it does not reject the group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeClaimMatcher {
    selector: Vec<(String, String)>,
    /// ORed terms of ANDed requirements; empty: no affinity.
    terms: Vec<Vec<Requirement>>,
}

impl NodeClaimMatcher {
    pub fn compile(
        field: &str,
        node_selector: &BTreeMap<String, String>,
        affinity_terms: &[Vec<NodeSelectorRequirement>],
    ) -> Result<NodeClaimMatcher, RequestError> {
        let selector = node_selector
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut terms = Vec::with_capacity(affinity_terms.len());
        for (t, term) in affinity_terms.iter().enumerate() {
            let mut requirements = Vec::with_capacity(term.len());
            for (i, expr) in term.iter().enumerate() {
                requirements.push(Requirement::compile(
                    &format!(
                        "{field}.hardNodeAffinity.nodeSelectorTerms[{t}].matchExpressions[{i}]"
                    ),
                    &expr.key,
                    &expr.operator,
                    expr.values.as_ref(),
                    true,
                )?);
            }
            terms.push(requirements);
        }
        Ok(NodeClaimMatcher { selector, terms })
    }

    pub fn is_empty(&self) -> bool {
        self.selector.is_empty() && self.terms.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let selector_ok = self
            .selector
            .iter()
            .all(|(k, v)| labels.get(k).is_none_or(|actual| actual == v));
        selector_ok
            && (self.terms.is_empty()
                || self.terms.iter().any(|term| {
                    term.iter().all(|r| match labels.get(&r.key) {
                        Some(value) => r.matches(Some(value)),
                        None => true,
                    })
                }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::TaintEffect;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn selector(value: serde_json::Value) -> Result<LabelMatcher, RequestError> {
        LabelMatcher::compile("sel", &serde_json::from_value(value).unwrap())
    }

    #[test]
    fn label_selector_operators() {
        let s = selector(json!({
            "matchLabels": {"env": "prod"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["gpu", "batch"]},
                {"key": "legacy", "operator": "DoesNotExist"},
                {"key": "owner", "operator": "Exists"},
                {"key": "pool", "operator": "NotIn", "values": ["reserved"]}
            ]
        }))
        .unwrap();
        let mut l = labels(&[("env", "prod"), ("tier", "gpu"), ("owner", "ml")]);
        assert!(s.matches(&l), "NotIn matches a missing label");
        l.insert("pool".into(), "reserved".into());
        assert!(!s.matches(&l));
        l.remove("pool");
        l.insert("legacy".into(), "yes".into());
        assert!(!s.matches(&l));
        l.remove("legacy");
        l.remove("owner");
        assert!(!s.matches(&l));
        assert!(selector(json!({})).unwrap().matches(&BTreeMap::new()));
    }

    #[test]
    fn bad_selectors_name_the_field() {
        let err =
            selector(json!({"matchExpressions": [{"key": "a", "operator": "Near"}]})).unwrap_err();
        assert_eq!(err.field, "sel.matchExpressions[0].operator");
        let err =
            selector(json!({"matchExpressions": [{"key": "a", "operator": "In"}]})).unwrap_err();
        assert_eq!(err.field, "sel.matchExpressions[0].values");
        let err = selector(
            json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
        )
        .unwrap_err();
        assert!(err.reason.contains("must be empty"), "{err}");
    }

    #[test]
    fn tolerations_follow_kubernetes() {
        let taint = ClusterTaint {
            key: "cluster.lifeboat.dev/unreachable".into(),
            value: String::new(),
            effect: TaintEffect::NoSchedule,
        };
        let t = |v: serde_json::Value| {
            TolerationMatcher::compile("t", &serde_json::from_value(v).unwrap())
        };
        assert!(
            t(json!({"key": "cluster.lifeboat.dev/unreachable", "operator": "Exists"}))
                .unwrap()
                .tolerates(&taint)
        );
        assert!(t(json!({"operator": "Exists"})).unwrap().tolerates(&taint));
        assert!(
            !t(json!({"operator": "Exists", "effect": "NoExecute"}))
                .unwrap()
                .tolerates(&taint)
        );
        assert!(
            t(json!({"key": "cluster.lifeboat.dev/unreachable"}))
                .unwrap()
                .tolerates(&taint),
            "Equal with no value matches an empty value"
        );
        assert!(
            !t(json!({"key": "cluster.lifeboat.dev/unreachable", "value": "x"}))
                .unwrap()
                .tolerates(&taint)
        );
        let err = t(json!({"key": "k", "operator": "Lt", "value": "3"})).unwrap_err();
        assert_eq!(err.field, "t.operator");
    }

    #[test]
    fn node_claims_only_judge_reported_labels() {
        let m = NodeClaimMatcher::compile("c", &labels(&[("nvidia.com/gpu.product", "H100")]), &[])
            .unwrap();
        assert!(m.matches(&labels(&[("nvidia.com/gpu.product", "H100")])));
        assert!(!m.matches(&labels(&[("nvidia.com/gpu.product", "A100")])));
        assert!(m.matches(&labels(&[("topology.kubernetes.io/zone", "a")])));
        let terms: Vec<Vec<NodeSelectorRequirement>> =
            vec![vec![serde_json::from_value(
            json!({"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}),
        )
        .unwrap()]];
        let m = NodeClaimMatcher::compile("c", &BTreeMap::new(), &terms).unwrap();
        assert!(m.matches(&labels(&[("topology.kubernetes.io/zone", "a")])));
        assert!(!m.matches(&labels(&[("topology.kubernetes.io/zone", "b")])));
    }
}
