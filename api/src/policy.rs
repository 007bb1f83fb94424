//! `policy.lifeboat.dev/v1alpha1` PropagationPolicy (namespaced) and ClusterPropagationPolicy
//! (cluster-scoped): which workload templates go to which member clusters, and how they fail
//! over. Field names and meanings follow Karmada's `policy.karmada.io/v1alpha1`, so Karmada
//! policies apply unchanged (reference `karmada-behaviour.md` §1, §3); Lifeboat extensions are
//! marked as such.
//!
//! Validation lives at the API: OpenAPI bounds and CEL rules in the generated CRD, each naming
//! the field and the reason, so `kubectl apply` of an invalid policy is refused before the hub
//! ever sees it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::health::FailureClass;
use crate::serde_helpers::null_as_default;

pub const GROUP: &str = "policy.lifeboat.dev";
pub const VERSION: &str = "v1alpha1";

/// Policy label that asks for a capacity type when the policy has no
/// `placement.capacityTypePreference` (Lifeboat extension): `spot` or `on-demand`.
pub const CAPACITY_TYPE_LABEL: &str = "placement.lifeboat.dev/capacity-type";

/// The desired behaviour of a PropagationPolicy or ClusterPropagationPolicy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "policy.lifeboat.dev",
    version = "v1alpha1",
    kind = "PropagationPolicy",
    plural = "propagationpolicies",
    singular = "propagationpolicy",
    namespaced,
    shortname = "pp",
    status = "PolicyStatus",
    derive = "PartialEq",
    doc = "PropagationPolicy places the workload templates of its namespace that its resourceSelectors match on member clusters, and says how they fail over.",
    printcolumn(name = "Priority", type_ = "integer", json_path = ".spec.priority"),
    printcolumn(
        name = "Failover",
        type_ = "string",
        json_path = ".spec.failover.application.purgeMode"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PropagationSpec {
    /// ResourceSelectors used to select resources. Nil or empty selector is not allowed and
    /// doesn't mean match all kinds of resources for security concerns that sensitive resources
    /// (like Secret) might be accidentally propagated.
    #[schemars(length(min = 1, max = 64))]
    pub resource_selectors: Vec<ResourceSelector>,

    /// Priority indicates the importance of a policy: when several policies match a template,
    /// the one with the highest priority wins (namespaced policies before cluster-scoped ones,
    /// then priority, then a selector naming the template before a label selector). Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,

    /// Placement represents the rule for selecting clusters.
    #[serde(default)]
    pub placement: Placement,

    /// PropagateDeps tells if relevant resources should be propagated automatically. Accepted
    /// for compatibility with Karmada policies; Lifeboat does not propagate dependencies yet.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub propagate_deps: bool,

    /// Failover indicates how Lifeboat migrates applications in case of failures. If this
    /// value is nil, failover is disabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverBehavior>,
}

/// The same spec, cluster-scoped: matches templates in every namespace (after namespaced
/// policies).
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "policy.lifeboat.dev",
    version = "v1alpha1",
    kind = "ClusterPropagationPolicy",
    plural = "clusterpropagationpolicies",
    singular = "clusterpropagationpolicy",
    shortname = "cpp",
    status = "PolicyStatus",
    derive = "PartialEq",
    doc = "ClusterPropagationPolicy places the workload templates of every namespace that its resourceSelectors match on member clusters, and says how they fail over.",
    printcolumn(name = "Priority", type_ = "integer", json_path = ".spec.priority"),
    printcolumn(
        name = "Failover",
        type_ = "string",
        json_path = ".spec.failover.application.purgeMode"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(transparent)]
#[schemars(transparent)]
pub struct ClusterPropagationSpec {
    pub spec: PropagationSpec,
}

/// What the hub observed of a policy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// The generation the hub last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// How many resource templates this policy currently places.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_templates: Option<i32>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub conditions: Vec<Condition>,
}

/// Selects resource templates. A template matches when apiVersion and kind match, and
/// namespace, name and labelSelector match where they are given.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSelector {
    /// APIVersion represents the API version of the target resources.
    #[schemars(length(min = 1))]
    pub api_version: String,
    /// Kind represents the Kind of the target resources.
    #[schemars(length(min = 1))]
    pub kind: String,
    /// Namespace of the target resource. Default is empty, which means inherit from the parent
    /// object scope (the policy's namespace for a PropagationPolicy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the target resource. Default is empty, which means selecting all resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A label query over a set of resources. If name is not empty, labelSelector will be
    /// ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
}

/// The rule for selecting clusters.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.spreadConstraints) || !self.spreadConstraints.exists(s, has(s.spreadByField)) || self.spreadConstraints.exists(s, has(s.spreadByField) && s.spreadByField == 'cluster')"
).message("a constraint with spreadByField 'cluster' is required when any spreadByField is used").field_path(".spreadConstraints"))]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.spreadConstraints) || self.spreadConstraints.all(a, !has(a.spreadByField) || self.spreadConstraints.exists_one(b, has(b.spreadByField) && b.spreadByField == a.spreadByField))"
).message("each spreadByField may appear only once").field_path(".spreadConstraints"))]
pub struct Placement {
    /// ClusterAffinity represents scheduling restrictions to a certain set of clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_affinity: Option<ClusterAffinity>,

    /// ClusterTolerations represents the tolerations. A cluster tainted `NoSchedule` or
    /// `NoExecute` (for example `cluster.lifeboat.dev/unreachable` while its agent's lease is
    /// expired) is only chosen when a toleration matches.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    #[schemars(length(max = 32))]
    #[x_kube(validation = kube::core::Rule::new(
        "self.all(t, !has(t.operator) || t.operator == 'Equal' || t.operator == 'Exists')"
    ).message("operator must be Equal or Exists (Lt and Gt are not supported for cluster tolerations)"))]
    pub cluster_tolerations: Vec<Toleration>,

    /// SpreadConstraints represents a list of the scheduling constraints.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    #[schemars(length(max = 5))]
    pub spread_constraints: Vec<SpreadConstraint>,

    /// ReplicaScheduling represents the scheduling policy on dealing with the number of
    /// replicas when propagating resources that have replicas in spec (e.g. Deployments) to
    /// member clusters. Nil means Duplicated. Gang workloads (AppWrapper, JobSet, PyTorchJob,
    /// RayJob) always go whole to exactly one cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_scheduling: Option<ReplicaSchedulingStrategy>,

    /// CapacityTypePreference (Lifeboat extension) prefers clusters with free capacity of this
    /// type: `spot` or `on-demand` (the `karpenter.sh/capacity-type` node label). A preference,
    /// not a filter. The policy label `placement.lifeboat.dev/capacity-type` sets the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_type_preference: Option<CapacityType>,
}

/// Node capacity type (the `karpenter.sh/capacity-type` label values).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum CapacityType {
    #[serde(rename = "spot")]
    Spot,
    #[serde(rename = "on-demand")]
    OnDemand,
}

impl CapacityType {
    pub fn as_str(self) -> &'static str {
        match self {
            CapacityType::Spot => "spot",
            CapacityType::OnDemand => "on-demand",
        }
    }

    pub fn parse(text: &str) -> Option<CapacityType> {
        match text {
            "spot" => Some(CapacityType::Spot),
            "on-demand" => Some(CapacityType::OnDemand),
            _ => None,
        }
    }
}

/// Scheduling restrictions to a set of clusters. All given terms must match.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterAffinity {
    /// LabelSelector is a filter to select member clusters by labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
    /// FieldSelector is a filter to select member clusters by fields (provider, region, zone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_selector: Option<FieldSelector>,
    /// ClusterNames is the list of clusters to be selected.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub cluster_names: Vec<String>,
    /// ExcludedClusters is the list of clusters to be ignored.
    #[serde(
        default,
        rename = "exclude",
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub excluded_clusters: Vec<String>,
}

/// A field selector over the cluster's provider, region and zone.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FieldSelector {
    /// A list of field selector requirements; keys are `provider`, `region` or `zone`, operators
    /// `In` or `NotIn`.
    #[serde(default, deserialize_with = "null_as_default")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = kube::core::Rule::new(
        "self.all(r, r.key in ['provider', 'region', 'zone'])"
    ).message("key must be one of provider, region, zone"))]
    #[x_kube(validation = kube::core::Rule::new(
        "self.all(r, r.operator in ['In', 'NotIn'])"
    ).message("operator must be In or NotIn"))]
    pub match_expressions: Vec<NodeSelectorRequirement>,
}

/// The field a spread constraint spreads by.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SpreadByField {
    Cluster,
    Region,
    Zone,
    Provider,
}

/// A scheduling constraint: spread the selected clusters over groups of a field or label.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!(has(self.spreadByField) && has(self.spreadByLabel))")
    .message("spreadByLabel should not co-exist with spreadByField"))]
#[x_kube(validation = kube::core::Rule::new("!has(self.maxGroups) || !has(self.minGroups) || self.maxGroups >= self.minGroups")
    .message("maxGroups lower than minGroups is not allowed").field_path(".maxGroups"))]
pub struct SpreadConstraint {
    /// SpreadByField represents the fields on a cluster to spread by: `cluster`, `region`,
    /// `zone` or `provider`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread_by_field: Option<SpreadByField>,
    /// SpreadByLabel represents the label key to spread by (accepted; not used for placement
    /// yet, as in Karmada).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread_by_label: Option<String>,
    /// MaxGroups restricts the maximum number of cluster groups to be selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_groups: Option<i32>,
    /// MinGroups restricts the minimum number of cluster groups to be selected. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub min_groups: Option<i32>,
}

/// How replicas are split over the selected clusters.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ReplicaSchedulingType {
    // Every selected cluster runs all replicas.
    Duplicated,
    // The replicas are divided among the selected clusters.
    #[default]
    Divided,
}

/// How Divided replicas are weighted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ReplicaDivisionPreference {
    // As few clusters as possible, by available replicas.
    Aggregated,
    // By the weight preference.
    Weighted,
}

/// The replica scheduling strategy.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaSchedulingStrategy {
    /// ReplicaSchedulingType determines how the replicas are scheduled: Duplicated or Divided
    /// (default Divided).
    #[serde(default)]
    pub replica_scheduling_type: ReplicaSchedulingType,
    /// ReplicaDivisionPreference (Divided only): Aggregated or Weighted (default Weighted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_division_preference: Option<ReplicaDivisionPreference>,
    /// WeightPreference describes weight for each cluster or for each group of clusters. If
    /// unset with Weighted, every selected cluster has weight 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_preference: Option<ClusterPreferences>,
}

/// Weights for Divided/Weighted scheduling.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPreferences {
    /// StaticWeightList defines the static cluster weight.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    #[schemars(length(max = 64))]
    pub static_weight_list: Vec<StaticClusterWeight>,
    /// DynamicWeight specifies the factor to generate a dynamic weight list. If specified,
    /// StaticWeightList will be ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_weight: Option<DynamicWeightFactor>,
}

/// The factor of dynamic weights.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DynamicWeightFactor {
    // Weight by the replicas each cluster can still run.
    AvailableReplicas,
}

/// The weight of the clusters an affinity term selects.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StaticClusterWeight {
    /// TargetCluster describes the filter to select clusters.
    pub target_cluster: ClusterAffinity,
    /// Weight expressing the preference to the cluster(s) specified by 'TargetCluster'.
    #[schemars(range(min = 1))]
    pub weight: i64,
}

/// Failover behaviours in case of an application or cluster failure.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FailoverBehavior {
    /// Application indicates failover behaviors in case of application failure. If this value
    /// is nil, application failover is disabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application: Option<ApplicationFailoverBehavior>,
    /// Cluster indicates failover behaviors in case of cluster failure (the agent's lease
    /// expired, or the Cluster deleted). If nil, the hub's defaults apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterFailoverBehavior>,
}

/// How the legacy copy of a workload is removed from the cluster it is moved away from.
/// `Immediately` and `Graciously` (the names of Karmada's original proposal) are accepted as
/// `Directly` and `Gracefully`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PurgeMode {
    /// Delete the old copy (or fence its cluster) before the new one is created: never two
    /// copies.
    #[serde(alias = "Immediately")]
    Directly,
    /// Create the new copy first; delete the old one when the new one is Healthy or after
    /// gracePeriodSeconds.
    #[default]
    #[serde(alias = "Graciously")]
    Gracefully,
    /// Never delete the old copy; `lifeboatctl confirm-purge` removes it.
    Never,
}

impl PurgeMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PurgeMode::Directly => "Directly",
            PurgeMode::Gracefully => "Gracefully",
            PurgeMode::Never => "Never",
        }
    }
}

impl JsonSchema for PurgeMode {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "PurgeMode".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "enum": ["Directly", "Gracefully", "Never", "Immediately", "Graciously"],
            "description": "Directly: delete the old copy before the new one is created; Gracefully: new copy first, old one deleted once the new one is Healthy or after gracePeriodSeconds; Never: keep the old copy until confirmed. Immediately and Graciously are accepted as aliases of Directly and Gracefully."
        })
    }
}

/// The purge modes of cluster failover: Karmada allows Directly and Gracefully there.
fn cluster_purge_mode_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "enum": ["Directly", "Gracefully", "Immediately", "Graciously"],
        "default": "Gracefully",
        "description": "How bindings are moved off a failed cluster: Directly (delete or fence the old copy first) or Gracefully (new copy first). Immediately and Graciously are accepted as aliases."
    })
}

fn application_purge_mode_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "enum": ["Directly", "Gracefully", "Never", "Immediately", "Graciously"],
        "default": "Gracefully",
        "description": "PurgeMode represents how to deal with the legacy applications on the cluster from which the application is migrated: Directly (delete the old copy before creating the new one: never two copies), Gracefully (new copy first; old copy deleted once the new one is Healthy or after gracePeriodSeconds), Never (keep the old copy until `lifeboatctl confirm-purge`). Immediately and Graciously are accepted as aliases of Directly and Gracefully."
    })
}

/// Application failover: move a workload off a cluster where it stays unhealthy.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.gracePeriodSeconds) || !has(self.purgeMode) || self.purgeMode in ['Gracefully', 'Graciously']"
).message("gracePeriodSeconds only takes effect when purgeMode is Gracefully").field_path(".gracePeriodSeconds"))]
pub struct ApplicationFailoverBehavior {
    /// PreConditions indicates the preconditions of the failover process. If specified, only
    /// when all conditions are met can the failover process be started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_conditions: Option<PreConditions>,

    /// DecisionConditions indicates the decision conditions of performing the failover
    /// process. Only when all conditions are met can the failover process be performed.
    #[serde(default)]
    pub decision_conditions: DecisionConditions,

    /// PurgeMode represents how to deal with the legacy applications on the cluster from which
    /// the application is migrated. Default Gracefully.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "application_purge_mode_schema")]
    pub purge_mode: Option<PurgeMode>,

    /// GracePeriodSeconds is the maximum waiting duration in seconds before the application on
    /// the migrated cluster is deleted. Only with purgeMode Gracefully; default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub grace_period_seconds: Option<i32>,

    /// BlockPredecessorSeconds represents the period of time the cluster from which the
    /// application was migrated from can be schedulable again. 0 means the cluster never gets
    /// this workload again. Default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub block_predecessor_seconds: Option<i32>,

    /// StatePreservation defines the policy for preserving and restoring state data during
    /// failover events for stateful applications: values read from the evicted copy's status
    /// are injected as labels into the new copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_preservation: Option<StatePreservation>,

    /// InPlaceReset (Lifeboat extension) resets the workload inside its cluster (delete and
    /// recreate by the agent) up to `limit` times before it is moved. For kinds without an
    /// in-cluster reset loop of their own (Job, JobSet, PyTorchJob, RayJob, Deployment); an
    /// AppWrapper resets itself. Default off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place_reset: Option<InPlaceReset>,

    /// MoveOnApplicationFailure (Lifeboat extension): also move a workload whose failure class
    /// is Application (terminal exit codes, a Job failing on its own). Default false: such a
    /// failure would fail the same way elsewhere, so it stays and the binding says why.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub move_on_application_failure: bool,
}

impl ApplicationFailoverBehavior {
    /// Karmada's CRD default: 300 s.
    pub const DEFAULT_TOLERATION_SECONDS: i32 = 300;
    /// Karmada's webhook default for Gracefully: 600 s.
    pub const DEFAULT_GRACE_PERIOD_SECONDS: i32 = 600;
    /// The proposal's default: 600 s.
    pub const DEFAULT_BLOCK_PREDECESSOR_SECONDS: i32 = 600;

    pub fn purge_mode(&self) -> PurgeMode {
        self.purge_mode.unwrap_or_default()
    }

    pub fn toleration_seconds(&self) -> i32 {
        self.decision_conditions
            .toleration_seconds
            .unwrap_or(Self::DEFAULT_TOLERATION_SECONDS)
    }

    pub fn grace_period_seconds(&self) -> i32 {
        self.grace_period_seconds
            .unwrap_or(Self::DEFAULT_GRACE_PERIOD_SECONDS)
    }

    pub fn block_predecessor_seconds(&self) -> i32 {
        self.block_predecessor_seconds
            .unwrap_or(Self::DEFAULT_BLOCK_PREDECESSOR_SECONDS)
    }

    /// Whether a failure of this class is worth moving the workload for.
    pub fn moves(&self, class: FailureClass) -> bool {
        class != FailureClass::Application || self.move_on_application_failure
    }
}

/// Preconditions of application failover.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PreConditions {
    /// DelaySeconds refers to a period of time after the first status is reported during which
    /// the application is not monitored for failover (startup time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub delay_seconds: Option<i32>,
    /// HealthyState: `Healthy` fails over only placements that were Healthy once; failures at
    /// start are left to the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_state: Option<HealthyStatePrecondition>,
}

/// The only meaningful precondition state.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum HealthyStatePrecondition {
    Healthy,
}

/// Decision conditions of application failover.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DecisionConditions {
    /// TolerationSeconds represents the period of time Lifeboat should wait after reaching
    /// the desired state before performing failover process. 0 fails over in the same pass.
    /// Default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub toleration_seconds: Option<i32>,
}

/// Cluster failover: move bindings off a cluster whose agent lease expired or which was
/// deleted.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterFailoverBehavior {
    /// PurgeMode represents how to deal with the legacy applications on the cluster from which
    /// the application is migrated: Directly or Gracefully (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "cluster_purge_mode_schema")]
    pub purge_mode: Option<PurgeMode>,
    /// TolerationSeconds (Lifeboat): how long the cluster's lease may stay expired before its
    /// bindings are evicted. Default 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub toleration_seconds: Option<i32>,
    /// StatePreservation as for application failover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_preservation: Option<StatePreservation>,
}

impl ClusterFailoverBehavior {
    pub const DEFAULT_TOLERATION_SECONDS: i32 = 60;

    pub fn purge_mode(&self) -> PurgeMode {
        self.purge_mode.unwrap_or_default()
    }

    pub fn toleration_seconds(&self) -> i32 {
        self.toleration_seconds
            .unwrap_or(Self::DEFAULT_TOLERATION_SECONDS)
    }
}

/// Values read from the evicted copy's status that the new copy receives as labels.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StatePreservation {
    /// Rules contains a list of StatePreservationRule configurations.
    #[schemars(length(min = 1, max = 16))]
    pub rules: Vec<StatePreservationRule>,
}

/// One value to carry over.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StatePreservationRule {
    /// AliasLabelName is the name of the label that carries the value into the new copy.
    #[schemars(length(min = 1, max = 317))]
    #[x_kube(validation = kube::core::Rule::new(
        "self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$')"
    ).message("must be a valid label name: an optional DNS subdomain prefix and '/', then at most 63 characters of alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"))]
    pub alias_label_name: String,
    /// JSONPath (kubectl syntax, relative to the reflected `status`, e.g. `{.checkpoint}`) of
    /// the value to carry over.
    #[schemars(length(min = 3, max = 256))]
    #[x_kube(validation = kube::core::Rule::new("self.startsWith('{') && self.endsWith('}')")
        .message("must be a JSONPath template in braces, relative to status, e.g. {.jobID}"))]
    pub json_path: String,
}

/// In-place resets before a move (Lifeboat extension).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InPlaceReset {
    /// How many resets in the same cluster before the workload is moved.
    #[schemars(range(min = 0, max = 10))]
    pub limit: i32,
    /// Pause between deleting and recreating the workload. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub pause_seconds: Option<i32>,
    /// How long a reset may take after its pause before the hub gives up on it: a workload its
    /// cluster cannot delete (a finalizer nobody removes) or create again (admission, quota)
    /// is then moved as an application failure would be. Default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: Option<i32>,
}

impl InPlaceReset {
    pub const DEFAULT_TIMEOUT_SECONDS: i32 = 600;

    pub fn timeout_seconds(&self) -> i32 {
        self.timeout_seconds
            .unwrap_or(Self::DEFAULT_TIMEOUT_SECONDS)
    }
}

/// Either kind of policy, as the detector sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum AnyPolicy {
    Namespaced(PropagationPolicy),
    Cluster(ClusterPropagationPolicy),
}

impl AnyPolicy {
    pub fn spec(&self) -> &PropagationSpec {
        match self {
            AnyPolicy::Namespaced(p) => &p.spec,
            AnyPolicy::Cluster(p) => &p.spec.spec,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            AnyPolicy::Namespaced(_) => "PropagationPolicy",
            AnyPolicy::Cluster(_) => "ClusterPropagationPolicy",
        }
    }

    pub fn labels(&self) -> &BTreeMap<String, String> {
        static EMPTY: BTreeMap<String, String> = BTreeMap::new();
        let labels = match self {
            AnyPolicy::Namespaced(p) => p.metadata.labels.as_ref(),
            AnyPolicy::Cluster(p) => p.metadata.labels.as_ref(),
        };
        labels.unwrap_or(&EMPTY)
    }

    /// The capacity type the placement prefers: the field, else the policy label.
    pub fn capacity_type_preference(&self) -> Option<CapacityType> {
        self.spec().placement.capacity_type_preference.or_else(|| {
            self.labels()
                .get(CAPACITY_TYPE_LABEL)
                .and_then(|v| CapacityType::parse(v))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn purge_mode_aliases_read_as_the_current_names() {
        let app: ApplicationFailoverBehavior = serde_json::from_value(json!({
            "decisionConditions": {"tolerationSeconds": 0}, "purgeMode": "Immediately"
        }))
        .unwrap();
        assert_eq!(app.purge_mode(), PurgeMode::Directly);
        let app: ApplicationFailoverBehavior =
            serde_json::from_value(json!({"purgeMode": "Graciously"})).unwrap();
        assert_eq!(app.purge_mode(), PurgeMode::Gracefully);
        assert_eq!(app.toleration_seconds(), 300);
        assert!(
            serde_json::from_value::<ApplicationFailoverBehavior>(json!({"purgeMode": "Soon"}))
                .is_err()
        );
    }

    #[test]
    fn application_failures_move_only_when_asked() {
        let mut app = ApplicationFailoverBehavior::default();
        assert!(app.moves(FailureClass::Infrastructure));
        assert!(app.moves(FailureClass::Capacity));
        assert!(app.moves(FailureClass::Unknown));
        assert!(!app.moves(FailureClass::Application));
        app.move_on_application_failure = true;
        assert!(app.moves(FailureClass::Application));
    }

    #[test]
    fn karmada_policy_reads_unchanged() {
        let policy: PropagationPolicy = serde_json::from_value(json!({
            "apiVersion": "policy.lifeboat.dev/v1alpha1",
            "kind": "PropagationPolicy",
            "metadata": {"name": "nginx", "namespace": "default"},
            "spec": {
                "resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "nginx"}],
                "propagateDeps": true,
                "placement": {
                    "clusterAffinity": {"clusterNames": ["member1", "member2"], "exclude": ["member3"]},
                    "clusterTolerations": [{"key": "cluster.karmada.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}],
                    "spreadConstraints": [{"spreadByField": "cluster", "maxGroups": 2, "minGroups": 1}],
                    "replicaScheduling": {
                        "replicaSchedulingType": "Divided",
                        "replicaDivisionPreference": "Weighted",
                        "weightPreference": {"staticWeightList": [
                            {"targetCluster": {"clusterNames": ["member1"]}, "weight": 1},
                            {"targetCluster": {"clusterNames": ["member2"]}, "weight": 2}
                        ]}
                    }
                },
                "failover": {"application": {
                    "decisionConditions": {"tolerationSeconds": 120},
                    "purgeMode": "Gracefully",
                    "gracePeriodSeconds": 600,
                    "statePreservation": {"rules": [{"aliasLabelName": "app.example.com/jobid", "jsonPath": "{.jobStatus.jobID}"}]}
                }}
            }
        }))
        .unwrap();
        let placement = &policy.spec.placement;
        assert_eq!(
            placement
                .cluster_affinity
                .as_ref()
                .unwrap()
                .excluded_clusters,
            ["member3"]
        );
        let weights = &placement
            .replica_scheduling
            .as_ref()
            .unwrap()
            .weight_preference
            .as_ref()
            .unwrap()
            .static_weight_list;
        assert_eq!(weights[1].weight, 2);
        let app = policy.spec.failover.unwrap().application.unwrap();
        assert_eq!(app.toleration_seconds(), 120);
        assert_eq!(app.grace_period_seconds(), 600);
    }

    #[test]
    fn capacity_type_from_field_or_label() {
        let mut policy = PropagationPolicy::new("p", PropagationSpec::default());
        let any = AnyPolicy::Namespaced(policy.clone());
        assert_eq!(any.capacity_type_preference(), None);
        policy.metadata.labels = Some(BTreeMap::from([(
            CAPACITY_TYPE_LABEL.to_string(),
            "spot".to_string(),
        )]));
        assert_eq!(
            AnyPolicy::Namespaced(policy.clone()).capacity_type_preference(),
            Some(CapacityType::Spot)
        );
        policy.spec.placement.capacity_type_preference = Some(CapacityType::OnDemand);
        assert_eq!(
            AnyPolicy::Namespaced(policy).capacity_type_preference(),
            Some(CapacityType::OnDemand)
        );
    }
}
