//! A member cluster as the scheduler sees it: built once per scheduling round from the
//! `Cluster` object, every quantity already converted to milli-units, shared by every decision of
//! the round.

use std::collections::BTreeMap;
use std::sync::Arc;

use lifeboat_api::cluster::{Cluster, NODE_CAPACITY_TYPE_LABEL, ResourceList};
use lifeboat_api::policy::CapacityType;

use crate::quantity::to_milli;

/// Free amount of a resource a node group does not report at all (distinct from 0).
pub(crate) const NOT_REPORTED: i64 = -1;

/// Resources every snapshot has a column for, at these indices; other resources follow,
/// sorted by name. Requests find these columns without comparing strings.
pub const WELL_KNOWN_RESOURCES: [&str; 5] = [
    "cpu",
    "memory",
    "nvidia.com/gpu",
    "pods",
    "ephemeral-storage",
];

/// The fixed column of a well-known resource.
pub fn well_known_column(resource: &str) -> Option<usize> {
    WELL_KNOWN_RESOURCES.iter().position(|r| *r == resource)
}

/// The key under which an API (`groupVersion`, `kind`) is indexed: FNV-1a, 64 bits.
pub fn api_key(group_version: &str, kind: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in group_version
        .as_bytes()
        .iter()
        .chain(&[0u8])
        .chain(kind.as_bytes())
    {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The APIs a cluster serves, indexed by [`api_key`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiSet {
    /// Keys, sorted; `apis[i]` has key `keys[i]`.
    keys: Vec<u64>,
    apis: Vec<(String, String)>,
}

impl ApiSet {
    pub fn new(pairs: impl IntoIterator<Item = (String, String)>) -> ApiSet {
        let mut keyed: Vec<(u64, (String, String))> = pairs
            .into_iter()
            .map(|(g, k)| (api_key(&g, &k), (g, k)))
            .collect();
        keyed.sort();
        keyed.dedup();
        let (keys, apis) = keyed.into_iter().unzip();
        ApiSet { keys, apis }
    }

    /// Whether the set holds the API; `key` is its [`api_key`].
    pub fn contains(&self, key: u64, group_version: &str, kind: &str) -> bool {
        let start = self.keys.partition_point(|k| *k < key);
        self.keys[start..]
            .iter()
            .zip(&self.apis[start..])
            .take_while(|(k, _)| **k == key)
            .any(|(_, (g, k))| g == group_version && k == kind)
    }

    pub fn len(&self) -> usize {
        self.apis.len()
    }

    pub fn is_empty(&self) -> bool {
        self.apis.is_empty()
    }
}

/// The taint effects that keep work off a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaintEffect {
    NoSchedule,
    NoExecute,
}

impl TaintEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }

    /// `NoSchedule` and `NoExecute`; other effects (`PreferNoSchedule`) do not filter.
    pub fn parse(text: &str) -> Option<TaintEffect> {
        match text {
            "NoSchedule" => Some(TaintEffect::NoSchedule),
            "NoExecute" => Some(TaintEffect::NoExecute),
            _ => None,
        }
    }
}

/// A taint that keeps work off the cluster unless tolerated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterTaint {
    pub key: String,
    /// Empty when the taint has no value.
    pub value: String,
    pub effect: TaintEffect,
}

/// The Ready condition as the hub last wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    NotReady,
    /// `Unknown` (lease expired) or no condition yet.
    Unknown,
}

/// Identical nodes: how many, and what each still has free.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeGroupSnapshot {
    pub count: i64,
    /// Free milli-units per resource, indexed like [`ClusterSnapshot::resources`];
    /// `-1` where the group does not report the resource. Negative free amounts reported by
    /// an over-committed node are read as 0.
    pub free: Vec<i64>,
    pub capacity_type: Option<CapacityType>,
    pub labels: BTreeMap<String, String>,
}

impl NodeGroupSnapshot {
    /// Free milli-units of the resource at `column` on one node of the group (0 when not
    /// reported).
    pub fn free_at(&self, column: usize) -> i64 {
        self.free.get(column).copied().unwrap_or(0).max(0)
    }
}

/// A member cluster, ready for scheduling.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSnapshot {
    pub name: Arc<str>,
    pub labels: BTreeMap<String, String>,
    pub provider: Option<String>,
    pub region: Option<String>,
    pub zone: Option<String>,
    /// `NoSchedule` and `NoExecute` taints only.
    pub taints: Vec<ClusterTaint>,
    /// The `(groupVersion, kind)` pairs served; `None` while the agent has not reported any.
    pub api_enablements: Option<ApiSet>,
    pub readiness: Readiness,
    /// The Cluster has a deletion timestamp.
    pub deleting: bool,
    /// Resource names, sorted: the columns of every resource vector of this snapshot.
    pub resources: Vec<String>,
    pub node_groups: Vec<NodeGroupSnapshot>,
    /// Free milli-units summed over every node (for scores only: fitting is per node).
    pub free_total: Vec<i64>,
    /// `resourceSummary.allocatable` and `allocated`, in milli-units (0 when absent).
    pub allocatable: Vec<i64>,
    pub allocated: Vec<i64>,
    /// Why the cluster's status cannot be used (unparseable quantities); such a cluster is
    /// rejected for every request.
    pub invalid: Option<String>,
}

impl ClusterSnapshot {
    /// Builds the snapshot of a Cluster. Never fails: a status the scheduler cannot read makes
    /// the snapshot [`invalid`](Self::invalid), and every request then rejects that cluster
    /// with the reason.
    pub fn from_cluster(cluster: &Cluster) -> ClusterSnapshot {
        let name: Arc<str> = Arc::from(cluster.metadata.name.as_deref().unwrap_or_default());
        let mut problems: Vec<String> = Vec::new();
        if name.is_empty() {
            problems.push("metadata.name is empty".to_string());
        }
        let taints = cluster
            .spec
            .taints
            .iter()
            .filter_map(|t| {
                Some(ClusterTaint {
                    key: t.key.clone(),
                    value: t.value.clone().unwrap_or_default(),
                    effect: TaintEffect::parse(&t.effect)?,
                })
            })
            .collect();
        let readiness = match cluster.ready_status() {
            Some("True") => Readiness::Ready,
            Some("False") => Readiness::NotReady,
            _ => Readiness::Unknown,
        };
        let status = cluster.status.as_ref();
        let api_enablements = status.filter(|s| !s.api_enablements.is_empty()).map(|s| {
            ApiSet::new(s.api_enablements.iter().flat_map(|e| {
                e.resources
                    .iter()
                    .map(|r| (e.group_version.clone(), r.kind.clone()))
            }))
        });

        // Resource columns: the well-known ones, then every other name any node group or the
        // summary reports.
        let empty = ResourceList::new();
        let groups = status.map(|s| s.node_groups.as_slice()).unwrap_or_default();
        let summary = status.and_then(|s| s.resource_summary.as_ref());
        let allocatable_list = summary.map(|s| &s.allocatable).unwrap_or(&empty);
        let allocated_list = summary.map(|s| &s.allocated).unwrap_or(&empty);
        let mut others: Vec<&String> = groups
            .iter()
            .flat_map(|g| g.free.keys())
            .chain(allocatable_list.keys())
            .chain(allocated_list.keys())
            .filter(|r| well_known_column(r).is_none())
            .collect();
        others.sort();
        others.dedup();
        let resources: Vec<String> = WELL_KNOWN_RESOURCES
            .iter()
            .map(|r| r.to_string())
            .chain(others.into_iter().cloned())
            .collect();

        let mut node_groups = Vec::with_capacity(groups.len());
        let mut free_total = vec![0i64; resources.len()];
        for (i, group) in groups.iter().enumerate() {
            if group.count < 0 {
                problems.push(format!(
                    "status.nodeGroups[{i}].count: {} is negative",
                    group.count
                ));
                continue;
            }
            let mut free = vec![NOT_REPORTED; resources.len()];
            for (resource, quantity) in &group.free {
                let Some(column) = column_in(&resources, resource) else {
                    continue;
                };
                match to_milli(quantity) {
                    Ok(milli) => free[column] = milli.max(0),
                    Err(e) => {
                        problems.push(format!("status.nodeGroups[{i}].free[{resource}]: {e}"))
                    }
                }
            }
            let count = i64::from(group.count);
            for (total, &f) in free_total.iter_mut().zip(&free) {
                *total = total.saturating_add(f.max(0).saturating_mul(count));
            }
            // The capacity type is reported beside the labels; a pod's node selector names it
            // as the node label, so it is matched as one (an unreported label matches anything).
            let mut labels = group.labels.clone();
            if let Some(capacity_type) = &group.capacity_type {
                labels
                    .entry(NODE_CAPACITY_TYPE_LABEL.to_string())
                    .or_insert_with(|| capacity_type.clone());
            }
            node_groups.push(NodeGroupSnapshot {
                count,
                free,
                capacity_type: group.capacity_type.as_deref().and_then(CapacityType::parse),
                labels,
            });
        }
        let allocatable = summary_vector(
            "status.resourceSummary.allocatable",
            allocatable_list,
            &resources,
            &mut problems,
        );
        let allocated = summary_vector(
            "status.resourceSummary.allocated",
            allocated_list,
            &resources,
            &mut problems,
        );

        ClusterSnapshot {
            name,
            labels: cluster.metadata.labels.clone().unwrap_or_default(),
            provider: cluster.spec.provider.clone(),
            region: cluster.spec.region.clone(),
            zone: cluster.spec.zone.clone(),
            taints,
            api_enablements,
            readiness,
            deleting: cluster.metadata.deletion_timestamp.is_some(),
            resources,
            node_groups,
            free_total,
            allocatable,
            allocated,
            invalid: (!problems.is_empty()).then(|| problems.join("; ")),
        }
    }

    /// The column of a resource in this snapshot's vectors.
    pub fn column(&self, resource: &str) -> Option<usize> {
        column_in(&self.resources, resource)
    }

    /// Whether the cluster reports `kind` in `groupVersion` (`None`: nothing reported yet).
    pub fn serves(&self, group_version: &str, kind: &str) -> Option<bool> {
        let apis = self.api_enablements.as_ref()?;
        Some(apis.contains(api_key(group_version, kind), group_version, kind))
    }

    /// Whether any node group reported capacity.
    pub fn has_node_capacity(&self) -> bool {
        self.node_groups.iter().any(|g| g.count > 0)
    }

    /// The cluster's free milli-units of a resource for scoring: the node sum when node groups
    /// are reported, else allocatable minus allocated.
    pub(crate) fn free_for_score(&self, column: usize) -> i64 {
        if self.node_groups.is_empty() {
            (self.allocatable[column] - self.allocated[column]).max(0)
        } else {
            self.free_total[column]
        }
    }
}

/// Every cluster of one scheduling round, sorted by name (a name given twice keeps its first
/// snapshot). Built once per round and shared by every decision of the round; positions in it
/// stand for names in deterministic tie-breaks.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    clusters: Vec<ClusterSnapshot>,
}

impl Snapshot {
    pub fn new(mut clusters: Vec<ClusterSnapshot>) -> Snapshot {
        clusters.sort_by(|a, b| a.name.cmp(&b.name));
        clusters.dedup_by(|later, earlier| later.name == earlier.name);
        Snapshot { clusters }
    }

    /// Builds every cluster's snapshot.
    pub fn from_clusters<'a>(clusters: impl IntoIterator<Item = &'a Cluster>) -> Snapshot {
        Snapshot::new(
            clusters
                .into_iter()
                .map(ClusterSnapshot::from_cluster)
                .collect(),
        )
    }

    /// The clusters, sorted by name.
    pub fn clusters(&self) -> &[ClusterSnapshot] {
        &self.clusters
    }

    pub fn get(&self, name: &str) -> Option<&ClusterSnapshot> {
        self.clusters
            .binary_search_by(|c| (*c.name).cmp(name))
            .ok()
            .map(|i| &self.clusters[i])
    }

    pub fn len(&self) -> usize {
        self.clusters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
    }
}

/// The column of `resource` in `resources` (well-known first, then sorted names).
fn column_in(resources: &[String], resource: &str) -> Option<usize> {
    well_known_column(resource).or_else(|| {
        let others = resources.get(WELL_KNOWN_RESOURCES.len()..)?;
        others
            .binary_search_by(|r| r.as_str().cmp(resource))
            .ok()
            .map(|i| i + WELL_KNOWN_RESOURCES.len())
    })
}

fn summary_vector(
    field: &str,
    list: &ResourceList,
    resources: &[String],
    problems: &mut Vec<String>,
) -> Vec<i64> {
    let mut out = vec![0i64; resources.len()];
    for (resource, quantity) in list {
        let Some(column) = column_in(resources, resource) else {
            continue;
        };
        match to_milli(quantity) {
            Ok(milli) => out[column] = milli,
            Err(e) => problems.push(format!("{field}[{resource}]: {e}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cluster(value: serde_json::Value) -> Cluster {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn builds_columns_groups_and_totals() {
        let snap = ClusterSnapshot::from_cluster(&cluster(json!({
            "apiVersion": "cluster.lifeboat.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "m1", "labels": {"env": "prod"}},
            "spec": {"region": "eu", "zone": "eu-1", "provider": "aws",
                     "taints": [{"key": "cluster.lifeboat.dev/unreachable", "effect": "NoSchedule"},
                                {"key": "soft", "effect": "PreferNoSchedule"}]},
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "ClusterReady",
                                "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "apiEnablements": [{"groupVersion": "apps/v1", "resources": [
                    {"name": "deployments", "kind": "Deployment"}]}],
                "resourceSummary": {"allocatable": {"cpu": "64", "nvidia.com/gpu": "16"},
                                    "allocated": {"cpu": "4"}},
                "nodeGroups": [
                    {"count": 2, "free": {"cpu": "30", "nvidia.com/gpu": "8", "example.com/fpga": "1"},
                     "capacityType": "spot"},
                    {"count": 1, "free": {"cpu": "500m", "amd.com/gpu": "2"}}
                ]
            }
        })));
        assert_eq!(snap.invalid, None);
        assert_eq!(
            snap.resources,
            [
                "cpu",
                "memory",
                "nvidia.com/gpu",
                "pods",
                "ephemeral-storage",
                "amd.com/gpu",
                "example.com/fpga"
            ]
        );
        assert_eq!(snap.column("example.com/fpga"), Some(6));
        assert_eq!(snap.column("amd.com/gpu"), Some(5));
        assert_eq!(snap.column("example.com/other"), None);
        assert_eq!(snap.node_groups[1].free_at(5), 2000);
        assert_eq!(snap.taints.len(), 1, "PreferNoSchedule does not filter");
        assert_eq!(snap.readiness, Readiness::Ready);
        assert_eq!(snap.serves("apps/v1", "Deployment"), Some(true));
        assert_eq!(snap.serves("batch/v1", "Job"), Some(false));
        let gpu = snap.column("nvidia.com/gpu").unwrap();
        assert_eq!(snap.free_total[gpu], 16_000);
        assert_eq!(snap.free_total[snap.column("cpu").unwrap()], 60_500);
        assert_eq!(snap.node_groups[1].free[gpu], NOT_REPORTED);
        assert_eq!(snap.node_groups[1].free_at(gpu), 0);
        assert_eq!(snap.node_groups[0].capacity_type, Some(CapacityType::Spot));
        assert_eq!(snap.allocated[snap.column("cpu").unwrap()], 4000);
    }

    #[test]
    fn unreadable_status_marks_the_cluster_invalid_with_the_field() {
        let snap = ClusterSnapshot::from_cluster(&cluster(json!({
            "apiVersion": "cluster.lifeboat.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "m2"},
            "spec": {},
            "status": {"nodeGroups": [{"count": 1, "free": {"nvidia.com/gpu": "lots"}}]}
        })));
        let invalid = snap.invalid.unwrap();
        assert!(
            invalid.contains("status.nodeGroups[0].free[nvidia.com/gpu]")
                && invalid.contains("`lots`"),
            "{invalid}"
        );
        assert_eq!(snap.api_enablements, None, "nothing reported yet");
        assert_eq!(snap.readiness, Readiness::Unknown);
    }
}
