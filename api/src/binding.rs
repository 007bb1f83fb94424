//! `work.lifeboat.dev/v1alpha1` ResourceBinding: one per placed workload template. The spec holds
//! what the detector resolved (resource, replicas and requirements, the policy's placement and
//! failover) and what the scheduler and failover decided (`clusters`, `gracefulEvictionTasks`,
//! `evictionHistory`); the status holds what the agents report, per cluster.
//!
//! Everything a failover decision needs is in this object (Karmada keeps the unhealthy timers in
//! process memory and loses them on restart, karmada#7431): `aggregatedStatus[].unhealthySince`,
//! `firstObservedAt`, `lastHealthyTime`, the failure class, and the eviction history with expiry.
//! Field names follow Karmada's `work.karmada.io/v1alpha2` where Karmada has them.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{NodeSelector, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::cluster::ResourceList;
use crate::health::FailureClass;
use crate::policy::{FailoverBehavior, Placement, PurgeMode};
use crate::serde_helpers::null_as_default;

pub const GROUP: &str = "work.lifeboat.dev";
pub const VERSION: &str = "v1alpha1";

/// Condition types of a binding.
pub const CONDITION_SCHEDULED: &str = "Scheduled";
pub const CONDITION_FULLY_APPLIED: &str = "FullyApplied";
pub const CONDITION_HEALTHY: &str = "Healthy";
/// Whether the binding's policy still exists (False: deleted, placement kept).
pub const CONDITION_POLICY_BOUND: &str = "PolicyBound";
/// True while a failover the workload would need cannot happen (an Application failure that
/// the policy does not move, no other cluster fits, failed on every allowed cluster, waiting
/// for the old copy to be purged, the hub recovering after a restart).
pub const CONDITION_FAILOVER_BLOCKED: &str = "FailoverBlocked";

/// Eviction reasons (a task's `reason`, an eviction record's `reason`).
pub const EVICTION_APPLICATION_FAILURE: &str = "ApplicationFailure";
pub const EVICTION_CLUSTER_FAILURE: &str = "ClusterFailure";
pub const EVICTION_CLUSTER_DELETED: &str = "ClusterDeleted";
/// An in-place reset did not complete within `inPlaceReset.timeoutSeconds` (also the reason of
/// `FailoverBlocked` when there is no application failover to move the workload).
pub const EVICTION_RESET_TIMED_OUT: &str = "InPlaceResetTimedOut";
/// The producer of the hub's evictions.
pub const EVICTION_PRODUCER: &str = "lifeboat-hub";

/// `FailoverBlocked` reasons while a `Directly` eviction's new copy waits for the old one to be
/// confirmed gone: its cluster is Ready and its agent is deleting it (`WaitingForPurge`), or its
/// cluster is not Ready, so nobody there can say, and the hub waits for evidence that the copy
/// no longer runs (`WaitingForFence`): the hub's own deletion through the member's
/// kube-apiserver with the cluster's fencing credential, the agent's report once it is back, or
/// an operator's `lifeboatctl confirm-purge`.
pub const BLOCKED_WAITING_FOR_PURGE: &str = "WaitingForPurge";
pub const BLOCKED_WAITING_FOR_FENCE: &str = "WaitingForFence";
/// `FailoverBlocked`: an eviction was due but no other cluster fits, so the copy stays.
pub const BLOCKED_NO_OTHER_CLUSTER_FITS: &str = "NoOtherClusterFits";
/// `FailoverBlocked`: `healthyState: Healthy` and the placement was never Healthy.
pub const BLOCKED_NEVER_HEALTHY: &str = "NeverHealthy";
/// `FailoverBlocked`: purgeMode Never keeps the old copy until `lifeboatctl confirm-purge`.
pub const BLOCKED_WAITING_FOR_PURGE_CONFIRMATION: &str = "WaitingForPurgeConfirmation";
/// Reason of `FailoverBlocked=False` once nothing blocks a failover any more.
pub const BLOCKED_NOT_BLOCKED: &str = "NotBlocked";
/// Every reason of `FailoverBlocked=True` (an Application failure the policy does not move and an
/// in-place reset that timed out without application failover use their eviction reasons).
pub const FAILOVER_BLOCKED_REASONS: [&str; 7] = [
    BLOCKED_NO_OTHER_CLUSTER_FITS,
    EVICTION_APPLICATION_FAILURE,
    BLOCKED_NEVER_HEALTHY,
    BLOCKED_WAITING_FOR_PURGE,
    BLOCKED_WAITING_FOR_FENCE,
    BLOCKED_WAITING_FOR_PURGE_CONFIRMATION,
    EVICTION_RESET_TIMED_OUT,
];

/// Annotation asking the hub for one in-place reset: `<cluster>` or `<cluster>/<nonce>` (a new
/// value asks again). Set by `lifeboatctl reset`.
pub const ANNOTATION_RESET_REQUEST: &str = "work.lifeboat.dev/reset-request";
/// Annotation the agent sets on a workload it re-created for an in-place reset: the reset
/// generation it completed. Kept on the object itself, so a restarted agent never repeats a
/// done reset, and reported to the hub with the object.
pub const ANNOTATION_RESET_GENERATION: &str = "work.lifeboat.dev/reset-generation";
/// Annotation confirming the purge of an old copy: a comma-separated list of clusters. Set by
/// `lifeboatctl confirm-purge`. For purgeMode Never it lets the hub remove the copy; for
/// Directly it is an operator's word that the copy no longer runs (its cluster is lost and the
/// hub cannot confirm it), so the new copy may be created.
pub const ANNOTATION_CONFIRM_PURGE: &str = "work.lifeboat.dev/confirm-purge";

/// Scheduled reasons (Karmada's).
pub const REASON_SUCCESS: &str = "Success";
pub const REASON_NO_CLUSTER_FIT: &str = "NoClusterFit";
pub const REASON_SCHEDULER_ERROR: &str = "SchedulerError";

/// Labels the hub puts on bindings and the agents on the objects they apply.
pub const LABEL_BINDING_NAMESPACE: &str = "work.lifeboat.dev/binding-namespace";
pub const LABEL_BINDING_NAME: &str = "work.lifeboat.dev/binding-name";
pub const ANNOTATION_BINDING_UID: &str = "work.lifeboat.dev/binding-uid";
/// Annotation the hub puts on each copy: the template's `metadata.generation` the copy was made
/// from, so a status rule can tell a member that caught up with the template (the Deployment and
/// StatefulSet rules advance the template's `observedGeneration` with it; Karmada's
/// `resourcetemplate.karmada.io/generation`).
pub const ANNOTATION_TEMPLATE_GENERATION: &str = "resourcetemplate.lifeboat.dev/generation";
/// Label on a binding naming its policy (`<Kind>/<namespace>/<name>`-safe form is in spec).
pub const LABEL_POLICY_NAME: &str = "policy.lifeboat.dev/name";
/// The field manager for everything the hub and agents apply.
pub const FIELD_MANAGER: &str = "lifeboat";

/// The clusters whose old copy a human confirmed may go (`lifeboatctl confirm-purge`: the
/// comma-separated [`ANNOTATION_CONFIRM_PURGE`]).
pub fn confirmed_purges(binding: &ResourceBinding) -> BTreeSet<String> {
    binding
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_CONFIRM_PURGE))
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// How many eviction history entries a binding keeps (oldest expired ones are dropped first).
pub const MAX_EVICTION_HISTORY: usize = 32;

/// The name of the binding of a template: `<name>-<kind>` in lower case, as Karmada names them.
pub fn binding_name(template_name: &str, kind: &str) -> String {
    format!("{template_name}-{}", kind.to_ascii_lowercase())
}

/// What to place, where it is placed, and what happened to it.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "work.lifeboat.dev",
    version = "v1alpha1",
    kind = "ResourceBinding",
    plural = "resourcebindings",
    singular = "resourcebinding",
    namespaced,
    shortname = "rb",
    status = "ResourceBindingStatus",
    derive = "PartialEq",
    doc = "ResourceBinding binds one workload template to the member clusters it runs on, and records their health and the evictions it went through.",
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.resource.kind"),
    printcolumn(
        name = "Scheduled",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Scheduled\")].status"
    ),
    printcolumn(
        name = "Applied",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"FullyApplied\")].status"
    ),
    printcolumn(
        name = "Healthy",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Healthy\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Clusters",
        type_ = "string",
        json_path = ".status.summary.clusters",
        priority = 1
    ),
    printcolumn(
        name = "Failures",
        type_ = "string",
        json_path = ".status.summary.failures",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ResourceBindingSpec {
    /// Resource represents the Kubernetes resource to be propagated.
    pub resource: ObjectReference,

    /// Replicas represents the replica number of the referencing resource.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub replicas: i32,

    /// ReplicaRequirements represents the requirements required by each replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_requirements: Option<ReplicaRequirements>,

    /// Components represents the requirements of multiple pod templates of the referencing
    /// resource (each podSet of an AppWrapper, each role of a PyTorchJob, ...). Gang fitting
    /// places every pod of every component.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub components: Vec<Component>,

    /// Gang (Lifeboat): the workload runs whole in exactly one cluster (AppWrapper, JobSet,
    /// PyTorchJob, RayJob).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gang: bool,

    /// Placement represents the rule for selecting clusters to propagate resources (copied from
    /// the policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,

    /// Failover indicates how Lifeboat migrates applications in case of failures (copied from
    /// the policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverBehavior>,

    /// The policy this binding was derived from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyReference>,

    /// Clusters represents target member clusters where the resource to be deployed.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    #[schemars(schema_with = "clusters_schema")]
    pub clusters: Vec<TargetCluster>,

    /// GracefulEvictionTasks holds the eviction tasks that are expected to perform the
    /// eviction in a graceful way: the old copy stays until the task is done.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    #[schemars(schema_with = "eviction_tasks_schema")]
    pub graceful_eviction_tasks: Vec<GracefulEvictionTask>,

    /// EvictionHistory (Lifeboat) records every eviction of this workload; a cluster stays out
    /// of scheduling until its entry expires (blockPredecessorSeconds), after the eviction task
    /// is gone. Kept to the most recent 32 entries (expired ones dropped first).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub eviction_history: Vec<EvictionRecord>,

    /// InPlaceResets (Lifeboat) counts the resets asked of each cluster (the agent deletes and
    /// recreates the workload when the generation grows).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    #[schemars(schema_with = "in_place_resets_schema")]
    pub in_place_resets: Vec<InPlaceResetRecord>,

    /// RescheduleTriggeredAt: a time later than status.lastScheduledTime asks for a fresh
    /// schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reschedule_triggered_at: Option<Time>,
}

/// The in-place resets of the workload in one cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InPlaceResetRecord {
    pub cluster_name: String,
    /// Grows by one per reset asked; the agent acts on a generation it has not completed.
    pub generation: i64,
    /// Resets asked because of failures (manual ones are not counted against the limit).
    pub count: i32,
    /// When the last reset was asked.
    pub last_requested_at: Time,
    /// The last manual request served (the annotation's value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manual_request: Option<String>,
    /// The pause between deleting and recreating asked with the last reset (seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_seconds: Option<i32>,
}

impl InPlaceResetRecord {
    /// The record of `cluster`, if a reset was ever asked there.
    pub fn of<'a>(
        records: &'a [InPlaceResetRecord],
        cluster: &str,
    ) -> Option<&'a InPlaceResetRecord> {
        records.iter().find(|r| r.cluster_name == cluster)
    }
}

/// A reference to the resource template.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    /// APIVersion represents the API version of the referent.
    pub api_version: String,
    /// Kind represents the Kind of the referent.
    pub kind: String,
    /// Namespace represents the namespace for the referent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Name represents the name of the referent.
    pub name: String,
    /// UID of the referent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// ResourceVersion represents the internal version of the referenced object, that can be
    /// used by clients to determine when the object has changed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
}

/// Requirements of one replica.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaRequirements {
    /// NodeClaim represents the node claim HardNodeAffinity, NodeSelector and Tolerations
    /// required by each replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_claim: Option<NodeClaim>,
    /// ResourceRequest represents the resources required by each replica.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resource_request: ResourceList,
    /// PriorityClassName represents the resources claim PriorityClassName.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
}

/// Node constraints of a replica.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaim {
    /// A node selector represents the union of the results of one or more label queries over a
    /// set of nodes; that is, it represents the OR of the selectors represented by the node
    /// selector terms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard_node_affinity: Option<NodeSelector>,
    /// NodeSelector is a selector which must be true for the pod to fit on a node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// If specified, the pod's tolerations.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub tolerations: Vec<Toleration>,
}

/// One pod template of a multi-template workload.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Component {
    /// Name of this component.
    pub name: String,
    /// Replicas represents the replica number of this component.
    pub replicas: i32,
    /// ReplicaRequirements represents the requirements required by each replica of this
    /// component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_requirements: Option<ReplicaRequirements>,
}

/// The policy a binding came from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyReference {
    /// PropagationPolicy or ClusterPropagationPolicy.
    pub kind: String,
    /// Namespace of a PropagationPolicy (empty for a ClusterPropagationPolicy).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
    /// The policy's generation that was copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}

/// A scheduling result: a cluster and its replicas.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetCluster {
    /// Name of target cluster.
    pub name: String,
    /// Replicas in target cluster.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub replicas: i32,
}

/// An eviction in progress: while it exists, the old copy is kept (Gracefully, Never) and
/// the cluster is out of scheduling.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GracefulEvictionTask {
    /// FromCluster which cluster the eviction perform from.
    pub from_cluster: String,
    /// PurgeMode represents how to deal with the legacy applications on the cluster from which
    /// the application is migrated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purge_mode: Option<PurgeMode>,
    /// Replicas indicates the number of replicas should be evicted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Reason contains a programmatic identifier indicating the reason for the eviction
    /// (`ApplicationFailure`, `ClusterFailure`, `TaintUntolerated`, ...).
    pub reason: String,
    /// Message containing details about the eviction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Producer indicates the controller who triggered the eviction.
    pub producer: String,
    /// GracePeriodSeconds is the maximum waiting duration in seconds before the item should be
    /// deleted (Gracefully).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period_seconds: Option<i32>,
    /// SuppressDeletion represents the grace period will be persistent until the tools or
    /// human intervention stops it (Never; set to false to confirm the purge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suppress_deletion: Option<bool>,
    /// PreservedLabelState represents the application state information collected from the
    /// original cluster, and it will be injected into the new cluster in form of
    /// application labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub preserved_label_state: BTreeMap<String, String>,
    /// ClustersBeforeFailover records the clusters where running the application before
    /// failover.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub clusters_before_failover: Vec<String>,
    /// CreationTimestamp is a timestamp representing the server time when this object was
    /// created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<Time>,
    /// PurgedAt (Lifeboat): when the old copy was confirmed gone, or its cluster fenced. A
    /// Directly eviction creates the new copy only after this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purged_at: Option<Time>,
    /// FailingSince (Lifeboat): when the trouble that caused the eviction began (the copy's
    /// `unhealthySince`, or since when its cluster was not Ready); the failover duration runs
    /// from here to the new placement Healthy. RFC 3339 with microseconds; a value without a
    /// fraction was written with whole seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since: Option<MicroTime>,
}

/// A past eviction (Lifeboat; the "activeEvictionHistory" of Karmada's proposal, kept after the
/// task is gone).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvictionRecord {
    /// The cluster the workload was evicted from.
    pub cluster_name: String,
    /// Why: `ApplicationFailure`, `ClusterFailure`, `SpotReclamation`, ...
    pub reason: String,
    /// The failure class that decided the move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_class: Option<FailureClass>,
    /// Details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the eviction was decided.
    pub evicted_at: Time,
    /// Until when the cluster stays out of scheduling for this workload; absent: forever
    /// (blockPredecessorSeconds 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
    /// The state preserved from the evicted copy (statePreservation): labels every later copy
    /// carries, until a later eviction preserves newer values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub preserved_label_state: BTreeMap<String, String>,
    /// The clusters the workload was placed on just before this eviction: their copies ran
    /// before it, so they do not get the preserved labels (only later copies do).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub clusters_before_failover: Vec<String>,
}

/// What the agents report, aggregated.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceBindingStatus {
    /// SchedulerObservedGeneration is the generation (.metadata.generation) observed by the
    /// scheduler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_observed_generation: Option<i64>,
    /// LastScheduledTime representing the latest timestamp when scheduler successfully
    /// finished a scheduling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scheduled_time: Option<Time>,
    /// Conditions: Scheduled, FullyApplied, Healthy, PolicyBound.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    #[schemars(schema_with = "crate::serde_helpers::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Why each cluster was rejected the last time nothing (or not enough) fitted.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub rejected_clusters: Vec<ClusterRejection>,
    /// AggregatedStatus represents status list of the resource running in each member cluster,
    /// sorted by cluster name.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    #[schemars(schema_with = "aggregated_status_schema")]
    pub aggregated_status: Vec<AggregatedStatusItem>,
    /// (Lifeboat) The placement and its failures on one line each, for `kubectl get rb -o
    /// wide` (a printer column shows one value of an array, not the list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<BindingSummary>,
}

/// What `kubectl get rb -o wide` shows of a binding's placement.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingSummary {
    /// The clusters the binding is placed on (`spec.clusters`), comma-separated.
    #[serde(default)]
    pub clusters: String,
    /// Each Unhealthy placement with its failure class, `cluster=Class`, comma-separated
    /// (empty while none is Unhealthy).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub failures: String,
}

fn clusters_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    crate::serde_helpers::list_map_schema::<TargetCluster>(g, &["name"])
}

fn eviction_tasks_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    crate::serde_helpers::list_map_schema::<GracefulEvictionTask>(g, &["fromCluster"])
}

fn in_place_resets_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    crate::serde_helpers::list_map_schema::<InPlaceResetRecord>(g, &["clusterName"])
}

fn aggregated_status_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    crate::serde_helpers::list_map_schema::<AggregatedStatusItem>(g, &["clusterName"])
}

/// Why the scheduler did not choose a cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRejection {
    pub cluster_name: String,
    /// The plugin that rejected it.
    pub plugin: String,
    pub reason: String,
}

/// Health of the workload in one cluster.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ResourceHealth {
    Healthy,
    Unhealthy,
    #[default]
    Unknown,
}

impl ResourceHealth {
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceHealth::Healthy => "Healthy",
            ResourceHealth::Unhealthy => "Unhealthy",
            ResourceHealth::Unknown => "Unknown",
        }
    }
}

/// The status of the workload in one member cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AggregatedStatusItem {
    /// ClusterName represents the member cluster name which the resource deployed on.
    pub cluster_name: String,
    /// Applied represents if the resource referencing by ResourceBinding is successfully
    /// applied on the cluster.
    #[serde(default)]
    pub applied: bool,
    /// AppliedMessage is a human readable message indicating details about the applied status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_message: Option<String>,
    /// Health represents the healthy state of the current resource (InterpretHealth on what the
    /// agent reported; Unknown when the interpreter failed or nothing was reported).
    #[serde(default)]
    pub health: ResourceHealth,
    /// Why the resource is (un)healthy, from the interpreter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_reason: Option<String>,
    /// The failure class of an Unhealthy resource (Application, Infrastructure, Capacity,
    /// Unknown): whether moving it can help.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_class: Option<FailureClass>,
    /// Status reflects running status of current manifest (ReflectStatus on what the agent
    /// reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub status: Option<serde_json::Value>,
    /// When the agent last reported this resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<Time>,
    /// When the first status of this placement was reported (preConditions.delaySeconds counts
    /// from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_observed_at: Option<Time>,
    /// When the resource was last seen Healthy (preConditions.healthyState).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_healthy_time: Option<Time>,
    /// Since when the resource has been Unhealthy without a Healthy report in between (Unknown
    /// does not reset it). The toleration counts from here. RFC 3339 with microseconds, never
    /// earlier than the hub took the report; a value without a fraction was written with whole
    /// seconds (an older hub) and counts from the end of its second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_since: Option<MicroTime>,
    /// The work revision the agent last reported on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_revision: Option<i64>,
    /// The in-place reset generation the observed object was re-created for (Lifeboat; the
    /// agent's `work.lifeboat.dev/reset-generation` annotation). A reset asked with a higher
    /// generation is still in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_generation: Option<i64>,
    /// (Lifeboat) When the hub took the agent's report that the copy is gone: the hub had
    /// withdrawn the work from this cluster (a `Directly` eviction) and the agent deleted the
    /// object and saw it no longer served, with its pods. Cleared by the next report of a copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gone_at: Option<Time>,
    /// (Lifeboat) Who confirmed the copy gone at `goneAt`: its agent, or the hub itself through
    /// the member's kube-apiserver with the cluster's fencing credential (the agent was silent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gone_confirmed_by: Option<GoneConfirmedBy>,
}

/// Who confirmed a withdrawn copy gone.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum GoneConfirmedBy {
    /// The cluster's agent deleted the object and saw it no longer served.
    Agent,
    /// The hub deleted it through the member's kube-apiserver (fencing credential) and saw it
    /// gone, or deleted with every dependent it blocks on gone.
    Hub,
}

impl GoneConfirmedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            GoneConfirmedBy::Agent => "Agent",
            GoneConfirmedBy::Hub => "Hub",
        }
    }
}

fn preserve_unknown_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

impl ResourceBinding {
    /// The binding's namespace and name.
    pub fn key(&self) -> (String, String) {
        (
            self.metadata.namespace.clone().unwrap_or_default(),
            self.metadata.name.clone().unwrap_or_default(),
        )
    }

    /// The status of one cluster, if reported.
    pub fn cluster_status(&self, cluster: &str) -> Option<&AggregatedStatusItem> {
        self.status
            .as_ref()?
            .aggregated_status
            .iter()
            .find(|s| s.cluster_name == cluster)
    }

    /// A condition of the status, if set.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn confirmed_purges_come_from_the_annotation() {
        let b: ResourceBinding = serde_json::from_value(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "w", "namespace": "ns",
                         "annotations": {ANNOTATION_CONFIRM_PURGE: "a, b,,"}},
            "spec": {"resource": {"apiVersion": "v1", "kind": "Job", "name": "w"}}
        }))
        .unwrap();
        let expected: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
        assert_eq!(confirmed_purges(&b), expected);
        assert!(confirmed_purges(&ResourceBinding::new("w", Default::default())).is_empty());
    }

    #[test]
    fn names_follow_karmada() {
        assert_eq!(binding_name("train", "AppWrapper"), "train-appwrapper");
    }

    #[test]
    fn spec_and_status_round_trip() {
        let rb: ResourceBinding = serde_json::from_value(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1",
            "kind": "ResourceBinding",
            "metadata": {"name": "train-appwrapper", "namespace": "ml"},
            "spec": {
                "resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
                             "namespace": "ml", "name": "train", "uid": "u1"},
                "replicas": 4,
                "replicaRequirements": {"resourceRequest": {"nvidia.com/gpu": "8"}},
                "gang": true,
                "clusters": [{"name": "member-2"}],
                "gracefulEvictionTasks": [{"fromCluster": "member-1", "purgeMode": "Directly",
                    "reason": "ApplicationFailure", "producer": "lifeboat-hub"}],
                "evictionHistory": [{"clusterName": "member-1", "reason": "ApplicationFailure",
                    "failureClass": "Infrastructure", "evictedAt": "2026-11-23T10:00:00Z",
                    "expiresAt": "2026-11-23T10:10:00Z"}]
            },
            "status": {"aggregatedStatus": [{"clusterName": "member-2", "applied": true,
                "health": "Unhealthy", "failureClass": "Capacity",
                "unhealthySince": "2026-11-23T10:05:00Z", "status": {"phase": "Running"}}]}
        }))
        .unwrap();
        assert_eq!(
            rb.spec.eviction_history[0].failure_class,
            Some(FailureClass::Infrastructure)
        );
        let item = rb.cluster_status("member-2").unwrap();
        assert_eq!(item.health, ResourceHealth::Unhealthy);
        assert_eq!(item.status.as_ref().unwrap()["phase"], "Running");
        let back = serde_json::to_value(&rb).unwrap();
        assert_eq!(
            back["spec"]["gracefulEvictionTasks"][0]["purgeMode"],
            "Directly"
        );
        assert_eq!(back["spec"]["clusters"][0], json!({"name": "member-2"}));
    }
}
