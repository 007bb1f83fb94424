//! Running: the workload is deployed; watch it. The rules are tried in their numbered order and
//! the first one that decides ends the step (reference §2.4).

use lifeboat_api::appwrapper::AppWrapperPhase as Phase;
use lifeboat_api::appwrapper::constants::{condition_types as ct, reasons as r};
use lifeboat_api::appwrapper::podsets::expected_pod_count_of_status;
use lifeboat_api::health::FailureClass;

use super::{ComponentObservation, EventType, Machine, REASON_SPOT_RECLAMATION, RUNNING_RESYNC};

impl Machine<'_, '_> {
    pub(super) fn running(&mut self) {
        if self.externally_suspended(Phase::Running) {
            return;
        }
        // Each rule returns true when it decided this step.
        let _decided = self.missing_component() // 1
            || self.failed_component() // 2
            || self.all_pods_succeeded() // 3
            || self.failed_pods() // 4
            || self.autopilot_no_execute() // 5
            || self.spot_reclamation() // 5b
            || self.no_failure_found() // 6
            || self.enough_pods_ready() // 7
            || self.pods_not_ready_after_grace(); // 8
    }

    /// Pods every podSet of the AppWrapper expects.
    fn expected_pods(&self) -> i32 {
        i32::try_from(expected_pod_count_of_status(&self.d.status)).unwrap_or(i32::MAX)
    }

    /// 1. A wrapped resource is gone: someone deleted it. No grace, no retry (upstream).
    fn missing_component(&mut self) -> bool {
        let expected_components = self.d.status.component_status.len();
        let components = self.obs().components.clone();
        let deployed_at = |c: &ComponentObservation| {
            matches!(
                c,
                ComponentObservation::Present | ComponentObservation::Failed(_)
            )
        };
        let deployed = components.iter().filter(|c| deployed_at(c)).count();
        if deployed == expected_components {
            return false;
        }
        let missing: Vec<String> = components
            .iter()
            .enumerate()
            .filter(|(_, c)| !deployed_at(c))
            .map(|(i, _)| {
                let c = &self.d.status.component_status[i];
                format!("{} {}", c.kind, c.name)
            })
            .collect();
        let message = FailureClass::Unknown.message(format!(
            "Only found {deployed} deployed components, but was expecting {expected_components} (missing: {})",
            missing.join(", ")
        ));
        self.set(ct::UNHEALTHY, true, r::MISSING_COMPONENT, message.clone());
        self.event(EventType::Warning, r::MISSING_COMPONENT, message.clone());
        self.transition(Phase::Failed, r::MISSING_COMPONENT, message);
        true
    }

    /// 2. A wrapped Job or PyTorchJob says it failed: its controller will do nothing more.
    fn failed_component(&mut self) -> bool {
        let failed: Vec<String> = self
            .obs()
            .components
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c {
                ComponentObservation::Failed(reason) => {
                    let cs = &self.d.status.component_status[i];
                    Some(format!("{} {} failed: {reason}", cs.kind, cs.name))
                }
                _ => None,
            })
            .collect();
        if failed.is_empty() {
            return false;
        }
        let class = match self.pods().failure_class() {
            FailureClass::Infrastructure => FailureClass::Infrastructure,
            FailureClass::Capacity => FailureClass::Capacity,
            _ => FailureClass::Application,
        };
        let message = class.message(failed.join("; "));
        self.set(ct::UNHEALTHY, true, r::FAILED_COMPONENT, message.clone());
        self.event(EventType::Warning, r::FAILED_COMPONENT, message.clone());
        let terminal = self.pods().terminal_failure;
        self.reset_or_fail(terminal, 1, r::FAILED_COMPONENT, message);
        true
    }

    /// 3. Success: every expected pod succeeded and nothing else is left.
    fn all_pods_succeeded(&mut self) -> bool {
        let pods = self.pods();
        if pods.succeeded < self.expected_pods() || pods.pending + pods.running + pods.failed != 0 {
            return false;
        }
        let message = format!(
            "{} pods succeeded and no running, pending, or failed pods",
            pods.succeeded
        );
        self.set(ct::QUOTA_RESERVED, false, r::SUCCEEDED, message.clone());
        self.set(ct::RESOURCES_DEPLOYED, true, r::SUCCEEDED, "");
        self.transition(Phase::Succeeded, r::SUCCEEDED, message);
        true
    }

    /// 4. Failed pods: give the workload's own controller the failure grace to recover.
    fn failed_pods(&mut self) -> bool {
        let pods = self.pods().clone();
        if pods.failed == 0 {
            return false;
        }
        let message = pods.failure_class().message(format!(
            "{} failed pods: {}",
            pods.failed,
            pods.failure_details()
        ));
        self.set(ct::UNHEALTHY, true, r::FOUND_FAILED_PODS, message.clone());
        let deadline = self.ltt(ct::UNHEALTHY) + self.params().failure_grace;
        if self.now() < deadline {
            self.requeue_at(deadline);
            return true;
        }
        self.event(
            EventType::Warning,
            r::FOUND_FAILED_PODS,
            format!("{}: {} failed pods", r::FOUND_FAILED_PODS, pods.failed),
        );
        self.reset_or_fail(pods.terminal_failure, 1, r::FOUND_FAILED_PODS, message);
        true
    }

    /// 5. Autopilot flagged a resource a running pod uses NoExecute: migrate at once, without
    ///    counting a retry (still bounded by the retry limit).
    fn autopilot_no_execute(&mut self) -> bool {
        let pods = self.pods();
        let Some(hit) = pods.no_execute.first() else {
            return false;
        };
        let message = FailureClass::Infrastructure.message(format!(
            "pod {} uses {} on node {}, which Autopilot flagged NoExecute ({} pods affected)",
            hit.pod,
            hit.what,
            hit.node,
            pods.no_execute.len()
        ));
        self.move_at_once(r::AUTOPILOT_NO_EXECUTE, message);
        true
    }

    /// 5b. (Lifeboat) a spot reclamation notice on a running pod's node: move before the node
    ///     is taken away, like the Autopilot migration.
    fn spot_reclamation(&mut self) -> bool {
        let pods = self.pods();
        let Some(hit) = pods.reclaiming.first() else {
            return false;
        };
        let message = FailureClass::Infrastructure.message(format!(
            "pod {} runs on node {}, which has a spot reclamation notice ({} pods affected)",
            hit.pod,
            hit.node,
            pods.reclaiming.len()
        ));
        self.move_at_once(REASON_SPOT_RECLAMATION, message);
        true
    }

    /// Unhealthy and an Event, then a reset that does not count as a retry (rules 5 and 5b).
    fn move_at_once(&mut self, reason: &str, message: String) {
        self.set(ct::UNHEALTHY, true, reason, message.clone());
        self.event(EventType::Warning, reason, message.clone());
        self.reset_or_fail(false, 0, reason, message);
    }

    /// 6. Healthy so far: no rule above found a failure. Never decides.
    fn no_failure_found(&mut self) -> bool {
        self.set(ct::UNHEALTHY, false, r::FOUND_NO_FAILED_PODS, "");
        false
    }

    /// 7. Enough pods running (or succeeded).
    fn enough_pods_ready(&mut self) -> bool {
        let pods = self.pods();
        if pods.running + pods.succeeded < self.expected_pods() {
            return false;
        }
        let message = format!(
            "{} pods running; {} pods succeeded",
            pods.running, pods.succeeded
        );
        self.set(ct::PODS_READY, true, r::SUFFICIENT_PODS_READY, message);
        self.requeue(RUNNING_RESYNC);
        true
    }

    /// 8. Not enough: wait the admission grace (pods missing) or the warmup grace (all pods
    ///    exist), counted from the last (re)deployment, then reset or fail.
    fn pods_not_ready_after_grace(&mut self) -> bool {
        let pods = self.pods().clone();
        let expected_pods = self.expected_pods();
        self.set(
            ct::PODS_READY,
            false,
            r::INSUFFICIENT_PODS_READY,
            format!(
                "{} pods pending; {} pods running; {} pods succeeded",
                pods.pending, pods.running, pods.succeeded
            ),
        );
        let all_exist = pods.pending + pods.running + pods.succeeded >= expected_pods;
        let (grace, grace_name) = if all_exist {
            (self.params().warmup_grace, "WarmupGracePeriod")
        } else {
            (self.params().admission_grace, "AdmissionGracePeriod")
        };
        let deadline = self.ltt(ct::RESOURCES_DEPLOYED) + grace;
        if self.now() < deadline {
            self.requeue_at(deadline);
            return true;
        }
        let (class, why) = if pods.unschedulable > 0 {
            (
                FailureClass::Capacity,
                format!(
                    "{} pods unschedulable: {}",
                    pods.unschedulable,
                    pods.unschedulable_message.clone().unwrap_or_default()
                ),
            )
        } else {
            (FailureClass::Unknown, String::new())
        };
        let mut text = format!(
            "{} of {expected_pods} pods ready after the {grace_name}",
            pods.running + pods.succeeded
        );
        if !why.is_empty() {
            text.push_str(&format!("; {why}"));
        }
        let message = class.message(text);
        self.set(
            ct::UNHEALTHY,
            true,
            r::INSUFFICIENT_PODS_READY,
            message.clone(),
        );
        self.event(
            EventType::Warning,
            r::INSUFFICIENT_PODS_READY,
            message.clone(),
        );
        self.reset_or_fail(
            pods.terminal_failure,
            1,
            r::INSUFFICIENT_PODS_READY,
            message,
        );
        true
    }
}
