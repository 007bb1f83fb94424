//! Succeeded: resources deleted after the time to live.

use super::*;

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
