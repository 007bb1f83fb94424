//! The `InvalidAnnotations` condition: malformed fault-tolerance annotations, reported once.

use super::{CONDITION_INVALID_ANNOTATIONS, EventType, Machine, REASON_MALFORMED_ANNOTATION};

impl Machine<'_, '_> {
    pub(super) fn annotation_condition(&mut self) {
        let problems = self.input.annotation_problems;
        if problems.is_empty() {
            if self.condition(CONDITION_INVALID_ANNOTATIONS).is_some() {
                self.d
                    .status
                    .conditions
                    .retain(|c| c.type_ != CONDITION_INVALID_ANNOTATIONS);
            }
            return;
        }
        let message = problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        let changed = self
            .condition(CONDITION_INVALID_ANNOTATIONS)
            .is_none_or(|c| c.message != message);
        self.set(
            CONDITION_INVALID_ANNOTATIONS,
            true,
            REASON_MALFORMED_ANNOTATION,
            message.clone(),
        );
        if changed {
            self.event(EventType::Warning, REASON_MALFORMED_ANNOTATION, message);
        }
    }
}
