//! Resetting: deletion (forceful after the grace), the pause, and the new deployment.

use super::*;

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
fn a_deletion_start_read_back_in_whole_seconds_never_shortens_the_forceful_grace() {
    let mut fx = resetting_after_failure();
    fx.params.forceful_deletion_grace = Duration::from_secs(3);
    fx.now = at(10) + Duration::from_millis(700); // deletion initiated at 10.95 s
    fx.apply();
    // The status comes back from the API server: the condition's time is 10 s, not 10.95 s.
    for c in &mut fx.status.conditions {
        c.last_transition_time.0 = whole(c.last_transition_time.0);
    }
    fx.obs.components = vec![ComponentObservation::Deleting, ComponentObservation::Absent];
    fx.obs.pods = PodSummary {
        total: 1,
        running: 1,
        ..Default::default()
    };
    // 13.9 s: 2.95 s after the true start (counted from 10 s, the grace would be over).
    fx.now = at(13) + Duration::from_millis(650);
    let d = fx.apply();
    assert!(!d.actions.force_delete_pods, "not before the grace");
    // The grace counts from the end of the written second: forceful after 14 s.
    fx.now = at(14);
    let d = fx.apply();
    assert!(d.actions.force_delete_pods);
}

#[test]
fn resetting_suspended_externally_goes_suspending() {
    let mut fx = resetting_after_failure();
    fx.spec.suspend = true;
    fx.apply();
    assert_eq!(fx.phase(), Phase::Suspending);
}
