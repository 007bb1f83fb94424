//! The state machine, transition by transition (reference §2.3–§2.9), with a fake clock.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use lifeboat_api::appwrapper::constants::{condition_types as ct, reasons as r};
use lifeboat_api::appwrapper::{AppWrapperPhase as Phase, AppWrapperSpec, AppWrapperStatus};
use serde_json::json;

use super::*;
use crate::config::FaultToleranceConfig;
use crate::params::{AnnotationProblem, Params};
use crate::pods::{NodeHit, PodFailure, PodSummary};

const T0: i64 = 1_800_000_000;

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(T0 + seconds).expect("valid timestamp")
}

fn spec(suspend: bool) -> AppWrapperSpec {
    serde_json::from_value(json!({
        "suspend": suspend,
        "components": [
            {"template": {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
              "spec": {"parallelism": 2, "completions": 2, "template": {"spec": {
                  "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}},
            {"template": {"apiVersion": "v1", "kind": "Service", "metadata": {"generateName": "svc-"},
              "spec": {"ports": [{"port": 80}]}}}
        ]
    }))
    .expect("valid spec")
}

fn params() -> Params {
    Params::defaults(&FaultToleranceConfig::default())
}

/// Everything one step needs, owned, with a fake clock.
struct Fx {
    spec: AppWrapperSpec,
    status: AppWrapperStatus,
    params: Params,
    problems: Vec<AnnotationProblem>,
    obs: Observation,
    now: Timestamp,
    deleting: bool,
    has_finalizer: bool,
}

impl Fx {
    fn new() -> Self {
        Fx {
            spec: spec(false),
            status: AppWrapperStatus::default(),
            params: params(),
            problems: vec![],
            obs: Observation::default(),
            now: at(0),
            deleting: false,
            has_finalizer: true,
        }
    }

    fn step(&self) -> Decision {
        step(&Input {
            spec: &self.spec,
            status: &self.status,
            uid: "0e5b7a52-uid",
            generation: Some(1),
            deleting: self.deleting,
            has_finalizer: self.has_finalizer,
            params: &self.params,
            annotation_problems: &self.problems,
            observation: &self.obs,
            now: self.now,
        })
    }

    /// Steps and keeps the new status (what the reconciler writes).
    fn apply(&mut self) -> Decision {
        let d = self.step();
        self.status = d.status.clone();
        self.obs.create_results = None;
        d
    }

    fn phase(&self) -> Phase {
        self.status.phase
    }

    fn cond(&self, type_: &str) -> (String, String) {
        let c = self
            .status
            .condition(type_)
            .unwrap_or_else(|| panic!("no {type_} condition"));
        (c.status.clone(), c.reason.clone())
    }

    fn cond_message(&self, type_: &str) -> String {
        self.status
            .condition(type_)
            .map(|c| c.message.clone())
            .unwrap_or_default()
    }

    fn ltt(&self, type_: &str) -> Timestamp {
        self.status
            .condition(type_)
            .expect("condition")
            .last_transition_time
            .0
    }

    /// Brings the AppWrapper to Resuming at `now`.
    fn resuming(mut self) -> Self {
        self.apply(); // Empty -> Suspended
        self.apply(); // Suspended -> Resuming
        assert_eq!(self.phase(), Phase::Resuming);
        self
    }

    /// Brings the AppWrapper to Running (both components created) at `now`.
    fn running(mut self) -> Self {
        self = self.resuming();
        let d = self.apply();
        assert_eq!(d.actions.create, vec![0, 1]);
        self.obs.create_results = Some(vec![
            Some(CreateResult::Created {
                name: "train".into(),
            }),
            Some(CreateResult::Created {
                name: "svc-abcde".into(),
            }),
        ]);
        let d = self.step();
        self.status = d.status;
        self.obs.create_results = None;
        assert_eq!(self.phase(), Phase::Running);
        self.obs.components = vec![ComponentObservation::Present, ComponentObservation::Present];
        self
    }

    fn pods(&mut self, pending: i32, running: i32, succeeded: i32, failed: i32) {
        self.obs.pods = PodSummary {
            pending,
            running,
            succeeded,
            failed,
            total: pending + running + succeeded + failed,
            failures: (0..failed)
                .map(|i| PodFailure {
                    pod: format!("train-{i}"),
                    node: Some("n1".into()),
                    exit_codes: vec![1],
                    detail: "exit code 1".into(),
                    class: lifeboat_api::health::FailureClass::Application,
                })
                .collect(),
            ..Default::default()
        };
    }

    fn all_gone(&mut self) {
        self.obs.components = vec![ComponentObservation::Absent, ComponentObservation::Absent];
        self.obs.pods = PodSummary::default();
    }
}

fn last_transition(status: &AppWrapperStatus) -> (Phase, String) {
    let t = status.transitions.last().expect("a transition");
    (t.phase, t.reason.clone())
}

// ---- Empty, Suspended, Resuming ------------------------------------------------------------

#[test]
fn empty_initialises_component_status_and_suspends() {
    let mut fx = Fx::new();
    let d = fx.apply();
    assert_eq!(fx.phase(), Phase::Suspended);
    assert_eq!(d.phase_change, Some((Phase::Empty, Phase::Suspended)));
    let cs = &fx.status.component_status;
    assert_eq!(cs.len(), 2);
    assert_eq!(
        (
            cs[0].kind.as_str(),
            cs[0].api_version.as_str(),
            cs[0].name.as_str()
        ),
        ("Job", "batch/v1", "train")
    );
    assert_eq!(cs[0].pod_sets.len(), 1);
    assert_eq!(cs[0].pod_sets[0].replicas, Some(2));
    // generateName: a stable name is chosen before the create.
    assert!(
        cs[1].name.starts_with("svc-") && cs[1].name.len() == 9,
        "{}",
        cs[1].name
    );
    assert_eq!(d.requeue_after, Some(Duration::ZERO));
    assert_eq!(
        last_transition(&fx.status),
        (Phase::Suspended, "Suspended".into())
    );
}

#[test]
fn suspended_stays_while_suspend_is_true() {
    let mut fx = Fx::new();
    fx.spec = spec(true);
    fx.apply();
    let d = fx.apply();
    assert_eq!(fx.phase(), Phase::Suspended);
    assert!(d.actions.is_empty());
    assert_eq!(d.finalizer, FinalizerChange::None);
    assert!(d.phase_change.is_none());
}

#[test]
fn unsuspend_adds_finalizer_and_resumes_with_quota() {
    let mut fx = Fx::new();
    fx.has_finalizer = false;
    fx.apply();
    let d = fx.apply();
    assert_eq!(fx.phase(), Phase::Resuming);
    assert_eq!(d.finalizer, FinalizerChange::Add);
    assert_eq!(
        fx.cond(ct::QUOTA_RESERVED),
        ("True".into(), r::RESUMING.into())
    );
    assert_eq!(
        fx.cond(ct::RESOURCES_DEPLOYED),
        ("True".into(), r::RESUMING.into())
    );
    assert_eq!(
        fx.cond(ct::PODS_READY),
        ("False".into(), r::RESUMING.into())
    );
    assert_eq!(fx.cond(ct::UNHEALTHY), ("False".into(), r::RESUMING.into()));
}

#[test]
fn resuming_records_identities_before_creating_then_runs() {
    let mut fx = Fx::new().resuming();
    let d = fx.apply();
    assert_eq!(d.actions.create, vec![0, 1]);
    for cs in &fx.status.component_status {
        let c = &cs.conditions[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("Unknown", r::COMPONENT_CREATION_INITIATED)
        );
    }
    fx.obs.create_results = Some(vec![
        Some(CreateResult::Created {
            name: "train".into(),
        }),
        Some(CreateResult::Created {
            name: "svc-xyz12".into(),
        }),
    ]);
    let d = fx.apply();
    assert_eq!(fx.phase(), Phase::Running);
    assert_eq!(d.phase_change, Some((Phase::Resuming, Phase::Running)));
    assert_eq!(fx.status.component_status[1].name, "svc-xyz12");
    assert_eq!(
        fx.status.component_status[0].conditions[0].reason,
        r::COMPONENT_CREATED_SUCCESSFULLY
    );
}

#[test]
fn resuming_suspended_externally_goes_suspending() {
    let mut fx = Fx::new().resuming();
    fx.spec.suspend = true;
    let d = fx.apply();
    assert_eq!(fx.phase(), Phase::Suspending);
    assert!(d.events.iter().any(|e| {
        e.note
            .contains("Externally suspended while in the Resuming phase")
    }));
}

#[test]
fn fatal_create_error_fails_without_retry() {
    let mut fx = Fx::new().resuming();
    fx.apply();
    fx.obs.create_results = Some(vec![
        Some(CreateResult::Created {
            name: "train".into(),
        }),
        Some(CreateResult::Fatal(
            "Service \"svc\" is invalid: spec.ports: Required value".into(),
        )),
    ]);
    fx.apply();
    assert_eq!(fx.phase(), Phase::Failed);
    assert_eq!(fx.status.retries, 0);
    assert_eq!(
        fx.cond(ct::UNHEALTHY),
        ("True".into(), r::CREATE_FAILED.into())
    );
    assert!(
        fx.cond_message(ct::UNHEALTHY)
            .starts_with("[Application] component 1")
    );
    // Quota and resources stay until the Failed phase has deleted what was created.
    assert_eq!(fx.cond(ct::QUOTA_RESERVED).0, "True");
    assert_eq!(fx.cond(ct::RESOURCES_DEPLOYED).0, "True");
}

#[test]
fn retryable_create_error_retries_within_admission_grace_then_resets() {
    let mut fx = Fx::new().resuming();
    fx.apply();
    let retry = |fx: &mut Fx| {
        fx.obs.create_results = Some(vec![
            Some(CreateResult::Created {
                name: "train".into(),
            }),
            Some(CreateResult::Retryable(
                "etcdserver: request timed out".into(),
            )),
        ]);
        fx.apply()
    };
    let d = retry(&mut fx);
    assert_eq!(fx.phase(), Phase::Resuming);
    assert_eq!(d.requeue_after, Some(CREATE_RETRY));
    // The next pass creates the failed component again (and only it).
    let d = fx.apply();
    assert_eq!(d.actions.create, vec![1]);
    fx.now = at(61);
    retry(&mut fx);
    assert_eq!(fx.phase(), Phase::Resetting);
    assert_eq!(fx.status.retries, 1);
    assert_eq!(
        fx.cond(ct::UNHEALTHY),
        ("True".into(), r::CREATE_FAILED.into())
    );
}

#[test]
fn quota_errors_are_capacity_failures() {
    let mut fx = Fx::new().resuming();
    fx.params.admission_grace = Duration::ZERO;
    fx.apply();
    fx.obs.create_results = Some(vec![
        Some(CreateResult::Retryable(
            "pods \"x\" is forbidden: exceeded quota: gpu-quota".into(),
        )),
        None,
    ]);
    fx.now = at(1);
    fx.apply();
    assert!(fx.cond_message(ct::UNHEALTHY).starts_with("[Capacity]"));
}

// ---- Running --------------------------------------------------------------------------------

#[test]
fn running_suspended_externally_goes_suspending() {
    let mut fx = Fx::new().running();
    fx.spec.suspend = true;
    fx.apply();
    assert_eq!(fx.phase(), Phase::Suspending);
}

#[test]
fn all_pods_running_sets_pods_ready() {
    let mut fx = Fx::new().running();
    fx.pods(0, 2, 0, 0);
    let d = fx.apply();
    assert_eq!(fx.phase(), Phase::Running);
    assert_eq!(
        fx.cond(ct::PODS_READY),
        ("True".into(), r::SUFFICIENT_PODS_READY.into())
    );
    assert_eq!(
        fx.cond_message(ct::PODS_READY),
        "2 pods running; 0 pods succeeded"
    );
    assert_eq!(
        fx.cond(ct::UNHEALTHY),
        ("False".into(), r::FOUND_NO_FAILED_PODS.into())
    );
    assert_eq!(d.requeue_after, Some(RUNNING_RESYNC));
}

#[test]
fn missing_component_fails_at_once_without_retry() {
    let mut fx = Fx::new().running();
    fx.pods(0, 2, 0, 0);
    fx.obs.components[1] = ComponentObservation::Absent;
    let d = fx.apply();
    assert_eq!(fx.phase(), Phase::Failed);
    assert_eq!(fx.status.retries, 0);
    assert_eq!(
        fx.cond(ct::UNHEALTHY),
        ("True".into(), r::MISSING_COMPONENT.into())
    );
    assert!(
        fx.cond_message(ct::UNHEALTHY)
            .contains("Only found 1 deployed components, but was expecting 2")
    );
    assert!(d.events.iter().any(|e| e.reason == r::MISSING_COMPONENT));
    // A component being deleted from outside counts as missing too.
    let mut fx = Fx::new().running();
    fx.obs.components[0] = ComponentObservation::Deleting;
    fx.apply();
    assert_eq!(fx.phase(), Phase::Failed);
}

#[test]
fn failed_component_resets_without_grace() {
    let mut fx = Fx::new().running();
    fx.pods(0, 0, 0, 2);
    fx.obs.components[0] = ComponentObservation::Failed(
        "BackoffLimitExceeded: Job has reached the specified backoff limit".into(),
    );
    fx.apply();
    assert_eq!(fx.phase(), Phase::Resetting);
    assert_eq!(fx.status.retries, 1);
    assert_eq!(
        fx.cond(ct::UNHEALTHY),
        ("True".into(), r::FAILED_COMPONENT.into())
    );
    assert!(
        fx.cond_message(ct::UNHEALTHY)
            .starts_with("[Application] Job train failed: BackoffLimitExceeded")
    );
}

#[test]
fn failed_component_with_terminal_exit_code_fails() {
    let mut fx = Fx::new().running();
    fx.pods(0, 0, 0, 1);
    fx.obs.pods.terminal_failure = true;
    fx.obs.components[0] = ComponentObservation::Failed("BackoffLimitExceeded".into());
    fx.apply();
    assert_eq!(fx.phase(), Phase::Failed);
}

#[test]
fn all_pods_succeeded_is_success_and_releases_quota() {
    let mut fx = Fx::new().running();
    fx.pods(0, 0, 2, 0);
    let rd_deployed_at = fx.ltt(ct::RESOURCES_DEPLOYED);
    fx.now = at(100);
    fx.apply();
    assert_eq!(fx.phase(), Phase::Succeeded);
    assert_eq!(
        fx.cond(ct::QUOTA_RESERVED),
        ("False".into(), r::SUCCEEDED.into())
    );
    assert_eq!(
        fx.cond(ct::RESOURCES_DEPLOYED),
        ("True".into(), r::SUCCEEDED.into())
    );
    assert_eq!(
        fx.ltt(ct::RESOURCES_DEPLOYED),
        rd_deployed_at,
        "True -> True keeps the transition time"
    );
    // Not while a pod is still running.
    let mut fx = Fx::new().running();
    fx.pods(0, 1, 2, 0);
    fx.apply();
    assert_eq!(fx.phase(), Phase::Running);
}

#[test]
fn failed_pods_wait_the_failure_grace_then_reset() {
    let mut fx = Fx::new().running();
    fx.pods(0, 1, 0, 1);
    fx.now = at(10);
    let d = fx.apply();
    assert_eq!(fx.phase(), Phase::Running);
    assert_eq!(
        fx.cond(ct::UNHEALTHY),
        ("True".into(), r::FOUND_FAILED_PODS.into())
    );
    assert!(
        fx.cond_message(ct::UNHEALTHY)
            .starts_with("[Application] 1 failed pods: train-0 (exit code 1)")
    );
    assert_eq!(
        d.requeue_after,
        Some(Duration::from_secs(60)),
        "requeue exactly at the deadline"
    );
    fx.now = at(69);
    fx.apply();
    assert_eq!(fx.phase(), Phase::Running, "still within the grace");
    assert_eq!(fx.ltt(ct::UNHEALTHY), at(10), "the anchor does not move");
    fx.now = at(70);
    let d = fx.apply();
    assert_eq!(fx.phase(), Phase::Resetting);
    assert_eq!(fx.status.retries, 1);
    assert!(
        d.events
            .iter()
            .any(|e| e.note == "FoundFailedPods: 1 failed pods")
    );
    assert_eq!(
        last_transition(&fx.status),
        (Phase::Resetting, r::FOUND_FAILED_PODS.into())
    );
}

#[test]
fn failed_pods_that_recover_within_grace_clear_unhealthy() {
    let mut fx = Fx::new().running();
    fx.pods(0, 1, 0, 1);
    fx.apply();
    fx.pods(0, 2, 0, 0);
    fx.now = at(30);
    fx.apply();
    assert_eq!(fx.phase(), Phase::Running);
    assert_eq!(
        fx.cond(ct::UNHEALTHY),
        ("False".into(), r::FOUND_NO_FAILED_PODS.into())
    );
}

#[test]
fn terminal_failure_still_waits_the_grace_then_fails() {
    let mut fx = Fx::new().running();
    fx.pods(0, 1, 0, 1);
    fx.obs.pods.terminal_failure = true;
    fx.apply();
    assert_eq!(fx.phase(), Phase::Running);
    fx.now = at(60);
    fx.apply();
    assert_eq!(fx.phase(), Phase::Failed);
    assert_eq!(fx.status.retries, 0);
}

#[test]
fn retries_exhausted_fail() {
    let mut fx = Fx::new().running();
    fx.params.retry_limit = 1;
    fx.params.failure_grace = Duration::ZERO;
    fx.status.retries = 1;
    fx.pods(0, 1, 0, 1);
    fx.apply();
    assert_eq!(fx.phase(), Phase::Failed);
    assert!(last_transition(&fx.status).0 == Phase::Failed);
    assert!(
        fx.status
            .transitions
            .last()
            .unwrap()
            .message
            .as_deref()
            .unwrap_or("")
            .contains("retry limit 1 reached")
    );
}

#[test]
fn autopilot_no_execute_resets_without_counting_a_retry() {
    let mut fx = Fx::new().running();
    fx.pods(0, 2, 0, 0);
    fx.obs.pods.no_execute = vec![NodeHit {
        pod: "train-0".into(),
        node: "n1".into(),
        what: "nvidia.com/gpu".into(),
    }];
    fx.status.retries = 2;
    fx.apply();
    assert_eq!(fx.phase(), Phase::Resetting);
    assert_eq!(fx.status.retries, 2);
    assert_eq!(
        fx.cond(ct::UNHEALTHY),
        ("True".into(), r::AUTOPILOT_NO_EXECUTE.into())
    );
    assert!(
        fx.cond_message(ct::UNHEALTHY)
            .starts_with("[Infrastructure]")
    );
    // Still bounded by the retry limit.
    let mut fx = Fx::new().running();
    fx.pods(0, 2, 0, 0);
    fx.obs.pods.no_execute = vec![NodeHit {
        pod: "p".into(),
        node: "n1".into(),
        what: "nvidia.com/gpu".into(),
    }];
    fx.status.retries = 3;
    fx.apply();
    assert_eq!(fx.phase(), Phase::Failed);
}

#[test]
fn spot_reclamation_notice_moves_pods_like_autopilot() {
    let mut fx = Fx::new().running();
    fx.pods(0, 2, 0, 0);
    fx.obs.pods.reclaiming = vec![NodeHit {
        pod: "train-1".into(),
        node: "spot-1".into(),
        what: "notice".into(),
    }];
    fx.apply();
    assert_eq!(fx.phase(), Phase::Resetting);
    assert_eq!(fx.status.retries, 0);
    assert_eq!(
        fx.cond(ct::UNHEALTHY),
        ("True".into(), REASON_SPOT_RECLAMATION.into())
    );
    assert!(fx.cond_message(ct::UNHEALTHY).contains("spot-1"));
}

#[test]
fn missing_pods_wait_the_admission_grace() {
    let mut fx = Fx::new().running();
    fx.pods(0, 1, 0, 0);
    fx.now = at(30);
    let d = fx.apply();
    assert_eq!(fx.phase(), Phase::Running);
    assert_eq!(
        fx.cond(ct::PODS_READY),
        ("False".into(), r::INSUFFICIENT_PODS_READY.into())
    );
    assert_eq!(
        fx.cond_message(ct::PODS_READY),
        "0 pods pending; 1 pods running; 0 pods succeeded"
    );
    assert_eq!(d.requeue_after, Some(Duration::from_secs(30)));
    fx.now = at(60);
    fx.apply();
    assert_eq!(fx.phase(), Phase::Resetting);
    assert_eq!(
        fx.cond(ct::UNHEALTHY),
        ("True".into(), r::INSUFFICIENT_PODS_READY.into())
    );
    assert!(
        fx.cond_message(ct::UNHEALTHY)
            .contains("AdmissionGracePeriod")
    );
}

#[test]
fn pending_pods_wait_the_warmup_grace_and_unschedulable_is_capacity() {
    let mut fx = Fx::new().running();
    fx.pods(1, 1, 0, 0);
    fx.obs.pods.unschedulable = 1;
    fx.obs.pods.unschedulable_message =
        Some("0/4 nodes are available: 4 Insufficient nvidia.com/gpu.".into());
    fx.now = at(120);
    fx.apply();
    assert_eq!(
        fx.phase(),
        Phase::Running,
        "all pods exist: the 5 minute warmup applies"
    );
    fx.now = at(300);
    fx.apply();
    assert_eq!(fx.phase(), Phase::Resetting);
    let message = fx.cond_message(ct::UNHEALTHY);
    assert!(
        message.starts_with("[Capacity]") && message.contains("Insufficient nvidia.com/gpu"),
        "{message}"
    );
}

// ---- Resetting, deletion, pause -------------------------------------------------------------

fn resetting_after_failure() -> Fx {
    let mut fx = Fx::new().running();
    fx.params.failure_grace = Duration::from_secs(10);
    fx.pods(0, 1, 0, 1);
    fx.apply(); // Unhealthy True at t=0
    fx.now = at(10);
    fx.apply();
    assert_eq!(fx.phase(), Phase::Resetting);
    fx
}

#[test]
fn reset_deletes_waits_for_pods_then_pauses_then_recreates() {
    let mut fx = resetting_after_failure();
    // Deletion starts: background delete of both components.
    let d = fx.apply();
    assert_eq!(d.actions.delete, vec![0, 1]);
    assert!(!d.actions.force_delete_pods);
    assert_eq!(
        fx.cond(ct::DELETING_RESOURCES),
        ("True".into(), r::DELETION_INITIATED.into())
    );
    assert_eq!(
        fx.cond(ct::PODS_READY),
        ("False".into(), r::RESETTING.into())
    );
    assert_eq!(
        fx.cond(ct::RESOURCES_DEPLOYED).0,
        "True",
        "resources count as deployed until every pod is gone"
    );
    // Components gone but a pod is still terminating: not done.
    fx.obs.components = vec![ComponentObservation::Absent, ComponentObservation::Absent];
    fx.obs.pods = PodSummary {
        total: 1,
        ..Default::default()
    };
    fx.now = at(20);
    let d = fx.apply();
    assert_eq!(fx.cond(ct::RESOURCES_DEPLOYED).0, "True");
    assert!(d.actions.delete.is_empty());
    assert_eq!(
        fx.status.component_status[0].conditions[0].reason,
        r::COMPONENT_DELETED
    );
    // Everything gone: deletion complete; quota is still reserved during the pause.
    fx.all_gone();
    fx.now = at(30);
    let d = fx.apply();
    assert_eq!(
        fx.cond(ct::DELETING_RESOURCES),
        ("False".into(), r::DELETION_COMPLETE.into())
    );
    assert_eq!(
        fx.cond(ct::RESOURCES_DEPLOYED),
        ("False".into(), r::RESETTING.into())
    );
    assert_eq!(fx.cond(ct::QUOTA_RESERVED).0, "True");
    assert_eq!(fx.phase(), Phase::Resetting);
    // The 90 s pause counts from Unhealthy's transition (t=0).
    assert_eq!(d.requeue_after, Some(Duration::from_secs(60)));
    fx.now = at(90);
    fx.apply();
    assert_eq!(fx.phase(), Phase::Resuming);
    assert_eq!(
        fx.cond(ct::RESOURCES_DEPLOYED),
        ("True".into(), r::RESUMING.into())
    );
    assert_eq!(
        fx.ltt(ct::RESOURCES_DEPLOYED),
        at(90),
        "a new deployment time anchors the next graces"
    );
    assert_eq!(fx.cond(ct::UNHEALTHY).0, "False");
    assert!(
        fx.status
            .component_status
            .iter()
            .all(|c| c.conditions.is_empty())
    );
    // And the components are created again.
    let d = fx.apply();
    assert_eq!(d.actions.create, vec![0, 1]);
    assert_eq!(fx.status.retries, 1, "retries are never reset");
}

#[test]
fn forceful_deletion_after_the_grace_deletes_pods_then_components() {
    let mut fx = resetting_after_failure();
    fx.params.forceful_deletion_grace = Duration::from_secs(600);
    fx.apply(); // deletion initiated at t=10
    fx.obs.components = vec![ComponentObservation::Deleting, ComponentObservation::Absent];
    fx.obs.pods = PodSummary {
        total: 2,
        running: 2,
        ..Default::default()
    };
    fx.now = at(610);
    let d = fx.apply();
    assert!(
        !d.actions.force_delete_pods,
        "not before the grace has passed"
    );
    fx.now = at(611);
    let d = fx.apply();
    assert!(d.actions.force_delete_pods, "pods first");
    assert!(d.actions.force_delete.is_empty());
    fx.obs.pods = PodSummary::default();
    let d = fx.apply();
    assert_eq!(d.actions.force_delete, vec![0], "then the components left");
}

#[test]
fn resetting_suspended_externally_goes_suspending() {
    let mut fx = resetting_after_failure();
    fx.spec.suspend = true;
    fx.apply();
    assert_eq!(fx.phase(), Phase::Suspending);
}

#[test]
fn suspending_deletes_and_releases_quota() {
    let mut fx = Fx::new().running();
    fx.spec.suspend = true;
    fx.apply();
    assert_eq!(fx.phase(), Phase::Suspending);
    // Suspending ignores the suspend bit once started.
    fx.spec.suspend = false;
    let d = fx.apply();
    assert_eq!(d.actions.delete, vec![0, 1]);
    assert_eq!(fx.phase(), Phase::Suspending);
    assert_eq!(fx.cond(ct::QUOTA_RESERVED).0, "True");
    fx.all_gone();
    fx.apply();
    assert_eq!(fx.phase(), Phase::Suspended);
    for type_ in [
        ct::RESOURCES_DEPLOYED,
        ct::QUOTA_RESERVED,
        ct::PODS_READY,
        ct::UNHEALTHY,
    ] {
        assert_eq!(
            fx.cond(type_),
            ("False".into(), r::SUSPENDED.into()),
            "{type_}"
        );
    }
}

// ---- Succeeded, Failed, Terminating ---------------------------------------------------------

#[test]
fn succeeded_deletes_resources_after_the_ttl_from_deployment() {
    let mut fx = Fx::new().running();
    fx.params.success_ttl = Duration::from_secs(60);
    fx.pods(0, 0, 2, 0);
    fx.now = at(50);
    fx.apply();
    assert_eq!(fx.phase(), Phase::Succeeded);
    let d = fx.apply();
    assert_eq!(
        d.requeue_after,
        Some(Duration::from_secs(10)),
        "TTL anchored on deployment at t=0"
    );
    assert!(d.actions.is_empty());
    fx.now = at(60);
    let d = fx.apply();
    assert_eq!(d.actions.delete, vec![0, 1]);
    fx.all_gone();
    fx.apply();
    assert_eq!(
        fx.cond(ct::RESOURCES_DEPLOYED),
        ("False".into(), r::SUCCEEDED.into())
    );
    assert_eq!(
        fx.cond_message(ct::RESOURCES_DEPLOYED),
        "Time to live after success of 1m0s expired"
    );
    assert_eq!(fx.phase(), Phase::Succeeded);
}

fn failed() -> Fx {
    let mut fx = Fx::new().running();
    fx.obs.components[1] = ComponentObservation::Absent;
    fx.apply();
    assert_eq!(fx.phase(), Phase::Failed);
    fx.obs.components[1] = ComponentObservation::Present;
    fx
}

#[test]
fn failed_deletes_resources_and_releases_quota() {
    let mut fx = failed();
    let d = fx.apply();
    assert_eq!(d.actions.delete, vec![0, 1]);
    assert_eq!(
        fx.cond(ct::QUOTA_RESERVED).0,
        "True",
        "quota held until resources are gone"
    );
    fx.all_gone();
    fx.apply();
    assert_eq!(
        fx.cond(ct::RESOURCES_DEPLOYED),
        ("False".into(), r::FAILED.into())
    );
    assert_eq!(
        fx.cond_message(ct::RESOURCES_DEPLOYED),
        "Resources deleted for failed AppWrapper"
    );
    assert_eq!(
        fx.cond(ct::QUOTA_RESERVED),
        ("False".into(), r::FAILED.into())
    );
    // Failed never leaves Failed, not even when suspended.
    fx.spec.suspend = true;
    fx.apply();
    assert_eq!(fx.phase(), Phase::Failed);
}

#[test]
fn deletion_on_failure_grace_keeps_resources_for_debugging() {
    let mut fx = failed();
    fx.params.deletion_on_failure_grace = Duration::from_secs(300);
    let d = fx.apply();
    assert!(d.actions.is_empty());
    assert_eq!(
        fx.cond(ct::DELETING_RESOURCES),
        ("False".into(), r::DELETION_PAUSED.into())
    );
    assert!(
        fx.cond_message(ct::DELETING_RESOURCES)
            .contains("has value 5m0s")
    );
    assert_eq!(d.requeue_after, Some(Duration::from_secs(300)));
    fx.now = at(300);
    let d = fx.apply();
    assert_eq!(d.actions.delete, vec![0, 1]);
}

#[test]
fn suspend_skips_the_deletion_on_failure_pause() {
    let mut fx = failed();
    fx.params.deletion_on_failure_grace = Duration::from_secs(300);
    fx.spec.suspend = true;
    let d = fx.apply();
    assert_eq!(d.actions.delete, vec![0, 1]);
    fx.all_gone();
    fx.apply();
    assert_eq!(
        fx.cond_message(ct::RESOURCES_DEPLOYED),
        "Kueue forced resource deletion by suspending AppWrapper"
    );
}

#[test]
fn deleting_the_appwrapper_cleans_up_then_removes_the_finalizer() {
    let mut fx = Fx::new().running();
    fx.deleting = true;
    let d = fx.apply();
    assert_eq!(fx.phase(), Phase::Terminating);
    assert!(
        d.phase_change.is_none(),
        "Terminating is not counted in the phase metric"
    );
    assert_eq!(d.actions.delete, vec![0, 1]);
    assert_eq!(d.finalizer, FinalizerChange::None);
    fx.all_gone();
    let d = fx.apply();
    assert_eq!(d.finalizer, FinalizerChange::Remove);
    assert_eq!(
        fx.cond(ct::RESOURCES_DEPLOYED),
        ("False".into(), r::TERMINATING.into())
    );
    assert_eq!(
        fx.cond(ct::QUOTA_RESERVED),
        ("False".into(), r::TERMINATING.into())
    );
    // Without our finalizer there is nothing to do.
    fx.has_finalizer = false;
    let d = fx.step();
    assert!(d.actions.is_empty() && d.finalizer == FinalizerChange::None);
}

// ---- Cross-cutting --------------------------------------------------------------------------

#[test]
fn appwrappers_managed_by_another_controller_are_ignored() {
    let mut fx = Fx::new();
    fx.spec.managed_by = Some("kueue.x-k8s.io/multikueue".into());
    let d = fx.step();
    assert_eq!(d.status, AppWrapperStatus::default());
    assert!(d.actions.is_empty() && d.events.is_empty());
    fx.spec.managed_by = Some(lifeboat_api::appwrapper::constants::CONTROLLER_NAME.into());
    fx.apply();
    assert_eq!(fx.phase(), Phase::Suspended);
}

#[test]
fn malformed_annotations_are_reported_once_in_a_condition_and_an_event() {
    let mut fx = Fx::new();
    fx.problems = vec![AnnotationProblem {
        annotation: "workload.codeflare.dev.appwrapper/retryLimit",
        value: "abc".into(),
        reason: "not an integer; using the default".into(),
    }];
    let d = fx.apply();
    assert_eq!(
        fx.cond(CONDITION_INVALID_ANNOTATIONS),
        ("True".into(), REASON_MALFORMED_ANNOTATION.into())
    );
    assert!(
        fx.cond_message(CONDITION_INVALID_ANNOTATIONS)
            .contains("retryLimit")
    );
    assert!(
        d.events
            .iter()
            .any(|e| e.reason == REASON_MALFORMED_ANNOTATION)
    );
    let d = fx.apply();
    assert!(
        !d.events
            .iter()
            .any(|e| e.reason == REASON_MALFORMED_ANNOTATION),
        "reported once"
    );
    fx.problems.clear();
    fx.apply();
    assert!(fx.status.condition(CONDITION_INVALID_ANNOTATIONS).is_none());
}

#[test]
fn every_phase_change_is_recorded_with_an_event_and_at_most_20_kept() {
    let mut fx = Fx::new().running();
    let phases: Vec<Phase> = fx.status.transitions.iter().map(|t| t.phase).collect();
    assert_eq!(phases, [Phase::Suspended, Phase::Resuming, Phase::Running]);
    // Drive many resets to overflow the history.
    fx.params.retry_limit = 100;
    fx.params.failure_grace = Duration::ZERO;
    fx.params.retry_pause = Duration::ZERO;
    for round in 0..10 {
        fx.now = at(1000 * (round + 1));
        fx.obs.components = vec![ComponentObservation::Present, ComponentObservation::Present];
        fx.pods(0, 1, 0, 1);
        let d = fx.apply();
        assert_eq!(fx.phase(), Phase::Resetting);
        assert!(d.events.iter().any(|e| e.reason == "Resetting"));
        fx.all_gone();
        fx.apply();
        fx.apply();
        assert_eq!(fx.phase(), Phase::Resuming);
        fx.apply();
        fx.obs.create_results = Some(vec![
            Some(CreateResult::Created {
                name: "train".into(),
            }),
            Some(CreateResult::Created {
                name: "svc-abcde".into(),
            }),
        ]);
        let d = fx.step();
        fx.status = d.status;
        fx.obs.create_results = None;
        assert_eq!(fx.phase(), Phase::Running);
    }
    assert_eq!(fx.status.transitions.len(), 20);
    assert_eq!(fx.status.retries, 10);
    assert_eq!(fx.status.transitions.last().unwrap().phase, Phase::Running);
}

#[test]
fn generated_component_names_are_stable_and_valid() {
    let template = json!({"metadata": {"generateName": "job-"}});
    let a = component_name(&template, "uid-1", 0);
    assert_eq!(a, component_name(&template, "uid-1", 0));
    assert_ne!(a, component_name(&template, "uid-1", 1));
    assert_ne!(a, component_name(&template, "uid-2", 0));
    assert!(
        a.chars()
            .skip(4)
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    );
    assert_eq!(
        component_name(&json!({"metadata": {"name": "x"}}), "u", 0),
        "x"
    );
    assert_eq!(component_name(&json!({}), "u", 0), "");
}
