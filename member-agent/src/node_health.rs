//! Node health index, fed by a watch on Nodes and read by every reconcile: which nodes Autopilot
//! flagged NoExecute for which resources, which are NotReady or unreachable, and which have a
//! spot reclamation notice. Pure: `apply`/`delete` are unit-tested directly.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Node;
use lifeboat_api::appwrapper::autopilot::{AutopilotConfig, no_execute_resources};

/// What is wrong with one node, if anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeHealth {
    /// Resources Autopilot flagged NoExecute on this node.
    pub no_execute: BTreeSet<String>,
    /// Ready is False or Unknown, or the node carries the not-ready/unreachable taint.
    pub not_ready: bool,
    /// A spot reclamation notice (one of the configured taints) is on the node.
    pub reclaiming: bool,
}

impl NodeHealth {
    pub fn is_healthy(&self) -> bool {
        self.no_execute.is_empty() && !self.not_ready && !self.reclaiming
    }
}

/// The index: only unhealthy nodes are stored; known nodes are tracked so that a pod bound to a
/// node that no longer exists is recognised as lost.
#[derive(Debug, Default)]
pub struct NodeHealthIndex {
    autopilot: Option<AutopilotConfig>,
    reclamation_taints: Vec<String>,
    unhealthy: HashMap<String, NodeHealth>,
    known: BTreeSet<String>,
    /// False until the first full list has been applied.
    synced: bool,
}

impl NodeHealthIndex {
    /// `autopilot` is `None` when node monitoring is off (no NoExecute migration).
    pub fn new(autopilot: Option<AutopilotConfig>, reclamation_taints: Vec<String>) -> Self {
        Self {
            autopilot: autopilot.filter(|a| a.monitor_nodes),
            reclamation_taints,
            ..Default::default()
        }
    }

    /// Health of a node from its object.
    pub fn assess(&self, node: &Node) -> NodeHealth {
        let empty = BTreeMap::new();
        let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
        let no_execute = self
            .autopilot
            .as_ref()
            .map(|a| no_execute_resources(labels, a))
            .unwrap_or_default();
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or_default();
        let ready_condition = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.as_str());
        let not_ready = matches!(ready_condition, Some("False") | Some("Unknown"))
            || taints.iter().any(|t| {
                t.key == "node.kubernetes.io/unreachable" || t.key == "node.kubernetes.io/not-ready"
            });
        let reclaiming = taints
            .iter()
            .any(|t| self.reclamation_taints.contains(&t.key));
        NodeHealth {
            no_execute,
            not_ready,
            reclaiming,
        }
    }

    /// Applies a node seen by the watch; returns true when its health changed.
    pub fn apply(&mut self, node: &Node) -> bool {
        let Some(name) = node.metadata.name.clone() else {
            return false;
        };
        self.known.insert(name.clone());
        let health = self.assess(node);
        let before = self.unhealthy.get(&name).cloned().unwrap_or_default();
        if health.is_healthy() {
            self.unhealthy.remove(&name);
        } else {
            self.unhealthy.insert(name, health.clone());
        }
        before != health
    }

    /// Forgets a deleted node; pods still bound to it are lost from now on.
    pub fn delete(&mut self, name: &str) {
        self.known.remove(name);
        self.unhealthy.remove(name);
    }

    /// Replaces everything with a full list (watch (re)start).
    pub fn reset<'a>(&mut self, nodes: impl IntoIterator<Item = &'a Node>) {
        self.unhealthy.clear();
        self.known.clear();
        for node in nodes {
            self.apply(node);
        }
        self.synced = true;
    }

    pub fn mark_synced(&mut self) {
        self.synced = true;
    }

    /// Health of a node by name; a node that no longer exists (after the first sync) is lost.
    pub fn health(&self, name: &str) -> NodeHealth {
        if let Some(h) = self.unhealthy.get(name) {
            return h.clone();
        }
        if self.synced && !self.known.contains(name) {
            return NodeHealth {
                not_ready: true,
                ..Default::default()
            };
        }
        NodeHealth::default()
    }

    /// True when the node is gone (after the first sync).
    pub fn is_gone(&self, name: &str) -> bool {
        self.synced && !self.known.contains(name)
    }

    pub fn unhealthy_nodes(&self) -> impl Iterator<Item = (&String, &NodeHealth)> {
        self.unhealthy.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, labels: serde_json::Value, taints: serde_json::Value, ready: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints},
            "status": {"capacity": {"nvidia.com/gpu": "4"}, "conditions": [{"type": "Ready", "status": ready}]}
        }))
        .unwrap()
    }

    fn index() -> NodeHealthIndex {
        NodeHealthIndex::new(
            Some(AutopilotConfig::default()),
            vec!["aws-node-termination-handler/spot-itn".into()],
        )
    }

    #[test]
    fn autopilot_evict_label_marks_gpu_no_execute_and_clears() {
        let mut idx = index();
        idx.reset([&node("n1", json!({"key1": "value1"}), json!([]), "True")]);
        assert!(idx.unhealthy_nodes().next().is_none());
        let evict = node(
            "n1",
            json!({"autopilot.ibm.com/gpuhealth": "EVICT"}),
            json!([]),
            "True",
        );
        assert!(idx.apply(&evict));
        assert_eq!(
            idx.health("n1").no_execute,
            BTreeSet::from(["nvidia.com/gpu".to_string()])
        );
        // Idempotent: applying the same node again changes nothing.
        assert!(!idx.apply(&evict));
        // WARN is only PreferNoSchedule: healthy for migration purposes.
        assert!(idx.apply(&node(
            "n1",
            json!({"autopilot.ibm.com/gpuhealth": "WARN"}),
            json!([]),
            "True"
        )));
        assert!(idx.health("n1").is_healthy());
    }

    #[test]
    fn not_ready_unreachable_and_reclaiming() {
        let mut idx = index();
        idx.reset([
            &node("a", json!({}), json!([]), "False"),
            &node("b", json!({}), json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]), "True"),
            &node("c", json!({}), json!([{"key": "aws-node-termination-handler/spot-itn", "value": "123", "effect": "NoSchedule"}]), "True"),
            &node("d", json!({}), json!([]), "True"),
        ]);
        assert!(idx.health("a").not_ready);
        assert!(idx.health("b").not_ready);
        assert!(idx.health("c").reclaiming && !idx.health("c").not_ready);
        assert!(idx.health("d").is_healthy());
    }

    #[test]
    fn deleted_nodes_are_lost_once_synced() {
        let mut idx = index();
        // Before the first list nothing is known, and nothing is declared lost.
        assert!(idx.health("x").is_healthy());
        idx.reset([&node("x", json!({}), json!([]), "True")]);
        assert!(idx.health("x").is_healthy());
        idx.delete("x");
        assert!(idx.is_gone("x"));
        assert!(idx.health("x").not_ready);
    }

    #[test]
    fn monitoring_off_ignores_autopilot_labels() {
        let mut idx = NodeHealthIndex::new(
            Some(AutopilotConfig {
                monitor_nodes: false,
                ..Default::default()
            }),
            vec![],
        );
        idx.reset([&node(
            "n1",
            json!({"autopilot.ibm.com/gpuhealth": "EVICT"}),
            json!([]),
            "True",
        )]);
        assert!(idx.health("n1").is_healthy());
    }
}
