//! Empty: component identities, then Suspended.

use super::*;

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
fn a_new_appwrapper_reaches_its_creates_in_one_reconcile() {
    let mut fx = Fx::new();
    fx.has_finalizer = false;
    let (d, changes) = steps(&fx.input());
    assert_eq!(
        changes,
        [
            (Phase::Empty, Phase::Suspended),
            (Phase::Suspended, Phase::Resuming)
        ]
    );
    assert_eq!(d.status.phase, Phase::Resuming);
    // The finalizer the Suspended step asked for is kept: it is added before the creates.
    assert_eq!(d.finalizer, FinalizerChange::Add);
    assert_eq!(d.actions.create, [0, 1]);
    let reasons: Vec<&str> = d.events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, ["Suspended", "Resuming"]);
    // The same as one step at a time, transitions included.
    let mut one_by_one = Fx::new();
    one_by_one.has_finalizer = false;
    one_by_one.apply();
    one_by_one.has_finalizer = true;
    one_by_one.apply();
    let d2 = one_by_one.apply();
    assert_eq!(d.status, d2.status);
    assert_eq!(d2.actions.create, [0, 1]);
}

#[test]
fn a_suspended_appwrapper_stops_at_suspended() {
    let mut fx = Fx::new();
    fx.spec = spec(true);
    let (d, changes) = steps(&fx.input());
    assert_eq!(changes, [(Phase::Empty, Phase::Suspended)]);
    assert_eq!(d.status.phase, Phase::Suspended);
    assert!(d.actions.create.is_empty());
    assert_eq!(d.finalizer, FinalizerChange::None);
}
