//! Resetting: deletes the workload, pauses (quota kept), then resumes it.

use lifeboat_api::appwrapper::AppWrapperPhase as Phase;
use lifeboat_api::appwrapper::constants::{condition_types as ct, reasons as r};

use super::Machine;

impl Machine<'_, '_> {
    pub(super) fn resetting(&mut self) {
        if self.externally_suspended(Phase::Resetting) {
            return;
        }
        self.set(ct::PODS_READY, false, r::RESETTING, "");
        if self.is_true(ct::RESOURCES_DEPLOYED) {
            if !self.delete_components() {
                return;
            }
            self.set(
                ct::RESOURCES_DEPLOYED,
                false,
                r::RESETTING,
                "Resources deleted for resetting AppWrapper",
            );
        }
        // The pause counts from when the workload became unhealthy (upstream anchor); quota
        // stays reserved meanwhile.
        let deadline = self.ltt(ct::UNHEALTHY) + self.params().retry_pause;
        if self.now() < deadline {
            self.requeue_at(deadline);
            return;
        }
        self.set(
            ct::RESOURCES_DEPLOYED,
            true,
            r::RESUMING,
            "Reset complete; resuming",
        );
        self.set(
            ct::UNHEALTHY,
            false,
            r::RESUMING,
            "Reset complete; resuming",
        );
        self.clear_component_conditions();
        self.transition(Phase::Resuming, r::RESUMING, "Reset complete; resuming");
    }
}
