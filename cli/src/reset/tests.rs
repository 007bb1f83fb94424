//! The reset request's exact API calls, against a mock client: a read of the binding, then a
//! merge patch of the reset-request annotation only; errors name the binding.

use lifeboat_runtime::mock::{ApiServer, Method};
use serde_json::{Value, json};

use super::*;

const PATH: &str =
    "/apis/work.lifeboat.dev/v1alpha1/namespaces/ml/resourcebindings/train-pytorchjob";

fn placed_on(clusters: &[&str]) -> Value {
    let clusters: Vec<_> = clusters.iter().map(|c| json!({"name": c})).collect();
    json!({
        "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
        "metadata": {"name": "train-pytorchjob", "namespace": "ml", "resourceVersion": "7"},
        "spec": {"resource": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "name": "train"}, "clusters": clusters}
    })
}

#[tokio::test]
async fn the_annotation_is_merged_in_with_a_fresh_value_for_the_single_placement() {
    let (client, mut server) = ApiServer::new();
    let ask = request(&client, "ml", "train-pytorchjob", None);
    let answer = async {
        server
            .next()
            .await
            .expect(Method::GET, PATH)
            .reply(200, placed_on(&["m1"]));
        let call = server.next().await.expect(Method::PATCH, PATH);
        assert_eq!(
            call.content_type.as_deref(),
            Some("application/merge-patch+json")
        );
        let value = call.body["metadata"]["annotations"][ANNOTATION_RESET_REQUEST]
            .as_str()
            .expect("the annotation's value")
            .to_string();
        assert_eq!(
            call.body,
            json!({"metadata": {"annotations": {ANNOTATION_RESET_REQUEST: value}}}),
            "only the annotation, no resourceVersion guard"
        );
        call.reply(200, placed_on(&["m1"]));
        value
    };
    let (asked, value) = tokio::join!(ask, answer);
    let asked = asked.expect("the reset is asked");
    assert_eq!(asked.cluster, "m1");
    assert_eq!(asked.value, value);
    assert!(value.starts_with("m1/"), "{value}");
}

#[tokio::test]
async fn a_missing_binding_a_wrong_cluster_and_a_failed_write_are_named() {
    let (client, mut server) = ApiServer::new();
    let ask = request(&client, "ml", "train-pytorchjob", None);
    let answer = async {
        server
            .next()
            .await
            .expect(Method::GET, PATH)
            .fail(404, "NotFound", "not found");
    };
    let (asked, ()) = tokio::join!(ask, answer);
    assert_eq!(
        asked.unwrap_err().to_string(),
        "ResourceBinding ml/train-pytorchjob not found"
    );

    let ask = request(&client, "ml", "train-pytorchjob", Some("m3"));
    let answer = async {
        server
            .next()
            .await
            .expect(Method::GET, PATH)
            .reply(200, placed_on(&["m1", "m2"]));
    };
    let (asked, ()) = tokio::join!(ask, answer);
    let error = asked.unwrap_err();
    assert!(
        matches!(
            &error,
            ResetError::Placement(ManualResetError::NotPlacedThere { .. })
        ),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "--cluster m3: ResourceBinding ml/train-pytorchjob is not placed there (spec.clusters: m1, m2)"
    );
    assert!(
        server.is_idle().await,
        "nothing written for a wrong cluster"
    );

    let ask = request(&client, "ml", "train-pytorchjob", Some("m2"));
    let answer = async {
        server
            .next()
            .await
            .expect(Method::GET, PATH)
            .reply(200, placed_on(&["m1", "m2"]));
        server
            .next()
            .await
            .expect(Method::PATCH, PATH)
            .fail(403, "Forbidden", "no patch for you");
    };
    let (asked, ()) = tokio::join!(ask, answer);
    let error = asked.unwrap_err();
    let ResetError::Kube { source, .. } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(source.code(), Some(403));
    assert!(
        error.to_string().starts_with(
            "ResourceBinding ml/train-pytorchjob: setting the reset-request annotation: "
        ),
        "{error}"
    );
}
