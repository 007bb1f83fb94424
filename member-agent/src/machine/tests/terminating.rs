//! Terminating: cleanup, then the finalizer goes.

use super::*;

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
