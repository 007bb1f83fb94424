//! The AppWrapper fault-tolerance state machine (reference §2), pure: one [`step`] takes the
//! AppWrapper's spec and status, what the cluster holds ([`Observation`]), the parameters and
//! the time, and returns the new status, the IO to perform and when to look again.
//!
//! The reconciler executes a [`Decision`] in this order: add the finalizer, write the status
//! (component identities are recorded before any create), perform the actions, and, when it
//! created components, call `step` again with the results in `Observation::create_results`.
//!
//! Timers are anchored on condition transition times, which change only when a condition's
//! status flips (`meta.SetStatusCondition` semantics), exactly as upstream.
//!
//! One file per phase (`empty`, `suspended`, `resuming`, `running`, `resetting`, `suspending`,
//! `succeeded`, `failed`, `terminating`), the deletion algorithm they share in `deletion`, and the
//! helpers every phase uses (conditions, Events, transitions, reset-or-fail) here.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use lifeboat_api::appwrapper::AppWrapperPhase as Phase;
use lifeboat_api::appwrapper::constants::{CONTROLLER_NAME, condition_types as ct};

use crate::params::Params;
use crate::pods::PodSummary;

mod annotations;
mod deletion;
mod empty;
mod failed;
mod names;
mod resetting;
mod resuming;
mod running;
mod succeeded;
mod suspended;
mod suspending;
mod terminating;
mod types;

pub use names::component_name;
pub use types::{
    Actions, ComponentObservation, CreateResult, Decision, EventNote, EventType, FinalizerChange,
    Input, Observation,
};

/// Lifeboat's reason for a reset away from a node with a spot reclamation notice.
pub const REASON_SPOT_RECLAMATION: &str = "SpotReclamation";
/// Condition type reporting malformed fault-tolerance annotations (True while any is).
pub const CONDITION_INVALID_ANNOTATIONS: &str = "InvalidAnnotations";
pub const REASON_MALFORMED_ANNOTATION: &str = "MalformedAnnotation";

/// How long a deletion in progress waits before looking again (upstream's cadence; watches on
/// pods and components usually wake the reconciler earlier).
pub const DELETION_POLL: Duration = Duration::from_secs(5);
/// Safety-net requeue of a healthy running AppWrapper (failures arrive through watches).
pub const RUNNING_RESYNC: Duration = Duration::from_secs(300);
/// Retry cadence of non-fatal create errors within the admission grace.
pub const CREATE_RETRY: Duration = Duration::from_secs(1);

/// Runs one step of the state machine.
pub fn step(input: &Input<'_>) -> Decision {
    let mut m = Machine {
        input,
        d: Decision {
            status: input.status.clone(),
            finalizer: FinalizerChange::None,
            actions: Actions::default(),
            events: Vec::new(),
            requeue_after: None,
            phase_change: None,
        },
    };
    if input
        .spec
        .managed_by
        .as_deref()
        .is_some_and(|m| m != CONTROLLER_NAME)
    {
        // Another controller (MultiKueue on a manager cluster) owns this AppWrapper.
        return m.d;
    }
    if input.deleting {
        if input.has_finalizer {
            m.terminating();
        }
        return m.d;
    }
    m.annotation_condition();
    match input.status.phase {
        Phase::Empty => m.initialize(),
        Phase::Suspended => m.suspended(),
        Phase::Resuming => m.resuming(),
        Phase::Running => m.running(),
        Phase::Resetting => m.resetting(),
        Phase::Suspending => m.suspending(),
        Phase::Succeeded => m.succeeded(),
        Phase::Failed => m.failed(),
        Phase::Terminating => {}
    }
    m.d
}

/// Runs [`step`] again on its own result while the phase it reached reads nothing new from the
/// cluster: a new AppWrapper goes Empty → Suspended → Resuming (and asks for its components'
/// creation) in one reconcile, one status write, where each step used to be a reconcile and a
/// write of its own, each waiting for the watch to bring the previous write back. Every phase
/// change is returned, in order, with the events of all steps.
pub fn steps(input: &Input<'_>) -> (Decision, Vec<(Phase, Phase)>) {
    let mut decision = step(input);
    let mut changes: Vec<(Phase, Phase)> = decision.phase_change.into_iter().collect();
    while matches!(
        decision.phase_change,
        Some((Phase::Empty, Phase::Suspended) | (Phase::Suspended, Phase::Resuming))
    ) {
        let status = decision.status.clone();
        let next_input = Input {
            status: &status,
            has_finalizer: input.has_finalizer || decision.finalizer == FinalizerChange::Add,
            ..*input
        };
        let mut next = step(&next_input);
        changes.extend(next.phase_change);
        if decision.finalizer == FinalizerChange::Add && next.finalizer == FinalizerChange::None {
            next.finalizer = FinalizerChange::Add;
        }
        let mut events = std::mem::take(&mut decision.events);
        events.append(&mut next.events);
        next.events = events;
        decision = next;
    }
    (decision, changes)
}

struct Machine<'a, 'b> {
    input: &'a Input<'b>,
    d: Decision,
}

impl Machine<'_, '_> {
    fn now(&self) -> Timestamp {
        self.input.now
    }

    fn obs(&self) -> &Observation {
        self.input.observation
    }

    fn pods(&self) -> &PodSummary {
        &self.input.observation.pods
    }

    fn params(&self) -> &Params {
        self.input.params
    }

    fn requeue(&mut self, after: Duration) {
        self.d.requeue_after = Some(match self.d.requeue_after {
            Some(existing) => existing.min(after),
            None => after,
        });
    }

    /// Requeue at `deadline` (or at once if it passed).
    fn requeue_at(&mut self, deadline: Timestamp) {
        let wait =
            Duration::try_from(deadline.duration_since(self.now())).unwrap_or(Duration::ZERO);
        self.requeue(wait);
    }

    fn condition(&self, type_: &str) -> Option<&Condition> {
        self.d.status.conditions.iter().find(|c| c.type_ == type_)
    }

    fn is_true(&self, type_: &str) -> bool {
        self.condition(type_).is_some_and(|c| c.status == "True")
    }

    /// Transition time of a condition (now if it is missing).
    fn ltt(&self, type_: &str) -> Timestamp {
        self.condition(type_)
            .map(|c| c.last_transition_time.0)
            .unwrap_or(self.now())
    }

    fn set(&mut self, type_: &str, status: bool, reason: &str, message: impl Into<String>) {
        let now = self.now();
        let generation = self.input.generation;
        set_condition(
            &mut self.d.status.conditions,
            type_,
            if status { "True" } else { "False" },
            reason,
            message.into(),
            now,
            generation,
        );
    }

    fn event(&mut self, type_: EventType, reason: &str, note: impl Into<String>) {
        self.d.events.push(EventNote {
            type_,
            reason: reason.to_string(),
            note: note.into(),
        });
    }

    /// Changes the phase, records it in `status.transitions`, and emits an Event.
    fn transition(&mut self, to: Phase, reason: &str, message: impl Into<String>) {
        let from = self.d.status.phase;
        let message = message.into();
        self.d.status.phase = to;
        self.d.status.record_transition(
            Time(self.now()),
            to,
            reason,
            (!message.is_empty()).then(|| message.clone()),
        );
        let type_ = if to == Phase::Failed {
            EventType::Warning
        } else {
            EventType::Normal
        };
        let from_label = if from == Phase::Empty {
            "Empty"
        } else {
            from.as_str()
        };
        let note = if message.is_empty() {
            format!("{from_label} -> {to}: {reason}")
        } else {
            format!("{from_label} -> {to}: {reason}: {message}")
        };
        self.event(type_, to.as_str(), note);
        self.d.phase_change = Some((from, to));
        // The next phase's logic runs on the next reconcile, at once.
        self.requeue(Duration::ZERO);
    }

    fn component_deployed(&self, i: usize) -> bool {
        self.d.status.component_status[i]
            .conditions
            .iter()
            .any(|c| c.type_ == ct::RESOURCES_DEPLOYED && c.status == "True")
    }

    fn set_component(&mut self, i: usize, status: &str, reason: &str, message: impl Into<String>) {
        let now = self.now();
        let generation = self.input.generation;
        set_condition(
            &mut self.d.status.component_status[i].conditions,
            ct::RESOURCES_DEPLOYED,
            status,
            reason,
            message.into(),
            now,
            generation,
        );
    }

    /// Reset (counting `increment` retries) unless the failure is terminal or the retries are
    /// used up, in which case the AppWrapper fails.
    fn reset_or_fail(&mut self, terminal: bool, increment: i32, reason: &str, message: String) {
        if !terminal && self.d.status.retries < self.params().retry_limit {
            self.d.status.retries += increment;
            self.transition(Phase::Resetting, reason, message);
        } else {
            let why = if terminal {
                format!("{message} (terminal failure)")
            } else {
                format!(
                    "{message} (retry limit {} reached)",
                    self.params().retry_limit
                )
            };
            self.transition(Phase::Failed, reason, why);
        }
    }

    fn clear_component_conditions(&mut self) {
        for cs in &mut self.d.status.component_status {
            cs.conditions.clear();
        }
    }
}

/// `meta.SetStatusCondition`: the transition time changes only when the status changes.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: Timestamp,
    generation: Option<i64>,
) {
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.status = status.to_string();
                c.last_transition_time = Time(now);
            }
            c.reason = reason.to_string();
            c.message = message;
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            last_transition_time: Time(now),
            observed_generation: generation,
        }),
    }
}

#[cfg(test)]
mod tests;
