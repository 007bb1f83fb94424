//! `lifeboatctl get bindings` and `lifeboatctl confirm-purge` against the fleet's hub apiserver
//! (the ResourceBinding CRD installed, a binding written as the hub would): what they print,
//! the annotation confirm-purge writes, and its refusals.

use std::process::{Command, ExitCode, Output};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use lifeboat_api::binding::{
    ANNOTATION_CONFIRM_PURGE, EVICTION_APPLICATION_FAILURE, EVICTION_CLUSTER_FAILURE,
    ResourceBinding,
};
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestError, TestResult};
use serde_json::{Value, json};

const HUB: &str = "hub";
const BINDING: &str = "train-appwrapper";

fn main() -> ExitCode {
    harness::run(
        "bindings-cli",
        |c| c.members = 1,
        vec![E2eTest::new(
            "get_bindings_shows_evictions_and_confirm_purge_confirms_only_never",
            bindings,
        )],
    )
}

fn lifeboatctl(ctx: &TestContext, args: &[&str]) -> Result<Output, TestError> {
    Ok(Command::new(env!("CARGO_BIN_EXE_lifeboatctl"))
        .args(args)
        .arg("--kubeconfig")
        .arg(ctx.fleet.kubeconfig(HUB)?)
        .env_remove("KUBECONFIG")
        .output()?)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn check(ok: bool, what: impl std::fmt::Display) -> TestResult {
    if ok {
        Ok(())
    } else {
        Err(what.to_string().into())
    }
}

async fn bindings(ctx: Arc<TestContext>) -> TestResult {
    let hub = ctx.client(HUB).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(hub.clone());
    let crd = ResourceBinding::crd();
    let crd_name = crd.metadata.name.clone().unwrap_or_default();
    crds.patch(
        &crd_name,
        &PatchParams::apply("lifeboat-e2e").force(),
        &Patch::Apply(&crd),
    )
    .await?;
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(crds, &crd_name, conditions::is_crd_established()),
    )
    .await??;
    let ns = ctx.namespace(HUB).await?;
    let api: Api<ResourceBinding> = Api::namespaced(hub.clone(), &ns);
    // Moved from member-1 (Never: its copy is kept) to member-2; member-3's Directly copy is gone.
    let binding: ResourceBinding = serde_json::from_value(json!({
        "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
        "metadata": {"name": BINDING, "namespace": ns},
        "spec": {
            "resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "train"},
            "clusters": [{"name": "member-2"}],
            "gracefulEvictionTasks": [
                {"fromCluster": "member-1", "purgeMode": "Never", "reason": EVICTION_APPLICATION_FAILURE,
                 "producer": "lifeboat-hub", "suppressDeletion": true,
                 "creationTimestamp": "2026-11-23T10:00:00Z"},
                {"fromCluster": "member-3", "purgeMode": "Directly", "reason": EVICTION_CLUSTER_FAILURE,
                 "producer": "lifeboat-hub", "creationTimestamp": "2026-11-23T10:00:00Z",
                 "purgedAt": "2026-11-23T10:00:05Z"}
            ]
        }
    }))?;
    api.create(&PostParams::default(), &binding).await?;
    api.patch_status(
        BINDING,
        &PatchParams::apply("lifeboat-e2e"),
        &Patch::Apply(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
            "status": {"aggregatedStatus": [
                {"clusterName": "member-1", "applied": true, "health": "Unhealthy",
                 "failureClass": "Infrastructure", "healthReason": "node n1 is NotReady"},
                {"clusterName": "member-2", "applied": true, "health": "Healthy"}
            ]}
        })),
    )
    .await?;

    // get bindings: a table, one row per cluster, and JSON.
    let out = lifeboatctl(&ctx, &["get", "bindings", "-n", &ns])?;
    let table = text(&out.stdout);
    check(
        out.status.success(),
        format!("get bindings: {}", text(&out.stderr)),
    )?;
    let rows: Vec<&str> = table.lines().collect();
    check(
        rows.len() == 4
            && rows[0].starts_with("BINDING")
            && rows[1].contains("member-2")
            && rows[1].contains("placed")
            && rows[1].contains("Healthy")
            && rows[2].contains("member-1")
            && rows[2].contains("Infrastructure")
            && rows[2].contains(&format!(
                "stays until `lifeboatctl confirm-purge {ns}/{BINDING} member-1`"
            ))
            && rows[3].contains("member-3")
            && rows[3].contains("Directly ClusterFailure"),
        format!("get bindings printed:\n{table}"),
    )?;
    let out = lifeboatctl(&ctx, &["get", "bindings", "-A", "-o", "json"])?;
    let all: Value = serde_json::from_slice(&out.stdout)?;
    let ours = all
        .as_array()
        .and_then(|a| a.iter().find(|b| b["namespace"] == json!(ns)))
        .ok_or_else(|| format!("-A does not list {ns}: {all}"))?;
    check(
        ours["placement"] == json!([{"cluster": "member-2", "replicas": 0}])
            && ours["evictionTasks"][0]["purgeMode"] == "Never"
            && ours["clusters"][1]["failureClass"] == "Infrastructure",
        format!("get bindings -o json: {ours}"),
    )?;

    // confirm-purge: refused for a Directly eviction already confirmed gone and for a cluster
    // not evicted; nothing written.
    let binding_arg = format!("{ns}/{BINDING}");
    for (cluster, needle) in [
        ("member-3", "was already confirmed gone"),
        ("member-2", "has no eviction from member-2"),
    ] {
        let out = lifeboatctl(&ctx, &["confirm-purge", &binding_arg, cluster])?;
        let stderr = text(&out.stderr);
        check(
            !out.status.success() && stderr.contains(needle),
            format!("confirm-purge {cluster}: {:?} {stderr}", out.status),
        )?;
    }
    let out = lifeboatctl(
        &ctx,
        &["confirm-purge", &format!("{ns}/missing"), "member-1"],
    )?;
    check(
        !out.status.success() && text(&out.stderr).contains("no ResourceBinding"),
        format!("a missing binding: {}", text(&out.stderr)),
    )?;
    let annotation = |b: &ResourceBinding| {
        b.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_CONFIRM_PURGE))
            .cloned()
    };
    check(
        annotation(&api.get(BINDING).await?).is_none(),
        "a refused confirm-purge wrote the annotation",
    )?;
    // The Never eviction: confirmed, then already confirmed.
    let out = lifeboatctl(&ctx, &["confirm-purge", &binding_arg, "member-1"])?;
    check(
        out.status.success() && text(&out.stdout).starts_with("confirmed"),
        format!(
            "confirm-purge member-1: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        ),
    )?;
    check(
        annotation(&api.get(BINDING).await?).as_deref() == Some("member-1"),
        "the annotation names member-1",
    )?;
    let out = lifeboatctl(&ctx, &["confirm-purge", &binding_arg, "member-1"])?;
    check(
        out.status.success() && text(&out.stdout).contains("already confirmed"),
        format!("confirm-purge again: {}", text(&out.stdout)),
    )?;
    let out = lifeboatctl(&ctx, &["get", "bindings", "-n", &ns])?;
    check(
        text(&out.stdout).contains("the purge is confirmed: the old copy in member-1 goes"),
        format!("after the confirmation:\n{}", text(&out.stdout)),
    )?;
    Ok(())
}
