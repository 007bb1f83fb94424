//! The binder's exact API calls, against a mock client: the spec by server-side apply (field
//! manager `lifeboat-hub`, forced, guarded by the resourceVersion it was computed from), a 409
//! answer as a conflict to retry, the scheduler's status fields (field manager
//! `lifeboat-hub/scheduler`, forced).

use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::store;
use lifeboat_runtime::mock::{ApiServer, Method};
use serde_json::json;

use super::*;
use crate::binding::binder::metrics::BinderMetrics;
use crate::binding::detector::TEMPLATE_KINDS;
use crate::binding::placement::SchedulerPlacer;
use crate::interpreters::Interpreters;
use lifeboat_interpreter::{Runtime, RuntimeConfig};

const BINDING_PATH: &str =
    "/apis/work.lifeboat.dev/v1alpha1/namespaces/ml/resourcebindings/train-appwrapper";

fn binder(client: kube::Client) -> Binder {
    let caches = Caches {
        templates: Arc::new(Templates::new()),
        policies: store().0,
        cluster_policies: store().0,
        bindings: store().0,
        clusters: store().0,
    };
    let builtin = Interpreters::builtin(Arc::new(Runtime::new(RuntimeConfig::default())))
        .expect("the built-in interpreters");
    let interpreters = InterpreterHandle::new(Interpreters::layered(builtin, &[]).0);
    Binder::new(
        client,
        caches,
        interpreters,
        Arc::new(SchedulerPlacer::new(
            &lifeboat_scheduler::SchedulerConfig::default(),
        )),
        Arc::new(WorkStore::new("e1")),
        BinderMetrics::new(&prometheus::Registry::new()).expect("binder metrics"),
    )
}

fn appwrapper_kind() -> &'static TemplateKind {
    TEMPLATE_KINDS
        .iter()
        .find(|k| k.kind == "AppWrapper")
        .expect("AppWrapper is a template kind")
}

fn template() -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
        "metadata": {"name": "train", "namespace": "ml", "uid": "template-uid"},
        "spec": {"components": []}
    }))
    .expect("a template")
}

fn policy() -> AnyPolicy {
    AnyPolicy::Namespaced(
        serde_json::from_value(json!({
            "apiVersion": "policy.lifeboat.dev/v1alpha1", "kind": "PropagationPolicy",
            "metadata": {"name": "gpu", "namespace": "ml", "generation": 3},
            "spec": {"resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2",
                "kind": "AppWrapper"}]}
        }))
        .expect("a policy"),
    )
}

fn spec(cluster: &str) -> Value {
    json!({"resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
        "namespace": "ml", "name": "train", "uid": "template-uid"},
        "replicas": 1, "clusters": [{"name": cluster, "replicas": 1}]})
}

fn stored(resource_version: &str, generation: i64, cluster: &str) -> ResourceBinding {
    serde_json::from_value(json!({
        "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
        "metadata": {"name": "train-appwrapper", "namespace": "ml", "uid": "binding-uid",
            "resourceVersion": resource_version, "generation": generation},
        "spec": spec(cluster)
    }))
    .expect("a binding")
}

/// The query's parameters, in the order kube sends them (form-encoded).
fn query(uri: &str) -> Vec<String> {
    uri.split_once('?')
        .map(|(_, q)| {
            q.split('&')
                .filter(|p| !p.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + second).expect("a time"))
}

/// The binder's spec write of the binding, placed on member-1, moved to member-2.
async fn move_to_member_2(
    binder: &Binder,
    existing: ResourceBinding,
) -> Result<Arc<ResourceBinding>, BindError> {
    let desired: ResourceBindingSpec = serde_json::from_value(spec("member-2")).expect("a spec");
    binder
        .apply_spec(
            appwrapper_kind(),
            &template(),
            Some(&existing),
            "train-appwrapper",
            desired,
            &policy(),
        )
        .await
}

#[tokio::test]
async fn the_spec_is_applied_forced_as_lifeboat_hub_with_the_version_it_was_computed_from() {
    let (client, mut server) = ApiServer::new();
    let binder = binder(client);
    let write = move_to_member_2(&binder, stored("41", 1, "member-1"));
    let answer = async {
        let call = server.next().await.expect(Method::PATCH, BINDING_PATH);
        assert_eq!(
            query(&call.uri),
            ["force=true", "fieldManager=lifeboat-hub"]
        );
        assert_eq!(
            call.content_type.as_deref(),
            Some("application/apply-patch+yaml")
        );
        assert_eq!(
            call.body,
            json!({
                "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
                "metadata": {
                    "name": "train-appwrapper", "namespace": "ml",
                    "labels": {LABEL_POLICY_NAME: "ml.gpu"},
                    "ownerReferences": [{"apiVersion": "workload.codeflare.dev/v1beta2",
                        "kind": "AppWrapper", "name": "train", "uid": "template-uid",
                        "controller": true, "blockOwnerDeletion": false}],
                    "resourceVersion": "41",
                },
                "spec": spec("member-2"),
            })
        );
        call.reply(
            200,
            serde_json::to_value(stored("42", 2, "member-2")).expect("serializable"),
        );
    };
    let (written, ()) = tokio::join!(write, answer);
    let written = written.expect("the spec is written");
    assert_eq!(written.metadata.resource_version.as_deref(), Some("42"));
    assert_eq!(written.spec.clusters[0].name, "member-2");
}

#[tokio::test]
async fn a_conflict_on_the_spec_write_is_a_conflict_to_retry_not_an_api_failure() {
    let (client, mut server) = ApiServer::new();
    let binder = binder(client);
    let write = move_to_member_2(&binder, stored("41", 1, "member-1"));
    let answer = async {
        let call = server.next().await.expect(Method::PATCH, BINDING_PATH);
        assert_eq!(call.body["metadata"]["resourceVersion"], "41");
        call.fail(
            409,
            "Conflict",
            "Operation cannot be fulfilled on resourcebindings.work.lifeboat.dev \"train-appwrapper\": the object has been modified; please apply your changes to the latest version and try again",
        );
    };
    let (written, ()) = tokio::join!(write, answer);
    let error = written.expect_err("a conflict fails the write");
    assert!(matches!(error, BindError::Conflict), "{error:?}");
    assert_eq!(error.metric_label(), "conflict");
}

#[tokio::test]
async fn an_unchanged_spec_sends_nothing() {
    let (client, mut server) = ApiServer::new();
    let binder = binder(client);
    let mut existing = stored("41", 1, "member-1");
    existing.metadata.labels = Some([(LABEL_POLICY_NAME.to_string(), "ml.gpu".to_string())].into());
    existing.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "workload.codeflare.dev/v1beta2".into(),
        kind: "AppWrapper".into(),
        name: "train".into(),
        uid: "template-uid".into(),
        controller: Some(true),
        block_owner_deletion: Some(false),
    }]);
    let desired = existing.spec.clone();
    let written = binder
        .apply_spec(
            appwrapper_kind(),
            &template(),
            Some(&existing),
            "train-appwrapper",
            desired,
            &policy(),
        )
        .await
        .expect("nothing to write");
    assert_eq!(written.metadata.resource_version.as_deref(), Some("41"));
    assert!(server.is_idle().await, "no request for an unchanged spec");
}

#[tokio::test]
async fn the_scheduler_status_is_applied_forced_as_lifeboat_hub_scheduler() {
    let (client, mut server) = ApiServer::new();
    let binder = binder(client);
    let binding = stored("42", 2, "member-2");
    let now = at(0);
    let scheduled = Ok(());
    let policy = policy();
    let write = binder.apply_status(&binding, Some(&scheduled), Some(&policy), &[], &now);
    let answer = async {
        let call = server
            .next()
            .await
            .expect(Method::PATCH, &format!("{BINDING_PATH}/status"));
        assert_eq!(
            query(&call.uri),
            ["force=true", "fieldManager=lifeboat-hub%2Fscheduler"]
        );
        assert_eq!(
            call.content_type.as_deref(),
            Some("application/apply-patch+yaml")
        );
        let body = &call.body;
        assert_eq!(
            (&body["apiVersion"], &body["kind"], &body["metadata"]),
            (
                &json!("work.lifeboat.dev/v1alpha1"),
                &json!("ResourceBinding"),
                &json!({"name": "train-appwrapper", "namespace": "ml"})
            )
        );
        assert!(
            body.get("spec").is_none(),
            "the status write carries no spec"
        );
        let status = body["status"].as_object().expect("a status");
        let mut fields: Vec<&str> = status.keys().map(String::as_str).collect();
        fields.sort();
        assert_eq!(
            fields,
            [
                "conditions",
                "lastScheduledTime",
                "rejectedClusters",
                "schedulerObservedGeneration"
            ]
        );
        assert_eq!(status["schedulerObservedGeneration"], 2);
        assert_eq!(status["lastScheduledTime"], json!(now));
        assert_eq!(status["rejectedClusters"], json!([]));
        let conditions: Vec<(&str, &str, &str)> = status["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .map(|c| {
                (
                    c["type"].as_str().unwrap_or_default(),
                    c["status"].as_str().unwrap_or_default(),
                    c["reason"].as_str().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            conditions,
            [
                (CONDITION_SCHEDULED, "True", REASON_SUCCESS),
                (CONDITION_POLICY_BOUND, "True", "PolicyMatched")
            ]
        );
        assert_eq!(status["conditions"][1]["message"], "placed by ml.gpu");
        call.reply(
            200,
            serde_json::to_value(stored("43", 2, "member-2")).expect("serializable"),
        );
    };
    let (written, ()) = tokio::join!(write, answer);
    written.expect("the status is written");
}
