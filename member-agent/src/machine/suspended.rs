//! Suspended: waits for `spec.suspend` to be false, then reserves quota and resumes.

use lifeboat_api::appwrapper::AppWrapperPhase as Phase;
use lifeboat_api::appwrapper::constants::{condition_types as ct, reasons as r};

use super::{FinalizerChange, Machine};

impl Machine<'_, '_> {
    pub(super) fn suspended(&mut self) {
        if self.input.spec.suspend {
            return;
        }
        if !self.input.has_finalizer {
            self.d.finalizer = FinalizerChange::Add;
        }
        self.set(ct::QUOTA_RESERVED, true, r::RESUMING, "Suspend is false");
        self.set(
            ct::RESOURCES_DEPLOYED,
            true,
            r::RESUMING,
            "Suspend is false",
        );
        self.set(ct::PODS_READY, false, r::RESUMING, "");
        self.set(ct::UNHEALTHY, false, r::RESUMING, "");
        self.transition(Phase::Resuming, r::RESUMING, "Suspend is false");
    }
}
