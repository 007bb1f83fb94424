//! Failed: resources deleted, after the DeletionOnFailureGracePeriod unless suspended.

use super::*;

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
