//! Summary of an AppWrapper's labelled pods: counts by phase (upstream's rules), terminal exit
//! codes, Autopilot NoExecute and spot-reclamation hits, and the failure class of what went
//! wrong. Pure: fed pods, the node health index and the parameters.

use k8s_openapi::api::core::v1::Pod;
use lifeboat_api::appwrapper::autopilot::pod_uses_resource;

use crate::node_health::NodeHealthIndex;
use crate::params::Params;
use lifeboat_api::health::FailureClass;

/// One failed (or lost) pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFailure {
    pub pod: String,
    pub node: Option<String>,
    /// Non-zero exit codes of its terminated regular containers.
    pub exit_codes: Vec<i32>,
    /// Short human description ("exit code 3", "node member-1-gpu-2 NotReady", ...).
    pub detail: String,
    pub class: FailureClass,
}

/// A running pod that must move off its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHit {
    pub pod: String,
    pub node: String,
    /// The flagged resource (Autopilot) or the reclamation notice.
    pub what: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSummary {
    pub pending: i32,
    pub running: i32,
    pub succeeded: i32,
    pub failed: i32,
    /// Every labelled pod present, whatever its phase (deletion completes only at 0).
    pub total: i32,
    /// A failed pod's exit code is terminal under the AppWrapper's exit-code annotations.
    pub terminal_failure: bool,
    pub failures: Vec<PodFailure>,
    /// Running pods on nodes Autopilot flagged NoExecute for a resource they use.
    pub no_execute: Vec<NodeHit>,
    /// Running pods on nodes with a spot reclamation notice.
    pub reclaiming: Vec<NodeHit>,
    /// Pending pods the scheduler could not place.
    pub unschedulable: i32,
    /// Pending pods on lost nodes, or with no scheduling verdict (for messages).
    pub unschedulable_message: Option<String>,
}

impl PodSummary {
    /// The class of the failed pods: Application for terminal or non-zero exit codes,
    /// Infrastructure when any failure is due to a node, Unknown otherwise.
    pub fn failure_class(&self) -> FailureClass {
        if self
            .failures
            .iter()
            .any(|f| f.class == FailureClass::Infrastructure)
        {
            FailureClass::Infrastructure
        } else if self.terminal_failure
            || self
                .failures
                .iter()
                .any(|f| f.class == FailureClass::Application)
        {
            FailureClass::Application
        } else if self
            .failures
            .iter()
            .any(|f| f.class == FailureClass::Capacity)
        {
            FailureClass::Capacity
        } else {
            FailureClass::Unknown
        }
    }

    /// "pod a (exit code 3); pod b (node n NotReady)", at most three entries.
    pub fn failure_details(&self) -> String {
        let mut parts: Vec<String> = self
            .failures
            .iter()
            .take(3)
            .map(|f| format!("{} ({})", f.pod, f.detail))
            .collect();
        if self.failures.len() > 3 {
            parts.push(format!("and {} more", self.failures.len() - 3));
        }
        parts.join("; ")
    }
}

/// Pod status reasons and disruption reasons that mean the node, not the application, failed.
const INFRASTRUCTURE_POD_REASONS: &[&str] = &[
    "NodeLost",
    "Evicted",
    "NodeShutdown",
    "Shutdown",
    "Terminated",
    "UnexpectedAdmissionError",
    "NodeAffinity",
    "DeletionByTaintManager",
    "TerminationByKubelet",
    "DeletionByPodGC",
];

/// Counts the pods of one AppWrapper. `monitor_nodes` enables the node-based checks.
pub fn summarize(
    pods: &[Pod],
    nodes: &NodeHealthIndex,
    params: &Params,
    monitor_nodes: bool,
) -> PodSummary {
    let mut s = PodSummary::default();
    for pod in pods {
        s.total += 1;
        let name = pod.metadata.name.clone().unwrap_or_default();
        let deleting = pod.metadata.deletion_timestamp.is_some();
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("");
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty());
        let node_health = node.as_deref().map(|n| nodes.health(n)).unwrap_or_default();
        match phase {
            "Pending" => {
                s.pending += 1;
                if let Some(message) = unschedulable(pod) {
                    s.unschedulable += 1;
                    s.unschedulable_message.get_or_insert(message);
                }
            }
            // A Running pod being deleted counts as nothing (upstream).
            "Running" if deleting => {}
            "Running" => {
                if monitor_nodes && node_health.not_ready && !deleting {
                    // Upstream keeps counting it as running until the taint manager evicts it
                    // (5 minutes); we treat it as failed at once, so the failure grace starts.
                    s.failed += 1;
                    let node = node.clone().unwrap_or_default();
                    let detail = if nodes.is_gone(&node) {
                        format!("node {node} is gone")
                    } else {
                        format!("node {node} is NotReady")
                    };
                    s.failures.push(PodFailure {
                        pod: name,
                        node: Some(node),
                        exit_codes: vec![],
                        detail,
                        class: FailureClass::Infrastructure,
                    });
                    continue;
                }
                s.running += 1;
                if monitor_nodes && let (Some(node), Some(spec)) = (&node, pod.spec.as_ref()) {
                    for resource in &node_health.no_execute {
                        if pod_uses_resource(spec, resource) {
                            s.no_execute.push(NodeHit {
                                pod: name.clone(),
                                node: node.clone(),
                                what: resource.clone(),
                            });
                            break;
                        }
                    }
                    if node_health.reclaiming {
                        s.reclaiming.push(NodeHit {
                            pod: name.clone(),
                            node: node.clone(),
                            what: "spot reclamation notice".into(),
                        });
                    }
                }
            }
            "Succeeded" => s.succeeded += 1,
            "Failed" => {
                s.failed += 1;
                let failure = classify_failure(pod, &name, node, nodes, params);
                if failure
                    .exit_codes
                    .iter()
                    .any(|c| params.is_terminal_exit_code(*c))
                {
                    s.terminal_failure = true;
                }
                s.failures.push(failure);
            }
            _ => {}
        }
    }
    s
}

fn unschedulable(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })
        .map(|c| c.message.clone().unwrap_or_else(|| "unschedulable".into()))
}

fn classify_failure(
    pod: &Pod,
    name: &str,
    node: Option<String>,
    nodes: &NodeHealthIndex,
    params: &Params,
) -> PodFailure {
    let status = pod.status.as_ref();
    let exit_codes: Vec<i32> = status
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
                .map(|t| t.exit_code)
                .filter(|c| *c != 0)
                .collect()
        })
        .unwrap_or_default();
    let oom = status
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .and_then(|t| t.reason.as_deref())
                    == Some("OOMKilled")
            })
        });
    let pod_reason = status.and_then(|s| s.reason.clone());
    let disruption = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
        })
        .and_then(|c| c.reason.clone());
    let node_health = node.as_deref().map(|n| nodes.health(n)).unwrap_or_default();
    let infra_reason = [pod_reason.as_deref(), disruption.as_deref()]
        .into_iter()
        .flatten()
        .find(|r| INFRASTRUCTURE_POD_REASONS.contains(r));
    let (class, detail) = if disruption.as_deref() == Some("PreemptionByScheduler") {
        (
            FailureClass::Capacity,
            "preempted by the scheduler".to_string(),
        )
    } else if let Some(reason) = infra_reason {
        (
            FailureClass::Infrastructure,
            format!("{reason} on node {}", node.clone().unwrap_or_default()),
        )
    } else if (node_health.not_ready
        || node_health.reclaiming
        || !node_health.no_execute.is_empty())
        && !oom
    {
        let n = node.clone().unwrap_or_default();
        let what = if node_health.reclaiming {
            "being reclaimed"
        } else if node_health.not_ready {
            "NotReady"
        } else {
            "flagged unhealthy by Autopilot"
        };
        (FailureClass::Infrastructure, format!("node {n} {what}"))
    } else if oom {
        (FailureClass::Application, "OOMKilled".to_string())
    } else if let Some(code) = exit_codes.first() {
        let terminal = if params.is_terminal_exit_code(*code) {
            ", terminal"
        } else {
            ""
        };
        (
            FailureClass::Application,
            format!("exit code {code}{terminal}"),
        )
    } else {
        (
            FailureClass::Unknown,
            pod_reason
                .clone()
                .unwrap_or_else(|| "failed without an exit code".into()),
        )
    };
    PodFailure {
        pod: name.to_string(),
        node,
        exit_codes,
        detail,
        class,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FaultToleranceConfig;
    use lifeboat_api::appwrapper::autopilot::AutopilotConfig;
    use serde_json::json;

    fn pod(name: &str, phase: &str, node: &str, extra_status: serde_json::Value) -> Pod {
        let mut status = json!({"phase": phase});
        if let (Some(s), Some(e)) = (status.as_object_mut(), extra_status.as_object()) {
            s.extend(e.clone());
        }
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": status
        }))
        .unwrap()
    }

    fn terminated(code: i32, reason: &str) -> serde_json::Value {
        json!({"containerStatuses": [{"name": "c", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": reason}}}]})
    }

    fn nodes(extra: &[(&str, serde_json::Value)]) -> NodeHealthIndex {
        let mut idx =
            NodeHealthIndex::new(Some(AutopilotConfig::default()), vec!["spot-itn".into()]);
        let mut all: Vec<k8s_openapi::api::core::v1::Node> = vec![serde_json::from_value(json!({
            "metadata": {"name": "good"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        })).unwrap()];
        for (name, v) in extra {
            let mut n = v.clone();
            n["metadata"]["name"] = json!(name);
            all.push(serde_json::from_value(n).unwrap());
        }
        idx.reset(all.iter());
        idx
    }

    fn params() -> Params {
        Params::defaults(&FaultToleranceConfig::default())
    }

    #[test]
    fn counts_by_phase_like_upstream() {
        let mut deleting_running = pod("d", "Running", "good", json!({}));
        deleting_running.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        let pods = vec![
            pod("p", "Pending", "good", json!({})),
            pod("r", "Running", "good", json!({})),
            deleting_running,
            pod("s", "Succeeded", "good", json!({})),
            pod("f", "Failed", "good", terminated(1, "Error")),
            pod("u", "Unknown", "good", json!({})),
        ];
        let s = summarize(&pods, &nodes(&[]), &params(), true);
        assert_eq!(
            (s.pending, s.running, s.succeeded, s.failed, s.total),
            (1, 1, 1, 1, 6)
        );
        assert!(!s.terminal_failure);
        assert_eq!(s.failure_class(), FailureClass::Application);
        assert!(s.failure_details().contains("exit code 1"));
    }

    #[test]
    fn terminal_exit_codes_mark_terminal_failure() {
        let mut p = params();
        p.terminal_exit_codes = vec![3];
        let s = summarize(
            &[pod("f", "Failed", "good", terminated(3, "Error"))],
            &nodes(&[]),
            &p,
            true,
        );
        assert!(s.terminal_failure);
        assert!(s.failures[0].detail.contains("terminal"));
        let s = summarize(
            &[pod("f", "Failed", "good", terminated(4, "Error"))],
            &nodes(&[]),
            &p,
            true,
        );
        assert!(!s.terminal_failure);
    }

    #[test]
    fn autopilot_no_execute_hits_running_gpu_pods_only() {
        let idx = nodes(&[(
            "bad",
            json!({"metadata": {"labels": {"autopilot.ibm.com/gpuhealth": "EVICT"}}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
        )]);
        let mut cpu_pod = pod("cpu", "Running", "bad", json!({}));
        cpu_pod.spec.as_mut().unwrap().containers[0].resources = None;
        let s = summarize(
            &[pod("gpu", "Running", "bad", json!({})), cpu_pod],
            &idx,
            &params(),
            true,
        );
        assert_eq!(s.no_execute.len(), 1);
        assert_eq!(s.no_execute[0].pod, "gpu");
        assert_eq!(s.running, 2);
        // Monitoring off: no hits.
        let s = summarize(
            &[pod("gpu", "Running", "bad", json!({}))],
            &idx,
            &params(),
            false,
        );
        assert!(s.no_execute.is_empty());
    }

    #[test]
    fn pods_on_not_ready_or_gone_nodes_are_infrastructure_failures() {
        let idx = nodes(&[(
            "down",
            json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
        )]);
        let s = summarize(
            &[
                pod("a", "Running", "down", json!({})),
                pod("b", "Running", "vanished", json!({})),
                pod("c", "Running", "good", json!({})),
            ],
            &idx,
            &params(),
            true,
        );
        assert_eq!((s.running, s.failed), (1, 2));
        assert_eq!(s.failure_class(), FailureClass::Infrastructure);
        assert!(s.failure_details().contains("NotReady"));
        assert!(s.failure_details().contains("gone"));
    }

    #[test]
    fn reclamation_notice_is_reported_for_running_pods() {
        let idx = nodes(&[(
            "spot",
            json!({"spec": {"taints": [{"key": "spot-itn", "effect": "NoSchedule"}]}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
        )]);
        let s = summarize(
            &[pod("a", "Running", "spot", json!({}))],
            &idx,
            &params(),
            true,
        );
        assert_eq!(s.reclaiming.len(), 1);
        assert_eq!(s.running, 1);
    }

    #[test]
    fn failure_classes() {
        let idx = nodes(&[]);
        let evicted = pod("e", "Failed", "good", json!({"reason": "Evicted"}));
        let preempted = pod(
            "p",
            "Failed",
            "good",
            json!({"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]}),
        );
        let oom = pod("o", "Failed", "good", terminated(137, "OOMKilled"));
        let unknown = pod("u", "Failed", "good", json!({}));
        let classes: Vec<_> = [evicted, preempted, oom, unknown]
            .iter()
            .map(|p| summarize(std::slice::from_ref(p), &idx, &params(), true).failures[0].class)
            .collect();
        assert_eq!(
            classes,
            [
                FailureClass::Infrastructure,
                FailureClass::Capacity,
                FailureClass::Application,
                FailureClass::Unknown
            ]
        );
    }

    #[test]
    fn unschedulable_pending_pods_are_counted() {
        let p = pod(
            "p",
            "Pending",
            "",
            json!({"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}]}),
        );
        let s = summarize(&[p], &nodes(&[]), &params(), true);
        assert_eq!(s.unschedulable, 1);
        assert!(s.unschedulable_message.unwrap().contains("nvidia.com/gpu"));
    }
}
