//! The detector's decisions, pure: which workload kinds the hub places, which policy a template
//! belongs to, and the binding spec it gets.
//!
//! Policy choice (Karmada's, made explicit): a PropagationPolicy of the template's namespace
//! before any ClusterPropagationPolicy; then the higher `priority`; then a selector that names
//! the template before one that selects it by labels, before one that selects the whole kind;
//! then the policy name, so the choice is deterministic.

use std::collections::BTreeMap;

use lifeboat_api::binding::{
    Component, ObjectReference, PolicyReference, ReplicaRequirements, ResourceBindingSpec,
};
use lifeboat_api::policy::{AnyPolicy, ResourceSelector};
use lifeboat_api::selector::Selector;

/// A kind of workload template the hub places.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TemplateKind {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    /// The whole workload goes to exactly one cluster.
    pub gang: bool,
}

impl TemplateKind {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// The kinds the hub places (AppWrapper first). The hub watches a kind once its API exists on
/// the hub; their own controllers must not run there.
pub const TEMPLATE_KINDS: &[TemplateKind] = &[
    TemplateKind {
        group: "workload.codeflare.dev",
        version: "v1beta2",
        kind: "AppWrapper",
        plural: "appwrappers",
        gang: true,
    },
    TemplateKind {
        group: "apps",
        version: "v1",
        kind: "Deployment",
        plural: "deployments",
        gang: false,
    },
    TemplateKind {
        group: "apps",
        version: "v1",
        kind: "StatefulSet",
        plural: "statefulsets",
        gang: false,
    },
    TemplateKind {
        group: "batch",
        version: "v1",
        kind: "Job",
        plural: "jobs",
        gang: false,
    },
    TemplateKind {
        group: "jobset.x-k8s.io",
        version: "v1alpha2",
        kind: "JobSet",
        plural: "jobsets",
        gang: true,
    },
    TemplateKind {
        group: "kubeflow.org",
        version: "v1",
        kind: "PyTorchJob",
        plural: "pytorchjobs",
        gang: true,
    },
    TemplateKind {
        group: "ray.io",
        version: "v1",
        kind: "RayJob",
        plural: "rayjobs",
        gang: true,
    },
];

/// The kind of `api_version`/`kind`, if the hub places it.
pub fn template_kind(api_version: &str, kind: &str) -> Option<&'static TemplateKind> {
    TEMPLATE_KINDS
        .iter()
        .find(|k| k.kind == kind && k.api_version() == api_version)
}

/// What the detector needs of a template.
#[derive(Debug, Clone, Copy)]
pub struct TemplateMeta<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
}

/// How specifically a selector picked a template: a higher value wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MatchStrength {
    Kind,
    Labels,
    Name,
}

/// Whether `selector` of a policy in `policy_namespace` (None: cluster-scoped) selects the
/// template, and how specifically. A selector with an invalid label selector selects nothing.
pub fn selects(
    selector: &ResourceSelector,
    policy_namespace: Option<&str>,
    template: &TemplateMeta<'_>,
) -> Option<MatchStrength> {
    if selector.api_version != template.api_version || selector.kind != template.kind {
        return None;
    }
    // A namespaced policy only ever selects templates of its own namespace.
    if let Some(ns) = policy_namespace
        && ns != template.namespace
    {
        return None;
    }
    if let Some(ns) = selector.namespace.as_deref().filter(|ns| !ns.is_empty())
        && ns != template.namespace
    {
        return None;
    }
    if let Some(name) = selector.name.as_deref().filter(|n| !n.is_empty()) {
        return (name == template.name).then_some(MatchStrength::Name);
    }
    match &selector.label_selector {
        Some(ls) => {
            let compiled = Selector::compile(ls).ok()?;
            compiled
                .matches(template.labels)
                .then_some(MatchStrength::Labels)
        }
        None => Some(MatchStrength::Kind),
    }
}

/// The policy's best match for the template, if any of its selectors selects it.
pub fn policy_match(policy: &AnyPolicy, template: &TemplateMeta<'_>) -> Option<MatchStrength> {
    let namespace = match policy {
        AnyPolicy::Namespaced(p) => Some(p.metadata.namespace.as_deref().unwrap_or("")),
        AnyPolicy::Cluster(_) => None,
    };
    policy
        .spec()
        .resource_selectors
        .iter()
        .filter_map(|s| selects(s, namespace, template))
        .max()
}

fn policy_name(policy: &AnyPolicy) -> &str {
    match policy {
        AnyPolicy::Namespaced(p) => p.metadata.name.as_deref().unwrap_or(""),
        AnyPolicy::Cluster(p) => p.metadata.name.as_deref().unwrap_or(""),
    }
}

fn being_deleted(policy: &AnyPolicy) -> bool {
    match policy {
        AnyPolicy::Namespaced(p) => p.metadata.deletion_timestamp.is_some(),
        AnyPolicy::Cluster(p) => p.metadata.deletion_timestamp.is_some(),
    }
}

/// The policy that places the template, by the order in the module doc.
pub fn select_policy<'p>(
    policies: impl IntoIterator<Item = &'p AnyPolicy>,
    template: &TemplateMeta<'_>,
) -> Option<&'p AnyPolicy> {
    policies
        .into_iter()
        .filter(|p| !being_deleted(p))
        .filter_map(|p| policy_match(p, template).map(|strength| (p, strength)))
        .max_by(|(a, sa), (b, sb)| {
            let namespaced = |p: &AnyPolicy| matches!(p, AnyPolicy::Namespaced(_));
            namespaced(a)
                .cmp(&namespaced(b))
                .then(
                    a.spec()
                        .priority
                        .unwrap_or(0)
                        .cmp(&b.spec().priority.unwrap_or(0)),
                )
                .then(sa.cmp(sb))
                // the smaller name wins: reverse for max_by
                .then(policy_name(b).cmp(policy_name(a)))
        })
        .map(|(p, _)| p)
}

/// A reference to the policy, as the binding records it.
pub fn policy_reference(policy: &AnyPolicy) -> PolicyReference {
    match policy {
        AnyPolicy::Namespaced(p) => PolicyReference {
            kind: "PropagationPolicy".into(),
            namespace: p.metadata.namespace.clone().unwrap_or_default(),
            name: p.metadata.name.clone().unwrap_or_default(),
            generation: p.metadata.generation,
        },
        AnyPolicy::Cluster(p) => PolicyReference {
            kind: "ClusterPropagationPolicy".into(),
            namespace: String::new(),
            name: p.metadata.name.clone().unwrap_or_default(),
            generation: p.metadata.generation,
        },
    }
}

/// Whether `reference` names `policy` (ignoring the generation).
pub fn is_policy(reference: &PolicyReference, policy: &AnyPolicy) -> bool {
    let current = policy_reference(policy);
    current.kind == reference.kind
        && current.namespace == reference.namespace
        && current.name == reference.name
}

/// What the interpreter said about the template's replicas.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Replicas {
    pub replicas: i32,
    pub requirements: Option<ReplicaRequirements>,
    pub components: Vec<Component>,
}

/// The detector's part of a binding spec: the resource, its replicas and requirements, and the
/// policy's placement and failover. The scheduler's and failover's fields (clusters, eviction
/// tasks and history) are not the detector's and are left empty here.
pub fn binding_spec(
    kind: &TemplateKind,
    template: &TemplateMeta<'_>,
    uid: &str,
    resource_version: &str,
    policy: &AnyPolicy,
    replicas: Replicas,
) -> ResourceBindingSpec {
    let spec = policy.spec();
    let mut placement = spec.placement.clone();
    if placement.capacity_type_preference.is_none() {
        placement.capacity_type_preference = policy.capacity_type_preference();
    }
    ResourceBindingSpec {
        resource: ObjectReference {
            api_version: template.api_version.to_string(),
            kind: template.kind.to_string(),
            namespace: template.namespace.to_string(),
            name: template.name.to_string(),
            uid: uid.to_string(),
            resource_version: resource_version.to_string(),
        },
        replicas: replicas.replicas,
        replica_requirements: replicas.requirements,
        components: replicas.components,
        gang: kind.gang,
        placement: Some(placement),
        failover: spec.failover.clone(),
        policy: Some(policy_reference(policy)),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lifeboat_api::policy::{
        ClusterPropagationPolicy, ClusterPropagationSpec, PropagationPolicy, PropagationSpec,
    };
    use serde_json::json;

    fn selector(v: serde_json::Value) -> ResourceSelector {
        serde_json::from_value(v).unwrap()
    }

    fn pp(name: &str, ns: &str, priority: i32, selectors: Vec<ResourceSelector>) -> AnyPolicy {
        let mut p = PropagationPolicy::new(
            name,
            PropagationSpec {
                resource_selectors: selectors,
                priority: Some(priority),
                ..Default::default()
            },
        );
        p.metadata.namespace = Some(ns.into());
        AnyPolicy::Namespaced(p)
    }

    fn cpp(name: &str, priority: i32, selectors: Vec<ResourceSelector>) -> AnyPolicy {
        AnyPolicy::Cluster(ClusterPropagationPolicy::new(
            name,
            ClusterPropagationSpec {
                spec: PropagationSpec {
                    resource_selectors: selectors,
                    priority: Some(priority),
                    ..Default::default()
                },
            },
        ))
    }

    fn name_of(p: Option<&AnyPolicy>) -> Option<String> {
        p.map(|p| policy_name(p).to_string())
    }

    const AW: &str = "workload.codeflare.dev/v1beta2";

    #[test]
    fn namespaced_before_cluster_then_priority_then_name_before_labels() {
        let labels = BTreeMap::from([("team".to_string(), "ml".to_string())]);
        let t = TemplateMeta {
            api_version: AW,
            kind: "AppWrapper",
            namespace: "ml",
            name: "train",
            labels: &labels,
        };
        let by_kind = selector(json!({"apiVersion": AW, "kind": "AppWrapper"}));
        let by_label = selector(json!({"apiVersion": AW, "kind": "AppWrapper",
            "labelSelector": {"matchLabels": {"team": "ml"}}}));
        let by_name = selector(json!({"apiVersion": AW, "kind": "AppWrapper", "name": "train"}));
        let policies = vec![
            cpp("cluster-high", 100, vec![by_name.clone()]),
            pp("kind", "ml", 0, vec![by_kind.clone()]),
            pp("labels", "ml", 0, vec![by_label.clone()]),
            pp("other-ns", "dev", 50, vec![by_kind.clone()]),
        ];
        assert_eq!(name_of(select_policy(&policies, &t)), Some("labels".into()));
        let policies = vec![
            pp("labels", "ml", 0, vec![by_label.clone()]),
            pp("kind-prio", "ml", 1, vec![by_kind.clone()]),
        ];
        assert_eq!(
            name_of(select_policy(&policies, &t)),
            Some("kind-prio".into())
        );
        let policies = vec![
            pp("b-name", "ml", 0, vec![by_name.clone()]),
            pp("a-name", "ml", 0, vec![by_name.clone()]),
        ];
        assert_eq!(name_of(select_policy(&policies, &t)), Some("a-name".into()));
        let policies = vec![
            cpp("c1", 0, vec![by_kind.clone()]),
            cpp("c2", 5, vec![by_kind]),
        ];
        assert_eq!(name_of(select_policy(&policies, &t)), Some("c2".into()));
    }

    #[test]
    fn selectors_filter_by_kind_namespace_name_and_labels() {
        let labels = BTreeMap::from([("team".to_string(), "ml".to_string())]);
        let t = TemplateMeta {
            api_version: "apps/v1",
            kind: "Deployment",
            namespace: "web",
            name: "nginx",
            labels: &labels,
        };
        let s = |v| selects(&selector(v), None, &t);
        assert_eq!(
            s(json!({"apiVersion": "apps/v1", "kind": "Deployment"})),
            Some(MatchStrength::Kind)
        );
        assert_eq!(
            s(json!({"apiVersion": "apps/v1", "kind": "StatefulSet"})),
            None
        );
        assert_eq!(
            s(json!({"apiVersion": "apps/v1beta1", "kind": "Deployment"})),
            None
        );
        assert_eq!(
            s(json!({"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "other"})),
            None
        );
        assert_eq!(
            s(json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "nginx"})),
            Some(MatchStrength::Name)
        );
        assert_eq!(
            s(json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "other"})),
            None
        );
        assert_eq!(
            s(
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "labelSelector": {"matchLabels": {"team": "web"}}})
            ),
            None
        );
        // an invalid label selector selects nothing rather than everything
        assert_eq!(
            s(
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "labelSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}})
            ),
            None
        );
        // a namespaced policy never reaches into another namespace
        let sel =
            selector(json!({"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "web"}));
        assert_eq!(selects(&sel, Some("dev"), &t), None);
        assert_eq!(selects(&sel, Some("web"), &t), Some(MatchStrength::Kind));
    }

    #[test]
    fn a_policy_being_deleted_selects_nothing() {
        let labels = BTreeMap::new();
        let t = TemplateMeta {
            api_version: "apps/v1",
            kind: "Deployment",
            namespace: "web",
            name: "nginx",
            labels: &labels,
        };
        let mut p = pp(
            "p",
            "web",
            0,
            vec![selector(
                json!({"apiVersion": "apps/v1", "kind": "Deployment"}),
            )],
        );
        if let AnyPolicy::Namespaced(inner) = &mut p {
            inner.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::from_second(1).unwrap(),
                ));
        }
        assert!(select_policy([&p], &t).is_none());
    }

    #[test]
    fn the_binding_spec_copies_placement_and_failover() {
        let labels = BTreeMap::new();
        let t = TemplateMeta {
            api_version: AW,
            kind: "AppWrapper",
            namespace: "ml",
            name: "train",
            labels: &labels,
        };
        let mut p = PropagationPolicy::new(
            "p",
            serde_json::from_value(json!({
                "resourceSelectors": [{"apiVersion": AW, "kind": "AppWrapper"}],
                "placement": {"clusterAffinity": {"clusterNames": ["member-1"]}},
                "failover": {"application": {"decisionConditions": {"tolerationSeconds": 30}}}
            }))
            .unwrap(),
        );
        p.metadata.namespace = Some("ml".into());
        p.metadata.generation = Some(4);
        p.metadata.labels = Some(BTreeMap::from([(
            lifeboat_api::policy::CAPACITY_TYPE_LABEL.to_string(),
            "spot".to_string(),
        )]));
        let policy = AnyPolicy::Namespaced(p);
        let kind = template_kind(AW, "AppWrapper").unwrap();
        let spec = binding_spec(
            kind,
            &t,
            "uid-1",
            "42",
            &policy,
            Replicas {
                replicas: 2,
                ..Default::default()
            },
        );
        assert!(spec.gang);
        assert_eq!(spec.replicas, 2);
        assert_eq!(spec.resource.uid, "uid-1");
        let placement = spec.placement.unwrap();
        assert_eq!(
            placement.cluster_affinity.unwrap().cluster_names,
            ["member-1"]
        );
        assert_eq!(
            placement.capacity_type_preference,
            Some(lifeboat_api::policy::CapacityType::Spot)
        );
        assert_eq!(
            spec.failover
                .unwrap()
                .application
                .unwrap()
                .toleration_seconds(),
            30
        );
        assert_eq!(spec.policy.unwrap().generation, Some(4));
        assert!(spec.clusters.is_empty());
    }

    #[test]
    fn template_kinds_are_known_by_api_version_and_kind() {
        assert!(template_kind(AW, "AppWrapper").unwrap().gang);
        assert!(!template_kind("apps/v1", "Deployment").unwrap().gang);
        assert!(template_kind("kubeflow.org/v1", "PyTorchJob").unwrap().gang);
        assert!(template_kind("apps/v1", "DaemonSet").is_none());
    }
}
