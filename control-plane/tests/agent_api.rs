//! The hub's agent API and cluster health monitor on a real hub kube-apiserver (the local
//! fleet): registration, heartbeats, work streams, status reports, every refusal (one test per
//! case, each checking that nothing changed), HTTPS end to end, and the cluster going Unknown and
//! tainted when its agent stops heartbeating, Ready again when it is back.

mod support;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use lifeboat_api::cluster::{
    CLUSTER_NAME_LABEL, Cluster, ClusterSpec, NodeSummary, Quantity, ResourceSummary,
    TAINT_UNREACHABLE, lease_name,
};
use lifeboat_api::credentials::{CLUSTER_CREDENTIAL_TYPE, CREDENTIAL_HASH_KEY};
use lifeboat_api::protocol::{
    self, HeartbeatResponse, Inventory, LEADER_HEADER, MAX_STATUS_ITEMS, RegisterRequest,
    StatusReport, StatusResponse, WorkEvent,
};
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestResult};
use lifeboat_e2e::wait;
use lifeboat_hub::agentapi::auth::{TokenHash, credential_secret_name};
use lifeboat_hub::clusters::health::{ClusterHealth, ClusterHealthConfig, ClusterHealthMonitor};
use lifeboat_hub::clusters::removal::{EVENT_REMOVED, FINALIZER};
use lifeboat_hub::leadership::{LeaderState, always_leader};
use lifeboat_hub::work::store::WorkStore;
use serde_json::json;
use support::*;

const HUB: &str = "hub";

fn main() -> ExitCode {
    harness::run(
        "agent-api",
        |c| {
            c.members = 1;
            c.nodes_per_member = 1;
        },
        vec![
            E2eTest::new(
                "registration_heartbeat_and_inventory",
                registration_heartbeat_and_inventory,
            ),
            E2eTest::new("no_token_is_401", no_token_is_401),
            E2eTest::new("forged_token_is_401", forged_token_is_401),
            E2eTest::new("revoked_token_is_401", revoked_token_is_401),
            E2eTest::new(
                "re_registration_with_the_current_credential_rotates_it",
                re_registration_with_the_current_credential_rotates_it,
            ),
            E2eTest::new(
                "unbound_token_cannot_take_over_a_registered_cluster_403",
                unbound_token_cannot_take_over_a_registered_cluster,
            ),
            E2eTest::new(
                "unbound_token_registers_a_new_cluster",
                unbound_token_registers_a_new_cluster,
            ),
            E2eTest::new(
                "bound_token_re_registers_a_registered_cluster",
                bound_token_re_registers_a_registered_cluster,
            ),
            E2eTest::new(
                "expired_bootstrap_token_is_401",
                expired_bootstrap_token_is_401,
            ),
            E2eTest::new(
                "unknown_bootstrap_token_is_401",
                unknown_bootstrap_token_is_401,
            ),
            E2eTest::new(
                "bootstrap_token_of_another_cluster_is_403",
                bootstrap_token_of_another_cluster_is_403,
            ),
            E2eTest::new("another_clusters_path_is_403", another_clusters_path_is_403),
            E2eTest::new("malformed_json_is_400", malformed_json_is_400),
            E2eTest::new("oversized_body_is_413", oversized_body_is_413),
            E2eTest::new("too_many_items_is_400", too_many_items_is_400),
            E2eTest::new(
                "unassigned_items_are_rejected_and_the_rest_taken",
                unassigned_items_are_rejected_and_the_rest_taken,
            ),
            E2eTest::new("standby_answers_503_naming_the_leader", standby_answers_503),
            E2eTest::new("malformed_since_is_400", malformed_since_is_400),
            E2eTest::new(
                "invalid_registration_is_400_and_creates_nothing",
                invalid_registration_is_400,
            ),
            E2eTest::new(
                "deleted_cluster_is_held_until_its_agent_stopped_then_401",
                deleted_cluster_stops_its_agent,
            ),
            E2eTest::new(
                "deleted_cluster_of_a_silent_agent_goes_with_its_lease_and_its_bound_tokens",
                deleted_cluster_of_a_silent_agent_goes_with_its_lease,
            ),
            E2eTest::new(
                "deleted_cluster_nobody_registered_goes_at_once",
                deleted_cluster_nobody_registered_goes_at_once,
            ),
            E2eTest::new(
                "replayed_status_batch_changes_nothing",
                replayed_status_batch_changes_nothing,
            ),
            E2eTest::new(
                "work_stream_resumes_with_changes_and_resets_on_a_new_epoch",
                work_stream_resumes_and_resets,
            ),
            E2eTest::new(
                "gone_reports_are_taken_only_for_an_awaited_purge_of_the_calling_cluster",
                gone_reports_only_for_awaited_purges,
            ),
            E2eTest::new("https_end_to_end", https_end_to_end),
            E2eTest::new(
                "slow_clients_are_closed_and_refused_while_an_agent_heartbeats",
                slow_clients_are_closed_and_refused_while_an_agent_heartbeats,
            ),
            E2eTest::new(
                "cluster_goes_unknown_and_tainted_when_its_agent_stops",
                cluster_health_follows_the_lease,
            ),
            E2eTest::new(
                "unregistered_cluster_is_unknown_and_tainted",
                unregistered_cluster_is_unknown_and_tainted,
            ),
            E2eTest::new(
                "fleet_gauges_follow_the_cluster_status_and_go_with_the_cluster_or_the_leadership",
                fleet_gauges_follow_the_cluster_status,
            ),
        ],
    )
}

async fn hub(ctx: &TestContext) -> Result<Hub, harness::TestError> {
    Hub::start(ctx.client(HUB).await?, &ctx.namespace, "e1", |_| {}).await
}

fn clusters(hub: &Hub) -> Api<Cluster> {
    Api::all(hub.client.clone())
}

fn leases(hub: &Hub) -> Api<Lease> {
    Api::namespaced(hub.client.clone(), &hub.namespace)
}

fn secrets(hub: &Hub) -> Api<Secret> {
    Api::namespaced(hub.client.clone(), &hub.namespace)
}

async fn renew_time(hub: &Hub, cluster: &str) -> Result<Option<Timestamp>, harness::TestError> {
    Ok(leases(hub)
        .get_opt(&lease_name(cluster))
        .await?
        .and_then(|l| l.spec?.renew_time.map(|t| t.0)))
}

/// A refused registration of `name` left nothing behind: no Cluster, no credential.
async fn nothing_created(hub: &Hub, name: &str) -> TestResult {
    check(
        clusters(hub).get_opt(name).await?.is_none(),
        format!("no Cluster {name}"),
    )?;
    check(
        secrets(hub)
            .get_opt(&credential_secret_name(name))
            .await?
            .is_none(),
        format!("no credential for {name}"),
    )
}

/// Exactly one Lease and one credential Secret for cluster `name`.
async fn one_lease_one_credential(hub: &Hub, name: &str) -> TestResult {
    let by_label = ListParams::default().labels(&format!("{CLUSTER_NAME_LABEL}={name}"));
    let leases = leases(hub).list(&by_label).await?.items.len();
    let credentials = secrets(hub).list(&by_label).await?.items.len();
    check(
        leases == 1 && credentials == 1,
        format!("{leases} Leases and {credentials} credential Secrets for {name}"),
    )
}

fn forged() -> String {
    "f0".repeat(32)
}

fn inventory(gpus: &str) -> Inventory {
    Inventory {
        kubernetes_version: Some("v1.36.3".into()),
        node_summary: NodeSummary {
            total_num: 2,
            ready_num: 2,
        },
        resource_summary: ResourceSummary {
            allocatable: [("nvidia.com/gpu".to_string(), Quantity(gpus.into()))].into(),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn check(condition: bool, what: impl std::fmt::Display) -> TestResult {
    if condition {
        Ok(())
    } else {
        Err(format!("{what}").into())
    }
}

async fn registration_heartbeat_and_inventory(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "happy-1";
    let token = hub.register(name).await?;
    check(token.len() == 64, format!("token of 64 hex chars: {token}"))?;

    // The Cluster, its credential (the hash only) and its Lease.
    let cluster = clusters(&hub).get(name).await?;
    check(
        cluster.spec.provider.as_deref() == Some("kwok")
            && cluster.spec.region.as_deref() == Some("eu-test-1"),
        format!("topology from the registration: {:?}", cluster.spec),
    )?;
    let agent = cluster
        .status
        .as_ref()
        .and_then(|s| s.agent.clone())
        .ok_or("status.agent written")?;
    check(
        agent.identity == "agent-happy-1" && agent.fencing_period_seconds == Some(60),
        format!("{agent:?}"),
    )?;
    let secret = secrets(&hub).get(&credential_secret_name(name)).await?;
    check(
        secret.type_.as_deref() == Some(CLUSTER_CREDENTIAL_TYPE)
            && secret.labels().get(CLUSTER_NAME_LABEL).map(String::as_str) == Some(name),
        "credential type and label",
    )?;
    check(
        secret
            .owner_references()
            .iter()
            .any(|o| o.kind == "Cluster" && Some(&o.uid) == cluster.metadata.uid.as_ref()),
        "credential owned by the Cluster",
    )?;
    let data = secret.data.clone().unwrap_or_default();
    let stored = data
        .get(CREDENTIAL_HASH_KEY)
        .map(|b| String::from_utf8_lossy(&b.0).to_string());
    check(
        stored.as_deref() == Some(TokenHash::of(&token).to_hex().as_str()),
        "the stored value is the token's SHA-256",
    )?;
    check(
        data.values()
            .all(|v| !String::from_utf8_lossy(&v.0).contains(&token)),
        "the token itself is not stored",
    )?;
    let lease = leases(&hub).get(&lease_name(name)).await?;
    let spec = lease.spec.clone().unwrap_or_default();
    check(
        spec.holder_identity.as_deref() == Some("agent-happy-1")
            && spec.lease_duration_seconds == Some(40),
        format!("lease {spec:?}"),
    )?;

    // Heartbeat with inventory: renewed lease, inventory in the status.
    let first_renew = renew_time(&hub, name).await?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let reply = hub.heartbeat(name, &token, Some(inventory("8"))).await;
    check(reply.status == StatusCode::OK, format!("{reply:?}"))?;
    let answer: HeartbeatResponse = serde_json::from_value(reply.body)?;
    check(
        answer.lease_duration_seconds == 40 && !answer.stop,
        format!("{answer:?}"),
    )?;
    let renewed = renew_time(&hub, name).await?;
    check(renewed > first_renew, "the heartbeat renewed the lease")?;
    let cluster = clusters(&hub).get(name).await?;
    let status = cluster.status.clone().unwrap_or_default();
    check(
        status.kubernetes_version.as_deref() == Some("v1.36.3")
            && status
                .resource_summary
                .as_ref()
                .and_then(|r| r.allocatable.get("nvidia.com/gpu"))
                == Some(&Quantity("8".into()))
            && status.last_heartbeat_time.is_some()
            && status.agent.is_some(),
        format!("inventory in the status: {status:?}"),
    )?;
    let managers: Vec<String> = cluster
        .managed_fields()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    check(
        managers.iter().any(|m| m == "lifeboat-hub/agent-api"),
        format!("field managers {managers:?}"),
    )?;

    // API enablements are stored one string per group version (one line each in `kubectl
    // describe`), and read back as the scheduler reads them.
    let mut with_apis = inventory("8");
    with_apis.api_enablements = vec![
        "apps/v1: Deployment (deployments), StatefulSet (statefulsets)"
            .parse()
            .map_err(|e: String| e)?,
    ];
    let reply = hub.heartbeat(name, &token, Some(with_apis.clone())).await;
    check(reply.status == StatusCode::OK, format!("{reply:?}"))?;
    let raw: kube::api::DynamicObject = Api::all_with(
        hub.client.clone(),
        &kube::api::ApiResource::erase::<Cluster>(&()),
    )
    .get(name)
    .await?;
    check(
        raw.data["status"]["apiEnablements"]
            == json!(["apps/v1: Deployment (deployments), StatefulSet (statefulsets)"]),
        format!("stored {}", raw.data["status"]["apiEnablements"]),
    )?;
    let stored = clusters(&hub).get(name).await?;
    check(
        stored.status.map(|s| s.api_enablements) == Some(with_apis.api_enablements),
        "read back as group version and resources",
    )?;
    let reply = hub.heartbeat(name, &token, Some(inventory("8"))).await;
    check(reply.status == StatusCode::OK, format!("{reply:?}"))?;
    let cluster = clusters(&hub).get(name).await?;

    // The same inventory again: the lease is renewed, the Cluster is not written.
    let version = cluster.resource_version();
    let reply = hub.heartbeat(name, &token, Some(inventory("8"))).await;
    check(reply.status == StatusCode::OK, format!("{reply:?}"))?;
    check(
        renew_time(&hub, name).await? > renewed,
        "the second heartbeat renewed the lease",
    )?;
    check(
        clusters(&hub).get(name).await?.resource_version() == version,
        "an unchanged inventory does not write the Cluster",
    )?;
    // A changed one does.
    hub.heartbeat(name, &token, Some(inventory("16"))).await;
    check(
        clusters(&hub).get(name).await?.resource_version() != version,
        "a changed inventory is written",
    )?;
    check(
        hub.metric(
            "lifeboat_hub_agent_requests_total",
            &[("endpoint", "heartbeat"), ("code", "200")],
        ) == 5.0
            && hub.metric(
                "lifeboat_hub_agent_requests_total",
                &[("endpoint", "register"), ("code", "200")],
            ) == 1.0,
        "request metrics by endpoint and code",
    )?;
    Ok(())
}

async fn no_token_is_401(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    hub.register_as(None, &register_request("no-token-1"))
        .await
        .refused(401, "Unauthorized", "no bearer")?;
    nothing_created(&hub, "no-token-1").await?;
    let name = "no-token-2";
    hub.register(name).await?;
    let before = renew_time(&hub, name).await?;
    hub.call(
        "POST",
        &protocol::heartbeat_path(name),
        None,
        Some(b"{\"identity\":\"x\"}".to_vec()),
    )
    .await
    .refused(401, "Unauthorized", "no bearer")?;
    hub.call("GET", &protocol::work_path(name), None, None)
        .await
        .refused(401, "Unauthorized", "no bearer")?;
    hub.call(
        "POST",
        &protocol::status_path(name),
        None,
        Some(b"{\"items\":[]}".to_vec()),
    )
    .await
    .refused(401, "Unauthorized", "no bearer")?;
    check(renew_time(&hub, name).await? == before, "lease not renewed")?;
    check(hub.batches().is_empty(), "nothing reached the intake")?;
    check(
        hub.metric("lifeboat_hub_agent_requests_total", &[("code", "401")]) == 4.0,
        "401s counted",
    )?;
    Ok(())
}

async fn forged_token_is_401(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "forged-1";
    hub.register(name).await?;
    hub.assign(name, "w1");
    let before = renew_time(&hub, name).await?;
    hub.heartbeat(name, &forged(), Some(inventory("64")))
        .await
        .refused(401, "Unauthorized", "unknown or revoked")?;
    let report = StatusReport {
        items: vec![status_item(&hub.namespace, "w1", 1)],
        full: false,
    };
    hub.call(
        "POST",
        &protocol::status_path(name),
        Some(&forged()),
        Some(json_bytes(&report)),
    )
    .await
    .refused(401, "Unauthorized", "unknown or revoked")?;
    // The bootstrap token is not a cluster credential either.
    hub.heartbeat(name, &hub.bootstrap, None).await.refused(
        401,
        "Unauthorized",
        "unknown or revoked",
    )?;
    check(renew_time(&hub, name).await? == before, "lease not renewed")?;
    check(hub.batches().is_empty(), "nothing reached the intake")?;
    let status = clusters(&hub).get(name).await?.status.unwrap_or_default();
    check(status.resource_summary.is_none(), "inventory not written")?;
    Ok(())
}

async fn revoked_token_is_401(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "revoked-1";
    let token = hub.register(name).await?;
    check(
        hub.heartbeat(name, &token, None).await.status == StatusCode::OK,
        "works before revocation",
    )?;
    let (_, mut stream) = open_work(&hub.app, name, &token, None).await?;
    stream.until_synced().await?;
    secrets(&hub)
        .delete(&credential_secret_name(name), &DeleteParams::default())
        .await?;
    wait::until("the revoked token refused", T, || async {
        let reply = hub.heartbeat(name, &token, None).await;
        match reply.refused(401, "Unauthorized", "unknown or revoked") {
            Ok(()) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    // The work stream opened before the revocation ends.
    let end = stream.next(T).await?;
    check(end.is_none(), format!("the open stream ended, got {end:?}"))
}

async fn re_registration_with_the_current_credential_rotates_it(
    ctx: Arc<TestContext>,
) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "rotated-1";
    let old = hub.register(name).await?;
    let (_, mut stream) = open_work(&hub.app, name, &old, None).await?;
    stream.until_synced().await?;
    // The agent re-registers itself: its current credential is the bearer.
    let reply = hub.register_as(Some(&old), &register_request(name)).await;
    check(reply.status == StatusCode::OK, format!("{reply:?}"))?;
    let new: protocol::RegisterResponse = serde_json::from_value(reply.body)?;
    let new = new.token;
    let end = stream.next(T).await?;
    check(
        end.is_none(),
        format!("the stream of the old token ended, got {end:?}"),
    )?;
    check(old != new, "a new token")?;
    // Registration answers once the new credential is live: no wait needed.
    hub.heartbeat(name, &old, None)
        .await
        .refused(401, "Unauthorized", "unknown or revoked")?;
    check(
        hub.heartbeat(name, &new, None).await.status == StatusCode::OK,
        "the new token works",
    )?;
    // The rotated-away credential registers nothing any more.
    hub.register_as(Some(&old), &register_request(name))
        .await
        .refused(401, "Unauthorized", "not known")?;
    one_lease_one_credential(&hub, name).await
}

/// The stored digest of `name`'s credential.
async fn stored_digest(hub: &Hub, name: &str) -> Result<Option<String>, harness::TestError> {
    Ok(secrets(hub)
        .get_opt(&credential_secret_name(name))
        .await?
        .and_then(|s| s.data)
        .and_then(|d| d.get(CREDENTIAL_HASH_KEY).cloned())
        .map(|b| String::from_utf8_lossy(&b.0).into_owned()))
}

async fn unbound_token_cannot_take_over_a_registered_cluster(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "takeover-1";
    let token = hub.register(name).await?;
    let digest = stored_digest(&hub, name).await?;
    // Another agent with the same unbound bootstrap token names the registered cluster.
    let intruder = RegisterRequest {
        identity: "intruder".into(),
        ..register_request(name)
    };
    hub.register_as(Some(&hub.bootstrap), &intruder)
        .await
        .refused(403, "Forbidden", "cluster takeover-1 is already registered")?;
    // Nothing changed: the real credential still works, the agent is still the real one.
    check(
        stored_digest(&hub, name).await? == digest,
        "the stored credential is unchanged",
    )?;
    check(
        hub.heartbeat(name, &token, None).await.status == StatusCode::OK,
        "the real credential still works",
    )?;
    let agent = clusters(&hub)
        .get(name)
        .await?
        .status
        .and_then(|s| s.agent)
        .map(|a| a.identity);
    check(
        agent.as_deref() == Some("agent-takeover-1"),
        format!("the Cluster's agent: {agent:?}"),
    )?;
    // Another cluster's credential registers nothing either.
    let other = hub.register("takeover-2").await?;
    hub.register_as(Some(&other), &register_request(name))
        .await
        .refused(
            403,
            "Forbidden",
            "the credential of cluster takeover-2 cannot register cluster takeover-1",
        )?;
    one_lease_one_credential(&hub, name).await
}

async fn unbound_token_registers_a_new_cluster(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "newcomer-1";
    nothing_created(&hub, name).await?;
    let reply = hub
        .register_as(Some(&hub.bootstrap), &register_request(name))
        .await;
    check(reply.status == StatusCode::OK, format!("{reply:?}"))?;
    let token: protocol::RegisterResponse = serde_json::from_value(reply.body)?;
    check(
        hub.heartbeat(name, &token.token, None).await.status == StatusCode::OK,
        "the new cluster's credential works",
    )?;
    // A Cluster an operator created, that no agent registered yet, is new too.
    let precreated = "newcomer-2";
    clusters(&hub)
        .create(
            &PostParams::default(),
            &Cluster::new(precreated, ClusterSpec::default()),
        )
        .await?;
    let reply = hub
        .register_as(Some(&hub.bootstrap), &register_request(precreated))
        .await;
    check(reply.status == StatusCode::OK, format!("{reply:?}"))?;
    one_lease_one_credential(&hub, name).await
}

async fn bound_token_re_registers_a_registered_cluster(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "rebound-1";
    let old = hub.register(name).await?;
    // The operator mints a token bound to the name (what `lifeboatctl join` does), e.g. for an
    // agent that lost its credential Secret.
    let bound = format!("{}-rebound-0123456789abcdef0123456789", hub.namespace);
    bootstrap_token(
        &hub.client,
        &hub.namespace,
        "join-rebound-1",
        &bound,
        None,
        Some(name),
    )
    .await?;
    let reply = wait::until("the bound token registers", T, || async {
        let reply = hub.register_as(Some(&bound), &register_request(name)).await;
        // Until the watch delivers the Secret, the token is merely unknown.
        if reply.status == StatusCode::OK {
            Ok(reply)
        } else {
            Err(format!("{} {}", reply.status, reply.body))
        }
    })
    .await?;
    let new: protocol::RegisterResponse = serde_json::from_value(reply.body)?;
    hub.heartbeat(name, &old, None)
        .await
        .refused(401, "Unauthorized", "unknown or revoked")?;
    check(
        hub.heartbeat(name, &new.token, None).await.status == StatusCode::OK,
        "the new credential works",
    )?;
    one_lease_one_credential(&hub, name).await
}

async fn expired_bootstrap_token_is_401(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let token = format!("{}-expired-0123456789abcdef0123456789", hub.namespace);
    bootstrap_token(
        &hub.client,
        &hub.namespace,
        "bootstrap-expired",
        &token,
        Some("2020-01-01T00:00:00Z"),
        None,
    )
    .await?;
    let name = "expired-1";
    let reply = wait::until("the expired token is known", T, || async {
        let reply = hub.register_as(Some(&token), &register_request(name)).await;
        // Until the watch delivers the Secret, the token is merely unknown.
        if reply.message().contains("expired") {
            Ok(reply)
        } else {
            Err(format!("{} {}", reply.status, reply.body))
        }
    })
    .await?;
    reply.refused(
        401,
        "Unauthorized",
        "bootstrap-expired expired at 2020-01-01T00:00:00Z",
    )?;
    nothing_created(&hub, name).await
}

async fn unknown_bootstrap_token_is_401(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "unknown-bootstrap-1";
    hub.register_as(Some(&forged()), &register_request(name))
        .await
        .refused(401, "Unauthorized", "not known")?;
    nothing_created(&hub, name).await
}

async fn bootstrap_token_of_another_cluster_is_403(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let token = format!("{}-bound-0123456789abcdef0123456789", hub.namespace);
    bootstrap_token(
        &hub.client,
        &hub.namespace,
        "bootstrap-bound",
        &token,
        None,
        Some("bound-ok"),
    )
    .await?;
    let register = |name: &'static str| {
        let hub = &hub;
        let token = token.clone();
        async move { hub.register_as(Some(&token), &register_request(name)).await }
    };
    let reply = wait::until("the bound token is known", T, || async {
        let reply = register("bound-other").await;
        if reply.status == StatusCode::FORBIDDEN {
            Ok(reply)
        } else {
            Err(format!("{} {}", reply.status, reply.body))
        }
    })
    .await?;
    reply.refused(
        403,
        "Forbidden",
        "bootstrap token bootstrap-bound only registers cluster bound-ok, not bound-other",
    )?;
    nothing_created(&hub, "bound-other").await?;
    let reply = register("bound-ok").await;
    check(reply.status == StatusCode::OK, format!("{reply:?}"))?;
    Ok(())
}

async fn another_clusters_path_is_403(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let a = "path-a";
    let b = "path-b";
    let token_a = hub.register(a).await?;
    hub.register(b).await?;
    hub.assign(b, "wb");
    let before = renew_time(&hub, b).await?;
    let needle = "the credential of cluster path-a cannot act for cluster path-b";
    hub.heartbeat(b, &token_a, Some(inventory("1")))
        .await
        .refused(403, "Forbidden", needle)?;
    hub.call("GET", &protocol::work_path(b), Some(&token_a), None)
        .await
        .refused(403, "Forbidden", needle)?;
    let report = StatusReport {
        items: vec![status_item(&hub.namespace, "wb", 1)],
        full: false,
    };
    hub.call(
        "POST",
        &protocol::status_path(b),
        Some(&token_a),
        Some(json_bytes(&report)),
    )
    .await
    .refused(403, "Forbidden", needle)?;
    check(
        renew_time(&hub, b).await? == before,
        "B's lease not renewed",
    )?;
    check(hub.batches().is_empty(), "nothing reached the intake")?;
    Ok(())
}

async fn malformed_json_is_400(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "malformed-1";
    let token = hub.register(name).await?;
    hub.call(
        "POST",
        &protocol::status_path(name),
        Some(&token),
        Some(b"{\"items\": [\n  {\"key\": ".to_vec()),
    )
    .await
    .refused(400, "BadRequest", "line 2 column")?;
    hub.call(
        "POST",
        &protocol::heartbeat_path(name),
        Some(&token),
        Some(b"{\"identity\": 5}".to_vec()),
    )
    .await
    .refused(400, "BadRequest", "invalid type")?;
    hub.call(
        "POST",
        &protocol::register_path(),
        Some(&hub.bootstrap),
        Some(b"{\"clusterName\": \"malformed-2\"}".to_vec()),
    )
    .await
    .refused(400, "BadRequest", "missing field")?;
    check(hub.batches().is_empty(), "nothing reached the intake")?;
    nothing_created(&hub, "malformed-2").await
}

async fn oversized_body_is_413(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "oversized-1";
    let token = hub.register(name).await?;
    hub.assign(name, "w1");
    // Just over the protocol's limit: valid JSON, one real item and padding.
    let mut report = serde_json::to_value(StatusReport {
        items: vec![status_item(&hub.namespace, "w1", 1)],
        full: false,
    })?;
    report["padding"] = json!("x".repeat(protocol::MAX_BODY_BYTES));
    hub.call(
        "POST",
        &protocol::status_path(name),
        Some(&token),
        Some(json_bytes(&report)),
    )
    .await
    .refused(413, "RequestEntityTooLarge", "8388608 bytes")?;
    check(hub.batches().is_empty(), "nothing reached the intake")?;
    Ok(())
}

async fn too_many_items_is_400(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "too-many-1";
    let token = hub.register(name).await?;
    hub.assign(name, "w1");
    let report = StatusReport {
        items: (0..=MAX_STATUS_ITEMS as i64)
            .map(|i| status_item(&hub.namespace, "w1", i))
            .collect(),
        full: false,
    };
    hub.call(
        "POST",
        &protocol::status_path(name),
        Some(&token),
        Some(json_bytes(&report)),
    )
    .await
    .refused(
        400,
        "BadRequest",
        "items: 5001 status items in one report, at most 5000",
    )?;
    check(hub.batches().is_empty(), "nothing reached the intake")?;
    Ok(())
}

async fn unassigned_items_are_rejected_and_the_rest_taken(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let (a, b) = ("assigned-a", "assigned-b");
    let token = hub.register(a).await?;
    hub.assign(a, "w1");
    hub.assign(a, "w2");
    hub.assign(b, "w3");
    let ns = hub.namespace.clone();
    let mut wrong_uid = status_item(&ns, "w2", 1);
    wrong_uid.binding_uid = "uid-of-an-older-binding".into();
    let report = StatusReport {
        items: vec![
            status_item(&ns, "w1", 1),
            status_item(&ns, "not-assigned", 1),
            wrong_uid,
            status_item(&ns, "w3", 1),
            status_item(&ns, "w2", 1),
        ],
        full: false,
    };
    let reply = hub
        .call(
            "POST",
            &protocol::status_path(a),
            Some(&token),
            Some(json_bytes(&report)),
        )
        .await;
    check(reply.status == StatusCode::OK, format!("{reply:?}"))?;
    let answer: StatusResponse = serde_json::from_value(reply.body)?;
    check(answer.accepted == 2, format!("{answer:?}"))?;
    let reasons: Vec<&str> = answer.rejected.iter().map(|r| r.reason.as_str()).collect();
    check(
        reasons
            == [
                format!("{ns}/not-assigned is not assigned to cluster assigned-a").as_str(),
                "binding UID uid-of-an-older-binding is not the one assigned to cluster assigned-a (uid-w2)",
                format!("{ns}/w3 is not assigned to cluster assigned-a").as_str(),
            ],
        format!("{reasons:?}"),
    )?;
    let batches = hub.batches();
    let taken: Vec<String> = batches
        .iter()
        .flat_map(|b| b.report.items.iter().map(|i| i.key.name.clone()))
        .collect();
    check(
        batches.len() == 1 && batches[0].cluster == a && taken == ["w1", "w2"],
        format!("the intake got {taken:?}"),
    )?;
    check(
        hub.metric("lifeboat_hub_status_items_total", &[("result", "rejected")]) == 3.0
            && hub.metric("lifeboat_hub_status_items_total", &[("result", "accepted")]) == 2.0,
        "item metrics",
    )?;
    Ok(())
}

async fn standby_answers_503(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "standby-1";
    let token = hub.register(name).await?;
    let before = renew_time(&hub, name).await?;
    let leader = "https://hub-1.lifeboat-system.svc:8443";
    hub.leader
        .send_replace(LeaderState::standby(Some(leader.into())));
    let calls = [
        (
            "POST",
            protocol::register_path(),
            Some(json_bytes(&register_request(name))),
        ),
        (
            "POST",
            protocol::heartbeat_path(name),
            Some(b"{\"identity\":\"a\"}".to_vec()),
        ),
        ("GET", protocol::work_path(name), None),
        (
            "POST",
            protocol::status_path(name),
            Some(b"{\"items\":[]}".to_vec()),
        ),
    ];
    for (method, path, body) in calls.clone() {
        let reply = hub.call(method, &path, Some(&token), body).await;
        reply.refused(503, "NotLeader", leader)?;
        check(
            reply.headers.get("retry-after").map(|v| v.as_bytes()) == Some(b"1")
                && reply.headers.get(LEADER_HEADER).map(|v| v.as_bytes())
                    == Some(leader.as_bytes()),
            format!(
                "{path}: Retry-After and {LEADER_HEADER}: {:?}",
                reply.headers
            ),
        )?;
    }
    // A standby that does not know the leader says so without the header.
    hub.leader.send_replace(LeaderState::standby(None));
    let reply = hub
        .call(
            "POST",
            &protocol::heartbeat_path(name),
            Some(&token),
            Some(b"{\"identity\":\"a\"}".to_vec()),
        )
        .await;
    reply.refused(503, "NotLeader", "not the leader")?;
    check(
        reply.headers.get(LEADER_HEADER).is_none(),
        "no leader header",
    )?;
    check(renew_time(&hub, name).await? == before, "lease not renewed")?;
    check(hub.batches().is_empty(), "nothing reached the intake")?;
    // Leading again: served.
    hub.leader.send_replace(LeaderState::leader());
    check(
        hub.heartbeat(name, &token, None).await.status == StatusCode::OK,
        "served once leading",
    )?;
    Ok(())
}

async fn malformed_since_is_400(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "since-1";
    let token = hub.register(name).await?;
    for since in ["garbage", "e1:notanumber", ":5"] {
        hub.call(
            "GET",
            &format!("{}?since={since}", protocol::work_path(name)),
            Some(&token),
            None,
        )
        .await
        .refused(400, "BadRequest", "since:")?;
    }
    check(
        hub.metric("lifeboat_hub_work_streams", &[]) == 0.0,
        "no stream opened",
    )?;
    Ok(())
}

async fn invalid_registration_is_400(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let register = |request: protocol::RegisterRequest| {
        let hub = &hub;
        async move { hub.register_as(Some(&hub.bootstrap), &request).await }
    };
    let mut bad_name = register_request("x");
    bad_name.cluster_name = "Bad_Name".into();
    register(bad_name).await.refused(
        400,
        "BadRequest",
        "clusterName: \"Bad_Name\" is not a DNS-1123 label",
    )?;
    let mut bad_version = register_request("invalid-version");
    bad_version.protocol_version = "v2".into();
    register(bad_version).await.refused(
        400,
        "BadRequest",
        "protocolVersion: the hub speaks v1, the agent sent \"v2\"",
    )?;
    let mut other_fencing = register_request("invalid-fencing");
    other_fencing.fencing_period_seconds = 30;
    register(other_fencing).await.refused(
        400,
        "BadRequest",
        "fencingPeriodSeconds: the agent's is 30 but the hub's for cluster invalid-fencing is 60",
    )?;
    for name in ["invalid-version", "invalid-fencing"] {
        nothing_created(&hub, name).await?;
    }
    // The Cluster's own fencing period wins over the hub's default.
    let mut cluster = Cluster::new(
        "invalid-fencing-90",
        ClusterSpec {
            fencing_period_seconds: Some(90),
            ..Default::default()
        },
    );
    cluster.metadata.labels = None;
    clusters(&hub)
        .create(&PostParams::default(), &cluster)
        .await?;
    register(register_request("invalid-fencing-90"))
        .await
        .refused(
            400,
            "BadRequest",
            "the agent's is 60 but the hub's for cluster invalid-fencing-90 is 90",
        )?;
    let mut matching = register_request("invalid-fencing-90");
    matching.fencing_period_seconds = 90;
    let reply = register(matching).await;
    check(reply.status == StatusCode::OK, format!("{reply:?}"))?;
    check(
        reply.body["fencingPeriodSeconds"] == 90,
        format!("{}", reply.body),
    )?;
    Ok(())
}

/// The hub's finalizer is on `name` (the monitor or the registration put it there).
async fn until_held(hub: &Hub, name: &str) -> TestResult {
    wait::until(&format!("the hub's finalizer on {name}"), T, || async {
        let cluster = clusters(hub).get(name).await.map_err(|e| e.to_string())?;
        if cluster.finalizers().iter().any(|f| f == FINALIZER) {
            Ok(())
        } else {
            Err(format!("finalizers {:?}", cluster.finalizers()))
        }
    })
    .await?;
    Ok(())
}

async fn until_gone(hub: &Hub, name: &str) -> TestResult {
    wait::until(&format!("Cluster {name} gone"), T, || async {
        match clusters(hub).get_opt(name).await {
            Ok(None) => Ok(()),
            Ok(Some(c)) => Err(format!(
                "still there, deleting since {:?}, finalizers {:?}",
                c.metadata
                    .deletion_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string()),
                c.finalizers()
            )),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    Ok(())
}

/// A heartbeat of `name`'s agent saying it stopped (after the hub told it to).
async fn stopped_heartbeat(hub: &Hub, name: &str, token: &str) -> Reply {
    let body = json!({"identity": format!("agent-{name}"), "stopped": true});
    hub.call(
        "POST",
        &protocol::heartbeat_path(name),
        Some(token),
        Some(body.to_string().into_bytes()),
    )
    .await
}

async fn deleted_cluster_stops_its_agent(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "deleted-1";
    // An operator's Cluster; the monitor (leading) puts the hub's finalizer on it.
    labelled_cluster(&hub, name).await?;
    let (_transitions, _registry, _stop) =
        monitor(&hub, Duration::from_secs(30), Duration::from_secs(5)).await?;
    until_held(&hub, name).await?;
    let token = hub.register(name).await?;
    check(
        hub.heartbeat(name, &token, None).await.status == StatusCode::OK,
        "heartbeat before the deletion",
    )?;
    clusters(&hub)
        .delete(name, &DeleteParams::default())
        .await?;
    wait::until("heartbeat answers stop", T, || async {
        let reply = hub.heartbeat(name, &token, None).await;
        match serde_json::from_value::<HeartbeatResponse>(reply.body.clone()) {
            Ok(r) if r.stop => Ok(()),
            _ => Err(format!("{} {}", reply.status, reply.body)),
        }
    })
    .await?;
    hub.call(
        "POST",
        &protocol::status_path(name),
        Some(&token),
        Some(b"{\"items\":[]}".to_vec()),
    )
    .await
    .refused(401, "Unauthorized", "being deleted")?;
    hub.register_as(Some(&hub.bootstrap), &register_request(name))
        .await
        .refused(409, "Conflict", "being deleted")?;
    // Until the agent says it stopped (or its 30 s lease runs out), the Cluster stays.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = clusters(&hub).get_opt(name).await?;
    check(
        held.as_ref()
            .is_some_and(|c| c.metadata.deletion_timestamp.is_some()),
        format!(
            "held for the agent: {:?}",
            held.map(|c| c.finalizers().to_vec())
        ),
    )?;
    // The agent removed the hub's work and says it stopped: the Cluster goes.
    let reply = stopped_heartbeat(&hub, name, &token).await;
    check(reply.status == StatusCode::OK, format!("{reply:?}"))?;
    until_gone(&hub, name).await?;
    check(
        events_of(&hub, name, EVENT_REMOVED).await? >= 1,
        "a ClusterRemoved Event",
    )?;
    // Deletion completed: the token no longer works (the credential Secret is owned by the
    // Cluster, so the garbage collector removes it too; when is up to its discovery resync).
    wait::until("the token refused", T, || async {
        let reply = hub.heartbeat(name, &token, None).await;
        reply
            .refused(401, "Unauthorized", "its Cluster is gone")
            .map_err(|e| e.to_string())
    })
    .await?;
    Ok(())
}

async fn deleted_cluster_of_a_silent_agent_goes_with_its_lease(
    ctx: Arc<TestContext>,
) -> TestResult {
    let lease = Duration::from_secs(4);
    let hub = Hub::start(ctx.client(HUB).await?, &ctx.namespace, "e1", |c| {
        c.lease_duration = lease;
    })
    .await?;
    let name = "deleted-silent-1";
    labelled_cluster(&hub, name).await?;
    let (_transitions, _registry, _stop) = monitor(&hub, lease, Duration::from_secs(5)).await?;
    until_held(&hub, name).await?;
    // A token bound to the name (an earlier `lifeboatctl join`) and an unbound one.
    let bound = format!("{}-bound-silent-0123456789abcdef0123456789", hub.namespace);
    bootstrap_token(
        &hub.client,
        &hub.namespace,
        "join-deleted-silent-1",
        &bound,
        None,
        Some(name),
    )
    .await?;
    let token = hub.register(name).await?;
    check(
        hub.heartbeat(name, &token, None).await.status == StatusCode::OK,
        "heartbeat",
    )?;
    let deleting = std::time::Instant::now();
    clusters(&hub)
        .delete(name, &DeleteParams::default())
        .await?;
    // The agent never confirms: the Cluster goes once its lease has run out, not before.
    until_gone(&hub, name).await?;
    check(
        deleting.elapsed() >= lease - Duration::from_secs(1),
        format!(
            "gone after {:?}, before the {lease:?} lease ran out",
            deleting.elapsed()
        ),
    )?;
    // The token bound to the deleted name is revoked; the unbound one stays.
    let tokens = secrets(&hub);
    check(
        tokens.get_opt("join-deleted-silent-1").await?.is_none(),
        "the bound bootstrap token is revoked",
    )?;
    check(
        tokens.get_opt("bootstrap-any").await?.is_some(),
        "the unbound bootstrap token stays",
    )?;
    check(
        events_of(&hub, name, EVENT_REMOVED).await? >= 1,
        "a ClusterRemoved Event",
    )?;
    Ok(())
}

async fn deleted_cluster_nobody_registered_goes_at_once(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "deleted-unregistered-1";
    labelled_cluster(&hub, name).await?;
    let (_transitions, _registry, _stop) =
        monitor(&hub, Duration::from_secs(30), Duration::from_secs(5)).await?;
    until_held(&hub, name).await?;
    let deleting = std::time::Instant::now();
    clusters(&hub)
        .delete(name, &DeleteParams::default())
        .await?;
    until_gone(&hub, name).await?;
    check(
        deleting.elapsed() < Duration::from_secs(30),
        format!(
            "gone after {:?}, without waiting for a lease",
            deleting.elapsed()
        ),
    )
}

async fn replayed_status_batch_changes_nothing(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "replay-1";
    let token = hub.register(name).await?;
    hub.assign(name, "w1");
    hub.assign(name, "w2");
    let ns = hub.namespace.clone();
    let batch = StatusReport {
        items: vec![status_item(&ns, "w1", 10), status_item(&ns, "w2", 10)],
        full: false,
    };
    let send = |report: StatusReport| {
        let hub = &hub;
        let token = token.clone();
        async move {
            let reply = hub
                .call(
                    "POST",
                    &protocol::status_path(name),
                    Some(&token),
                    Some(json_bytes(&report)),
                )
                .await;
            serde_json::from_value::<StatusResponse>(reply.body)
                .map_err(|e| format!("{}: {e}", reply.status))
        }
    };
    let first = send(batch.clone()).await?;
    check(
        first.accepted == 2 && first.rejected.is_empty(),
        format!("{first:?}"),
    )?;
    let again = send(batch.clone()).await?;
    check(
        again.accepted == 2 && again.rejected.is_empty(),
        format!("a replay is answered like the original: {again:?}"),
    )?;
    check(
        hub.batches().len() == 1,
        format!(
            "the replay did not reach the intake: {} batches",
            hub.batches().len()
        ),
    )?;
    check(
        hub.metric(
            "lifeboat_hub_status_items_total",
            &[("result", "duplicate")],
        ) == 2.0,
        "duplicates counted",
    )?;
    let older = send(StatusReport {
        items: vec![status_item(&ns, "w1", 9)],
        full: false,
    })
    .await?;
    check(
        older.accepted == 0 && older.rejected[0].reason.starts_with("stale"),
        format!("{older:?}"),
    )?;
    let newer = send(StatusReport {
        items: vec![status_item(&ns, "w1", 11)],
        full: false,
    })
    .await?;
    check(newer.accepted == 1, format!("{newer:?}"))?;
    check(hub.batches().len() == 2, "a newer report is handed on")?;
    Ok(())
}

fn names(events: &[WorkEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e {
            WorkEvent::Reset { epoch, revision } => format!("reset {epoch}:{revision}"),
            WorkEvent::Upsert { work } => format!("+{}@{}", work.key.name, work.revision),
            WorkEvent::Delete {
                key,
                revision,
                confirm_gone,
                ..
            } => {
                let confirm = if *confirm_gone { "?" } else { "" };
                format!("-{}@{revision}{confirm}", key.name)
            }
            WorkEvent::Synced { epoch, revision } => format!("synced {epoch}:{revision}"),
            WorkEvent::Bookmark => "bookmark".into(),
        })
        .collect()
}

async fn work_stream_resumes_and_resets(ctx: Arc<TestContext>) -> TestResult {
    let client = ctx.client(HUB).await?;
    let hub = Hub::start(client.clone(), &ctx.namespace, "e1", |c| {
        c.bookmark_interval = Duration::from_millis(300);
    })
    .await?;
    let name = "stream-1";
    let token = hub.register(name).await?;
    hub.assign(name, "a");
    hub.assign(name, "b");

    // From scratch: Reset, the full set, Synced.
    let (status, mut lines) = open_work(&hub.app, name, &token, None).await?;
    check(status == StatusCode::OK, format!("{status}"))?;
    let first = names(&lines.until_synced().await?);
    check(
        first == ["reset e1:2", "+a@1", "+b@2", "synced e1:2"],
        format!("{first:?}"),
    )?;
    check(
        hub.metric("lifeboat_hub_work_streams", &[]) == 1.0,
        "one open stream",
    )?;
    // Live: each change, then Synced.
    hub.assign(name, "c");
    let live = names(&lines.until_synced().await?);
    check(live == ["+c@3", "synced e1:3"], format!("{live:?}"))?;
    // Quiet: a bookmark.
    let quiet = lines.next(Duration::from_secs(5)).await?;
    check(quiet == Some(WorkEvent::Bookmark), format!("{quiet:?}"))?;
    drop(lines);
    wait::until("the stream is closed", T, || async {
        let open = hub.metric("lifeboat_hub_work_streams", &[]);
        if open == 0.0 {
            Ok(())
        } else {
            Err(format!("{open} open"))
        }
    })
    .await?;

    // Reconnect with the cursor: only what changed meanwhile.
    hub.work.remove(name, &key(&hub.namespace, "a"));
    hub.assign(name, "d");
    let (_, mut lines) = open_work(&hub.app, name, &token, Some("e1:3")).await?;
    let resumed = names(&lines.until_synced().await?);
    check(
        resumed == ["-a@4", "+d@5", "synced e1:5"],
        format!("{resumed:?}"),
    )?;

    // Leadership lost: the stream ends.
    hub.leader.send_replace(LeaderState::standby(None));
    let end = lines.next(Duration::from_secs(5)).await?;
    check(end.is_none(), format!("the stream ended, got {end:?}"))?;

    // A new leader term (new epoch): the old cursor gets Reset and the full set.
    let next_term = Arc::new(WorkStore::new("e2"));
    for w in ["b", "c", "d"] {
        next_term.upsert(name, work(&hub.namespace, w));
    }
    next_term.mark_ready();
    let hub2 = Hub::with_work(
        client,
        &ctx.namespace,
        next_term,
        hub.bootstrap.clone(),
        |_| {},
    )
    .await?;
    let (_, mut lines) = open_work(&hub2.app, name, &token, Some("e1:5")).await?;
    let reset = names(&lines.until_synced().await?);
    check(
        reset == ["reset e2:3", "+b@1", "+c@2", "+d@3", "synced e2:3"],
        format!("{reset:?}"),
    )?;
    // Shutdown (close_streams) ends it too.
    hub2.api.close_streams();
    let end = lines.next(Duration::from_secs(5)).await?;
    check(
        end.is_none(),
        format!("the stream ended at shutdown, got {end:?}"),
    )?;
    Ok(())
}

async fn gone_reports_only_for_awaited_purges(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let (a, b) = ("purge-a", "purge-b");
    let token_a = hub.register(a).await?;
    let token_b = hub.register(b).await?;
    let ns = hub.namespace.clone();
    hub.assign(a, "w1");
    hub.assign(a, "w2");
    // w1's old copy in a is withdrawn for a Directly eviction.
    hub.work
        .withdraw_for_purge(a, &key(&ns, "w1"), "uid-w1")
        .ok_or("the purge took no revision")?;
    // The stream asks a's agent to confirm it gone, in a snapshot (after the full set) as when
    // resuming.
    let (_, mut lines) = open_work(&hub.app, a, &token_a, None).await?;
    let snapshot = names(&lines.until_synced().await?);
    let epoch = hub.work.epoch().to_string();
    check(
        snapshot
            == [
                format!("reset {epoch}:3"),
                "+w2@2".into(),
                "-w1@3?".into(),
                format!("synced {epoch}:3"),
            ],
        format!("{snapshot:?}"),
    )?;
    drop(lines);
    let (_, mut lines) = open_work(&hub.app, a, &token_a, Some(&format!("{epoch}:2"))).await?;
    let resumed = names(&lines.until_synced().await?);
    check(
        resumed == ["-w1@3?".to_string(), format!("synced {epoch}:3")],
        format!("{resumed:?}"),
    )?;
    drop(lines);

    let gone = |name: &str, uid: &str, second: i64| {
        let mut item = status_item(&ns, name, second);
        item.binding_uid = uid.into();
        item.applied = false;
        item.observed = None;
        item.gone = true;
        item
    };
    let send = |cluster: &'static str, token: String, items| {
        let hub = &hub;
        async move {
            let reply = hub
                .call(
                    "POST",
                    &protocol::status_path(cluster),
                    Some(&token),
                    Some(json_bytes(&StatusReport { items, full: false })),
                )
                .await;
            check(reply.status == StatusCode::OK, format!("{reply:?}"))?;
            Ok::<StatusResponse, harness::TestError>(serde_json::from_value(reply.body)?)
        }
    };
    // Forged: another binding UID, work that was not withdrawn, another cluster.
    let answer = send(
        a,
        token_a.clone(),
        vec![gone("w1", "uid-forged", 1), gone("w2", "uid-w2", 1)],
    )
    .await?;
    let reasons: Vec<&str> = answer.rejected.iter().map(|r| r.reason.as_str()).collect();
    check(
        answer.accepted == 0
            && reasons
                == [
                    "gone: binding UID uid-forged is not the one withdrawn from cluster purge-a (uid-w1)",
                    format!(
                        "gone: {ns}/w2 was not withdrawn from cluster purge-a awaiting its purge"
                    )
                    .as_str(),
                ],
        format!("{answer:?}"),
    )?;
    let answer = send(b, token_b, vec![gone("w1", "uid-w1", 1)]).await?;
    check(
        answer.accepted == 0
            && answer.rejected[0].reason
                == format!(
                    "gone: {ns}/w1 was not withdrawn from cluster purge-b awaiting its purge"
                ),
        format!("{answer:?}"),
    )?;
    check(
        hub.batches().is_empty(),
        "no forged report reached the intake",
    )?;
    // The cluster it was withdrawn from, under its binding UID: taken.
    let answer = send(a, token_a.clone(), vec![gone("w1", "uid-w1", 2)]).await?;
    check(
        answer.accepted == 1 && answer.rejected.is_empty(),
        format!("{answer:?}"),
    )?;
    let batches = hub.batches();
    check(
        batches.len() == 1
            && batches[0].cluster == a
            && batches[0].report.items == [gone("w1", "uid-w1", 2)],
        format!("the intake got {batches:?}"),
    )?;
    // Once the purge is settled, a late report is refused.
    hub.work.settle_purge(a, &key(&ns, "w1"));
    let answer = send(a, token_a, vec![gone("w1", "uid-w1", 3)]).await?;
    check(
        answer.accepted == 0 && answer.rejected.len() == 1,
        format!("{answer:?}"),
    )?;
    Ok(())
}

async fn https_end_to_end(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let (server_tls, client_tls) = tls_pair(&ctx.fleet.state_dir().join("agent-api-pki"))?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(hub.api.clone().serve(listener, server_tls, async {
        let _ = stopped.await;
    }));
    let client = https_client(client_tls);
    let base = format!("https://localhost:{}", address.port());
    let send = |method: &str, path: String, token: &str, body: Vec<u8>| {
        let request = http::Request::builder()
            .method(method)
            .uri(format!("{base}{path}"))
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body));
        let client = client.clone();
        async move { Ok::<_, harness::TestError>(client.request(request?).await?) }
    };
    let name = "https-1";
    let response = send(
        "POST",
        protocol::register_path(),
        &hub.bootstrap,
        json_bytes(&register_request(name)),
    )
    .await?;
    check(
        response.status() == StatusCode::OK,
        format!("{}", response.status()),
    )?;
    use http_body_util::BodyExt;
    let registered: protocol::RegisterResponse =
        serde_json::from_slice(&response.into_body().collect().await?.to_bytes())?;
    let token = registered.token;
    let response = send(
        "POST",
        protocol::heartbeat_path(name),
        &token,
        b"{\"identity\":\"agent-https-1\"}".to_vec(),
    )
    .await?;
    check(response.status() == StatusCode::OK, "heartbeat over HTTPS")?;
    hub.assign(name, "w1");
    let report = StatusReport {
        items: vec![status_item(&hub.namespace, "w1", 1)],
        full: true,
    };
    let response = send(
        "POST",
        protocol::status_path(name),
        &token,
        json_bytes(&report),
    )
    .await?;
    check(response.status() == StatusCode::OK, "status over HTTPS")?;
    check(hub.batches().len() == 1, "the intake got the batch")?;
    let response = send("GET", protocol::work_path(name), &token, Vec::new()).await?;
    check(
        response.headers().get("content-type").map(|v| v.as_bytes())
            == Some(b"application/x-ndjson"),
        "NDJSON content type",
    )?;
    let mut lines = Lines::new(axum::body::Body::new(response.into_body()));
    let first = names(&lines.until_synced().await?);
    check(
        first == ["reset e1:1", "+w1@1", "synced e1:1"],
        format!("{first:?}"),
    )?;
    // Shutdown ends the open stream and the server.
    let _ = stop.send(());
    let end = lines.next(Duration::from_secs(10)).await?;
    check(end.is_none(), format!("stream ended at shutdown: {end:?}"))?;
    tokio::time::timeout(Duration::from_secs(10), server).await???;
    Ok(())
}

/// One slow client: what happened to it.
#[derive(Debug)]
struct SlowClient {
    /// The TLS handshake completed (the hub admitted the connection).
    admitted: bool,
    /// From the end of the handshake until the hub closed the connection.
    open_for: Option<Duration>,
}

/// A client from `source` that completes its TLS handshake, then sends a request header one
/// byte every `every` and never finishes it; it reads until the hub closes the connection (at
/// most `limit`).
async fn slow_client(
    source: std::net::IpAddr,
    hub: std::net::SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    every: Duration,
    limit: Duration,
) -> Result<SlowClient, harness::TestError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::new(source, 0))?;
    let tcp = socket.connect(hub).await?;
    let connector = tokio_rustls::TlsConnector::from(tls);
    let name = rustls::pki_types::ServerName::try_from("localhost")?;
    let stream = match tokio::time::timeout(T, connector.connect(name, tcp)).await? {
        Ok(stream) => stream,
        // Refused: the hub closed the connection before any handshake.
        Err(_) => {
            return Ok(SlowClient {
                admitted: false,
                open_for: None,
            });
        }
    };
    let handshaken = std::time::Instant::now();
    let (mut reader, mut writer) = tokio::io::split(stream);
    let trickle = async move {
        let header = format!(
            "POST {} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n",
            protocol::register_path()
        );
        for byte in header.bytes().cycle() {
            if writer.write_all(&[byte]).await.is_err() || writer.flush().await.is_err() {
                break;
            }
            tokio::time::sleep(every).await;
        }
        std::future::pending::<()>().await;
    };
    let closed = async move {
        let mut buffer = [0u8; 1024];
        // Anything the hub sends before it closes (it sends no answer to half a header) is
        // read; the end of the stream or an error is the close.
        while let Ok(n) = reader.read(&mut buffer).await {
            if n == 0 {
                break;
            }
        }
        handshaken.elapsed()
    };
    let open_for = tokio::select! {
        elapsed = closed => Some(elapsed),
        () = trickle => None,
        () = tokio::time::sleep(limit) => None,
    };
    Ok(SlowClient {
        admitted: true,
        open_for,
    })
}

async fn slow_clients_are_closed_and_refused_while_an_agent_heartbeats(
    ctx: Arc<TestContext>,
) -> TestResult {
    use lifeboat_hub::agentapi::server::ConnectionLimits;
    const PER_IP: usize = 8;
    const SLOW: usize = 10;
    let header_timeout = Duration::from_secs(3);
    let hub = Hub::start(ctx.client(HUB).await?, &ctx.namespace, "e1", |config| {
        config.heartbeat_interval = Duration::from_secs(1);
        config.connections = ConnectionLimits {
            max_total: 64,
            max_per_ip: PER_IP,
            tls_handshake_timeout: Duration::from_secs(5),
            header_read_timeout: header_timeout,
            idle_timeout: Duration::from_secs(30),
        };
    })
    .await?;
    let pki_dir = ctx.fleet.state_dir().join("agent-api-slow-pki");
    let (server_tls, client_tls) = tls_pair(&pki_dir)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(hub.api.clone().serve(listener, server_tls, async {
        let _ = stopped.await;
    }));

    // A real agent in hub mode (on the fleet's member, from 127.0.0.1).
    let dir = ctx.fleet.state_dir().join("agent-api-slow-agent");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("bootstrap-token"), &hub.bootstrap)?;
    let member = ctx.first_member();
    let credential_namespace = ctx.namespace(&member).await?;
    let cluster = "slow-clients-agent-1";
    let registry = prometheus::Registry::new();
    let agent = lifeboat_agent::agent::spawn(
        lifeboat_agent::agent::AgentOptions {
            kubeconfig: Some(ctx.fleet.kubeconfig(&member)?),
            config: Default::default(),
            cluster: cluster.into(),
            metrics_bind: None,
            concurrency: 2,
            install_crd: true,
            webhook: None,
            leader_election: None,
            hub: Some(lifeboat_agent::uplink::HubOptions {
                urls: vec![format!("https://localhost:{}", address.port())],
                ca_file: Some(pki_dir.join("ca.crt")),
                bootstrap_token_file: dir.join("bootstrap-token"),
                fencing_period: Duration::from_secs(60),
                provider: None,
                region: None,
                zone: None,
                credential_secret: lifeboat_agent::uplink::SecretRef {
                    namespace: credential_namespace,
                    name: "hub-credential".into(),
                },
                fencing: lifeboat_agent::uplink::FencingChoice::Off,
                identity: Some("slow-clients-agent".into()),
                timing: lifeboat_agent::uplink::HubTiming {
                    request_timeout: Duration::from_secs(2),
                    ..Default::default()
                },
            }),
        },
        registry.clone(),
    )
    .await?;
    let heartbeats = |result: &str| {
        metric(
            &registry,
            "lifeboat_agent_hub_requests_total",
            &[("call", "heartbeat"), ("result", result)],
        )
    };
    let failed_heartbeats = || {
        let all = registry
            .gather()
            .iter()
            .filter(|f| f.name() == "lifeboat_agent_hub_requests_total")
            .flat_map(|f| f.get_metric().to_vec())
            .filter(|m| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == "call" && l.value() == "heartbeat")
            })
            .map(|m| m.get_counter().get_value())
            .sum::<f64>();
        all - heartbeats("ok")
    };
    wait::until("the agent heartbeats", T, || async {
        if heartbeats("ok") >= 2.0 {
            Ok(())
        } else {
            Err(format!("{} heartbeats", heartbeats("ok")))
        }
    })
    .await?;

    eprintln!(
        "the agent holds {} connection(s) to the agent API (work stream and pooled requests)",
        hub.metric("lifeboat_hub_agent_connections", &[])
    );
    // More slow clients than one address may hold, from another loopback address.
    let source: std::net::IpAddr = "127.0.0.2".parse()?;
    let tls = Arc::new(client_tls);
    let (ok_before, failed_before) = (heartbeats("ok"), failed_heartbeats());
    let started = std::time::Instant::now();
    let clients = futures::future::join_all(
        (0..SLOW).map(|_| slow_client(source, address, tls.clone(), Duration::from_millis(200), T)),
    )
    .await
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    let window = started.elapsed();
    let (ok_during, failed_during) = (
        heartbeats("ok") - ok_before,
        failed_heartbeats() - failed_before,
    );
    let admitted: Vec<&SlowClient> = clients.iter().filter(|c| c.admitted).collect();
    check(
        admitted.len() == PER_IP,
        format!("{PER_IP} admitted from one address, the rest refused: {clients:?}"),
    )?;
    // Each admitted slow client is closed once the header timeout has passed, not before.
    for client in &admitted {
        let open_for = client
            .open_for
            .ok_or("an admitted slow client stayed open")?;
        check(
            open_for >= header_timeout && open_for < header_timeout + Duration::from_secs(5),
            format!("closed {open_for:?} after its handshake (header timeout {header_timeout:?})"),
        )?;
    }
    let dropped = |reason: &str| {
        hub.metric(
            "lifeboat_hub_agent_connections_dropped_total",
            &[("reason", reason)],
        )
    };
    check(
        dropped("per_ip_limit") == (SLOW - PER_IP) as f64
            && dropped("header_timeout") == PER_IP as f64,
        format!(
            "dropped: per_ip_limit {}, header_timeout {}",
            dropped("per_ip_limit"),
            dropped("header_timeout")
        ),
    )?;
    // Meanwhile the agent's heartbeats (1 s apart) went through, none failed.
    check(
        failed_during == 0.0 && ok_during >= (window.as_secs_f64() - 2.0).floor().max(2.0),
        format!("{ok_during} heartbeats went through and {failed_during} failed in {window:?}"),
    )?;
    // The places are free again: a new client from that address gets an answer.
    let client = https_client((*tls).clone());
    let response = client
        .request(
            http::Request::post(format!(
                "https://localhost:{}{}",
                address.port(),
                protocol::register_path()
            ))
            .body(axum::body::Body::from("{}"))?,
        )
        .await?;
    check(
        response.status() == StatusCode::UNAUTHORIZED,
        format!("{}", response.status()),
    )?;
    agent.stop().await?;
    let _ = stop.send(());
    tokio::time::timeout(T, server).await???;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A test's monitor: only the Clusters labelled for the test, Leases in its namespace.
async fn monitor(
    hub: &Hub,
    lease: Duration,
    grace: Duration,
) -> Result<
    (
        tokio::sync::broadcast::Receiver<lifeboat_hub::clusters::health::ReadinessTransition>,
        prometheus::Registry,
        tokio::sync::oneshot::Sender<()>,
    ),
    harness::TestError,
> {
    let (leader, leadership) = always_leader();
    monitor_led(hub, lease, grace, leadership, Some(leader))
}

/// The monitor under `leadership`; `keep` (the sender of a fixed leadership) lives as long as it.
fn monitor_led(
    hub: &Hub,
    lease: Duration,
    grace: Duration,
    leadership: tokio::sync::watch::Receiver<LeaderState>,
    keep: Option<tokio::sync::watch::Sender<LeaderState>>,
) -> Result<
    (
        tokio::sync::broadcast::Receiver<lifeboat_hub::clusters::health::ReadinessTransition>,
        prometheus::Registry,
        tokio::sync::oneshot::Sender<()>,
    ),
    harness::TestError,
> {
    let registry = prometheus::Registry::new();
    let monitor = ClusterHealthMonitor::new(
        ClusterHealthConfig {
            namespace: hub.namespace.clone(),
            lease_duration: lease,
            period: Duration::from_secs(1),
            registration_grace: grace,
            cluster_selector: Some(format!("e2e.lifeboat.dev/test={}", hub.namespace)),
        },
        hub.client.clone(),
        &registry,
    )?;
    let transitions = monitor.subscribe();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        monitor
            .run(leadership, async {
                let _ = stopped.await;
            })
            .await;
        drop(keep);
    });
    Ok((transitions, registry, stop))
}

async fn labelled_cluster(hub: &Hub, name: &str) -> TestResult {
    let mut cluster = Cluster::new(name, ClusterSpec::default());
    cluster.metadata.labels =
        Some([("e2e.lifeboat.dev/test".to_string(), hub.namespace.clone())].into());
    clusters(hub)
        .create(&PostParams::default(), &cluster)
        .await?;
    Ok(())
}

fn health_of(cluster: &Cluster) -> (Option<String>, Option<String>, bool) {
    let ready = cluster
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    (
        ready.map(|c| c.status.clone()),
        ready.map(|c| c.reason.clone()),
        cluster
            .spec
            .taints
            .iter()
            .any(|t| t.key == TAINT_UNREACHABLE && t.effect == "NoSchedule"),
    )
}

async fn wait_health(
    hub: &Hub,
    name: &str,
    status: &str,
    reason: &str,
    tainted: bool,
) -> Result<Cluster, harness::TestError> {
    Ok(wait::until(
        &format!("{name} Ready={status} ({reason}), tainted={tainted}"),
        T,
        || async {
            let cluster = clusters(hub).get(name).await.map_err(|e| e.to_string())?;
            let seen = health_of(&cluster);
            if seen == (Some(status.into()), Some(reason.into()), tainted) {
                Ok(cluster)
            } else {
                Err(format!("{seen:?}"))
            }
        },
    )
    .await?)
}

async fn events_of(hub: &Hub, name: &str, reason: &str) -> Result<usize, harness::TestError> {
    let events: Api<Event> = Api::namespaced(hub.client.clone(), "default");
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
        })
        .count())
}

/// The readiness gauge reaches `expected`. The monitor sets its gauges after the pass's status
/// writes (and their Events), so a test that has just seen the condition may read the gauge a
/// moment early: wait, bounded.
async fn readiness_gauge(
    registry: &prometheus::Registry,
    cluster: &str,
    expected: i64,
) -> TestResult {
    lifeboat_e2e::wait::until(
        &format!("lifeboat_hub_cluster_ready{{cluster={cluster}}} = {expected}"),
        Duration::from_secs(10),
        || async {
            let value = metric(
                registry,
                "lifeboat_hub_cluster_ready",
                &[("cluster", cluster)],
            );
            if value == expected as f64 {
                Ok(())
            } else {
                Err(format!("it is {value}"))
            }
        },
    )
    .await?;
    Ok(())
}

async fn cluster_health_follows_the_lease(ctx: Arc<TestContext>) -> TestResult {
    let lease = Duration::from_secs(3);
    let hub = Hub::start(ctx.client(HUB).await?, &ctx.namespace, "e1", |c| {
        c.lease_duration = lease;
    })
    .await?;
    let name = "health-1";
    labelled_cluster(&hub, name).await?;
    let (mut transitions, registry, _stop) = monitor(&hub, lease, Duration::from_secs(5)).await?;
    let token = hub.register(name).await?;

    // An agent heartbeating every 500 ms keeps the cluster Ready, untainted.
    let heartbeats = |token: String| {
        let app = hub.app.clone();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            loop {
                let body = b"{\"identity\":\"agent-health-1\"}".to_vec();
                let reply = call(
                    &app,
                    "POST",
                    &protocol::heartbeat_path(name),
                    Some(&token),
                    Some(body),
                )
                .await;
                if reply.status != StatusCode::OK {
                    return Err(format!("heartbeat: {reply:?}"));
                }
                tokio::select! {
                    _ = &mut stopped => return Ok(()),
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        });
        (stop, task)
    };
    let (stop_agent, agent) = heartbeats(token.clone());
    wait_health(&hub, name, "True", "ClusterReady", false).await?;
    tokio::time::sleep(lease * 2).await;
    let cluster = clusters(&hub).get(name).await?;
    check(
        health_of(&cluster) == (Some("True".into()), Some("ClusterReady".into()), false),
        format!(
            "still Ready after two lease durations of heartbeats: {:?}",
            health_of(&cluster)
        ),
    )?;
    readiness_gauge(&registry, name, 1).await?;

    // The agent is killed: Unknown and tainted once the lease runs out.
    let _ = stop_agent.send(());
    agent.await??;
    let last_renew = renew_time(&hub, name).await?.ok_or("a renew time")?;
    let cluster = wait_health(&hub, name, "Unknown", "ClusterStatusUnknown", true).await?;
    let noticed = Timestamp::now();
    let after = noticed.duration_since(last_renew);
    // Never before the lease ran out. The upper bound is a liveness bound only (the machine
    // runs every e2e suite at once); how fast it is noticed is the monitor's period (1 s).
    check(
        after >= k8s_openapi::jiff::SignedDuration::from_millis(3000),
        format!("marked {after:?} after the last renewal, before the 3 s lease ran out"),
    )?;
    check(
        after <= k8s_openapi::jiff::SignedDuration::from_millis(3000 + 15_000),
        format!("marked {after:?} after the last renewal (lease 3 s)"),
    )?;
    eprintln!(
        "health-1 marked Unknown and tainted {after:#} after the last lease renewal (lease 3 s)"
    );
    let taint = cluster
        .spec
        .taints
        .iter()
        .find(|t| t.key == TAINT_UNREACHABLE)
        .ok_or("the taint")?;
    check(taint.time_added.is_some(), "timeAdded set")?;
    readiness_gauge(&registry, name, -1).await?;

    // Restarted (it reuses its credential, kept in its member): Ready, the taint gone.
    let (stop_agent, agent) = heartbeats(token);
    wait_health(&hub, name, "True", "ClusterReady", false).await?;
    let _ = stop_agent.send(());
    agent.await??;

    // Transitions: Ready, Unreachable, Ready. The monitor announces a transition after it has
    // written the status and its Event, so the last one may still be on its way.
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while seen.len() < 3 {
        match tokio::time::timeout_at(deadline, transitions.recv()).await {
            Ok(Ok(t)) if t.cluster == name => seen.push((t.from, t.to)),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(format!("transitions: {e}").into()),
            Err(_) => break,
        }
    }
    check(
        seen == [
            (None, ClusterHealth::Ready),
            (Some(ClusterHealth::Ready), ClusterHealth::Unreachable),
            (Some(ClusterHealth::Unreachable), ClusterHealth::Ready),
        ],
        format!("transitions {seen:?}"),
    )?;
    // Nothing duplicated.
    one_lease_one_credential(&hub, name).await?;
    let cluster = clusters(&hub).get(name).await?;
    check(
        cluster
            .spec
            .taints
            .iter()
            .filter(|t| t.key == TAINT_UNREACHABLE)
            .count()
            == 0
            && cluster
                .status
                .as_ref()
                .map(|s| s.conditions.iter().filter(|c| c.type_ == "Ready").count())
                == Some(1),
        "one Ready condition, no taint",
    )?;
    let unreachable = events_of(&hub, name, "ClusterUnreachable").await?;
    let ready = events_of(&hub, name, "ClusterReady").await?;
    check(
        unreachable >= 1 && ready >= 1,
        format!("Events: {unreachable} ClusterUnreachable, {ready} ClusterReady"),
    )?;
    Ok(())
}

/// The fleet gauges' samples of `cluster`: (metric, label value) → value.
fn fleet_samples(
    registry: &prometheus::Registry,
    cluster: &str,
) -> std::collections::BTreeMap<(String, String), i64> {
    registry
        .gather()
        .iter()
        .filter(|f| {
            f.name() == "lifeboat_hub_cluster_gpus" || f.name() == "lifeboat_hub_cluster_nodes"
        })
        .flat_map(|f| {
            f.get_metric()
                .iter()
                .map(move |m| (f.name().to_string(), m))
        })
        .filter(|(_, m)| {
            m.get_label()
                .iter()
                .any(|l| l.name() == "cluster" && l.value() == cluster)
        })
        .map(|(name, m)| {
            let value = m
                .get_label()
                .iter()
                .find(|l| l.name() != "cluster")
                .map(|l| l.value().to_string())
                .unwrap_or_default();
            ((name, value), m.get_gauge().get_value() as i64)
        })
        .collect()
}

async fn until_fleet_samples(
    registry: &prometheus::Registry,
    cluster: &str,
    expected: &[(&str, &str, i64)],
) -> TestResult {
    let expected: std::collections::BTreeMap<(String, String), i64> = expected
        .iter()
        .map(|(name, value, v)| ((name.to_string(), value.to_string()), *v))
        .collect();
    wait::until(
        &format!("fleet gauges of {cluster} = {expected:?}"),
        T,
        || async {
            let seen = fleet_samples(registry, cluster);
            if seen == expected {
                Ok(())
            } else {
                Err(format!("{seen:?}"))
            }
        },
    )
    .await?;
    Ok(())
}

async fn fleet_gauges_follow_the_cluster_status(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "fleet-1";
    labelled_cluster(&hub, name).await?;
    let (leader, leadership) = tokio::sync::watch::channel(LeaderState::leader());
    let (_transitions, registry, _stop) = monitor_led(
        &hub,
        Duration::from_secs(30),
        Duration::from_secs(5),
        leadership,
        None,
    )?;
    // Registered, nothing reported yet: no series (a zero would claim no GPUs).
    let token = hub.register(name).await?;
    wait_health(&hub, name, "True", "ClusterReady", false).await?;
    readiness_gauge(&registry, name, 1).await?;
    // Passes of the monitor (every second) after the one that set the readiness gauge.
    tokio::time::sleep(Duration::from_secs(2)).await;
    check(
        fleet_samples(&registry, name).is_empty(),
        format!(
            "series before any inventory: {:?}",
            fleet_samples(&registry, name)
        ),
    )?;

    // The agent reports 16 GPUs, 4 of them allocated, and one NotReady node: every series,
    // zeros included, from the Cluster status the heartbeat wrote.
    let mut reported = inventory("16");
    reported
        .resource_summary
        .allocated
        .insert("nvidia.com/gpu".into(), Quantity("4".into()));
    reported.node_health.not_ready = 1;
    reported.node_health.not_ready_nodes = vec!["gpu-node-3".into()];
    check(
        hub.heartbeat(name, &token, Some(reported.clone()))
            .await
            .status
            == StatusCode::OK,
        "heartbeat",
    )?;
    until_fleet_samples(
        &registry,
        name,
        &[
            ("lifeboat_hub_cluster_gpus", "allocatable", 16),
            ("lifeboat_hub_cluster_gpus", "allocated", 4),
            ("lifeboat_hub_cluster_nodes", "not_ready", 1),
            ("lifeboat_hub_cluster_nodes", "autopilot_flagged", 0),
            ("lifeboat_hub_cluster_nodes", "spot_reclaiming", 0),
        ],
    )
    .await?;

    // A spot reclamation notice and an Autopilot flag: the next heartbeat moves the gauges.
    reported.node_health.spot_reclaiming = 2;
    reported.node_health.autopilot_flagged = 1;
    check(
        hub.heartbeat(name, &token, Some(reported)).await.status == StatusCode::OK,
        "heartbeat",
    )?;
    let with_notices = [
        ("lifeboat_hub_cluster_gpus", "allocatable", 16),
        ("lifeboat_hub_cluster_gpus", "allocated", 4),
        ("lifeboat_hub_cluster_nodes", "not_ready", 1),
        ("lifeboat_hub_cluster_nodes", "autopilot_flagged", 1),
        ("lifeboat_hub_cluster_nodes", "spot_reclaiming", 2),
    ];
    until_fleet_samples(&registry, name, &with_notices).await?;

    // No longer leading: the series go (a standby exports none); leading again: back.
    leader.send_replace(LeaderState::standby(None));
    until_fleet_samples(&registry, name, &[]).await?;
    check(
        registry
            .gather()
            .iter()
            .filter(|f| f.name() == "lifeboat_hub_cluster_ready")
            .all(|f| f.get_metric().is_empty()),
        "no lifeboat_hub_cluster_ready series on a standby",
    )?;
    leader.send_replace(LeaderState::leader());
    until_fleet_samples(&registry, name, &with_notices).await?;

    // The Cluster is deleted: its series go.
    clusters(&hub)
        .delete(name, &DeleteParams::default())
        .await?;
    until_fleet_samples(&registry, name, &[]).await?;
    Ok(())
}

async fn unregistered_cluster_is_unknown_and_tainted(ctx: Arc<TestContext>) -> TestResult {
    let hub = hub(&ctx).await?;
    let name = "unregistered-1";
    labelled_cluster(&hub, name).await?;
    let (mut transitions, registry, _stop) =
        monitor(&hub, Duration::from_secs(3), Duration::from_secs(1)).await?;
    wait_health(&hub, name, "Unknown", "AgentNotRegistered", true).await?;
    let transition = tokio::time::timeout(T, transitions.recv()).await??;
    check(
        transition.cluster == name
            && transition.from.is_none()
            && transition.to == ClusterHealth::NotRegistered,
        format!("{transition:?}"),
    )?;
    readiness_gauge(&registry, name, -1).await?;
    // Registering lifts it.
    let token = hub.register(name).await?;
    check(
        hub.heartbeat(name, &token, None).await.status == StatusCode::OK,
        "heartbeat",
    )?;
    wait_health(&hub, name, "True", "ClusterReady", false).await?;
    Ok(())
}
