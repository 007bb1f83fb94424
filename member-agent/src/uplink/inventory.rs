//! The member's inventory as the heartbeat carries it, computed from its nodes and pods: pure.
//! Watches feed a [`ClusterView`] (nodes reduced to [`NodeFacts`], pods to [`PodLoad`]);
//! [`ClusterView::inventory`] sums it up.
//!
//! - **Capacity** counts only nodes that can take a new pod now: Ready, not cordoned, not
//!   flagged by Autopilot (NoExecute-class GPU health), and without a NoSchedule/NoExecute taint
//!   from [`EXCLUDING_TAINTS`] or a spot reclamation taint. Other taints (e.g. `nvidia.com/gpu`
//!   that dedicates GPU nodes to pods tolerating it) do not exclude a node: the workloads they
//!   are for tolerate them.
//! - **Free** per node = allocatable − the requests of its non-terminal pods, as the scheduler
//!   counts them (see [`pod_requests`]), one `pods` per pod, never below zero.
//! - **Node groups**: capacity nodes with equal free resources, capacity type
//!   (`karpenter.sh/capacity-type`) and labels of interest ([`GROUP_LABELS`]).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec};
use lifeboat_api::cluster::{
    GPU_RESOURCE, NODE_CAPACITY_TYPE_LABEL, NODE_ZONE_LABEL, NodeGroup, NodeHealthSummary,
    NodeSummary, ResourceList, ResourceSummary,
};
use lifeboat_api::protocol::Inventory;
use lifeboat_api::quantity::Quantity;

use crate::node_health::NodeHealthIndex;

/// Taint keys that take a node out of capacity (with effect NoSchedule or NoExecute): the node
/// lifecycle controller's condition taints, the cloud provider's, and the autoscalers' "about to
/// be removed".
pub const EXCLUDING_TAINTS: &[&str] = &[
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/unschedulable",
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/pid-pressure",
    "node.kubernetes.io/network-unavailable",
    "node.kubernetes.io/out-of-service",
    "node.cloudprovider.kubernetes.io/uninitialized",
    "node.cloudprovider.kubernetes.io/shutdown",
    "ToBeDeletedByClusterAutoscaler",
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
];

/// Node labels a node group carries (placement reads them).
pub const GROUP_LABELS: &[&str] = &[NODE_ZONE_LABEL, "nvidia.com/gpu.product"];

/// Resource amounts by name, exact.
pub type Amounts = BTreeMap<String, Quantity>;

/// What the inventory needs of one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeFacts {
    pub name: String,
    /// The Ready condition is True.
    pub ready: bool,
    /// Why the node takes no new pods, if it does not (`None`: it counts as capacity).
    pub excluded: Option<String>,
    pub not_ready: bool,
    pub autopilot_flagged: bool,
    pub spot_reclaiming: bool,
    pub capacity_type: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub allocatable: Amounts,
}

impl NodeFacts {
    /// The facts of a node; `health` assesses NotReady, Autopilot and spot reclamation as the
    /// AppWrapper controller does.
    pub fn of(node: &Node, health: &NodeHealthIndex, reclamation_taints: &[String]) -> Self {
        let name = node.metadata.name.clone().unwrap_or_default();
        let assessed = health.assess(node);
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        let spec = node.spec.as_ref();
        let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
        let blocking_taint = spec
            .and_then(|s| s.taints.as_deref())
            .unwrap_or_default()
            .iter()
            .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
            .find(|t| {
                EXCLUDING_TAINTS.contains(&t.key.as_str()) || reclamation_taints.contains(&t.key)
            })
            .map(|t| t.key.clone());
        let autopilot_flagged = !assessed.no_execute.is_empty();
        let excluded = if !ready || assessed.not_ready {
            Some("not ready".to_string())
        } else if cordoned {
            Some("cordoned".to_string())
        } else if autopilot_flagged {
            Some("flagged by Autopilot".to_string())
        } else if assessed.reclaiming {
            Some("spot reclamation notice".to_string())
        } else {
            blocking_taint.map(|key| format!("taint {key}"))
        };
        let node_labels = node.metadata.labels.clone().unwrap_or_default();
        let labels = GROUP_LABELS
            .iter()
            .filter_map(|k| node_labels.get(*k).map(|v| (k.to_string(), v.clone())))
            .collect();
        let allocatable = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .map(amounts)
            .unwrap_or_default();
        NodeFacts {
            name,
            ready,
            excluded,
            not_ready: !ready || assessed.not_ready,
            autopilot_flagged,
            spot_reclaiming: assessed.reclaiming,
            capacity_type: node_labels.get(NODE_CAPACITY_TYPE_LABEL).cloned(),
            labels,
            allocatable,
        }
    }
}

/// What one pod takes from its node.
#[derive(Debug, Clone, PartialEq)]
pub struct PodLoad {
    pub node: String,
    pub requests: Amounts,
}

impl PodLoad {
    /// The load of a pod bound to a node and not finished (Succeeded and Failed pods free their
    /// node; a terminating pod still holds it, as the scheduler counts it).
    pub fn of(pod: &Pod) -> Option<PodLoad> {
        let spec = pod.spec.as_ref()?;
        let node = spec.node_name.clone().filter(|n| !n.is_empty())?;
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return None;
        }
        Some(PodLoad {
            node,
            requests: pod_requests(spec),
        })
    }
}

/// A pod's requests as the scheduler counts them (Kubernetes' `resourcehelper.PodRequests`):
/// the sum of its containers and of its sidecars (restartable init containers), or the largest
/// init container plus the sidecars started before it if that is more; pod-level requests
/// replace the container sum for the resources they name; plus the pod overhead; plus one
/// `pods`.
pub fn pod_requests(spec: &PodSpec) -> Amounts {
    let mut total = Amounts::new();
    for c in &spec.containers {
        add(&mut total, &container_requests(c));
    }
    let mut sidecars = Amounts::new();
    let mut largest_init = Amounts::new();
    for c in spec.init_containers.as_deref().unwrap_or_default() {
        let mut effective = container_requests(c);
        if c.restart_policy.as_deref() == Some("Always") {
            add(&mut total, &effective);
            add(&mut sidecars, &effective);
            effective = sidecars.clone();
        } else {
            add(&mut effective, &sidecars);
        }
        for (name, q) in effective {
            let slot = largest_init.entry(name).or_insert(Quantity::ZERO);
            *slot = (*slot).max(q);
        }
    }
    for (name, q) in largest_init {
        let slot = total.entry(name).or_insert(Quantity::ZERO);
        *slot = (*slot).max(q);
    }
    if let Some(pod_level) = spec.resources.as_ref().and_then(|r| r.requests.as_ref()) {
        for (name, q) in amounts(pod_level) {
            total.insert(name, q);
        }
    }
    if let Some(overhead) = spec.overhead.as_ref() {
        add(&mut total, &amounts(overhead));
    }
    add(
        &mut total,
        &Amounts::from([("pods".into(), Quantity::from_units(1))]),
    );
    total
}

fn container_requests(c: &Container) -> Amounts {
    c.resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .map(amounts)
        .unwrap_or_default()
}

/// Parses a resource list; a malformed quantity (the API server rejects them) is skipped.
fn amounts(
    list: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) -> Amounts {
    list.iter()
        .filter_map(|(k, v)| Quantity::parse(&v.0).ok().map(|q| (k.clone(), q)))
        .collect()
}

fn add(total: &mut Amounts, more: &Amounts) {
    for (name, q) in more {
        let slot = total.entry(name.clone()).or_insert(Quantity::ZERO);
        *slot = slot.saturating_add(*q);
    }
}

fn resource_list(amounts: &Amounts) -> ResourceList {
    amounts
        .iter()
        .map(|(k, q)| {
            (
                k.clone(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(q.to_string()),
            )
        })
        .collect()
}

/// Nodes and pods of the member, reduced to what the inventory needs; fed by watches.
#[derive(Debug, Default, Clone)]
pub struct ClusterView {
    nodes: BTreeMap<String, NodeFacts>,
    /// `namespace/name` → load.
    pods: HashMap<String, PodLoad>,
}

impl ClusterView {
    /// Returns whether the node's facts changed (a heartbeat status update of a node changes
    /// nothing here).
    pub fn apply_node(&mut self, facts: NodeFacts) -> bool {
        let changed = self.nodes.get(&facts.name) != Some(&facts);
        self.nodes.insert(facts.name.clone(), facts);
        changed
    }

    /// Returns whether the node was known.
    pub fn delete_node(&mut self, name: &str) -> bool {
        self.nodes.remove(name).is_some()
    }

    pub fn reset_nodes(&mut self, nodes: impl IntoIterator<Item = NodeFacts>) {
        self.nodes = nodes.into_iter().map(|n| (n.name.clone(), n)).collect();
    }

    /// A pod seen by the watch: `load` is `None` once it no longer holds a node.
    pub fn apply_pod(&mut self, key: String, load: Option<PodLoad>) {
        match load {
            Some(load) => {
                self.pods.insert(key, load);
            }
            None => {
                self.pods.remove(&key);
            }
        }
    }

    pub fn reset_pods(&mut self, pods: impl IntoIterator<Item = (String, PodLoad)>) {
        self.pods = pods.into_iter().collect();
    }

    /// The inventory (without the API facts: version and enablements).
    pub fn inventory(&self) -> Inventory {
        let mut requested: HashMap<&str, Amounts> = HashMap::new();
        for load in self.pods.values() {
            add(
                requested.entry(load.node.as_str()).or_default(),
                &load.requests,
            );
        }
        let mut allocatable = Amounts::new();
        let mut allocated = Amounts::new();
        type GroupKey = (
            Option<String>,
            BTreeMap<String, String>,
            Vec<(String, i128)>,
        );
        let mut groups: BTreeMap<GroupKey, (i32, Amounts)> = BTreeMap::new();
        let mut health = NodeHealthSummary::default();
        let mut summary = NodeSummary::default();
        for node in self.nodes.values() {
            summary.total_num += 1;
            if node.ready {
                summary.ready_num += 1;
            }
            if node.not_ready {
                health.not_ready += 1;
                health.not_ready_nodes.push(node.name.clone());
            }
            if node.autopilot_flagged {
                health.autopilot_flagged += 1;
                health.autopilot_flagged_nodes.push(node.name.clone());
            }
            if node.spot_reclaiming {
                health.spot_reclaiming += 1;
                health.spot_reclaiming_nodes.push(node.name.clone());
            }
            if node.excluded.is_some() {
                continue;
            }
            let empty = Amounts::new();
            let used = requested.get(node.name.as_str()).unwrap_or(&empty);
            add(&mut allocatable, &node.allocatable);
            add(&mut allocated, used);
            let free: Amounts = node
                .allocatable
                .iter()
                .map(|(name, q)| {
                    let taken = used.get(name).copied().unwrap_or(Quantity::ZERO);
                    (name.clone(), q.saturating_sub(taken).max(Quantity::ZERO))
                })
                .collect();
            let key = (
                node.capacity_type.clone(),
                node.labels.clone(),
                free.iter().map(|(k, q)| (k.clone(), q.nanos())).collect(),
            );
            groups.entry(key).or_insert((0, free)).0 += 1;
        }
        for names in [
            &mut health.not_ready_nodes,
            &mut health.autopilot_flagged_nodes,
            &mut health.spot_reclaiming_nodes,
        ] {
            names.truncate(NodeHealthSummary::MAX_NAMES);
        }
        Inventory {
            kubernetes_version: None,
            api_enablements: Vec::new(),
            node_summary: summary,
            resource_summary: ResourceSummary {
                allocatable: resource_list(&allocatable),
                allocated: resource_list(&allocated),
            },
            node_groups: groups
                .into_iter()
                .map(|((capacity_type, labels, _), (count, free))| NodeGroup {
                    count,
                    free: resource_list(&free),
                    capacity_type,
                    labels,
                })
                .collect(),
            node_health: health,
        }
    }

    /// GPUs free on capacity nodes (for logs).
    pub fn free_gpus(inventory: &Inventory) -> i64 {
        inventory
            .node_groups
            .iter()
            .map(|g| {
                let per_node = g
                    .free
                    .get(GPU_RESOURCE)
                    .and_then(|q| Quantity::parse(&q.0).ok())
                    .map(|q| (q.nanos() / 1_000_000_000) as i64)
                    .unwrap_or(0);
                per_node * i64::from(g.count)
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lifeboat_api::appwrapper::autopilot::AutopilotConfig;
    use serde_json::{Value, json};

    const RECLAIM: &str = "aws-node-termination-handler/spot-itn";

    fn health() -> NodeHealthIndex {
        NodeHealthIndex::new(Some(AutopilotConfig::default()), vec![RECLAIM.into()])
    }

    fn node(name: &str, capacity: &str, gpus: u32, extra: Value) -> NodeFacts {
        let mut obj = json!({
            "metadata": {"name": name, "labels": {
                "karpenter.sh/capacity-type": capacity,
                "topology.kubernetes.io/zone": "us-east-1a",
                "nvidia.com/gpu.product": "H100",
                "kubernetes.io/hostname": name}},
            "spec": {},
            "status": {
                "allocatable": {"cpu": "96", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string()},
                "conditions": [{"type": "Ready", "status": "True"}]}
        });
        merge(&mut obj, extra);
        let node: Node = serde_json::from_value(obj).expect("a node");
        NodeFacts::of(&node, &health(), &[RECLAIM.to_string()])
    }

    fn merge(target: &mut Value, patch: Value) {
        match (target, patch) {
            (Value::Object(t), Value::Object(p)) => {
                for (k, v) in p {
                    merge(t.entry(k).or_insert(Value::Null), v);
                }
            }
            (t, p) => *t = p,
        }
    }

    fn pod(node: &str, spec: Value, phase: &str) -> Pod {
        let mut spec = spec;
        spec["nodeName"] = json!(node);
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": spec,
            "status": {"phase": phase}
        }))
        .expect("a pod")
    }

    fn container(requests: Value) -> Value {
        json!({"name": "c", "image": "x", "resources": {"requests": requests}})
    }

    fn requests_of(spec: Value) -> BTreeMap<String, String> {
        let pod = pod("n", spec, "Running");
        PodLoad::of(&pod)
            .expect("counts")
            .requests
            .into_iter()
            .map(|(k, q)| (k, q.to_string()))
            .collect()
    }

    fn text(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_a_change_of_a_nodes_facts_counts_as_a_node_change() {
        let mut view = ClusterView::default();
        assert!(
            view.apply_node(node("a", "spot", 8, json!({}))),
            "a new node"
        );
        // The same facts again (a node status heartbeat): nothing to tell the hub early.
        assert!(!view.apply_node(node("a", "spot", 8, json!({}))));
        let noticed = node(
            "a",
            "spot",
            8,
            json!({"spec": {"taints": [{"key": RECLAIM, "effect": "NoSchedule"}]}}),
        );
        assert!(noticed.spot_reclaiming);
        assert!(view.apply_node(noticed), "a reclamation notice");
        assert!(view.delete_node("a"));
        assert!(!view.delete_node("a"), "already gone");
    }

    #[test]
    fn requests_take_the_larger_of_containers_and_init_containers_plus_overhead() {
        // Two containers: 1 + 2 GPUs; init container 4 GPUs but less CPU: max per resource.
        let spec = json!({
            "containers": [container(json!({"nvidia.com/gpu": "1", "cpu": "500m"})),
                           container(json!({"nvidia.com/gpu": "2", "cpu": "1"}))],
            "initContainers": [container(json!({"nvidia.com/gpu": "4", "cpu": "100m", "memory": "1Gi"}))],
            "overhead": {"cpu": "250m"}
        });
        assert_eq!(
            requests_of(spec),
            text(&[
                ("cpu", "1750m"),
                ("memory", "1Gi"),
                ("nvidia.com/gpu", "4"),
                ("pods", "1")
            ])
        );
    }

    #[test]
    fn sidecars_add_to_the_containers_and_to_later_init_containers() {
        let mut sidecar = container(json!({"cpu": "1"}));
        sidecar["restartPolicy"] = json!("Always");
        let spec = json!({
            "containers": [container(json!({"cpu": "2"}))],
            // init 2 cpu runs after the 1-cpu sidecar started: 3; regular phase: 2 + 1 = 3.
            // A later 5-cpu init container with the sidecar: 6, the largest.
            "initContainers": [sidecar, container(json!({"cpu": "2"})), container(json!({"cpu": "5"}))]
        });
        assert_eq!(requests_of(spec), text(&[("cpu", "6"), ("pods", "1")]));
    }

    #[test]
    fn pod_level_requests_replace_the_container_sum() {
        let spec = json!({
            "containers": [container(json!({"cpu": "1", "nvidia.com/gpu": "1"}))],
            "resources": {"requests": {"cpu": "4"}}
        });
        assert_eq!(
            requests_of(spec),
            text(&[("cpu", "4"), ("nvidia.com/gpu", "1"), ("pods", "1")])
        );
    }

    #[test]
    fn finished_and_unbound_pods_hold_no_node() {
        let spec = json!({"containers": [container(json!({"cpu": "1"}))]});
        assert!(PodLoad::of(&pod("n", spec.clone(), "Succeeded")).is_none());
        assert!(PodLoad::of(&pod("n", spec.clone(), "Failed")).is_none());
        assert!(PodLoad::of(&pod("n", spec.clone(), "Pending")).is_some());
        let unbound: Pod =
            serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).expect("pod");
        assert!(PodLoad::of(&unbound).is_none());
    }

    fn gpu_pod(node: &str, gpus: u32) -> PodLoad {
        PodLoad::of(&pod(
            node,
            json!({"containers": [container(json!({"nvidia.com/gpu": gpus.to_string(), "cpu": "1"}))]}),
            "Running",
        ))
        .expect("counts")
    }

    fn groups(inv: &Inventory) -> Vec<(Option<String>, String, String, i32)> {
        inv.node_groups
            .iter()
            .map(|g| {
                (
                    g.capacity_type.clone(),
                    g.free["nvidia.com/gpu"].0.clone(),
                    g.free["cpu"].0.clone(),
                    g.count,
                )
            })
            .collect()
    }

    #[test]
    fn equal_nodes_group_and_pods_split_them() {
        let mut view = ClusterView::default();
        view.reset_nodes([
            node("a", "on-demand", 8, json!({})),
            node("b", "on-demand", 8, json!({})),
            node("c", "spot", 8, json!({})),
            node("d", "spot", 8, json!({})),
        ]);
        let inv = view.inventory();
        assert_eq!(
            groups(&inv),
            vec![
                (Some("on-demand".into()), "8".into(), "96".into(), 2),
                (Some("spot".into()), "8".into(), "96".into(), 2),
            ]
        );
        assert_eq!(
            inv.node_groups[0].labels,
            text(&[
                ("nvidia.com/gpu.product", "H100"),
                ("topology.kubernetes.io/zone", "us-east-1a")
            ])
        );
        assert_eq!(inv.node_groups[0].free["memory"].0, "1Ti");
        view.apply_pod("ns/p1".into(), Some(gpu_pod("a", 3)));
        view.apply_pod("ns/p2".into(), Some(gpu_pod("a", 5)));
        view.apply_pod("ns/p3".into(), Some(gpu_pod("c", 2)));
        let inv = view.inventory();
        assert_eq!(
            groups(&inv),
            vec![
                (Some("on-demand".into()), "0".into(), "94".into(), 1),
                (Some("on-demand".into()), "8".into(), "96".into(), 1),
                (Some("spot".into()), "6".into(), "95".into(), 1),
                (Some("spot".into()), "8".into(), "96".into(), 1),
            ]
        );
        assert_eq!(inv.resource_summary.allocatable["nvidia.com/gpu"].0, "32");
        assert_eq!(inv.resource_summary.allocated["nvidia.com/gpu"].0, "10");
        assert_eq!(inv.resource_summary.allocated["pods"].0, "3");
        assert_eq!(ClusterView::free_gpus(&inv), 22);
        // The pod finished: its node is free again.
        view.apply_pod("ns/p3".into(), None);
        assert_eq!(ClusterView::free_gpus(&view.inventory()), 24);
        assert_eq!(
            inv.node_summary,
            NodeSummary {
                total_num: 4,
                ready_num: 4
            }
        );
    }

    #[test]
    fn overcommitted_nodes_have_zero_free_not_negative() {
        let mut view = ClusterView::default();
        view.reset_nodes([node("a", "on-demand", 2, json!({}))]);
        view.reset_pods([("ns/p".to_string(), gpu_pod("a", 3))]);
        let inv = view.inventory();
        assert_eq!(inv.node_groups[0].free["nvidia.com/gpu"].0, "0");
        assert_eq!(inv.resource_summary.allocated["nvidia.com/gpu"].0, "3");
    }

    #[test]
    fn unavailable_nodes_are_no_capacity_but_are_in_the_health_summary() {
        let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        let cordoned = json!({"spec": {"unschedulable": true}});
        let pressure = json!({"spec": {"taints": [{"key": "node.kubernetes.io/disk-pressure", "effect": "NoSchedule"}]}});
        let reclaim =
            json!({"spec": {"taints": [{"key": RECLAIM, "value": "1", "effect": "NoSchedule"}]}});
        let evict = json!({"metadata": {"labels": {"autopilot.ibm.com/gpuhealth": "EVICT"}}});
        // Dedication taints and PreferNoSchedule keep a node in capacity.
        let dedicated = json!({"spec": {"taints": [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/memory-pressure", "effect": "PreferNoSchedule"}]}});
        let mut view = ClusterView::default();
        view.reset_nodes([
            node("n1", "spot", 8, not_ready),
            node("n2", "spot", 8, cordoned),
            node("n3", "spot", 8, pressure),
            node("n4", "spot", 8, reclaim),
            node("n5", "spot", 8, evict),
            node("n6", "spot", 8, dedicated),
        ]);
        let inv = view.inventory();
        assert_eq!(
            groups(&inv),
            vec![(Some("spot".into()), "8".into(), "96".into(), 1)]
        );
        assert_eq!(inv.resource_summary.allocatable["nvidia.com/gpu"].0, "8");
        assert_eq!(
            inv.node_summary,
            NodeSummary {
                total_num: 6,
                ready_num: 5
            }
        );
        let h = &inv.node_health;
        assert_eq!(
            (h.not_ready, h.autopilot_flagged, h.spot_reclaiming),
            (1, 1, 1)
        );
        assert_eq!(h.not_ready_nodes, vec!["n1".to_string()]);
        assert_eq!(h.autopilot_flagged_nodes, vec!["n5".to_string()]);
        assert_eq!(h.spot_reclaiming_nodes, vec!["n4".to_string()]);
        let why: Vec<Option<String>> = ["n1", "n2", "n3", "n4", "n5", "n6"]
            .iter()
            .map(|n| view.nodes[*n].excluded.clone())
            .collect();
        assert_eq!(
            why,
            vec![
                Some("not ready".into()),
                Some("cordoned".into()),
                Some("taint node.kubernetes.io/disk-pressure".into()),
                Some("spot reclamation notice".into()),
                Some("flagged by Autopilot".into()),
                None
            ]
        );
    }

    #[test]
    fn health_name_lists_are_truncated_counts_are_not() {
        let mut view = ClusterView::default();
        let down = json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}});
        view.reset_nodes((0..60).map(|i| node(&format!("n{i:02}"), "spot", 8, down.clone())));
        let inv = view.inventory();
        assert_eq!(inv.node_health.not_ready, 60);
        assert_eq!(
            inv.node_health.not_ready_nodes.len(),
            NodeHealthSummary::MAX_NAMES
        );
        assert!(inv.node_groups.is_empty());
        view.delete_node("n00");
        assert_eq!(view.inventory().node_summary.total_num, 59);
    }
}
