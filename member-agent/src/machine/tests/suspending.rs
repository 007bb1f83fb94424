//! Suspending: deletion and quota release.

use super::*;

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
