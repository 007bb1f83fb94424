//! Suspended: stays while `spec.suspend` is true; resumes with quota when it turns false.

use super::*;

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
