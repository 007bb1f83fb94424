//! The state machine, transition by transition (reference §2.3–§2.9), with a fake clock: the
//! fixture here, the tests of each phase in the file of the same name.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use lifeboat_api::appwrapper::constants::{condition_types as ct, reasons as r};
use lifeboat_api::appwrapper::{AppWrapperPhase as Phase, AppWrapperSpec, AppWrapperStatus};
use serde_json::json;

use super::*;
use crate::config::FaultToleranceConfig;
use crate::params::{AnnotationProblem, Params};
use crate::pods::{NodeHit, PodFailure, PodSummary};

mod cross_cutting;
mod empty;
mod failed;
mod resetting;
mod resuming;
mod running;
mod succeeded;
mod suspended;
mod suspending;
mod terminating;

const T0: i64 = 1_800_000_000;

/// `seconds` after the fixture's start, a quarter into its second: a clock's reading has a
/// fraction (a time without one is what the API server gives back, see `whole`).
fn at(seconds: i64) -> Timestamp {
    Timestamp::new(T0 + seconds, 250_000_000).expect("valid timestamp")
}

/// `t` as the API server stores it: whole seconds.
fn whole(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).expect("valid timestamp")
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

    fn input(&self) -> Input<'_> {
        Input {
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
        }
    }

    fn step(&self) -> Decision {
        step(&self.input())
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
