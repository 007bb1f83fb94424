//! Fencing across an agent-to-hub partition (issue 9, scenario 6), on the local fleet (hub + 2
//! members) with the real hub and one agent per member in hub mode, in this process. Each agent
//! reaches the hub through its own TCP proxy, which the test cuts to partition it.
//!
//! An AppWrapper whose policy fails over with `purgeMode: Directly` runs in one member. That
//! member's agent is cut off from the hub (the member itself keeps running, and the hub still
//! reaches its kube-apiserver): after its fencing period the agent suspends the AppWrapper (its
//! own fence); the hub sees the cluster lost, evicts the binding after the cluster toleration,
//! deletes the old copy itself through the member's kube-apiserver with the fencing credential
//! the agent gave before the cut, and creates the new copy in the other member only once the old
//! one is gone. The partition heals: the agent reports what it suspended and learns from the
//! hub's snapshot that the work moved. Both members are polled throughout: never two copies with
//! live pods.
//!
//! One test: the suite shares one hub cluster, and one hub binds it.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, ListParams, PostParams};
use lifeboat_api::binding::{EVICTION_CLUSTER_FAILURE, ResourceBinding};
use lifeboat_api::policy::PurgeMode;
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestError, TestResult};
use lifeboat_e2e::partition::PartitionProxy;
use lifeboat_e2e::wait;
use serde_json::json;
use support::T;
use support::hub::{
    appwrapper_resource, binding_of, bootstrap, live, placement, start_hub_with, tempfile_dir,
    until_placed_on_one,
};

/// The agents' and the hub's fencing period (they must agree).
const FENCING: Duration = Duration::from_secs(5);
/// The cluster lease and heartbeat interval of the test hub (support::hub::start_hub): the
/// last heartbeat before a cut is up to one interval before it, and both the agent's fencing
/// period and the hub's lease count from that heartbeat.
const LEASE: Duration = Duration::from_secs(10);
const HEARTBEAT: Duration = Duration::from_secs(2);
/// The policy's cluster toleration.
const CLUSTER_TOLERATION: Duration = Duration::from_secs(2);
/// Slack over a deadline: heartbeat intervals, one scheduling pass, an apply, a loaded machine.
const SLACK: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    harness::run(
        "fencing",
        |c| {
            c.members = 2;
            c.nodes_per_member = 2;
            c.gpus_per_node = 8;
        },
        vec![E2eTest::new(
            "a_partitioned_agent_fences_directly_workloads_and_the_hub_moves_them_without_a_second_copy",
            partition,
        )],
    )
}

async fn partition(ctx: Arc<TestContext>) -> TestResult {
    let dir = tempfile_dir(&ctx.namespace)?;
    let hub = ctx.client("hub").await?;
    lifeboat_agent::install::ensure_crd(&hub).await?;
    let hub_url = start_hub_with(&ctx, |o| o.agent_api.fencing_period = FENCING).await?;
    bootstrap(&hub, &dir).await?;
    let hub_addr: SocketAddr = hub_url
        .trim_start_matches("https://")
        .parse()
        .map_err(|e| format!("hub URL {hub_url}: {e}"))?;
    let members = ctx.fleet.member_names();
    let mut proxies = BTreeMap::new();
    let mut agents = Vec::new();
    for (member, region) in members.iter().zip(["us-east-1", "eu-west-1"]) {
        let proxy = PartitionProxy::start(hub_addr).await?;
        let mut options = support::hub_mode(
            vec![format!("https://{}", proxy.addr())],
            &dir,
            region,
            &format!("{member}-agent"),
        );
        options.fencing_period = FENCING;
        agents.push(
            support::spawn_agent(&ctx.fleet, member, 4, Some(options))
                .await?
                .0,
        );
        proxies.insert(member.clone(), proxy);
    }
    support::hub::until_clusters_ready(&hub, members.iter()).await?;
    // Each agent gave the hub its fencing credential (a heartbeat carries it once it is made).
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(hub.clone(), lifeboat_api::cluster::HUB_SYSTEM_NAMESPACE);
    for member in &members {
        let name = lifeboat_api::fencing::credential_secret_name(member);
        wait::until(&format!("the hub holds {name}"), T, || async {
            match secrets.get_opt(&name).await {
                Ok(Some(_)) => Ok(()),
                Ok(None) => Err("not yet".to_string()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await?;
    }

    let ns = ctx.namespace("hub").await?;
    for member in &members {
        ctx.namespace(member).await?;
    }
    lifeboat_e2e::fleet::lifeboat::apply_propagation_policy(
        &hub,
        &ns,
        "never-twice",
        json!({
            "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper"}],
            "failover": {
                "application": {"decisionConditions": {"tolerationSeconds": 0}, "purgeMode": "Directly"},
                "cluster": {"tolerationSeconds": CLUSTER_TOLERATION.as_secs(), "purgeMode": "Directly"}
            }
        }),
    )
    .await?;
    let mut train = serde_json::to_value(support::appwrapper(
        "train",
        &[],
        vec![support::job("train-job", "sleep 3600", 1, 1)],
    )?)?;
    train["metadata"]["namespace"] = json!(ns);
    Api::<DynamicObject>::namespaced_with(hub.clone(), &ns, &appwrapper_resource())
        .create(&PostParams::default(), &serde_json::from_value(train)?)
        .await?;
    let bindings: Api<ResourceBinding> = Api::namespaced(hub.clone(), &ns);
    let placed = until_placed_on_one(&bindings, "train", T).await?;
    let other = members
        .iter()
        .find(|m| **m != placed)
        .cloned()
        .ok_or("no other member")?;
    let member_api = |member: &str| {
        let ctx = ctx.clone();
        let member = member.to_string();
        let ns = ns.clone();
        async move {
            Ok::<_, TestError>(Api::<DynamicObject>::namespaced_with(
                ctx.client(&member).await?,
                &ns,
                &appwrapper_resource(),
            ))
        }
    };
    let old_api = member_api(&placed).await?;
    let new_api = member_api(&other).await?;
    wait::until("train's pod live where it was placed", T, || async {
        let pods = support::pods_of(&ctx, &placed, "train")
            .await
            .map_err(|e| e.to_string())?;
        if live(&pods) > 0 {
            Ok(())
        } else {
            Err("no live pod yet".to_string())
        }
    })
    .await?;

    // Both members polled throughout: how many have live pods of train at once.
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicUsize::new(0));
    let poller = {
        let (ctx, stop, most) = (ctx.clone(), stop.clone(), most.clone());
        let members = members.clone();
        tokio::spawn(async move {
            let mut polls = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let mut with_pods = 0;
                for member in &members {
                    match support::pods_of(&ctx, member, "train").await {
                        Ok(pods) if live(&pods) > 0 => with_pods += 1,
                        Ok(_) => {}
                        Err(e) => return Err(format!("polling {member}: {e}")),
                    }
                }
                most.fetch_max(with_pods, Ordering::SeqCst);
                polls += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(polls)
        })
    };

    // The partition: the placed member's agent cannot reach the hub.
    let proxy = proxies.get(&placed).ok_or("no proxy")?;
    proxy.cut();
    let cut_at = Instant::now();
    wait::until(
        "the agent suspends train (fenced)",
        FENCING + SLACK,
        || async {
            let aw = old_api
                .get_opt("train")
                .await
                .map_err(|e| e.to_string())?
                .ok_or("train is gone from the old member")?;
            if aw.data["spec"]["suspend"] == json!(true) {
                Ok(())
            } else {
                Err("not suspended yet".to_string())
            }
        },
    )
    .await?;
    let fenced_after = cut_at.elapsed();
    if fenced_after + HEARTBEAT < FENCING {
        return Err(format!(
            "suspended {fenced_after:?} after the cut: before the fencing period ({FENCING:?}) \
             counted from the last heartbeat"
        )
        .into());
    }
    wait::until("train's pods gone from the fenced member", T, || async {
        let pods = support::pods_of(&ctx, &placed, "train")
            .await
            .map_err(|e| e.to_string())?;
        match live(&pods) {
            0 => Ok(()),
            n => Err(format!("{n} live pods")),
        }
    })
    .await?;
    // The hub moves it once the lease ran out and the toleration passed, and creates the new
    // copy once its own fence confirmed the old one gone.
    let moved = wait::until(
        "train placed in the other member",
        LEASE + CLUSTER_TOLERATION + SLACK,
        || async {
            let b = binding_of(&bindings, "train").await?;
            let purged = b
                .spec
                .graceful_eviction_tasks
                .iter()
                .any(|t| t.from_cluster == placed && t.purged_at.is_some());
            if placement(&b) == [other.clone()]
                && (purged || b.spec.graceful_eviction_tasks.is_empty())
            {
                Ok(b)
            } else {
                Err(format!(
                    "clusters {:?}, tasks {:?}",
                    placement(&b),
                    b.spec.graceful_eviction_tasks
                ))
            }
        },
    )
    .await?;
    let record = moved
        .spec
        .eviction_history
        .iter()
        .find(|r| r.cluster_name == placed)
        .ok_or("no eviction record for the partitioned cluster")?;
    if record.reason != EVICTION_CLUSTER_FAILURE {
        return Err(format!("eviction record {record:?}").into());
    }
    wait::until("train Running in the other member", T, || async {
        let aw = new_api
            .get_opt("train")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("not there yet")?;
        match aw.data["status"]["phase"].as_str() {
            Some("Running") => Ok(()),
            p => Err(format!("phase {p:?}")),
        }
    })
    .await?;
    let started_after = cut_at.elapsed();
    // The evidence: the hub's own deletion through the member's kube-apiserver (the agent could
    // not tell it), which the agent's controller carried out on the suspended copy.
    let old_item = binding_of(&bindings, "train")
        .await?
        .cluster_status(&placed)
        .cloned()
        .ok_or("no status item of the old cluster")?;
    if old_item.gone_confirmed_by != Some(lifeboat_api::binding::GoneConfirmedBy::Hub) {
        return Err(format!("the old copy was not confirmed gone by the hub: {old_item:?}").into());
    }
    if old_api.get_opt("train").await?.is_some() {
        return Err("the old copy is still in the partitioned member".into());
    }

    // The partition heals: the agent learns that train moved (nothing to put back).
    proxy.heal();
    support::hub::until_clusters_ready(&hub, [&placed]).await?;
    if old_api.get_opt("train").await?.is_some() {
        return Err("the old copy came back in the healed member".into());
    }
    // Back, the agent reported what it suspended: a Warning Event on its Cluster.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(hub.clone());
    wait::until("a Fenced Event on the Cluster", T, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let fenced = list.items.iter().find(|e| {
            e.reason.as_deref() == Some("Fenced")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(placed.as_str())
        });
        match fenced {
            Some(e) if e.note.as_deref().is_some_and(|n| n.contains("/train")) => Ok(()),
            Some(e) => Err(format!("the Event does not name train: {:?}", e.note)),
            None => Err("no Fenced Event yet".to_string()),
        }
    })
    .await?;
    let after = binding_of(&bindings, "train").await?;
    if placement(&after) != [other.clone()] {
        return Err(format!("after the partition: clusters {:?}", placement(&after)).into());
    }
    if moved
        .spec
        .failover
        .as_ref()
        .and_then(|f| f.cluster.as_ref())
        .map(|c| c.purge_mode())
        != Some(PurgeMode::Directly)
    {
        return Err("the binding's cluster failover is not Directly".into());
    }

    stop.store(true, Ordering::SeqCst);
    let polls = poller.await.map_err(|e| e.to_string())??;
    let most = most.load(Ordering::SeqCst);
    tracing::info!(polls, ?fenced_after, ?started_after, "partition survived");
    if polls < 10 || most != 1 {
        return Err(format!(
            "members with live pods of train at once: at most {most} over {polls} polls (want exactly 1)"
        )
        .into());
    }
    drop(agents);
    Ok(())
}
