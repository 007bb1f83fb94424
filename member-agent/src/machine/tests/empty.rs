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
