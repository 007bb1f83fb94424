//! At most one copy when agents die (issue 18, part 1), with Lifeboat as real processes on the
//! local fleet: one `lifeboat-hub`, two `lifeboat-agent` replicas per member (leader election,
//! as the agent chart runs them), three members. Workloads fail over with `purgeMode: Directly`:
//! the new copy may be created only on evidence that the old one no longer runs, never on time
//! alone (a SIGKILLed agent suspends nothing; its pods keep running).
//!
//! 1. The leading agent replica of a member is killed while a standby exists: the standby takes
//!    the member's Lease over and the workload stays where it is, one copy.
//! 2. Every agent replica of a member is killed: the cluster goes Unknown, its workloads are
//!    evicted after the cluster toleration, and the hub fences them itself through the member's
//!    kube-apiserver with the fencing credential the agent gave (it deletes each old copy and
//!    waits until its pods are gone) before it creates the new copies elsewhere.
//! 3. The same without a fencing credential (the hub's copy of it is deleted after the agents
//!    die): the failover waits (`FailoverBlocked=WaitingForFence`, the message saying how to
//!    confirm it, the gauge the alert reads) until an operator stops the old copy and runs
//!    `lifeboatctl confirm-purge --all-in`.
//!
//! Every member is polled every 200 ms throughout: never two copies with live pods (terminating
//! pods count as live). The tests run one at a time, in order, on one fleet.
//!
//! Needs the binaries: `cargo build -p lifeboat-hub -p lifeboat-agent -p lifeboatctl`.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use lifeboat_api::binding::{
    BLOCKED_WAITING_FOR_FENCE, CONDITION_FAILOVER_BLOCKED, EVICTION_CLUSTER_FAILURE,
    GoneConfirmedBy, ResourceBinding,
};
use lifeboat_api::cluster::HUB_SYSTEM_NAMESPACE;
use lifeboat_e2e::fleet::lifeboat::{
    apply_propagation_policy, appwrapper_resource, binding_of, cluster_ready, lifeboat_bin_dir,
    placement, training_appwrapper, until_appwrapper_running, until_placed_on_one,
};
use lifeboat_e2e::fleet::{LifeboatConfig, LifeboatProcess};
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestError, TestResult};
use lifeboat_e2e::wait;
use serde_json::json;

/// The hub's `--cluster-lease-seconds` in this suite (heartbeats every 2 s).
const CLUSTER_LEASE: Duration = Duration::from_secs(10);
/// The policies' cluster toleration for the failover tests.
const CLUSTER_TOLERATION: Duration = Duration::from_secs(2);
/// The agents' leader Lease in their member (lifeboat-agent's default `--leader-elect-*`: 15 s
/// lease, 2 s retry).
const AGENT_LEADER_LEASE: Duration = Duration::from_secs(15);
/// Slack on top of a lease: retry periods, the health monitor's period, API round trips on a
/// 2-core machine shared with other work.
const SLACK: Duration = Duration::from_secs(30);
/// Everything else (placements, restarts).
const T: Duration = Duration::from_secs(120);
/// The agents' Lease in their member (its default name, in the kubeconfig's namespace).
const AGENT_LEASE: &str = "lifeboat-agent";
const AGENT_LEASE_NAMESPACE: &str = "default";
/// Pods of an AppWrapper carry this label with its name.
const APPWRAPPER_LABEL: &str = "workload.codeflare.dev/appwrapper";

fn main() -> ExitCode {
    harness::run_serial(
        "dead_agents",
        |c| {
            c.members = 3;
            c.nodes_per_member = 2;
            c.gpus_per_node = 8;
            c.lifeboat = Some(LifeboatConfig {
                hubs: 1,
                cluster_lease_seconds: CLUSTER_LEASE.as_secs(),
                heartbeat_seconds: 2,
                agent_replicas: 2,
                bin_dir: None,
            });
        },
        vec![
            E2eTest::new(
                "a_standby_agent_takes_over_and_the_workload_stays_one_copy",
                standby_takes_over,
            ),
            E2eTest::new(
                "every_agent_of_a_member_killed_the_hub_fences_each_old_copy_before_the_new",
                hub_fences,
            ),
            E2eTest::new(
                "without_a_fencing_credential_the_failover_waits_and_says_so_until_an_operator_confirms",
                operator_confirms,
            ),
        ],
    )
}

/// A Directly policy for the AppWrappers labelled `scenario=<scenario>`.
async fn directly_policy(
    ctx: &TestContext,
    scenario: &str,
    cluster_toleration: Duration,
) -> Result<(), TestError> {
    let ns = ctx.namespace("hub").await?;
    apply_propagation_policy(
        &ctx.client("hub").await?,
        &ns,
        scenario,
        json!({
            "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
                                   "labelSelector": {"matchLabels": {"scenario": scenario}}}],
            "failover": {"cluster": {"tolerationSeconds": cluster_toleration.as_secs(), "purgeMode": "Directly"}}
        }),
    )
    .await?;
    Ok(())
}

/// Creates the training AppWrapper `name` (labelled `scenario`) on the hub; returns where it
/// was placed once it runs there.
async fn create(ctx: &TestContext, name: &str, scenario: &str) -> Result<String, TestError> {
    let ns = ctx.namespace("hub").await?;
    let hub = ctx.client("hub").await?;
    let mut aw = training_appwrapper(name, &ns)?;
    aw.metadata.labels = Some([("scenario".to_string(), scenario.to_string())].into());
    Api::<DynamicObject>::namespaced_with(hub.clone(), &ns, &appwrapper_resource())
        .create(&PostParams::default(), &aw)
        .await?;
    let bindings: Api<ResourceBinding> = Api::namespaced(hub, &ns);
    let member = until_placed_on_one(&bindings, name, T).await?;
    let in_member: Api<DynamicObject> =
        Api::namespaced_with(ctx.client(&member).await?, &ns, &appwrapper_resource());
    until_appwrapper_running(&in_member, name, &member, T).await?;
    Ok(member)
}

/// Pods of AppWrapper `name` in `member` that may run: not Succeeded or Failed (terminating
/// ones included).
async fn live_pods(ctx: &TestContext, member: &str, name: &str) -> Result<usize, TestError> {
    let pods: Api<Pod> = Api::namespaced(ctx.client(member).await?, &ctx.namespace);
    Ok(pods
        .list(&ListParams::default().labels(&format!("{APPWRAPPER_LABEL}={name}")))
        .await?
        .items
        .iter()
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .count())
}

/// Polls every member every 200 ms: the most members with live pods of one of `names` at once.
struct CopyPoller {
    stop: Arc<AtomicBool>,
    most: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<Result<u64, String>>,
}

impl CopyPoller {
    fn start(ctx: &Arc<TestContext>, names: &[String]) -> CopyPoller {
        let stop = Arc::new(AtomicBool::new(false));
        let most = Arc::new(AtomicUsize::new(0));
        let task = {
            let (ctx, stop, most) = (ctx.clone(), stop.clone(), most.clone());
            let names = names.to_vec();
            tokio::spawn(async move {
                let mut polls = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    for name in &names {
                        let mut with_pods = 0;
                        for member in ctx.fleet.member_names() {
                            match live_pods(&ctx, &member, name).await {
                                Ok(n) if n > 0 => with_pods += 1,
                                Ok(_) => {}
                                Err(e) => return Err(format!("polling {member}: {e}")),
                            }
                        }
                        if with_pods > 1 {
                            eprintln!("{name}: live pods in {with_pods} members at once");
                        }
                        most.fetch_max(with_pods, Ordering::SeqCst);
                    }
                    polls += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(polls)
            })
        };
        CopyPoller { stop, most, task }
    }

    /// Stops polling; fails if two members ever had live pods of one workload.
    async fn finish(self) -> TestResult {
        self.stop.store(true, Ordering::SeqCst);
        let polls = self.task.await??;
        let most = self.most.load(Ordering::SeqCst);
        eprintln!(
            "{polls} polls of every member; most members with live pods of one workload: {most}"
        );
        if most > 1 {
            return Err(format!("{most} members ran live pods of one workload at once").into());
        }
        Ok(())
    }
}

/// The agent replica of `member` that holds its leader Lease.
async fn leading_agent(ctx: &TestContext, member: &str) -> Result<LifeboatProcess, TestError> {
    let leases: Api<Lease> = Api::namespaced(ctx.client(member).await?, AGENT_LEASE_NAMESPACE);
    let holder = leases
        .get(AGENT_LEASE)
        .await?
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    agent_replicas(ctx, member)
        .into_iter()
        .find(|p| holder == format!("{member}-{}", p.component()))
        .ok_or_else(|| {
            format!("{member}'s agent Lease names {holder:?}, no agent of the fleet").into()
        })
}

fn agent_replicas(ctx: &TestContext, member: &str) -> Vec<LifeboatProcess> {
    ctx.fleet
        .lifeboat_processes()
        .into_iter()
        .filter(|p| matches!(p, LifeboatProcess::Agent(m, _) if m == member))
        .collect()
}

async fn until_ready(
    ctx: &TestContext,
    member: &str,
    ready: &str,
    timeout: Duration,
) -> TestResult {
    let clusters: Api<lifeboat_api::cluster::Cluster> = Api::all(ctx.client("hub").await?);
    wait::until(
        &format!("Cluster {member} Ready={ready}"),
        timeout,
        || async {
            let c = clusters.get(member).await.map_err(|e| e.to_string())?;
            match cluster_ready(&c) {
                Some((status, _)) if status == ready => Ok(()),
                other => Err(format!("Ready {other:?}")),
            }
        },
    )
    .await?;
    Ok(())
}

/// The AppWrapper copies of `name` in each member (member → uid).
async fn copies(ctx: &TestContext, name: &str) -> Result<BTreeMap<String, String>, TestError> {
    let mut out = BTreeMap::new();
    for member in ctx.fleet.member_names() {
        let api: Api<DynamicObject> = Api::namespaced_with(
            ctx.client(&member).await?,
            &ctx.namespace,
            &appwrapper_resource(),
        );
        if let Some(aw) = api.get_opt(name).await? {
            out.insert(member, aw.metadata.uid.unwrap_or_default());
        }
    }
    Ok(out)
}

async fn standby_takes_over(ctx: Arc<TestContext>) -> TestResult {
    // A long cluster toleration: the member may go Unknown for a moment while the standby
    // takes over (its Lease outlasts the hub's cluster lease), which must not move anything.
    directly_policy(&ctx, "standby", Duration::from_secs(120)).await?;
    let member = create(&ctx, "standby-job", "standby").await?;
    let before = copies(&ctx, "standby-job").await?;
    let leader = leading_agent(&ctx, &member).await?;
    let poller = CopyPoller::start(&ctx, &["standby-job".to_string()]);

    ctx.fleet.kill_lifeboat(&leader)?;
    let killed = Instant::now();
    let standby = wait::until(
        &format!("a standby agent of {member} leading"),
        AGENT_LEADER_LEASE + SLACK,
        || async {
            match leading_agent(&ctx, &member).await {
                Ok(p) if p != leader => Ok(p),
                Ok(p) => Err(format!("{p} still holds the Lease")),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await?;
    eprintln!(
        "{standby} leads {:.1}s after {leader} was killed",
        killed.elapsed().as_secs_f64()
    );
    until_ready(&ctx, &member, "True", SLACK).await?;
    // A few heartbeats and a full re-sync by the new leader: time to (wrongly) make a copy.
    tokio::time::sleep(Duration::from_secs(6)).await;
    poller.finish().await?;
    assert_eq!(
        copies(&ctx, "standby-job").await?,
        before,
        "the same copy, in {member} only"
    );
    let bindings: Api<ResourceBinding> = Api::namespaced(ctx.client("hub").await?, &ctx.namespace);
    let binding = binding_of(&bindings, "standby-job").await?;
    assert_eq!(placement(&binding), std::slice::from_ref(&member));
    assert!(
        binding.spec.eviction_history.is_empty(),
        "no eviction: {:?}",
        binding.spec.eviction_history
    );
    ctx.fleet.restart_lifeboat(&leader).await?;
    clean_up(&ctx, &["standby-job".to_string()]).await
}

/// The hub holds a fencing credential for `member` (the agent sent it with a heartbeat).
async fn until_fencing_credential(ctx: &TestContext, member: &str) -> TestResult {
    let secrets: Api<Secret> = Api::namespaced(ctx.client("hub").await?, HUB_SYSTEM_NAMESPACE);
    let name = lifeboat_api::fencing::credential_secret_name(member);
    wait::until(&format!("the hub holds {name}"), T, || async {
        match secrets.get_opt(&name).await {
            Ok(Some(s))
                if s.type_.as_deref() == Some(lifeboat_api::fencing::CREDENTIAL_SECRET_TYPE) =>
            {
                Ok(())
            }
            Ok(other) => Err(format!("{other:?}")),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    Ok(())
}

/// The fencing credential the hub holds for `member` may delete what Lifeboat placed in the
/// namespaces of its work, and nothing else: an unlabelled object there is refused by the
/// admission policy, any object elsewhere by RBAC, and so is every read.
async fn fencing_credential_is_narrow(ctx: &TestContext, member: &str) -> TestResult {
    let secrets: Api<Secret> = Api::namespaced(ctx.client("hub").await?, HUB_SYSTEM_NAMESPACE);
    let secret = secrets
        .get(&lifeboat_api::fencing::credential_secret_name(member))
        .await?;
    let data = secret.data.unwrap_or_default();
    let text = |key: &str| {
        data.get(key)
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
            .unwrap_or_default()
    };
    let dir = ctx.fleet.state_dir().join("lifeboat");
    let ca = dir.join(format!("{member}-fencing-ca.crt"));
    std::fs::write(&ca, text(lifeboat_api::fencing::KEY_CA))?;
    let kubeconfig = lifeboat_e2e::kubeconfig::write_token(
        &dir.join(format!("{member}-fencer.kubeconfig")),
        member,
        &text(lifeboat_api::fencing::KEY_SERVER),
        &ca,
        ("lifeboat-fencer", &text(lifeboat_api::fencing::KEY_TOKEN)),
        &ctx.namespace,
    )?;
    let fencer = lifeboat_e2e::kubeconfig::client(&kubeconfig).await?;
    let admin = ctx.client(member).await?;
    let config_map = |name: &str| -> Result<k8s_openapi::api::core::v1::ConfigMap, TestError> {
        Ok(serde_json::from_value(json!({"metadata": {"name": name}}))?)
    };
    // In the work's namespace (the fencer's RoleBinding is there), unlabelled: the policy.
    let here: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(admin.clone(), &ctx.namespace);
    here.create(&PostParams::default(), &config_map("not-lifeboats")?)
        .await?;
    let by_fencer: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(fencer.clone(), &ctx.namespace);
    match by_fencer
        .delete("not-lifeboats", &DeleteParams::default())
        .await
    {
        Err(kube::Error::Api(s))
            if s.code == 403
                && s.message
                    .contains("may only delete objects Lifeboat placed") => {}
        other => {
            return Err(format!("deleting an unlabelled ConfigMap: {other:?}").into());
        }
    }
    assert!(
        here.get_opt("not-lifeboats").await?.is_some(),
        "still there"
    );
    // Elsewhere: RBAC (no RoleBinding in kube-system).
    refused(
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(fencer.clone(), "kube-system")
            .delete("kube-root-ca.crt", &DeleteParams::default())
            .await,
        "deleting in kube-system",
    )?;
    // No reads.
    refused(
        Api::<DynamicObject>::namespaced_with(fencer, &ctx.namespace, &appwrapper_resource())
            .list(&ListParams::default())
            .await,
        "listing AppWrappers",
    )?;
    Ok(())
}

/// Ok when `result` is the apiserver's 403.
fn refused<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str) -> TestResult {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
        other => Err(format!("{what}: expected 403, got {other:?}").into()),
    }
}

/// Waits until `name` runs in a member other than `old`; returns it.
async fn until_moved(
    ctx: &TestContext,
    name: &str,
    old: &str,
    timeout: Duration,
) -> Result<String, TestError> {
    let bindings: Api<ResourceBinding> = Api::namespaced(ctx.client("hub").await?, &ctx.namespace);
    let new = wait::until(&format!("{name} placed off {old}"), timeout, || async {
        match placement(&binding_of(&bindings, name).await?).as_slice() {
            [one] if one != old => Ok(one.clone()),
            other => Err(format!("clusters {other:?}")),
        }
    })
    .await?;
    let in_member: Api<DynamicObject> = Api::namespaced_with(
        ctx.client(&new).await?,
        &ctx.namespace,
        &appwrapper_resource(),
    );
    until_appwrapper_running(&in_member, name, &new, timeout).await?;
    Ok(new)
}

async fn hub_fences(ctx: Arc<TestContext>) -> TestResult {
    directly_policy(&ctx, "fence", CLUSTER_TOLERATION).await?;
    let mut placed = BTreeMap::new();
    for i in 0..4 {
        let name = format!("fence-{i}");
        let member = create(&ctx, &name, "fence").await?;
        placed.insert(name, member);
    }
    let victim = placed["fence-0"].clone();
    let moving: Vec<String> = placed
        .iter()
        .filter(|(_, m)| **m == victim)
        .map(|(n, _)| n.clone())
        .collect();
    until_fencing_credential(&ctx, &victim).await?;
    fencing_credential_is_narrow(&ctx, &victim).await?;
    let poller = CopyPoller::start(&ctx, &placed.keys().cloned().collect::<Vec<_>>());

    for agent in agent_replicas(&ctx, &victim) {
        ctx.fleet.kill_lifeboat(&agent)?;
    }
    let killed = Instant::now();
    for name in &moving {
        let new = until_moved(
            &ctx,
            name,
            &victim,
            CLUSTER_LEASE + CLUSTER_TOLERATION + SLACK + T,
        )
        .await?;
        eprintln!(
            "{name}: running in {new} {:.1}s after every agent of {victim} was killed",
            killed.elapsed().as_secs_f64()
        );
        assert_eq!(
            live_pods(&ctx, &victim, name).await?,
            0,
            "{name}: the old copy's pods in {victim} are gone"
        );
    }
    poller.finish().await?;
    // The evidence the hub acted on: its own fence through the member's kube-apiserver, as the
    // binding's Purged Event says. (The old copy's status item says it too, but only until the
    // new placement is Healthy: then the eviction task goes and the item with it.)
    let bindings: Api<ResourceBinding> = Api::namespaced(ctx.client("hub").await?, &ctx.namespace);
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(ctx.client("hub").await?, &ctx.namespace);
    for name in &moving {
        let binding = binding_of(&bindings, name).await?;
        let history = &binding.spec.eviction_history;
        assert!(
            history
                .iter()
                .any(|r| r.cluster_name == victim && r.reason == EVICTION_CLUSTER_FAILURE),
            "{name}: {history:?}"
        );
        if let Some(old) = binding.cluster_status(&victim) {
            assert_eq!(
                (old.applied, old.gone_confirmed_by),
                (false, Some(GoneConfirmedBy::Hub)),
                "{name}: the old copy confirmed gone by the hub: {old:?}"
            );
        }
        let binding_name = binding.metadata.name.clone().unwrap_or_default();
        let purged: Vec<String> = events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some("Purged")
                    && e.regarding.as_ref().is_some_and(|r| {
                        r.kind.as_deref() == Some("ResourceBinding")
                            && r.name.as_deref() == Some(binding_name.as_str())
                    })
            })
            .filter_map(|e| e.note)
            .collect();
        assert!(
            purged.iter().any(
                |note| note.contains(&format!("old copy in {victim} is gone"))
                    && note.contains("the hub deleted it through the member's kube-apiserver")
            ),
            "{name}: the binding's Purged Events: {purged:?}"
        );
    }
    // The agents come back: the old AppWrappers, held by their controller's finalizer, go.
    for agent in agent_replicas(&ctx, &victim) {
        ctx.fleet.restart_lifeboat(&agent).await?;
    }
    until_ready(&ctx, &victim, "True", T).await?;
    for name in &moving {
        wait::until(
            &format!("{name}'s old AppWrapper gone from {victim}"),
            T,
            || async {
                let here = copies(&ctx, name).await.map_err(|e| e.to_string())?;
                if here.contains_key(&victim) {
                    Err(format!("copies {here:?}"))
                } else {
                    Ok(())
                }
            },
        )
        .await?;
    }
    clean_up(&ctx, &placed.keys().cloned().collect::<Vec<_>>()).await
}

/// Deletes the AppWrappers `names` from the hub and waits until no member holds a copy (the
/// next test kills agents again and must not move this one's workloads).
async fn clean_up(ctx: &TestContext, names: &[String]) -> TestResult {
    let hub: Api<DynamicObject> = Api::namespaced_with(
        ctx.client("hub").await?,
        &ctx.namespace,
        &appwrapper_resource(),
    );
    for name in names {
        hub.delete(name, &DeleteParams::default()).await?;
    }
    for name in names {
        wait::until(&format!("{name} gone from every member"), T, || async {
            let here = copies(ctx, name).await.map_err(|e| e.to_string())?;
            if here.is_empty() {
                Ok(())
            } else {
                Err(format!("copies {here:?}"))
            }
        })
        .await?;
    }
    Ok(())
}

/// The hub's `lifeboat_hub_bindings_failover_blocked{reason}` as its /metrics says.
async fn blocked_gauge(ctx: &TestContext, reason: &str) -> Result<Option<f64>, TestError> {
    let status = ctx
        .fleet
        .lifeboat_status()
        .await
        .ok_or("the fleet runs no Lifeboat")?;
    let hub = status
        .processes
        .iter()
        .find(|p| p.component == LifeboatProcess::Hub(1).component())
        .ok_or("no hub process")?;
    let port = hub.ports.first().ok_or("the hub has no metrics port")?;
    let text = lifeboat_e2e::http::get(*port, "/metrics")
        .await?
        .map_err(|status| format!("GET /metrics of the hub: {status}"))?;
    let series = format!("lifeboat_hub_bindings_failover_blocked{{reason=\"{reason}\"}} ");
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok()))
}

async fn operator_confirms(ctx: Arc<TestContext>) -> TestResult {
    directly_policy(&ctx, "confirm", CLUSTER_TOLERATION).await?;
    let name = "confirm-job".to_string();
    let victim = create(&ctx, &name, "confirm").await?;
    until_fencing_credential(&ctx, &victim).await?;
    let poller = CopyPoller::start(&ctx, std::slice::from_ref(&name));

    for agent in agent_replicas(&ctx, &victim) {
        ctx.fleet.kill_lifeboat(&agent)?;
    }
    // The hub loses the credential (as if the member never gave one); the agents are dead, so
    // nobody sends it again.
    let secrets: Api<Secret> = Api::namespaced(ctx.client("hub").await?, HUB_SYSTEM_NAMESPACE);
    secrets
        .delete(
            &lifeboat_api::fencing::credential_secret_name(&victim),
            &DeleteParams::default(),
        )
        .await?;

    let bindings: Api<ResourceBinding> = Api::namespaced(ctx.client("hub").await?, &ctx.namespace);
    let message = wait::until(
        "FailoverBlocked=True WaitingForFence",
        CLUSTER_LEASE + CLUSTER_TOLERATION + SLACK,
        || async {
            let b = binding_of(&bindings, &name).await?;
            match b.condition(CONDITION_FAILOVER_BLOCKED) {
                Some(c) if c.status == "True" && c.reason == BLOCKED_WAITING_FOR_FENCE => {
                    Ok(c.message.clone())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    let namespace = &ctx.namespace;
    assert!(
        message.contains(&format!("lifeboatctl confirm-purge {namespace}/"))
            && message.contains(&victim),
        "{message}"
    );
    wait::until("the WaitingForFence gauge at 1", SLACK, || async {
        match blocked_gauge(&ctx, BLOCKED_WAITING_FOR_FENCE).await {
            Ok(Some(1.0)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    // Nothing moves on time alone: the old copy still runs, no new one anywhere.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        copies(&ctx, &name).await?.keys().collect::<Vec<_>>(),
        [&victim],
        "still only the old copy"
    );
    assert!(
        live_pods(&ctx, &victim, &name).await? > 0,
        "the old copy still runs"
    );

    // The operator stops the old copy by hand (its controller is dead: the wrapped Job goes in
    // the foreground, its pod with it), then confirms.
    let jobs: Api<k8s_openapi::api::batch::v1::Job> =
        Api::namespaced(ctx.client(&victim).await?, namespace);
    jobs.delete(&name, &DeleteParams::foreground()).await?;
    wait::until("the old copy's pods gone", T, || async {
        match live_pods(&ctx, &victim, &name).await {
            Ok(0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    let output = tokio::process::Command::new(lifeboat_bin_dir()?.join("lifeboatctl"))
        .args(["confirm-purge", "--all-in", &victim])
        .env("KUBECONFIG", ctx.fleet.kubeconfig("hub")?)
        .output()
        .await?;
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success() && printed.contains("1 binding(s)"),
        "lifeboatctl confirm-purge: {printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let new = until_moved(&ctx, &name, &victim, T).await?;
    eprintln!("{name}: running in {new} after the operator's confirmation");
    poller.finish().await?;
    let binding = binding_of(&bindings, &name).await?;
    assert!(
        binding
            .condition(CONDITION_FAILOVER_BLOCKED)
            .is_none_or(|c| c.status == "False"),
        "{:?}",
        binding.condition(CONDITION_FAILOVER_BLOCKED)
    );
    for agent in agent_replicas(&ctx, &victim) {
        ctx.fleet.restart_lifeboat(&agent).await?;
    }
    until_ready(&ctx, &victim, "True", T).await?;
    clean_up(&ctx, &[name]).await
}
