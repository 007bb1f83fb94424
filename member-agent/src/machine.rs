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

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use lifeboat_api::appwrapper::constants::{CONTROLLER_NAME, condition_types as ct, reasons as r};
use lifeboat_api::appwrapper::podsets::{effective_pod_sets, expected_pod_count_of_status};
use lifeboat_api::appwrapper::{
    AppWrapperComponentStatus, AppWrapperPhase as Phase, AppWrapperSpec, AppWrapperStatus,
};

use crate::params::{AnnotationProblem, Params};
use crate::pods::PodSummary;
use lifeboat_api::health::FailureClass;

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

/// What the cluster holds for one component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComponentObservation {
    /// Not there: never created, or deleted (confirmed by a read from the API server).
    Absent,
    /// Exists and is not being deleted.
    Present,
    /// Exists, and its status says it failed (batch/v1 Job, PyTorchJob), with the reason.
    Failed(String),
    /// Exists with a deletion timestamp.
    Deleting,
}

/// Outcome of one create call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateResult {
    /// Created, or already existed under this AppWrapper's control; the actual name.
    Created { name: String },
    /// Retrying cannot help (invalid object, kind not installed, owned by someone else, ...).
    Fatal(String),
    /// May succeed later (API server errors, quota).
    Retryable(String),
}

/// What the reconciler observed.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    /// Parallel to `status.componentStatus`.
    pub components: Vec<ComponentObservation>,
    pub pods: PodSummary,
    /// Results of the creates made in this reconcile, by component index.
    pub create_results: Option<Vec<Option<CreateResult>>>,
}

/// Everything one step needs.
pub struct Input<'a> {
    pub spec: &'a AppWrapperSpec,
    pub status: &'a AppWrapperStatus,
    pub uid: &'a str,
    pub generation: Option<i64>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    pub has_finalizer: bool,
    pub params: &'a Params,
    pub annotation_problems: &'a [AnnotationProblem],
    pub observation: &'a Observation,
    pub now: Timestamp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FinalizerChange {
    #[default]
    None,
    Add,
    Remove,
}

/// IO the reconciler performs after writing the status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Actions {
    /// Create these components (their identity is already in the status being written).
    pub create: Vec<usize>,
    /// Delete these components with background propagation.
    pub delete: Vec<usize>,
    /// Delete every labelled pod with grace period 0.
    pub force_delete_pods: bool,
    /// Delete these components with grace period 0.
    pub force_delete: Vec<usize>,
}

impl Actions {
    pub fn is_empty(&self) -> bool {
        self.create.is_empty()
            && self.delete.is_empty()
            && !self.force_delete_pods
            && self.force_delete.is_empty()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// A Kubernetes Event to record on the AppWrapper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventNote {
    pub type_: EventType,
    pub reason: String,
    pub note: String,
}

/// The result of one step.
#[derive(Debug, Clone)]
pub struct Decision {
    pub status: AppWrapperStatus,
    pub finalizer: FinalizerChange,
    pub actions: Actions,
    pub events: Vec<EventNote>,
    /// Look again after this long (None: only when something changes).
    pub requeue_after: Option<Duration>,
    /// (from, to) when the phase changed.
    pub phase_change: Option<(Phase, Phase)>,
}

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

    fn annotation_condition(&mut self) {
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

    // ---- phases ------------------------------------------------------------------------

    fn initialize(&mut self) {
        let spec = self.input.spec;
        if self.d.status.component_status.len() != spec.components.len() {
            self.d.status.component_status = spec
                .components
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let template = &c.template;
                    AppWrapperComponentStatus {
                        name: component_name(template, self.input.uid, i),
                        kind: str_at(template, &["kind"]).unwrap_or_default(),
                        api_version: str_at(template, &["apiVersion"]).unwrap_or_default(),
                        pod_sets: effective_pod_sets(c),
                        conditions: Vec::new(),
                    }
                })
                .collect();
        }
        self.transition(Phase::Suspended, r::SUSPENDED, "");
    }

    fn suspended(&mut self) {
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

    fn externally_suspended(&mut self, phase: Phase) -> bool {
        if !self.input.spec.suspend {
            return false;
        }
        let note = format!("Externally suspended while in the {phase} phase");
        self.event(EventType::Normal, r::SUSPENDING, note.clone());
        self.transition(Phase::Suspending, r::SUSPENDING, note);
        true
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

    fn resuming(&mut self) {
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

    fn running(&mut self) {
        if self.externally_suspended(Phase::Running) {
            return;
        }
        let expected_components = self.d.status.component_status.len();
        let expected_pods =
            i32::try_from(expected_pod_count_of_status(&self.d.status)).unwrap_or(i32::MAX);
        let components = self.obs().components.clone();
        let deployed = components
            .iter()
            .filter(|c| {
                matches!(
                    c,
                    ComponentObservation::Present | ComponentObservation::Failed(_)
                )
            })
            .count();
        // 1. A wrapped resource is gone: someone deleted it. No grace, no retry (upstream).
        if deployed != expected_components {
            let missing: Vec<String> = components
                .iter()
                .enumerate()
                .filter(|(_, c)| {
                    !matches!(
                        c,
                        ComponentObservation::Present | ComponentObservation::Failed(_)
                    )
                })
                .map(|(i, _)| {
                    let c = &self.d.status.component_status[i];
                    format!("{} {}", c.kind, c.name)
                })
                .collect();
            let message = FailureClass::Unknown.message(format!(
                "Only found {deployed} deployed components, but was expecting {expected_components} (missing: {})",
                missing.join(", ")
            ));
            self.set(ct::UNHEALTHY, true, r::MISSING_COMPONENT, message.clone());
            self.event(EventType::Warning, r::MISSING_COMPONENT, message.clone());
            self.transition(Phase::Failed, r::MISSING_COMPONENT, message);
            return;
        }
        // 2. A wrapped Job or PyTorchJob says it failed: its controller will do nothing more.
        let failed: Vec<String> = components
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c {
                ComponentObservation::Failed(reason) => {
                    let cs = &self.d.status.component_status[i];
                    Some(format!("{} {} failed: {reason}", cs.kind, cs.name))
                }
                _ => None,
            })
            .collect();
        if !failed.is_empty() {
            let class = match self.pods().failure_class() {
                FailureClass::Infrastructure => FailureClass::Infrastructure,
                FailureClass::Capacity => FailureClass::Capacity,
                _ => FailureClass::Application,
            };
            let message = class.message(failed.join("; "));
            self.set(ct::UNHEALTHY, true, r::FAILED_COMPONENT, message.clone());
            self.event(EventType::Warning, r::FAILED_COMPONENT, message.clone());
            let terminal = self.pods().terminal_failure;
            self.reset_or_fail(terminal, 1, r::FAILED_COMPONENT, message);
            return;
        }
        let pods = self.pods().clone();
        // 3. Success.
        if pods.succeeded >= expected_pods && pods.pending + pods.running + pods.failed == 0 {
            let message = format!(
                "{} pods succeeded and no running, pending, or failed pods",
                pods.succeeded
            );
            self.set(ct::QUOTA_RESERVED, false, r::SUCCEEDED, message.clone());
            self.set(ct::RESOURCES_DEPLOYED, true, r::SUCCEEDED, "");
            self.transition(Phase::Succeeded, r::SUCCEEDED, message);
            return;
        }
        // 4. Failed pods: give the workload's own controller the failure grace to recover.
        if pods.failed > 0 {
            let message = pods.failure_class().message(format!(
                "{} failed pods: {}",
                pods.failed,
                pods.failure_details()
            ));
            self.set(ct::UNHEALTHY, true, r::FOUND_FAILED_PODS, message.clone());
            let deadline = self.ltt(ct::UNHEALTHY) + self.params().failure_grace;
            if self.now() < deadline {
                self.requeue_at(deadline);
                return;
            }
            self.event(
                EventType::Warning,
                r::FOUND_FAILED_PODS,
                format!("{}: {} failed pods", r::FOUND_FAILED_PODS, pods.failed),
            );
            self.reset_or_fail(pods.terminal_failure, 1, r::FOUND_FAILED_PODS, message);
            return;
        }
        // 5. Autopilot flagged a resource a running pod uses NoExecute: migrate at once,
        //    without counting a retry (still bounded by the retry limit).
        if let Some(hit) = pods.no_execute.first() {
            let message = FailureClass::Infrastructure.message(format!(
                "pod {} uses {} on node {}, which Autopilot flagged NoExecute ({} pods affected)",
                hit.pod,
                hit.what,
                hit.node,
                pods.no_execute.len()
            ));
            self.set(
                ct::UNHEALTHY,
                true,
                r::AUTOPILOT_NO_EXECUTE,
                message.clone(),
            );
            self.event(EventType::Warning, r::AUTOPILOT_NO_EXECUTE, message.clone());
            self.reset_or_fail(false, 0, r::AUTOPILOT_NO_EXECUTE, message);
            return;
        }
        // 5b. (Lifeboat) a spot reclamation notice on a running pod's node: move before the
        //     node is taken away, like the Autopilot migration.
        if let Some(hit) = pods.reclaiming.first() {
            let message = FailureClass::Infrastructure.message(format!(
                "pod {} runs on node {}, which has a spot reclamation notice ({} pods affected)",
                hit.pod,
                hit.node,
                pods.reclaiming.len()
            ));
            self.set(
                ct::UNHEALTHY,
                true,
                REASON_SPOT_RECLAMATION,
                message.clone(),
            );
            self.event(EventType::Warning, REASON_SPOT_RECLAMATION, message.clone());
            self.reset_or_fail(false, 0, REASON_SPOT_RECLAMATION, message);
            return;
        }
        // 6. Healthy so far.
        self.set(ct::UNHEALTHY, false, r::FOUND_NO_FAILED_PODS, "");
        // 7. Enough pods running.
        if pods.running + pods.succeeded >= expected_pods {
            self.set(
                ct::PODS_READY,
                true,
                r::SUFFICIENT_PODS_READY,
                format!(
                    "{} pods running; {} pods succeeded",
                    pods.running, pods.succeeded
                ),
            );
            self.requeue(RUNNING_RESYNC);
            return;
        }
        // 8. Not enough: wait the admission grace (pods missing) or the warmup grace (all pods
        //    exist), counted from the last (re)deployment.
        self.set(
            ct::PODS_READY,
            false,
            r::INSUFFICIENT_PODS_READY,
            format!(
                "{} pods pending; {} pods running; {} pods succeeded",
                pods.pending, pods.running, pods.succeeded
            ),
        );
        let all_exist = pods.pending + pods.running + pods.succeeded >= expected_pods;
        let (grace, grace_name) = if all_exist {
            (self.params().warmup_grace, "WarmupGracePeriod")
        } else {
            (self.params().admission_grace, "AdmissionGracePeriod")
        };
        let deadline = self.ltt(ct::RESOURCES_DEPLOYED) + grace;
        if self.now() < deadline {
            self.requeue_at(deadline);
            return;
        }
        let (class, why) = if pods.unschedulable > 0 {
            (
                FailureClass::Capacity,
                format!(
                    "{} pods unschedulable: {}",
                    pods.unschedulable,
                    pods.unschedulable_message.clone().unwrap_or_default()
                ),
            )
        } else {
            (FailureClass::Unknown, String::new())
        };
        let mut text = format!(
            "{} of {expected_pods} pods ready after the {grace_name}",
            pods.running + pods.succeeded
        );
        if !why.is_empty() {
            text.push_str(&format!("; {why}"));
        }
        let message = class.message(text);
        self.set(
            ct::UNHEALTHY,
            true,
            r::INSUFFICIENT_PODS_READY,
            message.clone(),
        );
        self.event(
            EventType::Warning,
            r::INSUFFICIENT_PODS_READY,
            message.clone(),
        );
        self.reset_or_fail(
            pods.terminal_failure,
            1,
            r::INSUFFICIENT_PODS_READY,
            message,
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

    fn resetting(&mut self) {
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

    fn clear_component_conditions(&mut self) {
        for cs in &mut self.d.status.component_status {
            cs.conditions.clear();
        }
    }

    fn suspending(&mut self) {
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

    fn succeeded(&mut self) {
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

    fn failed(&mut self) {
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
                format!(
                    "{} has value {d}",
                    lifeboat_api::appwrapper::constants::annotations::DELETION_ON_FAILURE_GRACE_PERIOD
                ),
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

    fn terminating(&mut self) {
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

    /// One pass of the deletion algorithm (reference §2.7). True when every component and every
    /// labelled pod is gone.
    fn delete_components(&mut self) -> bool {
        self.set(ct::DELETING_RESOURCES, true, r::DELETION_INITIATED, "");
        let started = self.ltt(ct::DELETING_RESOURCES);
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

fn str_at(value: &serde_json::Value, path: &[&str]) -> Option<String> {
    let mut v = value;
    for p in path {
        v = v.get(p)?;
    }
    v.as_str().map(str::to_string)
}

/// The name a component's object gets: `metadata.name`, or for `generateName` a name chosen
/// here (stable for this AppWrapper and component), so that it is recorded before the create
/// and a create repeated after a crash finds the same object.
pub fn component_name(template: &serde_json::Value, uid: &str, index: usize) -> String {
    if let Some(name) = str_at(template, &["metadata", "name"]).filter(|n| !n.is_empty()) {
        return name;
    }
    match str_at(template, &["metadata", "generateName"]) {
        Some(prefix) if !prefix.is_empty() => format!("{prefix}{}", stable_suffix(uid, index)),
        _ => String::new(),
    }
}

/// Five characters from Kubernetes' generateName alphabet, derived from (uid, index) (FNV-1a).
fn stable_suffix(uid: &str, index: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in uid.bytes().chain(index.to_le_bytes()) {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (0..5)
        .map(|i| ALPHABET[((hash >> (i * 8)) % ALPHABET.len() as u64) as usize] as char)
        .collect()
}

#[cfg(test)]
mod tests;
