//! The watches behind the inventory: every node and every pod bound to a node and not finished,
//! each reduced at once to what [`ClusterView`] needs (the controller's own pod watch sees only
//! AppWrapper pods, and its node index keeps only unhealthy nodes, so neither fits).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::watcher;
use lifeboat_api::protocol::Inventory;

use super::inventory::{ClusterView, NodeFacts, PodLoad};
use crate::controller::watches::{Change, Feeder};
use crate::node_health::NodeHealthIndex;

/// Pods that hold a node: bound and not finished (a pod that finishes leaves the selection, and
/// the watch reports it deleted).
pub const POD_FIELD_SELECTOR: &str = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed";

/// The view and whether both watches have listed once.
#[derive(Default)]
pub struct ClusterState {
    view: Mutex<ClusterView>,
    nodes_synced: AtomicBool,
    pods_synced: AtomicBool,
    /// A node's facts changed (a node went NotReady, got a reclamation notice, was flagged by
    /// Autopilot, came or went): the hub should hear of it before the next heartbeat is due,
    /// since whether a workload still fits in this cluster decides whether it moves.
    pub nodes_changed: tokio::sync::Notify,
}

impl ClusterState {
    fn with<T>(&self, f: impl FnOnce(&mut ClusterView) -> T) -> T {
        f(&mut self.view.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The inventory, once nodes and pods have been listed.
    pub fn inventory(&self) -> Option<Inventory> {
        if !(self.nodes_synced.load(Ordering::Acquire) && self.pods_synced.load(Ordering::Acquire))
        {
            return None;
        }
        Some(self.with(|v| v.inventory()))
    }
}

/// Feeds the nodes into `state` until dropped. `health` assesses NotReady, Autopilot and spot
/// reclamation as the controller does.
pub async fn watch_nodes(
    client: kube::Client,
    state: std::sync::Arc<ClusterState>,
    health: NodeHealthIndex,
    reclamation_taints: Vec<String>,
) {
    let api: Api<Node> = Api::all(client);
    let stream = lifeboat_runtime::watch::backoff(watcher(api, watcher::Config::default()));
    let mut stream = std::pin::pin!(stream);
    let mut feeder = Feeder::default();
    let facts = |node: &Node| NodeFacts::of(node, &health, &reclamation_taints);
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(watch = "inventory nodes", error = %e, "watch error; retrying with backoff");
                continue;
            }
        };
        let changed = match feeder.feed(event) {
            Some(Change::Reset(nodes)) => {
                state.with(|v| v.reset_nodes(nodes.iter().map(facts)));
                state.nodes_synced.store(true, Ordering::Release);
                false
            }
            Some(Change::Apply(node)) => state.with(|v| v.apply_node(facts(&node))),
            Some(Change::Delete(node)) => {
                let name = node.metadata.name.as_deref().unwrap_or_default();
                state.with(|v| v.delete_node(name))
            }
            None => false,
        };
        if changed {
            state.nodes_changed.notify_one();
        }
    }
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Feeds the pods that hold a node into `state` until dropped.
pub async fn watch_pods(client: kube::Client, state: std::sync::Arc<ClusterState>) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(POD_FIELD_SELECTOR);
    let stream = lifeboat_runtime::watch::backoff(watcher(api, config));
    let mut stream = std::pin::pin!(stream);
    let mut feeder = Feeder::default();
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(watch = "inventory pods", error = %e, "watch error; retrying with backoff");
                continue;
            }
        };
        match feeder.feed(event) {
            Some(Change::Reset(pods)) => {
                state.with(|v| {
                    v.reset_pods(
                        pods.iter()
                            .filter_map(|p| PodLoad::of(p).map(|load| (pod_key(p), load))),
                    )
                });
                state.pods_synced.store(true, Ordering::Release);
            }
            Some(Change::Apply(pod)) => {
                state.with(|v| v.apply_pod(pod_key(&pod), PodLoad::of(&pod)))
            }
            Some(Change::Delete(pod)) => state.with(|v| v.apply_pod(pod_key(&pod), None)),
            None => {}
        }
    }
}
