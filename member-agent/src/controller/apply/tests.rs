//! The apply step's exact API calls, against a mock client: resourceVersion preconditions on
//! every write, 404 on finalizer removal is success, 409 is a conflict, creates are classified.

use lifeboat_api::appwrapper::AppWrapper;
use lifeboat_api::appwrapper::constants::FINALIZER;
use serde_json::{Value, json};

use super::*;
use crate::controller::mock::{ApiServer, Method, context};

const AW_PATH: &str = "/apis/workload.codeflare.dev/v1beta2/namespaces/team/appwrappers/train";

fn appwrapper(finalizers: &[&str]) -> AppWrapper {
    serde_json::from_value(json!({
        "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
        "metadata": {"name": "train", "namespace": "team", "uid": "uid-1",
            "resourceVersion": "7", "finalizers": finalizers},
        "spec": {"components": [{"template": {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train-job"},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox"}]}}}}}]},
        "status": {"phase": "Resuming", "componentStatus": [{"name": "train-job",
            "kind": "Job", "apiVersion": "batch/v1", "podSets": [], "conditions": []}]}
    }))
    .expect("a valid AppWrapper")
}

/// The stored object the API server answers a write with.
fn stored(resource_version: &str, finalizers: &[&str]) -> Value {
    let mut aw = serde_json::to_value(appwrapper(finalizers)).expect("serializable");
    aw["metadata"]["resourceVersion"] = json!(resource_version);
    aw
}

#[tokio::test]
async fn finalizer_and_status_writes_carry_the_resource_version_they_were_computed_from() {
    let (client, mut server) = ApiServer::new();
    let ctx = context(client);
    let aw = appwrapper(&[]);
    let old = aw.status.clone().unwrap_or_default();
    let mut new = old.clone();
    new.phase = lifeboat_api::appwrapper::AppWrapperPhase::Running;
    let writes = async {
        let mut writer = Writer::new(&aw, &ctx);
        writer.add_finalizer().await?;
        writer.write_status(&old, &new).await
    };
    let server = async {
        let call = server.next().await.expect(Method::PATCH, AW_PATH);
        assert_eq!(
            call.content_type.as_deref(),
            Some("application/merge-patch+json")
        );
        assert_eq!(
            call.body,
            json!({"metadata": {"finalizers": [FINALIZER], "resourceVersion": "7"}})
        );
        call.reply(200, stored("8", &[FINALIZER]));
        // The status write is conditional on the version the finalizer write produced.
        let call = server
            .next()
            .await
            .expect(Method::PATCH, &format!("{AW_PATH}/status"));
        assert_eq!(call.body["metadata"], json!({"resourceVersion": "8"}));
        assert_eq!(call.body["status"]["phase"], json!("Running"));
        call.reply(200, stored("9", &[FINALIZER]));
    };
    let (result, ()) = tokio::join!(writes, server);
    result.expect("both writes succeed");
}

#[tokio::test]
async fn an_unchanged_status_or_a_present_finalizer_sends_nothing() {
    let (client, mut server) = ApiServer::new();
    let ctx = context(client);
    let aw = appwrapper(&[FINALIZER]);
    let status = aw.status.clone().unwrap_or_default();
    let mut writer = Writer::new(&aw, &ctx);
    // Nothing answers: a request would hang until the timeout.
    let quiet = async {
        writer.add_finalizer().await?;
        writer.write_status(&status, &status).await
    };
    tokio::time::timeout(std::time::Duration::from_secs(1), quiet)
        .await
        .expect("no request was sent")
        .expect("nothing to write");
    drop(writer);
    drop(ctx);
    assert!(server.is_idle().await);
}

#[tokio::test]
async fn finalizer_removal_of_a_vanished_appwrapper_succeeds() {
    let (client, mut server) = ApiServer::new();
    let ctx = context(client);
    let aw = appwrapper(&[FINALIZER, "example.com/other"]);
    let remove = async { Writer::new(&aw, &ctx).remove_finalizer().await };
    let server = async {
        let call = server.next().await.expect(Method::PATCH, AW_PATH);
        // Other finalizers stay; the write is conditional.
        assert_eq!(
            call.body,
            json!({"metadata": {"finalizers": ["example.com/other"], "resourceVersion": "7"}})
        );
        call.fail(404, "NotFound", "appwrappers \"train\" not found");
    };
    let (result, ()) = tokio::join!(remove, server);
    result.expect("404 on finalizer removal is success");
}

#[tokio::test]
async fn a_stale_resource_version_is_a_conflict() {
    for (what, status_write) in [("finalizer", false), ("status", true)] {
        let (client, mut server) = ApiServer::new();
        let ctx = context(client);
        let aw = appwrapper(if status_write { &[FINALIZER] } else { &[] });
        let old = aw.status.clone().unwrap_or_default();
        let mut new = old.clone();
        new.retries = 1;
        let write = async {
            let mut writer = Writer::new(&aw, &ctx);
            if status_write {
                writer.write_status(&old, &new).await
            } else {
                writer.add_finalizer().await
            }
        };
        let server = async {
            server.next().await.fail(
                409,
                "Conflict",
                "the object has been modified; please apply your changes to the latest version",
            );
        };
        let (result, ()) = tokio::join!(write, server);
        assert!(matches!(result, Err(Error::Conflict)), "{what}: {result:?}");
    }
}

#[tokio::test]
async fn other_write_failures_keep_their_context() {
    let (client, mut server) = ApiServer::new();
    let ctx = context(client);
    let aw = appwrapper(&[]);
    let write = async { Writer::new(&aw, &ctx).add_finalizer().await };
    let server = async {
        server
            .next()
            .await
            .fail(403, "Forbidden", "appwrappers is forbidden");
    };
    let (result, ()) = tokio::join!(write, server);
    match result {
        Err(Error::Kube(e)) => assert_eq!(e.context(), "update finalizers"),
        other => panic!("expected a Kube error, got {other:?}"),
    }
}

fn status(code: u16, reason: &str, message: &str) -> kube::Error {
    kube::Error::Api(Box::new(kube::core::Status {
        code,
        reason: reason.into(),
        message: message.into(),
        ..kube::core::Status::failure(message, reason)
    }))
}

#[test]
fn create_errors_are_classified_by_status() {
    let cases = [
        (
            status(409, "AlreadyExists", "exists"),
            CreateFailure::AlreadyExists,
        ),
        (
            status(422, "Invalid", "spec.template: Required value"),
            CreateFailure::Fatal("spec.template: Required value".into()),
        ),
        (
            status(400, "BadRequest", "bad"),
            CreateFailure::Fatal("bad".into()),
        ),
        (
            status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ),
            CreateFailure::Fatal("the server could not find the requested resource".into()),
        ),
        // A 409 that is not AlreadyExists (an optimistic-lock conflict) is retried.
        (
            status(409, "Conflict", "try again"),
            CreateFailure::Retryable("try again".into()),
        ),
        (
            status(403, "Forbidden", "jobs.batch is forbidden"),
            CreateFailure::Retryable("jobs.batch is forbidden".into()),
        ),
        (
            status(429, "TooManyRequests", "slow down"),
            CreateFailure::Retryable("slow down".into()),
        ),
        (
            status(500, "InternalError", "etcd"),
            CreateFailure::Retryable("etcd".into()),
        ),
        // Without a message the reason and code are said.
        (
            status(503, "ServiceUnavailable", ""),
            CreateFailure::Retryable("ServiceUnavailable (503)".into()),
        ),
    ];
    for (error, expected) in cases {
        assert_eq!(classify_create_error(&error), expected, "{error}");
    }
    let transport = kube::Error::Service("connection refused".into());
    assert!(matches!(
        classify_create_error(&transport),
        CreateFailure::Retryable(m) if m.contains("connection refused")
    ));
}

/// Answers the discovery of `batch/v1` that `ComponentWatches::kind` asks for.
async fn answer_discovery(server: &mut ApiServer) {
    server
        .next()
        .await
        .expect(Method::GET, "/apis/batch/v1")
        .reply(
            200,
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "batch/v1",
        "resources": [{"name": "jobs", "singularName": "job", "namespaced": true, "kind": "Job",
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}]}),
        );
}

fn job(owner_uid: &str) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train-job", "namespace": "team", "uid": "job-uid",
            "ownerReferences": [{"apiVersion": "workload.codeflare.dev/v1beta2",
                "kind": "AppWrapper", "name": "train", "uid": owner_uid, "controller": true}]}})
}

#[tokio::test]
async fn an_existing_component_counts_as_created_only_when_this_appwrapper_controls_it() {
    for (owner, ours) in [("uid-1", true), ("uid-other", false)] {
        let (client, mut server) = ApiServer::new();
        let ctx = context(client);
        let aw = appwrapper(&[FINALIZER]);
        let status = aw.status.clone().unwrap_or_default();
        let create = async { create_components(&aw, &status, &[0], &ctx).await };
        let server = async {
            answer_discovery(&mut server).await;
            let call = server
                .next()
                .await
                .expect(Method::POST, "/apis/batch/v1/namespaces/team/jobs");
            // The name recorded in the status, the AppWrapper as controller.
            assert_eq!(call.body["metadata"]["name"], json!("train-job"));
            assert_eq!(
                call.body["metadata"]["ownerReferences"][0]["uid"],
                json!("uid-1")
            );
            call.fail(
                409,
                "AlreadyExists",
                "jobs.batch \"train-job\" already exists",
            );
            server
                .next()
                .await
                .expect(Method::GET, "/apis/batch/v1/namespaces/team/jobs/train-job")
                .reply(200, job(owner));
        };
        let (results, ()) = tokio::join!(create, server);
        match (&results[0], ours) {
            (Some(CreateResult::Created { name }), true) => assert_eq!(name, "train-job"),
            (Some(CreateResult::Fatal(message)), false) => {
                assert!(
                    message.contains("not controlled by appwrapper train"),
                    "{message}"
                )
            }
            (other, _) => panic!("owner {owner}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn an_invalid_template_is_a_fatal_create_with_the_api_server_message() {
    let (client, mut server) = ApiServer::new();
    let ctx = context(client);
    let aw = appwrapper(&[FINALIZER]);
    let status = aw.status.clone().unwrap_or_default();
    let create = async { create_components(&aw, &status, &[0], &ctx).await };
    let server = async {
        answer_discovery(&mut server).await;
        server
            .next()
            .await
            .expect(Method::POST, "/apis/batch/v1/namespaces/team/jobs")
            .fail(
                422,
                "Invalid",
                "Job.batch \"train-job\" is invalid: spec.template.spec.containers[0].image: Required value",
            );
    };
    let (results, ()) = tokio::join!(create, server);
    assert!(
        matches!(&results[0], Some(CreateResult::Fatal(m)) if m.contains("containers[0].image")),
        "{results:?}"
    );
}

#[tokio::test]
async fn deletes_propagate_in_the_background_and_a_missing_component_is_deleted() {
    let (client, mut server) = ApiServer::new();
    let ctx = context(client);
    let aw = appwrapper(&[FINALIZER]);
    let status = aw.status.clone().unwrap_or_default();
    let actions = crate::machine::Actions {
        delete: vec![0],
        ..Default::default()
    };
    let key = AwKey::new("team", "train");
    let delete = async { deletions(&aw, &status, &actions, &key, &ctx).await };
    let server = async {
        answer_discovery(&mut server).await;
        let call = server.next().await.expect(
            Method::DELETE,
            "/apis/batch/v1/namespaces/team/jobs/train-job",
        );
        assert_eq!(call.body["propagationPolicy"], json!("Background"));
        assert!(call.body.get("gracePeriodSeconds").is_none());
        call.fail(404, "NotFound", "jobs.batch \"train-job\" not found");
    };
    let (result, ()) = tokio::join!(delete, server);
    result.expect("a component already gone is deleted");
}
