//! Resuming: records each component's identity, creates it, and judges the create results.

use std::time::Duration;

use lifeboat_api::appwrapper::AppWrapperPhase as Phase;
use lifeboat_api::appwrapper::constants::{condition_types as ct, reasons as r};
use lifeboat_api::health::FailureClass;

use super::{CREATE_RETRY, CreateResult, Machine};

impl Machine<'_, '_> {
    pub(super) fn resuming(&mut self) {
        if self.externally_suspended(Phase::Resuming) {
            return;
        }
        let pending: Vec<usize> = (0..self.d.status.component_status.len())
            .filter(|&i| !self.component_deployed(i))
            .collect();
        if pending.is_empty() {
            self.transition(Phase::Running, r::RUNNING, "All components created");
            return;
        }
        let Some(results) = self.obs().create_results.clone() else {
            // Record each identity before its create, so a crash cannot leak an object.
            for &i in &pending {
                let initiated = self.d.status.component_status[i]
                    .conditions
                    .iter()
                    .any(|c| {
                        c.type_ == ct::RESOURCES_DEPLOYED
                            && c.reason == r::COMPONENT_CREATION_INITIATED
                    });
                if !initiated {
                    self.set_component(i, "Unknown", r::COMPONENT_CREATION_INITIATED, "");
                }
            }
            self.d.actions.create = pending;
            return;
        };
        let mut fatal = None;
        let mut retryable = None;
        for &i in &pending {
            match results.get(i).cloned().flatten() {
                Some(CreateResult::Created { name }) => {
                    self.d.status.component_status[i].name = name;
                    self.set_component(i, "True", r::COMPONENT_CREATED_SUCCESSFULLY, "");
                }
                Some(CreateResult::Fatal(message)) => {
                    self.set_component(i, "False", r::COMPONENT_CREATION_ERRORED, message.clone());
                    fatal.get_or_insert(self.describe_component(i, &message));
                }
                Some(CreateResult::Retryable(message)) => {
                    self.set_component(i, "False", r::COMPONENT_CREATION_ERRORED, message.clone());
                    retryable.get_or_insert(self.describe_component(i, &message));
                }
                None => {}
            }
        }
        if let Some(message) = fatal {
            let message = FailureClass::Application.message(message);
            self.set(ct::UNHEALTHY, true, r::CREATE_FAILED, message.clone());
            self.transition(Phase::Failed, r::CREATE_FAILED, message);
            return;
        }
        if let Some(message) = retryable {
            let deadline = self.ltt(ct::RESOURCES_DEPLOYED) + self.params().admission_grace;
            if self.now() < deadline {
                self.requeue(CREATE_RETRY.min(
                    Duration::try_from(deadline.duration_since(self.now())).unwrap_or_default(),
                ));
                return;
            }
            let class = if message.contains("exceeded quota") {
                FailureClass::Capacity
            } else {
                FailureClass::Unknown
            };
            let message = class.message(message);
            self.set(ct::UNHEALTHY, true, r::CREATE_FAILED, message.clone());
            self.reset_or_fail(false, 1, r::CREATE_FAILED, message);
            return;
        }
        if (0..self.d.status.component_status.len()).all(|i| self.component_deployed(i)) {
            self.transition(Phase::Running, r::RUNNING, "All components created");
        }
    }

    fn describe_component(&self, i: usize, message: &str) -> String {
        let c = &self.d.status.component_status[i];
        format!("component {i} ({} {}): {message}", c.kind, c.name)
    }
}
