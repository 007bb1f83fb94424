//! `cluster.lifeboat.dev/v1alpha1` Cluster: a member cluster as the hub sees it. The spec is the
//! operator's (topology and taints); the status is written by the hub from what the cluster's
//! agent reports (heartbeat lease, inventory) and is what the scheduler places work by.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::serde_helpers::null_as_default;
pub use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

pub const GROUP: &str = "cluster.lifeboat.dev";
pub const VERSION: &str = "v1alpha1";

/// Condition type: the agent's lease is fresh and the agent reaches its member's kube-apiserver.
pub const CONDITION_READY: &str = "Ready";
/// Ready reasons.
pub const REASON_CLUSTER_READY: &str = "ClusterReady";
pub const REASON_LEASE_EXPIRED: &str = "ClusterStatusUnknown";
pub const REASON_NOT_REGISTERED: &str = "AgentNotRegistered";
/// `Ready=False`: the agent renews its lease but reports that the member's kube-apiserver has
/// not answered it for its bound.
pub const REASON_MEMBER_API_UNREACHABLE: &str = "MemberAPIUnreachable";

/// Taint the hub puts on a cluster whose agent lease expired (NoSchedule), lifted when the
/// lease is renewed.
pub const TAINT_UNREACHABLE: &str = "cluster.lifeboat.dev/unreachable";
/// Taint the hub puts on a cluster that reports itself not ready (NoSchedule): its agent says
/// the member's kube-apiserver does not answer.
pub const TAINT_NOT_READY: &str = "cluster.lifeboat.dev/not-ready";

/// Namespace on the hub that holds the agents' leases and credentials.
pub const HUB_SYSTEM_NAMESPACE: &str = "lifeboat-system";
/// The hub's own leader-election Lease (in its namespace unless a flag names another).
pub const HUB_LEASE_NAME: &str = "lifeboat-hub";
/// Label naming the cluster a credential (or Lease) belongs to.
pub const CLUSTER_NAME_LABEL: &str = "cluster.lifeboat.dev/name";
/// Annotation on a cluster's Lease while its agent reports that the member's kube-apiserver has
/// not answered it: since when (RFC 3339, the hub's clock). Every heartbeat writes the Lease
/// (server-side apply): one that says so sets it, one that does not removes it.
pub const ANNOTATION_MEMBER_API_UNREACHABLE_SINCE: &str =
    "cluster.lifeboat.dev/member-api-unreachable-since";

/// Name of cluster `cluster`'s heartbeat Lease in the hub namespace.
pub fn lease_name(cluster: &str) -> String {
    format!("cluster-{cluster}")
}

/// Well-known node labels.
pub const NODE_CAPACITY_TYPE_LABEL: &str = "karpenter.sh/capacity-type";
pub const NODE_REGION_LABEL: &str = "topology.kubernetes.io/region";
pub const NODE_ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The GPU resource name.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// A resource list: resource name → quantity.
pub type ResourceList = BTreeMap<String, Quantity>;

/// The operator's view of a member cluster.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cluster.lifeboat.dev",
    version = "v1alpha1",
    kind = "Cluster",
    plural = "clusters",
    singular = "cluster",
    shortname = "lbc",
    status = "ClusterStatus",
    derive = "PartialEq",
    doc = "Cluster is a member cluster of the Lifeboat fleet: its topology and taints, and (status) what its agent reports.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Region", type_ = "string", json_path = ".spec.region"),
    printcolumn(
        name = "Zone",
        type_ = "string",
        json_path = ".spec.zone",
        priority = 1
    ),
    printcolumn(
        name = "GPUs",
        type_ = "string",
        json_path = ".status.resourceSummary.allocatable.nvidia\\.com/gpu"
    ),
    printcolumn(
        name = "Heartbeat",
        type_ = "date",
        json_path = ".status.lastHeartbeatTime"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Provider represents the cloud provider name of the member cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Region represents the region in which the member cluster is located.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Zone represents the zone in which the member cluster is located.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Taints attached to the member cluster. Work is only placed on a tainted cluster when the
    /// policy tolerates the taint. The hub adds and removes `cluster.lifeboat.dev/unreachable`
    /// itself.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    #[schemars(schema_with = "taints_schema")]
    pub taints: Vec<Taint>,
    /// FencingPeriodSeconds (Lifeboat): how long the agent may be cut off from the hub before it
    /// suspends the workloads whose policy says purgeMode Directly. Must match the agent's own
    /// setting (checked at registration). Default: the hub's `--fencing-period`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub fencing_period_seconds: Option<i32>,
}

fn taints_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    crate::serde_helpers::list_map_schema::<Taint>(g, &["key", "effect"])
}

/// What the hub knows of the cluster, from its agent.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// Conditions: `Ready` (True while the agent's lease is fresh, Unknown once it expired).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub conditions: Vec<Condition>,
    /// (Lifeboat) While `Ready` is not True: since when, RFC 3339 with microseconds (the
    /// condition's `lastTransitionTime` keeps whole seconds; the cluster toleration counts from
    /// here). Absent while Ready, and on Clusters an older hub wrote (the toleration
    /// then counts from the end of the condition's written second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_ready_since: Option<MicroTime>,
    /// When the agent last renewed its lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,
    /// The agent serving this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentInfo>,
    /// KubernetesVersion represents version of the member cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    /// APIEnablements represents the list of APIs installed in the member cluster.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub api_enablements: Vec<ApiEnablement>,
    /// NodeSummary represents the summary of nodes status in the member cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_summary: Option<NodeSummary>,
    /// ResourceSummary represents the summary of resources in the member cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_summary: Option<ResourceSummary>,
    /// Free capacity per node, grouped: nodes with the same free resources, capacity type and
    /// labels of interest form one group. Gang workloads are fitted pod by pod against these.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub node_groups: Vec<NodeGroup>,
    /// Nodes that cannot (or soon will not) run work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_health: Option<NodeHealthSummary>,
}

/// The agent serving a cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentInfo {
    /// Identity of the agent replica holding the member's lease (hostname and pid).
    pub identity: String,
    /// Agent version.
    pub version: String,
    /// When the agent registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered_at: Option<Time>,
    /// The agent's fencing period (seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_period_seconds: Option<i32>,
}

/// The resources of one API group version installed in the member.
///
/// Written as one string, `GROUP/VERSION: Kind (plural), Kind (plural)` (e.g. `apps/v1:
/// Deployment (deployments), StatefulSet (statefulsets)`), so `kubectl describe` shows one line
/// per group version instead of two per resource; the object form Karmada uses
/// (`{groupVersion, resources: [{name, kind}]}`) is still read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiEnablement {
    /// GroupVersion is the group and version this APIResourceList is for.
    pub group_version: String,
    /// Resources is a list of APIResource.
    pub resources: Vec<ApiResourceRef>,
}

impl fmt::Display for ApiEnablement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.group_version)?;
        f.write_str(":")?;
        for (i, r) in self.resources.iter().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            write!(f, "{sep}{} ({})", r.kind, r.name)?;
        }
        Ok(())
    }
}

impl std::str::FromStr for ApiEnablement {
    type Err = String;

    /// Parses the compact form ([`ApiEnablement`]'s `Display`); the error says what is wrong.
    fn from_str(text: &str) -> Result<Self, String> {
        let (group_version, list) = text.split_once(':').ok_or_else(|| {
            format!("{text:?} is not \"GROUP/VERSION: Kind (plural), ...\" (no ':')")
        })?;
        let group_version = group_version.trim();
        if group_version.is_empty() || group_version.contains(char::is_whitespace) {
            return Err(format!(
                "{text:?}: {group_version:?} is not a group version"
            ));
        }
        let mut resources = Vec::new();
        for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let parsed = item
                .strip_suffix(')')
                .and_then(|rest| rest.split_once(" ("))
                .map(|(kind, name)| (kind.trim(), name.trim()))
                .filter(|(kind, name)| {
                    !kind.is_empty()
                        && !name.is_empty()
                        && !kind.contains(char::is_whitespace)
                        && !name.contains(char::is_whitespace)
                });
            let (kind, name) =
                parsed.ok_or_else(|| format!("{text:?}: {item:?} is not \"Kind (plural)\""))?;
            resources.push(ApiResourceRef {
                name: name.to_string(),
                kind: kind.to_string(),
            });
        }
        Ok(ApiEnablement {
            group_version: group_version.to_string(),
            resources,
        })
    }
}

impl Serialize for ApiEnablement {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ApiEnablement {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// Karmada's object form, as older agents and stored Clusters have it.
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Object {
            group_version: String,
            #[serde(default, deserialize_with = "null_as_default")]
            resources: Vec<ApiResourceRef>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Text(String),
            Object(Object),
        }
        match Form::deserialize(deserializer)? {
            Form::Text(text) => text.parse().map_err(serde::de::Error::custom),
            Form::Object(o) => Ok(ApiEnablement {
                group_version: o.group_version,
                resources: o.resources,
            }),
        }
    }
}

impl JsonSchema for ApiEnablement {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ApiEnablement".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "One API group version served by the member and its resources: \"GROUP/VERSION: Kind (plural), Kind (plural), ...\"."
        })
    }
}

/// One resource of an API group version.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiResourceRef {
    /// Name is the plural name of the resource.
    pub name: String,
    /// Kind is the kind for the resource (e.g. 'Deployment' is the kind for resource
    /// 'deployments').
    pub kind: String,
}

/// Node counts.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSummary {
    /// TotalNum is the total number of nodes in the cluster.
    pub total_num: i32,
    /// ReadyNum is the number of ready nodes in the cluster.
    pub ready_num: i32,
}

/// Cluster-wide resources.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSummary {
    /// Allocatable represents the resources of a cluster that are available for scheduling
    /// (ready, schedulable nodes). Total amount of allocatable resources on all nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocatable: ResourceList,
    /// Allocated represents the resources of a cluster that have been scheduled: the requests
    /// of all pods bound to those nodes and not finished.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocated: ResourceList,
}

/// Nodes with the same free capacity.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeGroup {
    /// How many nodes are in the group.
    pub count: i32,
    /// Free resources of each node: allocatable minus the requests of its pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub free: ResourceList,
    /// `spot` or `on-demand` (the `karpenter.sh/capacity-type` label), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_type: Option<String>,
    /// Node labels of interest to placement (a fixed, small set: zone, GPU product).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// Nodes that cannot or soon will not run work. Name lists are truncated at
/// [`NodeHealthSummary::MAX_NAMES`]; the counts are exact.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeHealthSummary {
    /// Nodes whose Ready condition is not True.
    pub not_ready: i32,
    /// Nodes flagged by Autopilot GPU health checks (NoExecute-class label values).
    pub autopilot_flagged: i32,
    /// Nodes carrying a spot reclamation notice taint.
    pub spot_reclaiming: i32,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub not_ready_nodes: Vec<String>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub autopilot_flagged_nodes: Vec<String>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub spot_reclaiming_nodes: Vec<String>,
}

impl NodeHealthSummary {
    pub const MAX_NAMES: usize = 50;
}

impl Cluster {
    /// The Ready condition's status (`True`, `False`, `Unknown`), if any.
    pub fn ready_status(&self) -> Option<&str> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_READY)
            .map(|c| c.status.as_str())
    }

    pub fn is_ready(&self) -> bool {
        self.ready_status() == Some("True")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn status_round_trips_with_quantities() {
        let status: ClusterStatus = serde_json::from_value(json!({
            "resourceSummary": {"allocatable": {"nvidia.com/gpu": "32", "cpu": "384"},
                                "allocated": {"nvidia.com/gpu": "8"}},
            "nodeGroups": [{"count": 3, "free": {"nvidia.com/gpu": "8"}, "capacityType": "spot"}],
            "nodeHealth": {"notReady": 1, "autopilotFlagged": 0, "spotReclaiming": 0,
                           "notReadyNodes": ["n1"]}
        }))
        .unwrap();
        let back = serde_json::to_value(&status).unwrap();
        assert_eq!(
            back["resourceSummary"]["allocatable"]["nvidia.com/gpu"],
            "32"
        );
        assert_eq!(back["nodeGroups"][0]["count"], 3);
        assert_eq!(back["nodeHealth"]["notReadyNodes"][0], "n1");
    }

    fn apps() -> ApiEnablement {
        ApiEnablement {
            group_version: "apps/v1".into(),
            resources: vec![
                ApiResourceRef {
                    name: "deployments".into(),
                    kind: "Deployment".into(),
                },
                ApiResourceRef {
                    name: "statefulsets".into(),
                    kind: "StatefulSet".into(),
                },
            ],
        }
    }

    #[test]
    fn api_enablements_are_one_string_per_group_version() {
        let status = ClusterStatus {
            api_enablements: vec![
                apps(),
                ApiEnablement {
                    group_version: "v1".into(),
                    resources: vec![ApiResourceRef {
                        name: "pods".into(),
                        kind: "Pod".into(),
                    }],
                },
                ApiEnablement {
                    group_version: "example.com/v1".into(),
                    resources: vec![],
                },
            ],
            ..ClusterStatus::default()
        };
        let wire = serde_json::to_value(&status).unwrap();
        assert_eq!(
            wire["apiEnablements"],
            json!([
                "apps/v1: Deployment (deployments), StatefulSet (statefulsets)",
                "v1: Pod (pods)",
                "example.com/v1:"
            ])
        );
        let back: ClusterStatus = serde_json::from_value(wire).unwrap();
        assert_eq!(back.api_enablements, status.api_enablements);
    }

    #[test]
    fn the_object_form_is_still_read() {
        let status: ClusterStatus = serde_json::from_value(json!({"apiEnablements": [
            {"groupVersion": "apps/v1", "resources": [
                {"name": "deployments", "kind": "Deployment"},
                {"name": "statefulsets", "kind": "StatefulSet"}]},
            {"groupVersion": "v1", "resources": null}
        ]}))
        .unwrap();
        assert_eq!(status.api_enablements[0], apps());
        assert!(status.api_enablements[1].resources.is_empty());
    }

    #[test]
    fn a_malformed_api_enablement_says_what_is_wrong() {
        for (text, needle) in [
            ("apps/v1 Deployment", "no ':'"),
            (": Deployment (deployments)", "not a group version"),
            ("apps/v1: Deployment", "is not \"Kind (plural)\""),
            ("apps/v1: Deployment ()", "is not \"Kind (plural)\""),
        ] {
            let error = text.parse::<ApiEnablement>().unwrap_err();
            assert!(error.contains(needle), "{text}: {error}");
            let status = serde_json::from_value::<ClusterStatus>(json!({"apiEnablements": [text]}));
            assert!(status.is_err(), "{text} was read");
        }
    }
}
