//! Fault injection on the fleet's member clusters: failed pods, NotReady nodes, spot
//! reclamation, GPU health labels. (Stopping a whole cluster is `Fleet::stop_apiserver`.)
//! Pods and nodes are played by kwok, so faults are requested through labels and annotations
//! that the fleet's kwok stages (`e2e/kwok/stages.yaml`) act on.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::error::{Error, Result};
use crate::nodes::{GPU_HEALTH_LABEL, NOT_READY_LABEL};

/// Annotation read by the kwok `pod-fail` stage: the exit code of the pod's first container.
pub const FAIL_EXIT_CODE_ANNOTATION: &str = "fleet.lifeboat.dev/fail-exit-code";
/// Taint that announces a spot reclamation (the key AWS node-termination-handler uses for a
/// spot interruption notice); its value is the Unix time at which the node goes away.
pub const SPOT_RECLAIM_TAINT: &str = "aws-node-termination-handler/spot-itn";

/// Fails a Pending or Running pod: its first container terminates with `exit_code`.
pub async fn fail_pod(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    exit_code: i32,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let patch =
        json!({"metadata": {"annotations": {FAIL_EXIT_CODE_ANNOTATION: exit_code.to_string()}}});
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::kube(format!("fail pod {namespace}/{pod}"), e))?;
    Ok(())
}

/// Makes a node NotReady (`ready = false`) or Ready again.
pub async fn set_node_ready(client: &kube::Client, node: &str, ready: bool) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let value = if ready {
        serde_json::Value::Null
    } else {
        json!("true")
    };
    let patch = json!({"metadata": {"labels": {NOT_READY_LABEL: value}}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::kube(format!("set node {node} ready={ready}"), e))?;
    Ok(())
}

/// Sets a node's Autopilot GPU health label to any value (`PASS`, `WARN`, `EVICT`, ...).
pub async fn set_gpu_health(client: &kube::Client, node: &str, value: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = json!({"metadata": {"labels": {GPU_HEALTH_LABEL: value}}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::kube(format!("set GPU health of {node} to {value}"), e))?;
    Ok(())
}

/// The reclamation notice taint for a node that goes away `notice` from now.
pub fn reclamation_taint(notice: Duration) -> Taint {
    let deadline = chrono::Utc::now() + chrono::Duration::from_std(notice).unwrap_or_default();
    Taint {
        key: SPOT_RECLAIM_TAINT.into(),
        value: Some(deadline.timestamp().to_string()),
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

/// Announces a spot reclamation: taints the node with the notice at once.
pub async fn announce_spot_reclamation(
    client: &kube::Client,
    node: &str,
    notice: Duration,
) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes
        .get(node)
        .await
        .map_err(|e| Error::kube(format!("get node {node}"), e))?;
    let mut taints: Vec<Taint> = current
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != SPOT_RECLAIM_TAINT)
        .collect();
    taints.push(reclamation_taint(notice));
    let patch = json!({"spec": {"taints": taints}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::kube(format!("taint node {node} for reclamation"), e))?;
    Ok(())
}

/// Reclaims a spot node: taints it with the notice, waits `notice`, then deletes it (the
/// cloud provider taking the instance away). Pods bound to it are then garbage collected.
pub async fn reclaim_spot_node(client: &kube::Client, node: &str, notice: Duration) -> Result<()> {
    announce_spot_reclamation(client, node, notice).await?;
    tokio::time::sleep(notice).await;
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.delete(node, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("delete reclaimed node {node}"), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reclamation_taint_carries_the_deadline() {
        let before = chrono::Utc::now().timestamp();
        let taint = reclamation_taint(Duration::from_secs(120));
        assert_eq!(taint.key, SPOT_RECLAIM_TAINT);
        assert_eq!(taint.effect, "NoSchedule");
        let deadline: i64 = taint.value.unwrap().parse().unwrap();
        assert!(deadline >= before + 120 && deadline <= before + 122);
    }
}
