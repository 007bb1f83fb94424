//! Every upstream sample AppWrapper must be accepted unchanged: it deserialises into our type
//! without losing a field, fits the generated CRD schema (nothing pruned, types right), and
//! passes create validation.

mod common;

use lifeboat_api::appwrapper::validation::validate_create;
use lifeboat_api::appwrapper::{AppWrapper, podsets};
use serde_json::Value;

#[test]
fn every_sample_is_accepted_unchanged() {
    let schema = common::appwrapper_schema();
    let files = common::yaml_files("appwrapper-samples");
    assert_eq!(
        files.len(),
        10,
        "the upstream samples folder has 10 AppWrappers"
    );
    for (name, text) in files {
        let input: Value = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let aw: AppWrapper =
            serde_json::from_value(input.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));

        // Field for field: serialising our type gives back exactly the input.
        let round_trip = serde_json::to_value(&aw).unwrap();
        assert_eq!(round_trip, input, "{name}: a field was lost or changed");

        let mut problems = Vec::new();
        common::schema_problems(&schema, &input, "", &mut problems);
        assert!(problems.is_empty(), "{name}: {problems:?}");

        validate_create(&aw.spec, "default")
            .unwrap_or_else(|e| panic!("{name}: rejected by create validation: {e}"));
    }
}

#[test]
fn sample_pod_counts_match_the_reference() {
    // reference §7: JobSet 4 + 1 pods, LeaderWorkerSet declared 2 + 3, PyTorchJob 1 + 2, ...
    let expected = [
        ("wrapped-deployment.yaml", 2),
        ("wrapped-failing-job.yaml", 1),
        ("wrapped-failing-pod.yaml", 1),
        ("wrapped-failing-pytorch-job.yaml", 2),
        ("wrapped-gpu-job.yaml", 1),
        ("wrapped-job.yaml", 1),
        ("wrapped-jobset.yaml", 5),
        ("wrapped-leader-worker-set.yaml", 5),
        ("wrapped-pod.yaml", 1),
        ("wrapped-pytorch-job.yaml", 3),
    ];
    let files = common::yaml_files("appwrapper-samples");
    for (name, count) in expected {
        let text = &files.iter().find(|(n, _)| n == name).expect(name).1;
        let aw: AppWrapper = serde_saphyr::from_str(text).unwrap();
        let pods: i64 = aw
            .spec
            .components
            .iter()
            .map(|c| podsets::expected_pod_count(&podsets::effective_pod_sets(c)))
            .sum();
        assert_eq!(pods, count, "{name}");
    }
}
