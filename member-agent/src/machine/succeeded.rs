//! Succeeded: deletes the workload once the time to live after success has expired.

use lifeboat_api::appwrapper::constants::{condition_types as ct, reasons as r};

use super::Machine;

impl Machine<'_, '_> {
    pub(super) fn succeeded(&mut self) {
        if !self.is_true(ct::RESOURCES_DEPLOYED) {
            return;
        }
        // Anchored on the (re)deployment time, as upstream.
        let deadline = self.ltt(ct::RESOURCES_DEPLOYED) + self.params().success_ttl;
        if self.now() < deadline {
            self.requeue_at(deadline);
            return;
        }
        if !self.delete_components() {
            return;
        }
        let ttl = crate::duration::GoDuration(
            i64::try_from(self.params().success_ttl.as_nanos()).unwrap_or(i64::MAX),
        );
        self.set(
            ct::RESOURCES_DEPLOYED,
            false,
            r::SUCCEEDED,
            format!("Time to live after success of {ttl} expired"),
        );
    }
}
