//! A member cluster as the scheduler sees it: built once per scheduling round from the
//! `Cluster` object, every quantity already converted to milli-units, shared by every decision of
//! the round.

use std::collections::BTreeMap;
use std::sync::Arc;

use lifeboat_api::cluster::{Cluster, ResourceList};
use lifeboat_api::policy::CapacityType;

use crate::quantity::to_milli;

/// Free amount of a resource a node group does not report at all (distinct from 0).
pub(crate) const NOT_REPORTED: i64 = -1;

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
    /// `(groupVersion, kind)` pairs, sorted; `None` while the agent has not reported any.
    pub api_enablements: Option<Vec<(String, String)>>,
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
            let mut pairs: Vec<(String, String)> = s
                .api_enablements
                .iter()
                .flat_map(|e| {
                    e.resources
                        .iter()
                        .map(|r| (e.group_version.clone(), r.kind.clone()))
                })
                .collect();
            pairs.sort();
            pairs.dedup();
            pairs
        });

        // Resource columns: every name any node group or the summary reports.
        let empty = ResourceList::new();
        let groups = status.map(|s| s.node_groups.as_slice()).unwrap_or_default();
        let summary = status.and_then(|s| s.resource_summary.as_ref());
        let allocatable_list = summary.map(|s| &s.allocatable).unwrap_or(&empty);
        let allocated_list = summary.map(|s| &s.allocated).unwrap_or(&empty);
        let mut resources: Vec<String> = groups
            .iter()
            .flat_map(|g| g.free.keys())
            .chain(allocatable_list.keys())
            .chain(allocated_list.keys())
            .cloned()
            .collect();
        resources.sort();
        resources.dedup();

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
                let Ok(column) = resources.binary_search(resource) else {
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
            node_groups.push(NodeGroupSnapshot {
                count,
                free,
                capacity_type: group.capacity_type.as_deref().and_then(CapacityType::parse),
                labels: group.labels.clone(),
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
        self.resources
            .binary_search_by(|r| r.as_str().cmp(resource))
            .ok()
    }

    /// Whether the cluster reports `kind` in `groupVersion` (`None`: nothing reported yet).
    pub fn serves(&self, group_version: &str, kind: &str) -> Option<bool> {
        let pairs = self.api_enablements.as_ref()?;
        Some(
            pairs
                .binary_search_by(|(g, k)| (g.as_str(), k.as_str()).cmp(&(group_version, kind)))
                .is_ok(),
        )
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

fn summary_vector(
    field: &str,
    list: &ResourceList,
    resources: &[String],
    problems: &mut Vec<String>,
) -> Vec<i64> {
    let mut out = vec![0i64; resources.len()];
    for (resource, quantity) in list {
        let Ok(column) = resources.binary_search(resource) else {
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
                    {"count": 2, "free": {"cpu": "30", "nvidia.com/gpu": "8"}, "capacityType": "spot"},
                    {"count": 1, "free": {"cpu": "500m"}}
                ]
            }
        })));
        assert_eq!(snap.invalid, None);
        assert_eq!(snap.resources, ["cpu", "nvidia.com/gpu"]);
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
