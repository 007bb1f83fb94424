//! The AppWrapper controller on the local fleet: the scenario catalogue of the upstream
//! operator (reference §6.4) and Lifeboat's improvements, with short grace periods set by
//! annotation.
//!
//! Clusters: member-1 runs the workload scenarios; member-2 the ones that break nodes, each on
//! a pool of nodes of its own; member-3, one scenario at a time, the standalone `lifeboat-agent`
//! binary and the leader-election handover (each runs agents that reconcile the whole cluster).

#[path = "../../e2e/tests/support/mod.rs"]
mod support;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use lifeboat_agent::agent::{self, AgentOptions};
use lifeboat_agent::config::OperatorConfig;
use lifeboat_agent::webhook::{MUTATING_CONFIGURATION, VALIDATING_CONFIGURATION};
use lifeboat_api::appwrapper::AppWrapperPhase as Phase;
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestResult};
use lifeboat_e2e::{faults, nodes, wait};
use lifeboat_runtime::leader::LeaseConfig;
use serde_json::json;
use support::*;

const M1: &str = "member-1";
const M2: &str = "member-2";
const M3: &str = "member-3";

fn main() -> ExitCode {
    harness::run(
        "agent-controller",
        |c| {
            c.members = 3;
            c.nodes_per_member = 6;
        },
        vec![
            E2eTest::new("fundamental_kinds_run", fundamental_kinds_run),
            E2eTest::new("mixed_components_run", mixed_components_run),
            E2eTest::new(
                "successful_job_succeeds_and_is_cleaned_after_ttl",
                job_succeeds,
            ),
            E2eTest::new(
                "failed_job_is_reset_up_to_retry_limit_then_failed",
                job_retries_then_fails,
            ),
            E2eTest::new(
                "deleted_component_fails_without_retry",
                deleted_component_fails,
            ),
            E2eTest::new(
                "stuck_init_container_is_detected_and_failed",
                stuck_init_container,
            ),
            E2eTest::new("terminal_exit_code_fails_without_reset", terminal_exit_code),
            E2eTest::new(
                "exit_code_outside_retryable_list_is_terminal",
                retryable_exit_codes,
            ),
            E2eTest::new("suspend_and_resume", suspend_and_resume),
            E2eTest::new(
                "forceful_deletion_frees_pods_stuck_terminating",
                forceful_deletion,
            ),
            E2eTest::new(
                "failed_pytorchjob_status_resets_the_appwrapper",
                pytorchjob_failed,
            ),
            E2eTest::new(
                "deleting_the_appwrapper_deletes_everything",
                delete_appwrapper,
            ),
            E2eTest::new("pod_failure_is_noticed_from_the_watch", failure_from_watch),
            E2eTest::new(
                "unschedulable_pods_are_a_capacity_failure",
                capacity_failure,
            ),
            E2eTest::new(
                "malformed_annotation_is_reported_and_default_applies",
                malformed_annotation,
            ),
            E2eTest::new("phase_changes_emit_events_and_metrics", events_and_metrics),
            E2eTest::new(
                "agent_restart_causes_no_false_missing_component",
                agent_restart,
            ),
            E2eTest::new(
                "node_not_ready_is_an_infrastructure_failure",
                node_not_ready,
            ),
            E2eTest::new(
                "autopilot_migrates_pods_off_an_evict_node",
                autopilot_migration,
            ),
            E2eTest::new(
                "spot_reclamation_notice_moves_the_workload",
                spot_reclamation,
            ),
            E2eTest::new(
                "standalone_agent_binary_installs_crd_and_runs",
                standalone_binary,
            ),
            E2eTest::new("every_sample_runs_under_the_agent", samples_run),
            E2eTest::new("pods_missing_after_the_admission_grace_reset", pods_missing),
            E2eTest::new(
                "failed_job_status_resets_without_the_failure_grace",
                failed_job_status,
            ),
            E2eTest::new(
                "deletion_on_failure_grace_keeps_resources_then_deletes",
                deletion_on_failure,
            ),
            E2eTest::new("fifty_appwrappers_all_run", load_fifty),
            E2eTest::new(
                "leader_election_hands_over_on_a_crash_and_faster_on_release",
                leader_handover,
            ),
            E2eTest::new(
                "readyz_is_unready_until_every_watch_synced_also_on_a_standby",
                readyz_follows_watch_sync,
            ),
        ],
    )
}

fn pod(name: &str, command: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox",
            "command": ["sh", "-c", command], "resources": {"requests": {"cpu": "250m"}}}]}})
}

fn statefulset(name: &str, replicas: i32) -> serde_json::Value {
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
        "spec": {"replicas": replicas, "serviceName": name, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "main",
                "image": "busybox", "command": ["sh", "-c", "sleep infinity"],
                "resources": {"requests": {"cpu": "200m"}}}]}}}})
}

async fn fundamental_kinds_run(ctx: Arc<TestContext>) -> TestResult {
    let mut generate_job = job("", "sleep infinity", 1, 0);
    generate_job["metadata"] = json!({"generateName": "batchjob-"});
    let cases = vec![
        (
            "two-pods",
            vec![
                pod("pod-a", "sleep infinity"),
                pod("pod-b", "sleep infinity"),
            ],
        ),
        ("deployment", vec![deployment("deploy", 2)]),
        ("statefulset", vec![statefulset("sts", 2)]),
        ("batch-job", vec![generate_job]),
    ];
    let mut apis = Vec::new();
    for (name, components) in cases {
        let api = create(&ctx, M1, &appwrapper(name, &[], components)?).await?;
        apis.push((name, api));
    }
    for (name, api) in &apis {
        let aw = until_ready(api, name).await?;
        assert_eq!(
            condition(&aw, "QuotaReserved").map(|c| c.0).as_deref(),
            Some("True")
        );
        assert_eq!(
            condition(&aw, "Unhealthy").map(|c| c.0).as_deref(),
            Some("False")
        );
    }
    for (name, api) in &apis {
        consistently(api, name, Phase::Running, Duration::from_secs(3)).await?;
    }
    // generateName: the name was chosen and recorded before the create, and is what exists.
    let (_, api) = &apis[3];
    let aw = api.get("batch-job").await?;
    let recorded = aw.status.unwrap_or_default().component_status[0]
        .name
        .clone();
    assert!(recorded.starts_with("batchjob-") && recorded.len() > "batchjob-".len());
    let jobs: Api<Job> = Api::namespaced(ctx.client(M1).await?, &ctx.namespace);
    let job = jobs.get(&recorded).await?;
    let owner = &job.metadata.owner_references.unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("AppWrapper", "batch-job", Some(true))
    );
    // Every pod carries the AppWrapper label injected at the podSet path.
    assert_eq!(pods_of(&ctx, M1, "deployment").await?.len(), 2);
    Ok(())
}

async fn mixed_components_run(ctx: Arc<TestContext>) -> TestResult {
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "mixed-svc"},
        "spec": {"ports": [{"port": 80}], "selector": {"app": "mixed-deploy"}}});
    let components = vec![
        pod("mixed-pod", "sleep infinity"),
        deployment("mixed-deploy", 2),
        statefulset("mixed-sts", 2),
        service,
        job("mixed-job", "sleep infinity", 1, 0),
    ];
    let api = create(&ctx, M1, &appwrapper("mixed", &[], components)?).await?;
    let aw = until_ready(&api, "mixed").await?;
    assert_eq!(aw.status.unwrap_or_default().component_status.len(), 5);
    assert_eq!(pods_of(&ctx, M1, "mixed").await?.len(), 6);
    consistently(&api, "mixed", Phase::Running, Duration::from_secs(5)).await
}

async fn job_succeeds(ctx: Arc<TestContext>) -> TestResult {
    let aw = appwrapper(
        "success",
        &[("successTTLDuration", "3s")],
        vec![job("success", "sleep 2", 2, 1)],
    )?;
    let api = create(&ctx, M1, &aw).await?;
    let done = until_phase(&api, "success", Phase::Succeeded).await?;
    assert_eq!(
        condition(&done, "QuotaReserved").map(|c| (c.0, c.1)),
        Some(("False".into(), "Succeeded".into()))
    );
    // After the TTL the resources are deleted; the AppWrapper stays.
    until(
        &api,
        "success",
        "resources deleted after the TTL",
        T,
        |aw| condition(aw, "ResourcesDeployed").is_some_and(|c| c.0 == "False"),
    )
    .await?;
    let jobs: Api<Job> = Api::namespaced(ctx.client(M1).await?, &ctx.namespace);
    wait::until("job deleted", T, || async {
        match jobs.get_opt("success").await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err("job still there".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    assert_eq!(phase(&api.get("success").await?), Phase::Succeeded);
    Ok(())
}

async fn job_retries_then_fails(ctx: Arc<TestContext>) -> TestResult {
    let aw = appwrapper(
        "retries",
        &[
            ("failureGracePeriodDuration", "0s"),
            ("retryLimit", "2"),
            ("retryPausePeriodDuration", "1s"),
        ],
        vec![job("retries", "sleep 1; exit 1", 1, 1)],
    )?;
    let api = create(&ctx, M1, &aw).await?;
    until_entered(&api, "retries", Phase::Resetting).await?;
    let failed = until_phase(&api, "retries", Phase::Failed).await?;
    let status = failed.status.clone().unwrap_or_default();
    assert_eq!(status.retries, 2);
    let unhealthy = condition(&failed, "Unhealthy").unwrap_or_default();
    assert_eq!(unhealthy.0, "True");
    assert!(unhealthy.2.starts_with("[Application]"), "{unhealthy:?}");
    let resets = status
        .transitions
        .iter()
        .filter(|t| t.phase == Phase::Resetting)
        .count();
    assert_eq!(resets, 2);
    // Resources and quota are released after failing.
    until(&api, "retries", "quota released", T, |aw| {
        condition(aw, "QuotaReserved").is_some_and(|c| c.0 == "False")
            && condition(aw, "ResourcesDeployed").is_some_and(|c| c.0 == "False")
    })
    .await?;
    assert!(pods_of(&ctx, M1, "retries").await?.is_empty());
    Ok(())
}

async fn deleted_component_fails(ctx: Arc<TestContext>) -> TestResult {
    let api = create(
        &ctx,
        M1,
        &appwrapper("victim", &[], vec![deployment("victim", 2)])?,
    )
    .await?;
    until_ready(&api, "victim").await?;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client(M1).await?, &ctx.namespace);
    deployments
        .delete("victim", &DeleteParams::default())
        .await?;
    let failed = until_phase(&api, "victim", Phase::Failed).await?;
    assert_eq!(
        failed.status.clone().unwrap_or_default().retries,
        0,
        "no retry for a deleted component"
    );
    let unhealthy = condition(&failed, "Unhealthy").unwrap_or_default();
    assert_eq!(unhealthy.1, "MissingComponent");
    assert!(
        unhealthy
            .2
            .contains("Only found 0 deployed components, but was expecting 1")
    );
    Ok(())
}

async fn stuck_init_container(ctx: Arc<TestContext>) -> TestResult {
    let mut stuck = job("stuck", "sleep 5", 1, 0);
    stuck["spec"]["template"]["spec"]["initContainers"] =
        json!([{"name": "init", "image": "busybox", "command": ["sh", "-c", "sleep 100000"]}]);
    let aw = appwrapper(
        "stuck",
        &[
            ("failureGracePeriodDuration", "1s"),
            ("warmupGracePeriodDuration", "3s"),
            ("admissionGracePeriodDuration", "3s"),
            ("retryLimit", "1"),
            ("retryPausePeriodDuration", "1s"),
        ],
        vec![stuck],
    )?;
    let api = create(&ctx, M1, &aw).await?;
    until_phase(&api, "stuck", Phase::Running).await?;
    // The reset is short (a 1 s pause): look for its record, not the phase itself.
    let reset = until_entered(&api, "stuck", Phase::Resetting).await?;
    assert_eq!(reset.reason, "InsufficientPodsReady");
    let message = reset.message.unwrap_or_default();
    assert!(message.contains("WarmupGracePeriod"), "{message:?}");
    let failed = until_phase(&api, "stuck", Phase::Failed).await?;
    assert_eq!(failed.status.unwrap_or_default().retries, 1);
    Ok(())
}

async fn terminal_exit_code(ctx: Arc<TestContext>) -> TestResult {
    let aw = appwrapper(
        "terminal",
        &[
            ("failureGracePeriodDuration", "0s"),
            ("terminalExitCodes", "3, 42"),
            ("retryLimit", "5"),
        ],
        vec![job("terminal", "sleep 1; exit 3", 1, 0)],
    )?;
    let api = create(&ctx, M1, &aw).await?;
    let failed = until_phase(&api, "terminal", Phase::Failed).await?;
    let status = failed.status.clone().unwrap_or_default();
    assert_eq!(status.retries, 0, "a terminal exit code is not retried");
    assert!(
        !status
            .transitions
            .iter()
            .any(|t| t.phase == Phase::Resetting)
    );
    let message = status
        .transitions
        .last()
        .and_then(|t| t.message.clone())
        .unwrap_or_default();
    assert!(message.contains("terminal"), "{message}");
    assert!(
        condition(&failed, "Unhealthy")
            .unwrap_or_default()
            .2
            .starts_with("[Application]")
    );
    Ok(())
}

async fn retryable_exit_codes(ctx: Arc<TestContext>) -> TestResult {
    let aw = appwrapper(
        "retryable",
        &[
            ("failureGracePeriodDuration", "0s"),
            ("retryableExitCodes", "1"),
            ("retryLimit", "5"),
        ],
        vec![job("retryable", "sleep 1; exit 2", 1, 0)],
    )?;
    let api = create(&ctx, M1, &aw).await?;
    let failed = until_phase(&api, "retryable", Phase::Failed).await?;
    assert_eq!(failed.status.unwrap_or_default().retries, 0);
    Ok(())
}

async fn suspend_and_resume(ctx: Arc<TestContext>) -> TestResult {
    let api = create(
        &ctx,
        M1,
        &appwrapper("pausable", &[], vec![deployment("pausable", 2)])?,
    )
    .await?;
    until_ready(&api, "pausable").await?;
    set_suspend(&api, "pausable", true).await?;
    let suspended = until_phase(&api, "pausable", Phase::Suspended).await?;
    assert_eq!(
        condition(&suspended, "QuotaReserved")
            .map(|c| c.0)
            .as_deref(),
        Some("False")
    );
    assert_eq!(
        condition(&suspended, "ResourcesDeployed")
            .map(|c| c.0)
            .as_deref(),
        Some("False")
    );
    assert!(
        pods_of(&ctx, M1, "pausable").await?.is_empty(),
        "suspension deletes every pod first"
    );
    set_suspend(&api, "pausable", false).await?;
    let resumed = until_ready(&api, "pausable").await?;
    assert_eq!(
        resumed.status.unwrap_or_default().retries,
        0,
        "suspension is not a retry"
    );
    Ok(())
}

async fn forceful_deletion(ctx: Arc<TestContext>) -> TestResult {
    // The Job's pod fails; the Deployment's running pod never finishes a graceful deletion (a
    // stuck kubelet). Failed pods are removed at once by the API server, running ones are not.
    let failing = job("hanging-fail", "sleep 1; exit 1", 1, 0);
    let mut hanging = deployment("hanging-run", 1);
    hanging["spec"]["template"]["metadata"]["annotations"] =
        json!({"fleet.lifeboat.dev/hang-on-delete": "true"});
    let aw = appwrapper(
        "hanging",
        &[
            ("failureGracePeriodDuration", "0s"),
            ("retryPausePeriodDuration", "0s"),
            ("forcefulDeletionGracePeriodDuration", "3s"),
            ("retryLimit", "1"),
        ],
        vec![failing, hanging],
    )?;
    let api = create(&ctx, M1, &aw).await?;
    until_phase(&api, "hanging", Phase::Resetting).await?;
    // The graceful delete leaves the pod Terminating.
    let pods: Api<Pod> = Api::namespaced(ctx.client(M1).await?, &ctx.namespace);
    let terminating = wait::until("pod terminating", T, || async {
        let list = pods
            .list(&ListParams::default().labels("workload.codeflare.dev/appwrapper=hanging"))
            .await
            .map_err(|e| e.to_string())?;
        if list
            .items
            .iter()
            .any(|p| p.metadata.deletion_timestamp.is_some())
        {
            Ok(Instant::now())
        } else {
            Err(format!("{} pods, none terminating", list.items.len()))
        }
    })
    .await?;
    // After the forceful deletion grace they are deleted with grace 0 and the reset completes.
    let resumed = until(&api, "hanging", "reset completed", T, |aw| {
        aw.status.as_ref().is_some_and(|s| {
            s.transitions.iter().any(|t| {
                t.phase == Phase::Resuming
                    && t.reason == "Resuming"
                    && t.message.as_deref() == Some("Reset complete; resuming")
            })
        })
    })
    .await?;
    assert!(
        terminating.elapsed() >= Duration::from_secs(2),
        "not before the forceful grace"
    );
    assert_eq!(resumed.status.unwrap_or_default().retries, 1);
    Ok(())
}

/// A schemaless CRD standing in for a workload kind whose operator does not run on the fleet
/// (the agent only creates, watches and deletes such objects).
async fn install_kind_crd(ctx: &TestContext, group: &str, version: &str, kind: &str) -> TestResult {
    let plural = format!("{}s", kind.to_lowercase());
    let name = format!("{plural}.{group}");
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client(M1).await?);
    let mut metadata = json!({"name": name});
    if group.ends_with(".k8s.io") {
        // Groups under k8s.io need the API-approval annotation.
        metadata["annotations"] = json!({"api-approved.kubernetes.io": "https://github.com/kubernetes/enhancements/pull/1111"});
    }
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": metadata,
        "spec": {"group": group, "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase()},
            "versions": [{"name": version, "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))?;
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    wait::until(&format!("{kind} CRD established"), T, || async {
        let crd = crds.get(&name).await.map_err(|e| e.to_string())?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            Ok(())
        } else {
            Err("not yet".into())
        }
    })
    .await?;
    Ok(())
}

async fn pytorchjob_failed(ctx: Arc<TestContext>) -> TestResult {
    install_kind_crd(&ctx, "kubeflow.org", "v1", "PyTorchJob").await?;
    let pytorch = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "ptj"},
        "spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": {"spec": {"containers": [{"name": "pytorch", "image": "x"}]}}},
            "Worker": {"replicas": 2, "template": {"spec": {"containers": [{"name": "pytorch", "image": "x"}]}}}}}});
    // No training operator runs here: the PyTorchJob never makes pods, so the admission grace
    // is long; its status is written by the test as the operator would.
    let aw = appwrapper(
        "ptj",
        &[("retryLimit", "1"), ("retryPausePeriodDuration", "1s")],
        vec![pytorch],
    )?;
    let api = create(&ctx, M1, &aw).await?;
    let running = until_phase(&api, "ptj", Phase::Running).await?;
    let pod_sets = running.status.unwrap_or_default().component_status[0]
        .pod_sets
        .clone();
    assert_eq!(
        pod_sets
            .iter()
            .map(|p| p.replicas_or_default())
            .sum::<i32>(),
        3,
        "inferred Master + 2 Workers"
    );
    let gvk = GroupVersionKind::gvk("kubeflow.org", "v1", "PyTorchJob");
    let jobs: Api<DynamicObject> = Api::namespaced_with(
        ctx.client(M1).await?,
        &ctx.namespace,
        &ApiResource::from_gvk(&gvk),
    );
    let failed = json!({"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "PyTorchJobFailed", "message": "PyTorchJob ptj is failed because 1 Worker replica(s) failed."}]}});
    jobs.patch_status("ptj", &PatchParams::default(), &Patch::Merge(&failed))
        .await?;
    // The reset itself is short (nothing to delete, a 1 s pause): look for its record.
    let reset = until_entered(&api, "ptj", Phase::Resetting).await?;
    assert_eq!(reset.reason, "FailedComponent");
    let message = reset.message.unwrap_or_default();
    assert!(message.contains("PyTorchJobFailed"), "{message:?}");
    let after = api.get("ptj").await?;
    assert_eq!(after.status.unwrap_or_default().retries, 1);
    // Recreated as a fresh PyTorchJob (no Failed condition), back to Running.
    until(&api, "ptj", "recreated", T, |aw| {
        phase(aw) == Phase::Running
            && aw.status.as_ref().is_some_and(|s| {
                s.transitions
                    .iter()
                    .filter(|t| t.phase == Phase::Running)
                    .count()
                    == 2
            })
    })
    .await?;
    let again = jobs.get("ptj").await?;
    assert!(
        again
            .data
            .get("status")
            .is_none_or(|s| s.get("conditions").is_none())
    );
    Ok(())
}

async fn delete_appwrapper(ctx: Arc<TestContext>) -> TestResult {
    let api = create(
        &ctx,
        M1,
        &appwrapper(
            "doomed",
            &[],
            vec![
                deployment("doomed", 2),
                job("doomed-job", "sleep infinity", 1, 1),
            ],
        )?,
    )
    .await?;
    until_ready(&api, "doomed").await?;
    api.delete("doomed", &DeleteParams::default()).await?;
    wait::until("AppWrapper gone", T, || async {
        match api.get_opt("doomed").await {
            Ok(None) => Ok(()),
            Ok(Some(aw)) => Err(format!("still there, phase {:?}", phase(&aw))),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    // The finalizer was removed only once every pod was gone.
    assert!(pods_of(&ctx, M1, "doomed").await?.is_empty());
    let deployments: Api<Deployment> = Api::namespaced(ctx.client(M1).await?, &ctx.namespace);
    assert!(deployments.get_opt("doomed").await?.is_none());
    Ok(())
}

async fn failure_from_watch(ctx: Arc<TestContext>) -> TestResult {
    let aw = appwrapper(
        "watched",
        &[("failureGracePeriodDuration", "1h")],
        vec![job("watched", "sleep infinity", 2, 1)],
    )?;
    let api = create(&ctx, M1, &aw).await?;
    until_ready(&api, "watched").await?;
    let pod = pods_of(&ctx, M1, "watched")
        .await?
        .into_iter()
        .next()
        .ok_or("no pod")?;
    let failed_at = Instant::now();
    faults::fail_pod(
        &ctx.client(M1).await?,
        &ctx.namespace,
        &pod.metadata.name.unwrap_or_default(),
        137,
    )
    .await?;
    // Upstream notices a failed pod of a ready workload only at its next 60 s poll; the pod
    // watch must bring it well within that. The 20 s bound is a liveness bound only (this test
    // runs beside others on a loaded machine): the detection latency figure (milliseconds) is
    // owned by the benchmark `cargo bench -p lifeboat-agent --bench agent` (BENCHMARKS.md,
    // "pod failure → Unhealthy condition").
    let aw = until(
        &api,
        "watched",
        "Unhealthy=True",
        Duration::from_secs(20),
        |aw| condition(aw, "Unhealthy").is_some_and(|c| c.0 == "True"),
    )
    .await?;
    assert!(failed_at.elapsed() < Duration::from_secs(20));
    let unhealthy = condition(&aw, "Unhealthy").unwrap_or_default();
    assert_eq!(unhealthy.1, "FoundFailedPods");
    assert!(unhealthy.2.contains("exit code 137"), "{unhealthy:?}");
    assert_eq!(
        phase(&aw),
        Phase::Running,
        "the failure grace (1h) is still running"
    );
    Ok(())
}

async fn capacity_failure(ctx: Arc<TestContext>) -> TestResult {
    let aw = appwrapper(
        "too-big",
        &[
            ("admissionGracePeriodDuration", "2s"),
            ("warmupGracePeriodDuration", "2s"),
            ("retryLimit", "0"),
        ],
        vec![job("too-big", "sleep 5", 1, 64)],
    )?;
    let api = create(&ctx, M1, &aw).await?;
    let failed = until_phase(&api, "too-big", Phase::Failed).await?;
    let unhealthy = condition(&failed, "Unhealthy").unwrap_or_default();
    assert_eq!(unhealthy.1, "InsufficientPodsReady");
    assert!(
        unhealthy.2.starts_with("[Capacity]") && unhealthy.2.contains("nvidia.com/gpu"),
        "{unhealthy:?}"
    );
    Ok(())
}

async fn malformed_annotation(ctx: Arc<TestContext>) -> TestResult {
    let aw = appwrapper(
        "odd",
        &[
            ("retryLimit", "abc"),
            ("failureGracePeriodDuration", "222badTime"),
        ],
        vec![deployment("odd", 1)],
    )?;
    let api = create(&ctx, M1, &aw).await?;
    let ready = until_ready(&api, "odd").await?;
    let invalid =
        condition(&ready, "InvalidAnnotations").ok_or("no InvalidAnnotations condition")?;
    assert_eq!(
        (invalid.0.as_str(), invalid.1.as_str()),
        ("True", "MalformedAnnotation")
    );
    assert!(
        invalid.2.contains("retryLimit") && invalid.2.contains("abc"),
        "{invalid:?}"
    );
    assert!(
        invalid.2.contains("failureGracePeriodDuration"),
        "{invalid:?}"
    );
    let events = events_of(&ctx, M1, "odd").await?;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("MalformedAnnotation")),
        "{events:?}"
    );
    Ok(())
}

async fn events_of(
    ctx: &TestContext,
    cluster: &str,
    name: &str,
) -> Result<Vec<Event>, harness::TestError> {
    let events: Api<Event> = Api::namespaced(ctx.client(cluster).await?, &ctx.namespace);
    Ok(wait::until("events recorded", T, || async {
        let list = events
            .list(&ListParams::default().fields(&format!("regarding.name={name}")))
            .await
            .map_err(|e| e.to_string())?;
        if list.items.is_empty() {
            Err("no events yet".to_string())
        } else {
            Ok(list.items)
        }
    })
    .await?)
}

// On member-2, where only the suite's agent runs: `agent_restart` restarts member-1's agent
// (whose counters start again at zero) and member-3 hosts more agents (leader election, the
// binary), any of which may count the phase change instead.
async fn events_and_metrics(ctx: Arc<TestContext>) -> TestResult {
    let aw = appwrapper(
        "observed",
        &[("failureGracePeriodDuration", "0s"), ("retryLimit", "0")],
        vec![job("observed", "sleep 1; exit 1", 1, 0)],
    )?;
    let api = create(&ctx, M2, &aw).await?;
    until_phase(&api, "observed", Phase::Failed).await?;
    let events = wait::until("phase events", T, || async {
        let events = events_of(&ctx, M2, "observed")
            .await
            .map_err(|e| e.to_string())?;
        let reasons: Vec<String> = events.iter().filter_map(|e| e.reason.clone()).collect();
        if ["Suspended", "Resuming", "Running", "Failed"]
            .iter()
            .all(|r| reasons.iter().any(|x| x == r))
        {
            Ok(events)
        } else {
            Err(format!("reasons so far: {reasons:?}"))
        }
    })
    .await?;
    let failed = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("Failed"))
        .ok_or("no Failed event")?;
    assert_eq!(failed.type_.as_deref(), Some("Warning"));
    assert!(
        failed
            .note
            .as_deref()
            .unwrap_or("")
            .contains("Running -> Failed")
    );
    let metrics_addr = agent(&ctx, M2).await?;
    let line = format!(
        "appwrapper_phase_total{{namespace=\"{}\",phase=\"Failed\"}}",
        ctx.namespace
    );
    wait::until("the Failed phase counted in /metrics", T, || async {
        let body = http_get(metrics_addr, "/metrics")
            .await
            .map_err(|e| e.to_string())?;
        if body.contains(&line) && body.contains("lifeboat_agent_reconciles_total") {
            Ok(())
        } else {
            Err(format!("no {line} in metrics yet"))
        }
    })
    .await?;
    Ok(())
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> Result<String, harness::TestError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    Ok(body)
}

async fn agent_restart(ctx: Arc<TestContext>) -> TestResult {
    let mut apis = Vec::new();
    for i in 0..5 {
        let name = format!("steady-{i}");
        let api = create(
            &ctx,
            M1,
            &appwrapper(
                &name,
                &[],
                vec![
                    deployment(&name, 1),
                    job(&format!("{name}-job"), "sleep infinity", 1, 0),
                ],
            )?,
        )
        .await?;
        apis.push((name, api));
    }
    for (name, api) in &apis {
        until_ready(api, name).await?;
    }
    // A restarted agent starts with empty caches: it must not take "not cached yet" for
    // "deleted" (upstream #416 failed such workloads at once, without retry).
    for _ in 0..3 {
        restart_agent(&ctx, M1).await?;
        for (name, api) in &apis {
            consistently(api, name, Phase::Running, Duration::from_millis(500)).await?;
        }
    }
    for (name, api) in &apis {
        let aw = api.get(name).await?;
        assert_eq!(phase(&aw), Phase::Running);
        assert!(
            !aw.status
                .unwrap_or_default()
                .transitions
                .iter()
                .any(|t| t.reason == "MissingComponent")
        );
    }
    Ok(())
}

fn node(cluster: &str, i: usize) -> String {
    nodes::node_name(cluster, i)
}

/// A Job pinned by nodeSelector to a pool of labelled nodes.
fn pinned_job(name: &str, pool: &str) -> serde_json::Value {
    let mut j = job(name, "sleep infinity", 1, 1);
    j["spec"]["template"]["spec"]["nodeSelector"] = json!({"lifeboat-e2e/pool": pool});
    j
}

async fn node_of_pod(
    ctx: &TestContext,
    cluster: &str,
    aw: &str,
) -> Result<String, harness::TestError> {
    let pods = pods_of(ctx, cluster, aw).await?;
    let running = pods
        .iter()
        .find(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .ok_or("no running pod")?;
    Ok(running
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default())
}

async fn node_not_ready(ctx: Arc<TestContext>) -> TestResult {
    let target = node(M2, 4);
    label_nodes(
        &ctx,
        M2,
        std::slice::from_ref(&target),
        "lifeboat-e2e/pool",
        "notready",
    )
    .await?;
    let aw = appwrapper(
        "on-bad-node",
        &[("failureGracePeriodDuration", "2s"), ("retryLimit", "0")],
        vec![pinned_job("on-bad-node", "notready")],
    )?;
    let api = create(&ctx, M2, &aw).await?;
    until_ready(&api, "on-bad-node").await?;
    let client = ctx.client(M2).await?;
    faults::set_node_ready(&client, &target, false).await?;
    let failed = until_phase(&api, "on-bad-node", Phase::Failed).await;
    faults::set_node_ready(&client, &target, true).await?;
    let failed = failed?;
    let unhealthy = condition(&failed, "Unhealthy").unwrap_or_default();
    assert!(
        unhealthy.2.starts_with("[Infrastructure]") && unhealthy.2.contains("NotReady"),
        "{unhealthy:?}"
    );
    Ok(())
}

async fn autopilot_migration(ctx: Arc<TestContext>) -> TestResult {
    let pool = [node(M2, 0), node(M2, 2)];
    label_nodes(&ctx, M2, &pool, "lifeboat-e2e/pool", "autopilot").await?;
    let api = create(
        &ctx,
        M2,
        // A short pause: the default retry pause (90 s) equals the wait below, and this test
        // is about where the pod goes, not how long the agent pauses.
        &appwrapper(
            "migrant",
            &[("retryPausePeriodDuration", "1s")],
            vec![pinned_job("migrant", "autopilot")],
        )?,
    )
    .await?;
    until_ready(&api, "migrant").await?;
    let first = node_of_pod(&ctx, M2, "migrant").await?;
    // The GPU pod was given Autopilot's anti-affinity at creation.
    let pod = pods_of(&ctx, M2, "migrant")
        .await?
        .into_iter()
        .next()
        .ok_or("no pod")?;
    let affinity = serde_json::to_string(&pod.spec.as_ref().and_then(|s| s.affinity.clone()))?;
    assert!(
        affinity.contains("autopilot.ibm.com/gpuhealth") && affinity.contains("EVICT"),
        "{affinity}"
    );
    let client = ctx.client(M2).await?;
    faults::set_gpu_health(&client, &first, "EVICT").await?;
    let result = async {
        until_entered(&api, "migrant", Phase::Resetting).await?;
        let aw = until(&api, "migrant", "running again elsewhere", T, |aw| {
            phase(aw) == Phase::Running
                && aw.status.as_ref().is_some_and(|s| {
                    s.transitions
                        .iter()
                        .any(|t| t.reason == "AutopilotNoExecute")
                })
                && condition(aw, "PodsReady").is_some_and(|c| c.0 == "True")
        })
        .await?;
        Ok::<_, harness::TestError>(aw)
    }
    .await;
    faults::set_gpu_health(&client, &first, nodes::GPU_HEALTHY).await?;
    let aw = result?;
    assert_eq!(
        aw.status.unwrap_or_default().retries,
        0,
        "an Autopilot migration is not a retry"
    );
    let second = node_of_pod(&ctx, M2, "migrant").await?;
    assert_ne!(first, second, "the new pod avoids the EVICT node");
    Ok(())
}

async fn spot_reclamation(ctx: Arc<TestContext>) -> TestResult {
    let pool = [node(M2, 1), node(M2, 3)];
    label_nodes(&ctx, M2, &pool, "lifeboat-e2e/pool", "spot").await?;
    let api = create(
        &ctx,
        M2,
        &appwrapper(
            "spotty",
            &[("retryPausePeriodDuration", "0s")],
            vec![pinned_job("spotty", "spot")],
        )?,
    )
    .await?;
    until_ready(&api, "spotty").await?;
    let first = node_of_pod(&ctx, M2, "spotty").await?;
    let client = ctx.client(M2).await?;
    // A two minute notice (AWS's): the workload moves long before the node goes.
    faults::announce_spot_reclamation(&client, &first, Duration::from_secs(120)).await?;
    let aw = until(&api, "spotty", "moved off the reclaimed node", T, |aw| {
        phase(aw) == Phase::Running
            && aw
                .status
                .as_ref()
                .is_some_and(|s| s.transitions.iter().any(|t| t.reason == "SpotReclamation"))
            && condition(aw, "PodsReady").is_some_and(|c| c.0 == "True")
    })
    .await?;
    let reset = aw
        .status
        .clone()
        .unwrap_or_default()
        .transitions
        .into_iter()
        .find(|t| t.reason == "SpotReclamation")
        .ok_or("no reset")?;
    assert!(
        reset
            .message
            .unwrap_or_default()
            .starts_with("[Infrastructure]")
    );
    assert_eq!(aw.status.unwrap_or_default().retries, 0);
    assert_ne!(node_of_pod(&ctx, M2, "spotty").await?, first);
    Ok(())
}

async fn standalone_binary(ctx: Arc<TestContext>) -> TestResult {
    let _alone = member_3_alone().await;
    let kubeconfig = ctx.fleet.kubeconfig(M3)?;
    let metrics_port = lifeboat_e2e::ports::free_port()?;
    let webhook_port = lifeboat_e2e::ports::free_port()?;
    let log = ctx.fleet.state_dir().join("lifeboat-agent-member-3.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_lifeboat-agent"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--cluster-name")
        .arg(M3)
        .arg("--metrics-bind")
        .arg(format!("127.0.0.1:{metrics_port}"))
        .arg("--webhook-url-host")
        .arg("127.0.0.1")
        .arg("--webhook-bind")
        .arg(format!("127.0.0.1:{webhook_port}"))
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(log.with_extension("err"))?)
        .spawn()?;
    let result = async {
        let client = ctx.client(M3).await?;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        wait::until("CRD installed by the agent", T, || async {
            crds.get_opt("appwrappers.workload.codeflare.dev")
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "not yet".to_string())
        })
        .await?;
        let ns = ctx.namespace(M3).await?;
        let api: Api<lifeboat_api::appwrapper::AppWrapper> = Api::namespaced(client, &ns);
        // The CRD may be installed but not yet served; retry the create briefly.
        let aw = appwrapper("standalone", &[], vec![job("standalone", "sleep 2", 1, 1)])?;
        wait::until("AppWrapper created", T, || async {
            match api.create(&PostParams::default(), &aw).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await?;
        until_phase(&api, "standalone", Phase::Succeeded).await?;
        // The binary registered its admission webhook: a nested AppWrapper is refused.
        let nested = appwrapper(
            "nested",
            &[],
            vec![serde_json::to_value(appwrapper(
                "inner",
                &[],
                vec![job("inner", "sleep 1", 1, 0)],
            )?)?],
        )?;
        let err = api
            .create(&PostParams::default(), &nested)
            .await
            .expect_err("nested AppWrappers are forbidden");
        assert!(
            err.to_string().contains("spec.components[0].template"),
            "{err}"
        );
        let body = http_get(([127, 0, 0, 1], metrics_port).into(), "/metrics").await?;
        assert!(
            body.contains("appwrapper_phase_total"),
            "metrics served by the binary"
        );
        Ok::<_, harness::TestError>(())
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    // Its webhook is gone with it: unregister it, or member-3 refuses every AppWrapper.
    let client = ctx.client(M3).await?;
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client);
    for deleted in [
        mutating
            .delete(MUTATING_CONFIGURATION, &DeleteParams::default())
            .await
            .map(|_| ()),
        validating
            .delete(VALIDATING_CONFIGURATION, &DeleteParams::default())
            .await
            .map(|_| ()),
    ] {
        match deleted {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    result
}

async fn samples_run(ctx: Arc<TestContext>) -> TestResult {
    for (group, version, kind) in [
        ("kubeflow.org", "v1", "PyTorchJob"),
        ("jobset.x-k8s.io", "v1alpha2", "JobSet"),
        ("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet"),
    ] {
        install_kind_crd(&ctx, group, version, kind).await?;
    }
    let dir = support::appwrapper_samples_dir();
    let mut names = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e} (set LIFEBOAT_SHARED_DIR)", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    agent(&ctx, M1).await?;
    let client = ctx.client(M1).await?;
    for (i, file) in files.iter().enumerate() {
        let aw: lifeboat_api::appwrapper::AppWrapper =
            serde_saphyr::from_str(&std::fs::read_to_string(file)?)?;
        let name = aw.metadata.name.clone().unwrap_or_default();
        // One namespace per sample: two samples wrap a PyTorchJob of the same name, and a
        // second AppWrapper must not adopt the first one's object.
        let ns = format!("{}-s{i}", ctx.namespace);
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
            )
            .await?;
        let api: Api<lifeboat_api::appwrapper::AppWrapper> = Api::namespaced(client.clone(), &ns);
        wait::until("sample created", T, || async {
            // Right after the namespace, its service account may not exist yet for Pod
            // components; the AppWrapper itself can be created at once.
            api.create(&PostParams::default(), &aw)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await?;
        names.push((file.clone(), name, api));
    }
    assert_eq!(names.len(), 10, "the ten upstream samples");
    // Each is deployed by the agent: Running reached (failing samples go on to reset).
    for (file, name, api) in &names {
        until(api, name, &format!("{} Running", file.display()), T, |aw| {
            aw.status
                .as_ref()
                .is_some_and(|s| s.transitions.iter().any(|t| t.phase == Phase::Running))
        })
        .await?;
    }
    // Samples of native kinds get their pods; LeaderWorkerSet podSets are declared: 2 + 3.
    let (_, _, lws) = names
        .iter()
        .find(|(f, _, _)| f.ends_with("wrapped-leader-worker-set.yaml"))
        .ok_or("no LWS sample")?;
    let status = lws.get("sample-lws").await?.status.unwrap_or_default();
    assert_eq!(
        lifeboat_api::appwrapper::podsets::expected_pod_count_of_status(&status),
        5
    );
    for pods_sample in ["sample-deployment", "sample-job"] {
        let (_, name, api) = names
            .iter()
            .find(|(_, n, _)| n == pods_sample)
            .ok_or_else(|| format!("no sample named {pods_sample} in {}", dir.display()))?;
        until_ready(api, name).await?;
    }
    Ok(())
}

async fn pods_missing(ctx: Arc<TestContext>) -> TestResult {
    let ns = ctx.namespace(M1).await?;
    // A quota of one pod: the Deployment's second pod can never be created.
    let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> =
        Api::namespaced(ctx.client(M1).await?, &ns);
    quotas
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "one-pod"}, "spec": {"hard": {"pods": "1"}}}),
            )?,
        )
        .await?;
    let aw = appwrapper(
        "half",
        &[
            ("admissionGracePeriodDuration", "3s"),
            ("warmupGracePeriodDuration", "1h"),
            ("retryLimit", "0"),
        ],
        vec![deployment("half", 2)],
    )?;
    let api = create(&ctx, M1, &aw).await?;
    let failed = until_phase(&api, "half", Phase::Failed).await?;
    let unhealthy = condition(&failed, "Unhealthy").unwrap_or_default();
    assert_eq!(unhealthy.1, "InsufficientPodsReady");
    assert!(
        unhealthy
            .2
            .contains("1 of 2 pods ready after the AdmissionGracePeriod"),
        "{unhealthy:?}"
    );
    Ok(())
}

async fn failed_job_status(ctx: Arc<TestContext>) -> TestResult {
    // The failed pod alone would wait an hour; the Job's Failed condition resets at once.
    let aw = appwrapper(
        "jobfail",
        &[
            ("failureGracePeriodDuration", "1h"),
            ("retryLimit", "1"),
            ("retryPausePeriodDuration", "1h"),
        ],
        vec![job("jobfail", "sleep 1; exit 1", 1, 0)],
    )?;
    let api = create(&ctx, M1, &aw).await?;
    let resetting = until_phase(&api, "jobfail", Phase::Resetting).await?;
    let unhealthy = condition(&resetting, "Unhealthy").unwrap_or_default();
    assert_eq!(unhealthy.1, "FailedComponent", "{unhealthy:?}");
    assert!(
        unhealthy.2.starts_with("[Application] Job jobfail failed"),
        "{unhealthy:?}"
    );
    assert_eq!(resetting.status.unwrap_or_default().retries, 1);
    Ok(())
}

async fn deletion_on_failure(ctx: Arc<TestContext>) -> TestResult {
    let aw = appwrapper(
        "debugme",
        &[
            ("failureGracePeriodDuration", "0s"),
            ("retryLimit", "0"),
            ("deletionOnFailureGracePeriodDuration", "6s"),
        ],
        vec![job("debugme", "sleep 1; exit 1", 1, 0)],
    )?;
    let api = create(&ctx, M1, &aw).await?;
    let failed = until_phase(&api, "debugme", Phase::Failed).await?;
    // Kept for debugging: the Job, its failed pod and the quota stay during the pause.
    assert_eq!(
        condition(&failed, "QuotaReserved").map(|c| c.0).as_deref(),
        Some("True")
    );
    let jobs: Api<Job> = Api::namespaced(ctx.client(M1).await?, &ctx.namespace);
    assert!(jobs.get_opt("debugme").await?.is_some());
    let paused = until(&api, "debugme", "deletion paused", T, |aw| {
        condition(aw, "DeletingResources").is_some_and(|c| c.1 == "DeletionPaused")
    })
    .await?;
    assert!(
        condition(&paused, "DeletingResources")
            .unwrap_or_default()
            .2
            .contains("6s")
    );
    assert!(
        jobs.get_opt("debugme").await?.is_some(),
        "still there during the pause"
    );
    until(
        &api,
        "debugme",
        "resources deleted after the pause",
        T,
        |aw| condition(aw, "QuotaReserved").is_some_and(|c| c.0 == "False"),
    )
    .await?;
    assert!(jobs.get_opt("debugme").await?.is_none());
    Ok(())
}

async fn load_fifty(ctx: Arc<TestContext>) -> TestResult {
    let mut apis = Vec::new();
    for i in 0..50 {
        let name = format!("load-{i}");
        let mut d = deployment(&name, 2);
        d["spec"]["template"]["spec"]["containers"][0]["resources"] =
            json!({"requests": {"cpu": "5m"}});
        apis.push((
            name.clone(),
            create(&ctx, M1, &appwrapper(&name, &[], vec![d])?).await?,
        ));
    }
    for (name, api) in &apis {
        until_ready(api, name).await?;
    }
    Ok(())
}

/// Member-3's agents reconcile every namespace: its scenarios take turns.
async fn member_3_alone() -> tokio::sync::MutexGuard<'static, ()> {
    static MEMBER_3: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    MEMBER_3.lock().await
}

/// The status code and body of a plain HTTP GET.
async fn http_status(
    addr: std::net::SocketAddr,
    path: &str,
) -> Result<(u16, String), harness::TestError> {
    let response = http_get(addr, path).await?;
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {response:?}"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// Waits until the agent at `metrics` answers `/readyz` with 200.
async fn until_serving_ready(metrics: std::net::SocketAddr, what: &str) -> TestResult {
    wait::until(what, T, || async {
        match http_status(metrics, "/readyz").await {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    Ok(())
}

fn lease_config(namespace: &str, name: &str, identity: &str) -> LeaseConfig {
    LeaseConfig {
        name: name.into(),
        namespace: namespace.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(6),
        renew_deadline: Duration::from_secs(4),
        retry_period: Duration::from_secs(1),
    }
}

/// An in-process agent of `cluster` campaigning for `lease`; its metrics address.
async fn elected_agent(
    cluster: &str,
    kubeconfig: std::path::PathBuf,
    lease: LeaseConfig,
) -> Result<(agent::SpawnedAgent, std::net::SocketAddr), harness::TestError> {
    let metrics: std::net::SocketAddr = ([127, 0, 0, 1], lifeboat_e2e::ports::free_port()?).into();
    let options = AgentOptions {
        kubeconfig: Some(kubeconfig),
        config: OperatorConfig::default(),
        cluster: cluster.to_string(),
        metrics_bind: Some(metrics),
        concurrency: 4,
        install_crd: false,
        webhook: None,
        leader_election: Some(lease),
        hub: None,
    };
    Ok((
        agent::spawn(options, prometheus::Registry::new()).await?,
        metrics,
    ))
}

async fn holder_of(leases: &Api<Lease>, name: &str) -> Result<(String, i32), String> {
    let lease = leases.get(name).await.map_err(|e| e.to_string())?;
    let spec = lease.spec.unwrap_or_default();
    Ok((
        spec.holder_identity.unwrap_or_default(),
        spec.lease_transitions.unwrap_or_default(),
    ))
}

/// Waits until `identity` holds the lease; the time it took and the transitions so far.
async fn until_holder(
    leases: &Api<Lease>,
    name: &str,
    identity: &str,
) -> Result<(Duration, i32), harness::TestError> {
    let started = Instant::now();
    let transitions = wait::until(&format!("{identity} holds {name}"), T, || async {
        match holder_of(leases, name).await? {
            (holder, transitions) if holder == identity => Ok(transitions),
            (holder, _) => Err(format!("held by {holder:?}")),
        }
    })
    .await?;
    Ok((started.elapsed(), transitions))
}

async fn leader_gauge(metrics: std::net::SocketAddr) -> Result<String, harness::TestError> {
    let (_, body) = http_status(metrics, "/metrics").await?;
    Ok(body
        .lines()
        .find(|l| l.starts_with("lifeboat_agent_leader "))
        .unwrap_or_default()
        .to_string())
}

async fn leader_handover(ctx: Arc<TestContext>) -> TestResult {
    let _alone = member_3_alone().await;
    let ns = ctx.namespace(M3).await?;
    let client = ctx.client(M3).await?;
    lifeboat_agent::install::ensure_crd(&client).await?;
    let kubeconfig = ctx.fleet.kubeconfig(M3)?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let lease = "e2e-leader";
    let timing = lease_config(&ns, lease, "");
    let api: Api<lifeboat_api::appwrapper::AppWrapper> = Api::namespaced(client, &ns);
    let run = |name: &str| appwrapper(name, &[], vec![job(name, "sleep infinity", 1, 0)]);

    let (a, a_metrics) =
        elected_agent(M3, kubeconfig.clone(), lease_config(&ns, lease, "agent-a")).await?;
    until_holder(&leases, lease, "agent-a").await?;
    let (b, b_metrics) =
        elected_agent(M3, kubeconfig.clone(), lease_config(&ns, lease, "agent-b")).await?;
    let result = async {
        api.create(&PostParams::default(), &run("before-crash")?)
            .await?;
        until_ready(&api, "before-crash").await?;
        assert_eq!(leader_gauge(a_metrics).await?, "lifeboat_agent_leader 1");
        // The standby serves and is ready (its caches are warm) without leading.
        until_serving_ready(b_metrics, "the standby ready").await?;
        assert_eq!(leader_gauge(b_metrics).await?, "lifeboat_agent_leader 0");
        assert_eq!(holder_of(&leases, lease).await?.0, "agent-a");

        // A crash: nothing is released, the standby waits the lease out.
        a.abort().await;
        let (crash_handover, transitions) = until_holder(&leases, lease, "agent-b").await?;
        assert_eq!(transitions, 1);
        tracing::info!(?crash_handover, "handover after a crash of the leader");
        // Not before the lease could have lapsed (the last renewal was at most one retry
        // period before the crash), and at the first tries after it.
        let retry = timing.retry_period;
        assert!(
            crash_handover >= timing.lease_duration - 2 * retry,
            "took over after {crash_handover:?}, before the lease lapsed"
        );
        assert!(
            crash_handover <= timing.lease_duration + 3 * retry + Duration::from_secs(1),
            "took over after {crash_handover:?}"
        );
        api.create(&PostParams::default(), &run("after-crash")?)
            .await?;
        until_ready(&api, "after-crash").await?;
        assert_eq!(leader_gauge(b_metrics).await?, "lifeboat_agent_leader 1");
        consistently(&api, "before-crash", Phase::Running, Duration::from_secs(2)).await?;

        // A graceful stop releases the lease: the standby takes it at its next try.
        let (a, a_metrics) =
            elected_agent(M3, kubeconfig.clone(), lease_config(&ns, lease, "agent-a")).await?;
        until_serving_ready(a_metrics, "the new standby ready").await?;
        let stopping = Instant::now();
        b.stop().await?;
        let (_, transitions) = until_holder(&leases, lease, "agent-a").await?;
        // From the stop request: the controller's graceful stop, the release, the takeover.
        let release_handover = stopping.elapsed();
        tracing::info!(
            ?release_handover,
            "handover after a graceful stop of the leader"
        );
        assert_eq!(transitions, 2);
        assert!(
            release_handover < timing.lease_duration - retry,
            "a released lease was taken after {release_handover:?}"
        );
        assert!(release_handover < crash_handover);
        api.create(&PostParams::default(), &run("after-release")?)
            .await?;
        until_ready(&api, "after-release").await?;
        // The workloads live on; their deletion is handled by the leader before it stops.
        for name in ["before-crash", "after-crash", "after-release"] {
            api.delete(name, &DeleteParams::default()).await?;
        }
        wait::until("AppWrappers deleted", T, || async {
            let left = api
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
            if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} left"))
            }
        })
        .await?;
        a.stop().await?;
        Ok::<_, harness::TestError>(())
    }
    .await;
    // On failure the agents still running are dropped, which stops them.
    result
}

/// A kubeconfig for `cluster` that authenticates as a service account (its token).
async fn service_account_kubeconfig(
    ctx: &TestContext,
    cluster: &str,
    namespace: &str,
    account: &str,
) -> Result<std::path::PathBuf, harness::TestError> {
    let client = ctx.client(cluster).await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client, namespace);
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": account}}))?,
        )
        .await?;
    let token = accounts
        .create_token_request(
            account,
            &PostParams::default(),
            &serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))?,
        )
        .await?
        .status
        .ok_or("no token issued")?
        .token;
    let admin = kube::config::Kubeconfig::read_from(ctx.fleet.kubeconfig(cluster)?)?;
    let mut config = serde_json::to_value(&admin)?;
    for user in config["users"]
        .as_array_mut()
        .ok_or("no users in the kubeconfig")?
    {
        user["user"] = json!({"token": token});
    }
    let path = ctx
        .fleet
        .state_dir()
        .join(format!("{cluster}-{namespace}-{account}.kubeconfig"));
    std::fs::write(&path, serde_json::to_vec(&config)?)?;
    Ok(path)
}

async fn readyz_follows_watch_sync(ctx: Arc<TestContext>) -> TestResult {
    let ns = ctx.namespace(M1).await?;
    let client = ctx.client(M1).await?;
    lifeboat_agent::install::ensure_crd(&client).await?;
    // The lease is held by someone else for an hour: this agent stays a standby and writes
    // nothing, whatever runs on the cluster.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let held = json!({"metadata": {"name": "e2e-readyz"}, "spec": {"holderIdentity": "someone-else",
        "leaseDurationSeconds": 3600, "renewTime": k8s_openapi::jiff::Timestamp::now()}});
    leases
        .create(&PostParams::default(), &serde_json::from_value(held)?)
        .await?;
    // It may read what it watches except nodes: its node watch cannot sync.
    let role = format!("{ns}-agent");
    let read = json!(["get", "list", "watch"]);
    let mut rules = json!([
        {"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"], "verbs": read},
        {"apiGroups": [""], "resources": ["pods"], "verbs": read},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": read},
    ]);
    let roles: Api<ClusterRole> = Api::all(client.clone());
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": role}, "rules": rules}))?,
        )
        .await?;
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": "readyz-agent", "namespace": ns}]}))?,
        )
        .await?;
    let kubeconfig = service_account_kubeconfig(&ctx, M1, &ns, "readyz-agent").await?;
    let (agent, metrics) = elected_agent(
        M1,
        kubeconfig,
        lease_config(&ns, "e2e-readyz", "readyz-agent"),
    )
    .await?;
    let result = async {
        // Served at once; unready, naming the watch that has not synced, for as long as it
        // cannot.
        let unready = wait::until("only the node watch unsynced", T, || async {
            match http_status(metrics, "/readyz").await {
                Ok((503, body)) if body == "watches not synced yet: nodes" => Ok(body),
                other => Err(format!("{other:?}")),
            }
        })
        .await?;
        assert_eq!(http_status(metrics, "/healthz").await?, (200, "ok".into()));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(http_status(metrics, "/readyz").await?, (503, unready));
        // Allowed to list nodes, the watch syncs on its next retry.
        rules
            .as_array_mut()
            .ok_or("rules")?
            .push(json!({"apiGroups": [""], "resources": ["nodes"], "verbs": read}));
        roles
            .patch(
                &role,
                &PatchParams::default(),
                &Patch::Merge(json!({"rules": rules})),
            )
            .await?;
        wait::until("ready once the node watch synced", T, || async {
            match http_status(metrics, "/readyz").await {
                Ok((200, body)) if body == "ok" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await?;
        // Ready as a standby: it never led nor touched the lease.
        assert_eq!(leader_gauge(metrics).await?, "lifeboat_agent_leader 0");
        assert_eq!(
            holder_of(&leases, "e2e-readyz").await?,
            ("someone-else".to_string(), 0)
        );
        Ok::<_, harness::TestError>(())
    }
    .await;
    agent.stop().await?;
    roles.delete(&role, &DeleteParams::default()).await?;
    bindings.delete(&role, &DeleteParams::default()).await?;
    result
}
