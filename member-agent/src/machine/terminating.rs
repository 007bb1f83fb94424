//! Terminating (the AppWrapper is being deleted): deletes the workload, then removes the finalizer.

use lifeboat_api::appwrapper::AppWrapperPhase as Phase;
use lifeboat_api::appwrapper::constants::{condition_types as ct, reasons as r};

use super::{DELETION_POLL, FinalizerChange, Machine};

impl Machine<'_, '_> {
    pub(super) fn terminating(&mut self) {
        if self.is_true(ct::RESOURCES_DEPLOYED) {
            if !self.delete_components() {
                if self.d.status.phase != Phase::Terminating {
                    self.transition(Phase::Terminating, r::TERMINATING, "AppWrapper deleted");
                    self.d.phase_change = None; // upstream does not count Terminating
                    self.requeue(DELETION_POLL);
                }
                return;
            }
            self.set(
                ct::RESOURCES_DEPLOYED,
                false,
                r::TERMINATING,
                "Resources successfully deleted",
            );
        }
        if self.is_true(ct::QUOTA_RESERVED) {
            self.set(
                ct::QUOTA_RESERVED,
                false,
                r::TERMINATING,
                "No resources deployed",
            );
        }
        self.d.finalizer = FinalizerChange::Remove;
    }
}
