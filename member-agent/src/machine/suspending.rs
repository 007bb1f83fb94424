//! Suspending: deletes the workload and releases quota.

use lifeboat_api::appwrapper::AppWrapperPhase as Phase;
use lifeboat_api::appwrapper::constants::{condition_types as ct, reasons as r};

use super::{EventType, Machine};

impl Machine<'_, '_> {
    pub(super) fn suspending(&mut self) {
        if self.is_true(ct::RESOURCES_DEPLOYED) && !self.delete_components() {
            return;
        }
        self.set(
            ct::RESOURCES_DEPLOYED,
            false,
            r::SUSPENDED,
            "Suspend is true",
        );
        self.set(ct::QUOTA_RESERVED, false, r::SUSPENDED, "Suspend is true");
        self.set(ct::PODS_READY, false, r::SUSPENDED, "");
        self.set(ct::UNHEALTHY, false, r::SUSPENDED, "");
        self.clear_component_conditions();
        self.transition(Phase::Suspended, r::SUSPENDED, "Suspend is true");
    }

    /// `spec.suspend` became true while the workload is deployed (Kueue preempted it): go
    /// Suspending. True when it did.
    pub(super) fn externally_suspended(&mut self, phase: Phase) -> bool {
        if !self.input.spec.suspend {
            return false;
        }
        let note = format!("Externally suspended while in the {phase} phase");
        self.event(EventType::Normal, r::SUSPENDING, note.clone());
        self.transition(Phase::Suspending, r::SUSPENDING, note);
        true
    }
}
