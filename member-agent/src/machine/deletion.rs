//! The deletion algorithm (reference §2.7), shared by every phase that removes the workload.

use std::time::Duration;

use lifeboat_api::appwrapper::constants::{condition_types as ct, reasons as r};

use super::{ComponentObservation, DELETION_POLL, Machine};

impl Machine<'_, '_> {
    /// One pass of the deletion algorithm (reference §2.7). True when every component and every
    /// labelled pod is gone.
    pub(super) fn delete_components(&mut self) -> bool {
        self.set(ct::DELETING_RESOURCES, true, r::DELETION_INITIATED, "");
        // Read back from the API server the start has lost its fraction of a second: counting
        // from the end of that second never cuts the forceful grace short.
        let started = lifeboat_api::time::counted_from(self.ltt(ct::DELETING_RESOURCES));
        let components = self.obs().components.clone();
        let mut remaining = Vec::new();
        let mut to_delete = Vec::new();
        for i in 0..self.d.status.component_status.len() {
            match components.get(i).unwrap_or(&ComponentObservation::Absent) {
                ComponentObservation::Absent => {
                    let was_there = self.d.status.component_status[i]
                        .conditions
                        .iter()
                        .any(|c| {
                            c.type_ == ct::RESOURCES_DEPLOYED && c.reason != r::COMPONENT_DELETED
                        });
                    if was_there {
                        self.set_component(i, "False", r::COMPONENT_DELETED, "");
                    }
                }
                ComponentObservation::Deleting => remaining.push(i),
                ComponentObservation::Present | ComponentObservation::Failed(_) => {
                    remaining.push(i);
                    to_delete.push(i);
                }
            }
        }
        let forceful_at = started + self.params().forceful_deletion_grace;
        let pods_left = self.pods().total;
        if remaining.is_empty() && pods_left == 0 {
            self.set(ct::DELETING_RESOURCES, false, r::DELETION_COMPLETE, "");
            return true;
        }
        self.d.actions.delete = to_delete;
        if self.now() > forceful_at {
            // The workload's controllers did not finish in time: delete with grace period 0,
            // pods first (they are what holds the GPUs).
            if pods_left > 0 {
                self.d.actions.force_delete_pods = true;
            } else {
                self.d.actions.force_delete = remaining;
            }
            self.requeue(DELETION_POLL);
        } else {
            self.requeue(DELETION_POLL);
            self.requeue_at(forceful_at + Duration::from_millis(1));
        }
        false
    }
}
