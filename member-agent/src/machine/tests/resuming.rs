//! Resuming: identities before creates, and the create results (fatal, retryable, quota).

use super::*;

#[test]
fn resuming_records_identities_before_creating_then_runs() {
    let mut fx = Fx::new().resuming();
    let d = fx.apply();
    assert_eq!(d.actions.create, vec![0, 1]);
    for cs in &fx.status.component_status {
        let c = &cs.conditions[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("Unknown", r::COMPONENT_CREATION_INITIATED)
        );
    }
    fx.obs.create_results = Some(vec![
        Some(CreateResult::Created {
            name: "train".into(),
        }),
        Some(CreateResult::Created {
            name: "svc-xyz12".into(),
        }),
    ]);
    let d = fx.apply();
    assert_eq!(fx.phase(), Phase::Running);
    assert_eq!(d.phase_change, Some((Phase::Resuming, Phase::Running)));
    assert_eq!(fx.status.component_status[1].name, "svc-xyz12");
    assert_eq!(
        fx.status.component_status[0].conditions[0].reason,
        r::COMPONENT_CREATED_SUCCESSFULLY
    );
}

#[test]
fn resuming_suspended_externally_goes_suspending() {
    let mut fx = Fx::new().resuming();
    fx.spec.suspend = true;
    let d = fx.apply();
    assert_eq!(fx.phase(), Phase::Suspending);
    assert!(d.events.iter().any(|e| {
        e.note
            .contains("Externally suspended while in the Resuming phase")
    }));
}

#[test]
fn fatal_create_error_fails_without_retry() {
    let mut fx = Fx::new().resuming();
    fx.apply();
    fx.obs.create_results = Some(vec![
        Some(CreateResult::Created {
            name: "train".into(),
        }),
        Some(CreateResult::Fatal(
            "Service \"svc\" is invalid: spec.ports: Required value".into(),
        )),
    ]);
    fx.apply();
    assert_eq!(fx.phase(), Phase::Failed);
    assert_eq!(fx.status.retries, 0);
    assert_eq!(
        fx.cond(ct::UNHEALTHY),
        ("True".into(), r::CREATE_FAILED.into())
    );
    assert!(
        fx.cond_message(ct::UNHEALTHY)
            .starts_with("[Application] component 1")
    );
    // Quota and resources stay until the Failed phase has deleted what was created.
    assert_eq!(fx.cond(ct::QUOTA_RESERVED).0, "True");
    assert_eq!(fx.cond(ct::RESOURCES_DEPLOYED).0, "True");
}

#[test]
fn retryable_create_error_retries_within_admission_grace_then_resets() {
    let mut fx = Fx::new().resuming();
    fx.apply();
    let retry = |fx: &mut Fx| {
        fx.obs.create_results = Some(vec![
            Some(CreateResult::Created {
                name: "train".into(),
            }),
            Some(CreateResult::Retryable(
                "etcdserver: request timed out".into(),
            )),
        ]);
        fx.apply()
    };
    let d = retry(&mut fx);
    assert_eq!(fx.phase(), Phase::Resuming);
    assert_eq!(d.requeue_after, Some(CREATE_RETRY));
    // The next pass creates the failed component again (and only it).
    let d = fx.apply();
    assert_eq!(d.actions.create, vec![1]);
    fx.now = at(61);
    retry(&mut fx);
    assert_eq!(fx.phase(), Phase::Resetting);
    assert_eq!(fx.status.retries, 1);
    assert_eq!(
        fx.cond(ct::UNHEALTHY),
        ("True".into(), r::CREATE_FAILED.into())
    );
}

#[test]
fn quota_errors_are_capacity_failures() {
    let mut fx = Fx::new().resuming();
    fx.params.admission_grace = Duration::ZERO;
    fx.apply();
    fx.obs.create_results = Some(vec![
        Some(CreateResult::Retryable(
            "pods \"x\" is forbidden: exceeded quota: gpu-quota".into(),
        )),
        None,
    ]);
    fx.now = at(1);
    fx.apply();
    assert!(fx.cond_message(ct::UNHEALTHY).starts_with("[Capacity]"));
}
