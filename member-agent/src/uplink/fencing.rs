//! Fencing: at most one copy of a workload whose cluster failover is `purgeMode: Directly`, across
//! a partition.
//!
//! An agent that has not reached the hub for its fencing period suspends the works whose purge
//! mode is `Directly`: the hub, on its side, recreates such a workload elsewhere only after the
//! cluster's lease plus that same period has passed (the periods are checked for equality at
//! registration). The agent lifts the fence once both a heartbeat and a full work snapshot got
//! through after the fence began: the snapshot says which works the hub still wants here (the
//! others are deleted, never resumed), the heartbeat tells the hub which works were suspended.
//!
//! [`FenceClock`] is the pure state machine (fed instants, unit-tested with a fake clock);
//! [`suspend`] says how one manifest is suspended.

use std::time::{Duration, Instant};

use lifeboat_api::protocol::WorkKey;
use serde_json::Value;

/// What a [`FenceClock`] step changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceChange {
    Nothing,
    /// The fencing period passed without contact: suspend the `Directly` works.
    Fenced,
    /// Contact and a fresh snapshot after the fence: apply the works as the hub sends them.
    Lifted,
}

/// When the agent last reached the hub, and whether it is fenced.
#[derive(Debug, Clone)]
pub struct FenceClock {
    period: Duration,
    last_contact: Instant,
    /// Since when the fence holds.
    fenced_since: Option<Instant>,
    /// A heartbeat and a full snapshot got through after `fenced_since`.
    heartbeat_after: bool,
    snapshot_after: bool,
}

impl FenceClock {
    /// A clock that starts as if the hub had just been reached (a new term is given a whole
    /// period to connect).
    pub fn new(period: Duration, now: Instant) -> Self {
        Self {
            period,
            last_contact: now,
            fenced_since: None,
            heartbeat_after: false,
            snapshot_after: false,
        }
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced_since.is_some()
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    /// When the fence falls if no contact comes before (`None` while fenced).
    pub fn deadline(&self) -> Option<Instant> {
        (!self.is_fenced()).then(|| self.last_contact + self.period)
    }

    /// A periodic check: fences once the period has passed since the last contact.
    pub fn tick(&mut self, now: Instant) -> FenceChange {
        if self.is_fenced() || now < self.last_contact + self.period {
            return FenceChange::Nothing;
        }
        self.fenced_since = Some(now);
        self.heartbeat_after = false;
        self.snapshot_after = false;
        FenceChange::Fenced
    }

    /// A heartbeat reached the hub (sent at `sent`: a call that started before the fence does
    /// not count as contact after it).
    pub fn heartbeat_ok(&mut self, sent: Instant) -> FenceChange {
        if sent > self.last_contact {
            self.last_contact = sent;
        }
        match self.fenced_since {
            Some(since) if sent >= since => {
                self.heartbeat_after = true;
                self.lift_if_ready()
            }
            _ => FenceChange::Nothing,
        }
    }

    /// A full work snapshot (requested at `requested`) completed.
    pub fn snapshot_complete(&mut self, requested: Instant) -> FenceChange {
        match self.fenced_since {
            Some(since) if requested >= since => {
                self.snapshot_after = true;
                self.lift_if_ready()
            }
            _ => FenceChange::Nothing,
        }
    }

    fn lift_if_ready(&mut self) -> FenceChange {
        if self.heartbeat_after && self.snapshot_after {
            self.fenced_since = None;
            FenceChange::Lifted
        } else {
            FenceChange::Nothing
        }
    }
}

/// The agent's fence, shared by the heartbeat, the work stream, the applier and the watchdog.
#[derive(Debug)]
pub struct Fence {
    clock: std::sync::Mutex<FenceClock>,
    /// The works suspended when the fence fell: what the heartbeats report until it lifts
    /// (even those the hub's snapshot has since removed).
    suspended: std::sync::Mutex<Vec<WorkKey>>,
    /// Wakes the work stream to reconnect for a full snapshot once fenced.
    pub resync: tokio::sync::Notify,
}

impl Fence {
    pub fn new(period: Duration) -> Self {
        Self {
            clock: std::sync::Mutex::new(FenceClock::new(period, Instant::now())),
            suspended: std::sync::Mutex::new(Vec::new()),
            resync: tokio::sync::Notify::new(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut FenceClock) -> T) -> T {
        f(&mut self.clock.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn is_fenced(&self) -> bool {
        self.with(|c| c.is_fenced())
    }

    pub fn period(&self) -> Duration {
        self.with(|c| c.period())
    }

    pub fn tick(&self, now: Instant) -> FenceChange {
        self.with(|c| c.tick(now))
    }

    pub fn heartbeat_ok(&self, sent: Instant) -> FenceChange {
        self.with(|c| c.heartbeat_ok(sent))
    }

    pub fn snapshot_complete(&self, requested: Instant) -> FenceChange {
        self.with(|c| c.snapshot_complete(requested))
    }

    /// Remembers the works the fence suspended.
    pub fn set_suspended(&self, keys: Vec<WorkKey>) {
        *self.suspended.lock().unwrap_or_else(|e| e.into_inner()) = keys;
    }

    /// The works to report as suspended: those of the current fence, none when not fenced.
    pub fn suspended(&self) -> Vec<WorkKey> {
        if self.is_fenced() {
            self.suspended
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        } else {
            Vec::new()
        }
    }
}

/// How a fenced work is kept from running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suspension {
    /// The manifest now asks the workload's controller to suspend it (its pods go, the object
    /// and its status stay).
    Suspended,
    /// The kind has no suspend switch: the object is deleted (and re-applied when the fence
    /// lifts, if the hub still wants it here).
    Delete,
}

/// Rewrites `manifest` so that applying it suspends the workload: `spec.suspend` for the kinds
/// that have it (AppWrapper, Job, JobSet, RayJob, RayCluster, MPIJob v2...), `spec.runPolicy.suspend` for the
/// Kubeflow training jobs, zero replicas for the replicated kinds.
pub fn suspend(manifest: &mut Value) -> Suspension {
    let api_version = manifest
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    let kind = manifest
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let group = group.to_string();
    let Some(spec) = manifest.get_mut("spec").and_then(Value::as_object_mut) else {
        return Suspension::Delete;
    };
    match (group.as_str(), kind.as_str()) {
        ("workload.codeflare.dev", "AppWrapper")
        | ("batch", "Job")
        | ("jobset.x-k8s.io", "JobSet")
        | ("ray.io", "RayJob")
        | ("ray.io", "RayCluster") => {
            spec.insert("suspend".into(), Value::Bool(true));
            Suspension::Suspended
        }
        ("kubeflow.org", "PyTorchJob" | "TFJob" | "XGBoostJob" | "PaddleJob" | "JAXJob") => {
            let run_policy = spec
                .entry("runPolicy")
                .or_insert_with(|| Value::Object(Default::default()));
            match run_policy.as_object_mut() {
                Some(p) => {
                    p.insert("suspend".into(), Value::Bool(true));
                    Suspension::Suspended
                }
                None => Suspension::Delete,
            }
        }
        ("apps", "Deployment" | "StatefulSet" | "ReplicaSet") => {
            spec.insert("replicas".into(), Value::from(0));
            Suspension::Suspended
        }
        _ => Suspension::Delete,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const PERIOD: Duration = Duration::from_secs(60);

    #[test]
    fn fenced_only_after_a_whole_period_without_contact() {
        let t0 = Instant::now();
        let mut clock = FenceClock::new(PERIOD, t0);
        assert_eq!(
            clock.tick(t0 + Duration::from_secs(59)),
            FenceChange::Nothing
        );
        assert_eq!(
            clock.heartbeat_ok(t0 + Duration::from_secs(30)),
            FenceChange::Nothing
        );
        // The heartbeat at 30 s pushed the fence to 90 s.
        assert_eq!(
            clock.tick(t0 + Duration::from_secs(89)),
            FenceChange::Nothing
        );
        assert_eq!(
            clock.deadline(),
            Some(t0 + Duration::from_secs(90)),
            "the fence falls a period after the last contact"
        );
        assert_eq!(
            clock.tick(t0 + Duration::from_secs(90)),
            FenceChange::Fenced
        );
        assert!(clock.is_fenced());
        assert_eq!(clock.deadline(), None);
        assert_eq!(
            clock.tick(t0 + Duration::from_secs(91)),
            FenceChange::Nothing,
            "fenced once"
        );
    }

    #[test]
    fn lifted_only_by_a_heartbeat_and_a_snapshot_both_after_the_fence() {
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let mut clock = FenceClock::new(PERIOD, t0);
        assert_eq!(clock.tick(at(60)), FenceChange::Fenced);
        // A heartbeat sent before the fence and answered after it is no contact after it.
        assert_eq!(clock.heartbeat_ok(at(59)), FenceChange::Nothing);
        assert!(clock.is_fenced());
        // Nor is a snapshot asked for before the fence.
        assert_eq!(clock.snapshot_complete(at(50)), FenceChange::Nothing);
        assert!(clock.is_fenced());
        // A heartbeat alone does not lift it: the hub may have moved the work meanwhile.
        assert_eq!(clock.heartbeat_ok(at(70)), FenceChange::Nothing);
        assert!(clock.is_fenced());
        assert_eq!(clock.snapshot_complete(at(71)), FenceChange::Lifted);
        assert!(!clock.is_fenced());
        assert_eq!(clock.deadline(), Some(at(130)));
    }

    #[test]
    fn the_snapshot_may_come_first() {
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let mut clock = FenceClock::new(PERIOD, t0);
        assert_eq!(clock.tick(at(60)), FenceChange::Fenced);
        assert_eq!(clock.snapshot_complete(at(61)), FenceChange::Nothing);
        assert_eq!(clock.heartbeat_ok(at(62)), FenceChange::Lifted);
        // Fenced again later: the old heartbeat and snapshot count for nothing.
        assert_eq!(clock.tick(at(122)), FenceChange::Fenced);
        assert_eq!(clock.heartbeat_ok(at(123)), FenceChange::Nothing);
        assert!(clock.is_fenced());
    }

    #[test]
    fn suspend_switches_per_kind() {
        let cases = [
            (
                json!({"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "spec": {"components": []}}),
                "/spec/suspend",
                json!(true),
            ),
            (
                json!({"apiVersion": "batch/v1", "kind": "Job", "spec": {"suspend": false}}),
                "/spec/suspend",
                json!(true),
            ),
            (
                json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "spec": {}}),
                "/spec/suspend",
                json!(true),
            ),
            (
                json!({"apiVersion": "ray.io/v1", "kind": "RayJob", "spec": {}}),
                "/spec/suspend",
                json!(true),
            ),
            (
                json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": {}}),
                "/spec/runPolicy/suspend",
                json!(true),
            ),
            (
                json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": {"runPolicy": {"backoffLimit": 3}}}),
                "/spec/runPolicy/suspend",
                json!(true),
            ),
            (
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 4}}),
                "/spec/replicas",
                json!(0),
            ),
            (
                json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "spec": {}}),
                "/spec/replicas",
                json!(0),
            ),
        ];
        for (mut manifest, pointer, want) in cases {
            let kind = manifest["kind"].clone();
            assert_eq!(suspend(&mut manifest), Suspension::Suspended, "{kind}");
            assert_eq!(manifest.pointer(pointer), Some(&want), "{kind}");
        }
        let mut policy = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": {"runPolicy": {"backoffLimit": 3}}});
        suspend(&mut policy);
        assert_eq!(
            policy["spec"]["runPolicy"]["backoffLimit"], 3,
            "other fields stay"
        );
    }

    #[test]
    fn kinds_without_a_switch_are_deleted() {
        for mut manifest in [
            json!({"apiVersion": "v1", "kind": "Pod", "spec": {"containers": []}}),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {}}),
            json!({"apiVersion": "example.com/v1", "kind": "Job", "spec": {}}),
            json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": {"runPolicy": 1}}),
        ] {
            let before = manifest.clone();
            assert_eq!(suspend(&mut manifest), Suspension::Delete, "{before}");
        }
    }
}
