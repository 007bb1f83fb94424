//! What holds in every phase: `managedBy`, annotation problems, the transition record,
//! component names.

use super::*;

#[test]
fn appwrappers_managed_by_another_controller_are_ignored() {
    let mut fx = Fx::new();
    fx.spec.managed_by = Some("kueue.x-k8s.io/multikueue".into());
    let d = fx.step();
    assert_eq!(d.status, AppWrapperStatus::default());
    assert!(d.actions.is_empty() && d.events.is_empty());
    fx.spec.managed_by = Some(lifeboat_api::appwrapper::constants::CONTROLLER_NAME.into());
    fx.apply();
    assert_eq!(fx.phase(), Phase::Suspended);
}

#[test]
fn malformed_annotations_are_reported_once_in_a_condition_and_an_event() {
    let mut fx = Fx::new();
    fx.problems = vec![AnnotationProblem {
        annotation: "workload.codeflare.dev.appwrapper/retryLimit",
        value: "abc".into(),
        reason: "not an integer; using the default".into(),
    }];
    let d = fx.apply();
    assert_eq!(
        fx.cond(CONDITION_INVALID_ANNOTATIONS),
        ("True".into(), REASON_MALFORMED_ANNOTATION.into())
    );
    assert!(
        fx.cond_message(CONDITION_INVALID_ANNOTATIONS)
            .contains("retryLimit")
    );
    assert!(
        d.events
            .iter()
            .any(|e| e.reason == REASON_MALFORMED_ANNOTATION)
    );
    let d = fx.apply();
    assert!(
        !d.events
            .iter()
            .any(|e| e.reason == REASON_MALFORMED_ANNOTATION),
        "reported once"
    );
    fx.problems.clear();
    fx.apply();
    assert!(fx.status.condition(CONDITION_INVALID_ANNOTATIONS).is_none());
}

#[test]
fn every_phase_change_is_recorded_with_an_event_and_at_most_20_kept() {
    let mut fx = Fx::new().running();
    let phases: Vec<Phase> = fx.status.transitions.iter().map(|t| t.phase).collect();
    assert_eq!(phases, [Phase::Suspended, Phase::Resuming, Phase::Running]);
    // Drive many resets to overflow the history.
    fx.params.retry_limit = 100;
    fx.params.failure_grace = Duration::ZERO;
    fx.params.retry_pause = Duration::ZERO;
    for round in 0..10 {
        fx.now = at(1000 * (round + 1));
        fx.obs.components = vec![ComponentObservation::Present, ComponentObservation::Present];
        fx.pods(0, 1, 0, 1);
        let d = fx.apply();
        assert_eq!(fx.phase(), Phase::Resetting);
        assert!(d.events.iter().any(|e| e.reason == "Resetting"));
        fx.all_gone();
        fx.apply();
        fx.apply();
        assert_eq!(fx.phase(), Phase::Resuming);
        fx.apply();
        fx.obs.create_results = Some(vec![
            Some(CreateResult::Created {
                name: "train".into(),
            }),
            Some(CreateResult::Created {
                name: "svc-abcde".into(),
            }),
        ]);
        let d = fx.step();
        fx.status = d.status;
        fx.obs.create_results = None;
        assert_eq!(fx.phase(), Phase::Running);
    }
    assert_eq!(fx.status.transitions.len(), 20);
    assert_eq!(fx.status.retries, 10);
    assert_eq!(fx.status.transitions.last().unwrap().phase, Phase::Running);
}

#[test]
fn generated_component_names_are_stable_and_valid() {
    let template = json!({"metadata": {"generateName": "job-"}});
    let a = component_name(&template, "uid-1", 0);
    assert_eq!(a, component_name(&template, "uid-1", 0));
    assert_ne!(a, component_name(&template, "uid-1", 1));
    assert_ne!(a, component_name(&template, "uid-2", 0));
    assert!(
        a.chars()
            .skip(4)
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    );
    assert_eq!(
        component_name(&json!({"metadata": {"name": "x"}}), "u", 0),
        "x"
    );
    assert_eq!(component_name(&json!({}), "u", 0), "");
}
