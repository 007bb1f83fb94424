//! Every legacy AppWrapper in testdata/mcad-legacy converts to a v1beta2 AppWrapper that fits
//! the CRD schema and passes create validation, with the mapped annotations, without MCAD's
//! placeholder labels, and with a warning for every setting that did not carry over.

// Test helper functions outside #[test] bodies: panicking on a broken fixture is the point.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use lifeboat_api::appwrapper::AppWrapper;
use lifeboat_api::appwrapper::constants::annotations;
use lifeboat_api::appwrapper::validation::validate_create;
use lifeboat_api::legacy::{self, Conversion, PLACEHOLDER_LABEL};

struct Expected {
    name: &'static str,
    components: usize,
    annotations: &'static [(&'static str, &'static str)],
    warnings: &'static [&'static str],
}

const GPU_REQUESTS: &str =
    "spec.resources.GenericItems[0].custompodresources[0].requests[nvidia.com/gpu]";

/// Per file, per document: the expected conversion, or `None` for a rejected document.
fn expectations() -> BTreeMap<&'static str, Vec<Option<Expected>>> {
    BTreeMap::from([
        (
            "appwrapper-podgroup-sample.yaml",
            vec![Some(Expected {
                name: "appwrapper-podgroup-sample",
                components: 3,
                annotations: &[(annotations::RETRY_LIMIT, "5")],
                warnings: &["spec.priority"],
            })],
        ),
        (
            "appwrapper-sample.yaml",
            vec![Some(Expected {
                name: "appwrapper-sample",
                components: 2,
                annotations: &[(annotations::RETRY_LIMIT, "5")],
                warnings: &["spec.priority"],
            })],
        ),
        // GenericItems: [] has no v1beta2 form (1..8 pod specs).
        ("kuttl-01-install.yaml", vec![None]),
        (
            "kuttl-02-install.yaml",
            vec![Some(Expected {
                name: "aw-02",
                components: 1,
                annotations: &[],
                warnings: &[],
            })],
        ),
        (
            "kuttl-03-install.yaml",
            vec![Some(Expected {
                name: "aw-03",
                components: 1,
                annotations: &[],
                warnings: &[],
            })],
        ),
        (
            "kuttl-04-install.yaml",
            vec![
                Some(Expected {
                    name: "aw-04",
                    components: 1,
                    annotations: &[],
                    warnings: &[GPU_REQUESTS],
                }),
                Some(Expected {
                    name: "aw-041",
                    components: 1,
                    annotations: &[],
                    warnings: &[
                        "spec.resources.GenericItems[0].custompodresources",
                        GPU_REQUESTS,
                    ],
                }),
            ],
        ),
        (
            "kuttl-06-install.yaml",
            vec![Some(Expected {
                name: "aw-06",
                components: 1,
                annotations: &[],
                warnings: &[GPU_REQUESTS],
            })],
        ),
    ])
}

fn check(file: &str, conversion: &Conversion, expected: &Expected) {
    let aw = &conversion.appwrapper;
    assert_eq!(aw.metadata.name.as_deref(), Some(expected.name), "{file}");
    assert_eq!(aw.spec.components.len(), expected.components, "{file}");
    assert!(aw.status.is_none());

    // Survives serialisation as v1beta2 and fits the CRD schema.
    let json = serde_json::to_value(aw).unwrap();
    assert_eq!(json["apiVersion"], "workload.codeflare.dev/v1beta2");
    let back: AppWrapper = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(&back, aw, "{file}");
    let yaml = serde_saphyr::to_string(aw).unwrap();
    let reparsed: AppWrapper = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(&reparsed, aw, "{file}: YAML round trip");
    let mut problems = Vec::new();
    common::schema_problems(&common::appwrapper_schema(), &json, "", &mut problems);
    assert!(problems.is_empty(), "{file}: {problems:?}");
    let namespace = aw.metadata.namespace.as_deref().unwrap_or("default");
    validate_create(&aw.spec, namespace).unwrap_or_else(|e| panic!("{file}: {e}"));

    assert!(
        !json.to_string().contains(PLACEHOLDER_LABEL),
        "{file}: placeholder label left in {json}"
    );
    let got = aw.metadata.annotations.clone().unwrap_or_default();
    let want: BTreeMap<String, String> = expected
        .annotations
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(got, want, "{file}");
    let warned: Vec<&str> = conversion
        .warnings
        .iter()
        .map(|w| w.field.as_str())
        .collect();
    assert_eq!(
        warned, expected.warnings,
        "{file}: {:?}",
        conversion.warnings
    );
    for w in &conversion.warnings {
        assert!(!w.reason.is_empty());
    }
}

#[test]
fn every_legacy_file_converts_as_expected() {
    let files = common::yaml_files("mcad-legacy");
    let expectations = expectations();
    assert_eq!(
        files.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        expectations.keys().copied().collect::<Vec<_>>(),
        "a legacy file without expectations (or the reverse)"
    );
    for (file, text) in &files {
        let docs = legacy::parse_documents(text).unwrap_or_else(|e| panic!("{file}: {e}"));
        let expected = &expectations[file.as_str()];
        assert_eq!(docs.len(), expected.len(), "{file}: documents");
        for (doc, expected) in docs.iter().zip(expected) {
            match (legacy::convert(doc), expected) {
                (Ok(conversion), Some(expected)) => check(file, &conversion, expected),
                (Err(err), None) => {
                    assert_eq!(err.0[0].field, "spec.resources.GenericItems", "{file}");
                }
                (Ok(c), None) => panic!("{file}: expected a rejection, got {:?}", c.appwrapper),
                (Err(e), Some(_)) => panic!("{file}: {e}"),
            }
        }
    }
}

#[test]
fn the_seed_example_converts() {
    // seeds/004: a Job with completionstatus and the placeholder label, plus MCAD v2 requeuing.
    let text = r#"
apiVersion: workload.codeflare.dev/v1beta1
kind: AppWrapper
metadata:
  name: appwrapper-sample
spec:
  priority: 5
  schedulingSpec:
    minAvailable: 2
    requeuing:
      maxNumRequeuings: 5
      timeInSeconds: 300
      forceDeletionTimeInSeconds: 120
      pauseTimeInSeconds: 300
  resources:
    GenericItems:
    - replicas: 1
      completionstatus: Complete
      custompodresources:
      - requests:
          memory: 10Mi
          cpu: 10m
        replicas: 1
      generictemplate:
        apiVersion: batch/v1
        kind: Job
        metadata:
          namespace: default
          name: sample-job
        spec:
          parallelism: 1
          completions: 1
          template:
            metadata:
              labels:
                appwrapper.mcad.ibm.com: placeholder
            spec:
              restartPolicy: Never
              containers:
                - name: busybox
                  image: quay.io/project-codeflare/busybox
                  imagePullPolicy: IfNotPresent
                  command: ["sh", "-c", "sleep 10"]
                  resources:
                    requests:
                      memory: 10Mi
                      cpu: 10m
"#;
    let docs = legacy::parse_documents(text).unwrap();
    let out = legacy::convert(&docs[0]).unwrap();
    let a = out.appwrapper.metadata.annotations.clone().unwrap();
    assert_eq!(a[annotations::RETRY_LIMIT], "5");
    assert_eq!(a[annotations::ADMISSION_GRACE_PERIOD], "300s");
    assert_eq!(a[annotations::WARMUP_GRACE_PERIOD], "300s");
    assert_eq!(a[annotations::FORCEFUL_DELETION_GRACE_PERIOD], "120s");
    assert_eq!(a[annotations::RETRY_PAUSE_PERIOD], "300s");
    let fields: Vec<&str> = out.warnings.iter().map(|w| w.field.as_str()).collect();
    assert_eq!(
        fields,
        vec![
            "spec.priority",
            "spec.resources.GenericItems[0].completionstatus",
            "spec.resources.GenericItems[0].replicas",
            "spec.schedulingSpec.minAvailable",
            "metadata.namespace",
        ]
    );
    let template = &out.appwrapper.spec.components[0].template;
    assert!(template["spec"]["template"].get("metadata").is_some());
    assert!(
        template["spec"]["template"]["metadata"]
            .get("labels")
            .is_none()
    );
}
