//! Running: each numbered rule of `running()`.

use super::*;

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
