//! Failed: keeps the workload for the DeletionOnFailureGracePeriod (for debugging), then deletes it.

use lifeboat_api::appwrapper::AppWrapperPhase as Phase;
use lifeboat_api::appwrapper::constants::annotations::DELETION_ON_FAILURE_GRACE_PERIOD;
use lifeboat_api::appwrapper::constants::{condition_types as ct, reasons as r};

use super::Machine;

impl Machine<'_, '_> {
    pub(super) fn failed(&mut self) {
        if !self.is_true(ct::RESOURCES_DEPLOYED) {
            if self.is_true(ct::QUOTA_RESERVED) {
                self.set(
                    ct::QUOTA_RESERVED,
                    false,
                    r::FAILED,
                    "No resources deployed",
                );
            }
            return;
        }
        let delay = self.params().deletion_on_failure_grace;
        let suspend = self.input.spec.suspend;
        if !delay.is_zero() && !suspend && !self.is_true(ct::DELETING_RESOURCES) {
            let d =
                crate::duration::GoDuration(i64::try_from(delay.as_nanos()).unwrap_or(i64::MAX));
            self.set(
                ct::DELETING_RESOURCES,
                false,
                r::DELETION_PAUSED,
                format!("{} has value {d}", DELETION_ON_FAILURE_GRACE_PERIOD),
            );
            // Anchored on the time the AppWrapper failed (upstream uses the condition's
            // transition time, which an earlier reset may have left in the past).
            let failed_at = self
                .d
                .status
                .transitions
                .iter()
                .rev()
                .find(|t| t.phase == Phase::Failed)
                .map(|t| t.time.0)
                .unwrap_or_else(|| self.ltt(ct::DELETING_RESOURCES));
            let deadline = failed_at + delay;
            if self.now() < deadline {
                self.requeue_at(deadline);
                return;
            }
        }
        if !self.delete_components() {
            return;
        }
        let message = if suspend {
            "Kueue forced resource deletion by suspending AppWrapper"
        } else {
            "Resources deleted for failed AppWrapper"
        };
        self.set(ct::RESOURCES_DEPLOYED, false, r::FAILED, message);
        self.set(
            ct::QUOTA_RESERVED,
            false,
            r::FAILED,
            "No resources deployed",
        );
    }
}
