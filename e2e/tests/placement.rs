//! The hub and its agents as they run in production, on the local fleet (hub + 2 members): the
//! real hub (`lifeboat_hub::process::run`: CRDs, agent API over TLS with its CA in a Secret, binder
//! with the scheduler plugins, status processor, cluster health) and one agent per member in
//! hub mode, each registering with a bootstrap token.
//!
//! An AppWrapper applied to the hub with a PropagationPolicy that names member-2 runs in
//! member-2 (and not in member-1); its health per cluster is on its ResourceBinding and its phase
//! on the hub's AppWrapper. A policy that no cluster satisfies leaves the binding with
//! `Scheduled=False` and a reason per cluster. The hub's event ledger (a SQLite file) then holds
//! the binding's dispatch to member-2, its health transition to Healthy there and member-2's
//! transition to Ready, read with the ledger's own queries.

mod support;

use std::process::ExitCode;
use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, PostParams};
use lifeboat_api::binding::ResourceBinding;
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestResult};
use lifeboat_e2e::wait;
use serde_json::json;
use support::T;
use support::hub::{
    appwrapper_resource, bootstrap, start_agent, start_hub, tempfile_dir, until_clusters_ready,
};

fn main() -> ExitCode {
    harness::run(
        "placement",
        |c| {
            c.members = 2;
            c.nodes_per_member = 2;
            c.gpus_per_node = 8;
        },
        vec![
            E2eTest::new(
                "an_appwrapper_applied_to_the_hub_runs_in_the_member_its_policy_names",
                appwrapper_runs_where_its_policy_says,
            ),
            // Here rather than in the fleet's own suite, which restarts the hub's apiserver.
            E2eTest::new(
                "the_hub_keeps_a_job_without_running_it",
                hub_runs_no_workloads,
            ),
        ],
    )
}

async fn appwrapper_runs_where_its_policy_says(ctx: Arc<TestContext>) -> TestResult {
    let dir = tempfile_dir(&ctx.namespace)?;
    let hub = ctx.client("hub").await?;
    // The hub serves AppWrappers as templates (it runs none itself).
    lifeboat_agent::install::ensure_crd(&hub).await?;
    let hub_url = start_hub(&ctx).await?;
    bootstrap(&hub, &dir).await?;
    let members = ctx.fleet.member_names();
    let (first, second) = match members.as_slice() {
        [a, b, ..] => (a.clone(), b.clone()),
        _ => return Err("the fleet needs two members".into()),
    };
    let _agent_1 = start_agent(&ctx, &first, &hub_url, &dir, "us-east-1").await?;
    let _agent_2 = start_agent(&ctx, &second, &hub_url, &dir, "eu-west-1").await?;

    // Both agents register and heartbeat: their Clusters are Ready, with GPU capacity.
    until_clusters_ready(&hub, [&first, &second]).await?;

    // A policy naming the second member, and an AppWrapper it selects, applied to the hub.
    let ns = ctx.namespace("hub").await?;
    lifeboat_e2e::fleet::lifeboat::apply_propagation_policy(
        &hub,
        &ns,
        "train-on-second",
        json!({
            "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "train"}],
            "placement": {"clusterAffinity": {"clusterNames": [second]}}
        }),
    )
    .await?;
    let appwrappers: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &ns, &appwrapper_resource());
    let mut train = serde_json::to_value(support::appwrapper(
        "train",
        &[],
        vec![support::job("train-job", "sleep 3600", 1, 1)],
    )?)?;
    train["metadata"]["namespace"] = json!(ns);
    appwrappers
        .create(&PostParams::default(), &serde_json::from_value(train)?)
        .await?;

    // The binding places it on the second member.
    let bindings: Api<ResourceBinding> = Api::namespaced(hub.clone(), &ns);
    let binding = wait::until("the binding scheduled on the second member", T, || async {
        let list = bindings
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let binding = list
            .items
            .into_iter()
            .find(|b| b.spec.resource.name == "train")
            .ok_or("no binding yet")?;
        let names: Vec<&str> = binding
            .spec
            .clusters
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        if names == [second.as_str()] {
            Ok(binding)
        } else {
            Err(format!("clusters {names:?}"))
        }
    })
    .await?;
    let binding_name = binding.metadata.name.clone().unwrap_or_default();

    // It runs in the second member (the agent's AppWrapper controller takes it to Running), and
    // nothing of it reaches the first.
    let in_second: Api<DynamicObject> =
        Api::namespaced_with(ctx.client(&second).await?, &ns, &appwrapper_resource());
    wait::until("the AppWrapper Running in the second member", T, || async {
        let aw = in_second
            .get_opt("train")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("not applied yet")?;
        match aw.data["status"]["phase"].as_str() {
            Some("Running") => Ok(()),
            other => Err(format!("phase {other:?}")),
        }
    })
    .await?;
    let in_first: Api<DynamicObject> =
        Api::namespaced_with(ctx.client(&first).await?, &ns, &appwrapper_resource());
    if in_first.get_opt("train").await?.is_some() {
        return Err("the AppWrapper reached the first member too".into());
    }

    // Its health per cluster is on the binding, and its phase on the hub's AppWrapper.
    wait::until("the binding's aggregated status Healthy", T, || async {
        let b = bindings
            .get(&binding_name)
            .await
            .map_err(|e| e.to_string())?;
        let items = b.status.map(|s| s.aggregated_status).unwrap_or_default();
        match items.as_slice() {
            [item]
                if item.cluster_name == second
                    && item.applied
                    && format!("{:?}", item.health) == "Healthy" =>
            {
                Ok(())
            }
            other => Err(format!("aggregated status {other:?}")),
        }
    })
    .await?;
    let binding_uid = binding.metadata.uid.clone().unwrap_or_default();
    ledger_has_the_run(&ctx, &ns, &binding_name, &binding_uid, &first, &second).await?;
    wait::until("the hub's AppWrapper shows Running", T, || async {
        let aw = appwrappers.get("train").await.map_err(|e| e.to_string())?;
        match aw.data["status"]["phase"].as_str() {
            Some("Running") => Ok(()),
            other => Err(format!("phase {other:?}")),
        }
    })
    .await?;

    // A policy nobody satisfies: Scheduled=False with a reason per cluster.
    lifeboat_e2e::fleet::lifeboat::apply_propagation_policy(
        &hub,
        &ns,
        "nowhere",
        json!({
            "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "huge"}],
            "placement": {"clusterAffinity": {"labelSelector": {"matchLabels": {"gpu": "b200"}}}}
        }),
    )
    .await?;
    let mut huge = serde_json::to_value(support::appwrapper(
        "huge",
        &[],
        vec![support::job("huge-job", "sleep 3600", 1, 1)],
    )?)?;
    huge["metadata"]["namespace"] = json!(ns);
    appwrappers
        .create(&PostParams::default(), &serde_json::from_value(huge)?)
        .await?;
    wait::until("the unschedulable binding says why", T, || async {
        let list = bindings
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let b = list
            .items
            .into_iter()
            .find(|b| b.spec.resource.name == "huge")
            .ok_or("no binding yet")?;
        let status = b.status.unwrap_or_default();
        let scheduled = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Scheduled")
            .ok_or("no Scheduled condition")?;
        if scheduled.status != "False" {
            return Err(format!("Scheduled={}", scheduled.status));
        }
        let rejected: Vec<&str> = status
            .rejected_clusters
            .iter()
            .map(|r| r.cluster_name.as_str())
            .collect();
        if rejected.len() == 2 && b.spec.clusters.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "rejected {rejected:?}, clusters {:?}",
                b.spec.clusters
            ))
        }
    })
    .await?;
    Ok(())
}

/// The hub keeps workload templates for the members: the same Job that a member's job
/// controller starts at once is left alone on the hub (no pods, no start time).
async fn hub_runs_no_workloads(ctx: Arc<TestContext>) -> TestResult {
    let member = ctx.first_member();
    let mut started = Vec::new();
    for cluster in ["hub", member.as_str()] {
        let ns = ctx.namespace(cluster).await?;
        let jobs: Api<Job> = Api::namespaced(ctx.client(cluster).await?, &ns);
        jobs.create(
            &PostParams::default(),
            &serde_json::from_value(support::job("template", "sleep infinity", 1, 0))?,
        )
        .await?;
        started.push((cluster.to_string(), jobs));
    }
    let (_, member_jobs) = &started[1];
    wait::until("the member's job controller starts the Job", T, || async {
        let job = member_jobs
            .get("template")
            .await
            .map_err(|e| e.to_string())?;
        match job.status.and_then(|s| s.start_time) {
            Some(_) => Ok(()),
            None => Err("not started yet".to_string()),
        }
    })
    .await?;
    let (_, hub_jobs) = &started[0];
    let hub_job = hub_jobs.get("template").await?;
    let status = hub_job.status.unwrap_or_default();
    assert!(
        status.start_time.is_none() && status.active.unwrap_or(0) == 0,
        "the hub ran its Job: {status:?}"
    );
    let pods: Api<Pod> = Api::namespaced(ctx.client("hub").await?, &ctx.namespace("hub").await?);
    assert!(
        pods.list(&kube::api::ListParams::default().labels("job-name=template"))
            .await?
            .items
            .is_empty(),
        "pods on the hub"
    );
    Ok(())
}

/// The ledger holds the binding's dispatch to `second` (none to `first`), its health transition
/// to Healthy there, and `second`'s transition to Ready, as the ledger's queries return them.
async fn ledger_has_the_run(
    ctx: &TestContext,
    namespace: &str,
    binding: &str,
    uid: &str,
    first: &str,
    second: &str,
) -> TestResult {
    use lifeboat_ledger::{EventKind, Ledger};
    let path = tempfile_dir(&ctx.namespace)?.join("ledger.db");
    let ledger = Ledger::connect(&format!("sqlite://{}", path.display())).await?;
    let of_this_binding = |r: &lifeboat_ledger::LedgerRecord| {
        r.event.binding.as_ref().and_then(|b| b.uid.as_deref()) == Some(uid)
    };
    wait::until(
        "the ledger records the dispatch and the health transition",
        T,
        || async {
            let history = ledger
                .history_of_binding(namespace, binding, 100)
                .await
                .map_err(|e| e.to_string())?;
            let dispatched = history.iter().any(|r| {
                of_this_binding(r)
                    && r.event.kind == EventKind::Dispatch
                    && r.event.cluster.as_deref() == Some(second)
                    && r.event.to.as_deref() == Some("Dispatched")
                    && r.event.details["revision"].as_i64().is_some_and(|v| v > 0)
                    && r.event.details["kind"] == "AppWrapper"
            });
            let healthy = history.iter().any(|r| {
                of_this_binding(r)
                    && r.event.kind == EventKind::HealthTransition
                    && r.event.cluster.as_deref() == Some(second)
                    && r.event.to.as_deref() == Some("Healthy")
            });
            if history
                .iter()
                .any(|r| r.event.cluster.as_deref() == Some(first))
            {
                return Err(format!("events on {first}: {history:?}"));
            }
            if dispatched && healthy {
                Ok(())
            } else {
                Err(format!("history {history:?}"))
            }
        },
    )
    .await?;
    let on_second = ledger
        .cluster_since(second, chrono::DateTime::UNIX_EPOCH, 1000)
        .await?;
    if !on_second.iter().any(|r| {
        r.event.kind == EventKind::ClusterTransition && r.event.to.as_deref() == Some("Ready")
    }) {
        return Err(format!("no Ready transition of {second}: {on_second:?}").into());
    }
    ledger.close().await;
    Ok(())
}
