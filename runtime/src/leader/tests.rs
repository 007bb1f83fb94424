//! The elector against a mock API server on tokio's paused clock: the exact requests (reads,
//! conditional writes, the release) and the timing guarantees (renew deadline, lease duration,
//! handover on release).

use std::time::Duration;

use http::Method;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::*;
use crate::mock::{ApiServer, Call};

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/lb/leases/lifeboat-agent";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/lb/leases";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/lb/events";

fn config() -> LeaseConfig {
    LeaseConfig::new("lifeboat-agent", "lb", "agent-a")
}

fn lease(resource_version: &str, spec: Value) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "lifeboat-agent", "namespace": "lb", "resourceVersion": resource_version},
        "spec": spec})
}

fn held_by(holder: &str, transitions: i32) -> Value {
    json!({"holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": transitions,
        "acquireTime": "2026-01-01T00:00:00.000000Z", "renewTime": "2026-01-01T00:00:00.000000Z"})
}

struct Running {
    server: ApiServer,
    leadership: Leadership,
    release: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

fn start(config: LeaseConfig) -> Running {
    let (client, server) = ApiServer::new();
    let (elector, leadership) = LeaderElector::new(client, config).expect("a valid config");
    let (release, released) = oneshot::channel::<()>();
    let task = tokio::spawn(elector.run(async move {
        let _ = released.await;
    }));
    Running {
        server,
        leadership,
        release: Some(release),
        task,
    }
}

/// Answers the write with what was written and a new resourceVersion.
fn accept(call: Call, resource_version: &str) {
    let mut stored = call.body.clone();
    stored["metadata"]["resourceVersion"] = json!(resource_version);
    call.reply(200, stored);
}

/// The "became leader" Event on the Lease.
async fn answer_event(server: &mut ApiServer) {
    let call = server.next().await.expect(Method::POST, EVENTS);
    assert_eq!(call.body["reason"], json!("LeaderElection"));
    assert_eq!(call.body["note"], json!("agent-a became leader"));
    assert_eq!(call.body["regarding"]["kind"], json!("Lease"));
    let body = call.body.clone();
    call.reply(201, body);
}

/// Runs the elector until it leads on a Lease it created.
async fn acquire_by_creating(r: &mut Running) {
    r.server.next().await.expect(Method::GET, LEASE).fail(
        404,
        "NotFound",
        "leases \"lifeboat-agent\" not found",
    );
    let call = r.server.next().await.expect(Method::POST, LEASES);
    assert_eq!(call.body["spec"]["holderIdentity"], json!("agent-a"));
    assert_eq!(call.body["spec"]["leaseDurationSeconds"], json!(15));
    assert_eq!(call.body["spec"]["leaseTransitions"], json!(0));
    accept(call, "1");
    answer_event(&mut r.server).await;
    r.leadership.acquired().await;
    assert!(r.leadership.is_leader());
}

#[tokio::test(start_paused = true)]
async fn creates_the_lease_renews_it_conditionally_and_releases_it_on_shutdown() {
    let mut r = start(config());
    assert!(!r.leadership.is_leader());
    let t0 = Instant::now();
    acquire_by_creating(&mut r).await;
    // Renewals every retry period, each conditional on the version read.
    for (read, written) in [("1", "2"), ("2", "3")] {
        let get = r.server.next().await.expect(Method::GET, LEASE);
        let mut spec = held_by("agent-a", 0);
        spec["renewTime"] = json!("2026-01-01T00:00:05.000000Z");
        get.reply(200, lease(read, spec));
        let put = r.server.next().await.expect(Method::PUT, LEASE);
        assert_eq!(put.body["metadata"]["resourceVersion"], json!(read));
        assert_eq!(put.body["spec"]["holderIdentity"], json!("agent-a"));
        // The acquire time is kept; the renew time is now.
        assert_eq!(
            put.body["spec"]["acquireTime"],
            json!("2026-01-01T00:00:00.000000Z")
        );
        assert_ne!(
            put.body["spec"]["renewTime"],
            json!("2026-01-01T00:00:05.000000Z")
        );
        accept(put, written);
    }
    assert_eq!(Instant::now() - t0, 2 * DEFAULT_RETRY_PERIOD);
    assert!(r.leadership.is_leader());
    // Graceful shutdown: read, then hand back conditionally, holder cleared.
    r.release.take().map(|tx| tx.send(()));
    r.server
        .next()
        .await
        .expect(Method::GET, LEASE)
        .reply(200, lease("3", held_by("agent-a", 0)));
    let put = r.server.next().await.expect(Method::PUT, LEASE);
    assert_eq!(put.body["metadata"]["resourceVersion"], json!("3"));
    assert!(put.body["spec"].get("holderIdentity").is_none());
    assert_eq!(put.body["spec"]["leaseDurationSeconds"], json!(1));
    accept(put, "4");
    r.task.await.expect("the elector finishes");
    assert!(!r.leadership.is_leader());
}

#[tokio::test(start_paused = true)]
async fn the_leader_steps_down_at_the_renew_deadline_when_the_api_server_stops_answering() {
    let mut r = start(config());
    acquire_by_creating(&mut r).await;
    let acquired = Instant::now();
    // The next renewal's read is never answered (held, not dropped).
    let hung = r.server.next().await.expect(Method::GET, LEASE);
    r.leadership.lost().await;
    let stepped_down = Instant::now() - acquired;
    assert_eq!(stepped_down, DEFAULT_RENEW_DEADLINE);
    // ...which is before any standby may take over (the lease duration).
    assert!(stepped_down < DEFAULT_LEASE_DURATION);
    drop(hung);
    r.task.abort();
}

#[tokio::test(start_paused = true)]
async fn failed_renewals_within_the_deadline_keep_the_lead() {
    let mut r = start(config());
    acquire_by_creating(&mut r).await;
    let acquired = Instant::now();
    // Two failed tries (at 2 s and 4 s), then a renewal at 6 s: still leading throughout.
    for _ in 0..2 {
        r.server
            .next()
            .await
            .fail(503, "ServiceUnavailable", "etcd is down");
        assert!(r.leadership.is_leader());
    }
    r.server
        .next()
        .await
        .expect(Method::GET, LEASE)
        .reply(200, lease("1", held_by("agent-a", 0)));
    accept(r.server.next().await.expect(Method::PUT, LEASE), "2");
    assert_eq!(Instant::now() - acquired, 3 * DEFAULT_RETRY_PERIOD);
    assert!(r.leadership.is_leader());
    r.task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_standby_waits_out_the_lease_duration_then_takes_over() {
    let mut r = start(config());
    let first_seen = Instant::now();
    let takeover = loop {
        let call = r.server.next().await;
        if call.method == Method::PUT {
            break call;
        }
        let call = call.expect(Method::GET, LEASE);
        // The holder stopped renewing: the same record every time.
        call.reply(200, lease("5", held_by("agent-b", 2)));
        assert!(!r.leadership.is_leader());
    };
    let waited = Instant::now() - first_seen;
    // Not before the lease duration, and at the first try after it.
    assert!(waited >= DEFAULT_LEASE_DURATION, "{waited:?}");
    assert!(
        waited <= DEFAULT_LEASE_DURATION + DEFAULT_RETRY_PERIOD.mul_f64(1.0 + JITTER),
        "{waited:?}"
    );
    let takeover = takeover.expect(Method::PUT, LEASE);
    assert_eq!(takeover.body["metadata"]["resourceVersion"], json!("5"));
    assert_eq!(takeover.body["spec"]["holderIdentity"], json!("agent-a"));
    assert_eq!(takeover.body["spec"]["leaseTransitions"], json!(3));
    accept(takeover, "6");
    answer_event(&mut r.server).await;
    r.leadership.acquired().await;
    r.task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_renewing_holder_is_never_taken_over() {
    let mut r = start(config());
    for i in 0..20 {
        let call = r.server.next().await.expect(Method::GET, LEASE);
        let mut spec = held_by("agent-b", 2);
        spec["renewTime"] = json!(format!("2026-01-01T00:00:{:02}.000000Z", i));
        call.reply(200, lease(&i.to_string(), spec));
        assert!(!r.leadership.is_leader());
    }
    r.task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_standby_takes_a_released_lease_at_its_next_try() {
    let mut r = start(config());
    r.server
        .next()
        .await
        .expect(Method::GET, LEASE)
        .reply(200, lease("5", held_by("agent-b", 2)));
    let released_at = Instant::now();
    r.server.next().await.expect(Method::GET, LEASE).reply(
        200,
        lease(
            "6",
            json!({"leaseDurationSeconds": 1, "leaseTransitions": 2,
                "renewTime": "2026-01-01T00:00:09.000000Z"}),
        ),
    );
    let put = r.server.next().await.expect(Method::PUT, LEASE);
    // In the same try that saw the release: no waiting out a duration.
    assert!(Instant::now() - released_at <= DEFAULT_RETRY_PERIOD.mul_f64(1.0 + JITTER));
    assert_eq!(put.body["metadata"]["resourceVersion"], json!("6"));
    assert_eq!(put.body["spec"]["leaseTransitions"], json!(3));
    accept(put, "7");
    answer_event(&mut r.server).await;
    r.leadership.acquired().await;
    r.task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_lost_write_race_is_not_leadership() {
    let mut r = start(config());
    r.server
        .next()
        .await
        .expect(Method::GET, LEASE)
        .fail(404, "NotFound", "not found");
    r.server.next().await.expect(Method::POST, LEASES).fail(
        409,
        "AlreadyExists",
        "leases \"lifeboat-agent\" already exists",
    );
    // The next read shows the winner.
    r.server
        .next()
        .await
        .expect(Method::GET, LEASE)
        .reply(200, lease("1", held_by("agent-b", 0)));
    assert!(!r.leadership.is_leader());
    let next = r.server.next().await.expect(Method::GET, LEASE);
    assert!(!r.leadership.is_leader());
    drop(next);
    r.task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_finds_another_holder_steps_down_at_once() {
    let mut r = start(config());
    acquire_by_creating(&mut r).await;
    let acquired = Instant::now();
    r.server
        .next()
        .await
        .expect(Method::GET, LEASE)
        .reply(200, lease("9", held_by("agent-b", 1)));
    r.leadership.lost().await;
    assert_eq!(Instant::now() - acquired, DEFAULT_RETRY_PERIOD);
    // On shutdown it does not release someone else's lease.
    r.release.take().map(|tx| tx.send(()));
    r.server
        .next()
        .await
        .expect(Method::GET, LEASE)
        .reply(200, lease("9", held_by("agent-b", 1)));
    r.task.await.expect("the elector finishes");
    assert!(r.server.is_idle().await);
}

#[test]
fn timing_follows_client_go_rules_and_names_the_field() {
    assert_eq!(config().validate(), Ok(()));
    let with = |f: fn(&mut LeaseConfig)| {
        let mut c = config();
        f(&mut c);
        c.validate().map_err(|e| e.field)
    };
    assert_eq!(
        with(|c| c.renew_deadline = Duration::from_secs(15)),
        Err("lease_duration")
    );
    assert_eq!(
        with(|c| c.retry_period = Duration::from_secs(9)),
        Err("renew_deadline")
    );
    assert_eq!(
        with(|c| c.retry_period = Duration::ZERO),
        Err("retry_period")
    );
    assert_eq!(
        with(|c| c.lease_duration = Duration::from_millis(15_500)),
        Err("lease_duration")
    );
    assert_eq!(with(|c| c.identity.clear()), Err("identity"));
    assert_eq!(with(|c| c.namespace.clear()), Err("namespace"));
    let err = with(|c| c.renew_deadline = Duration::from_secs(2)).unwrap_err();
    assert_eq!(err, "renew_deadline");
}

#[test]
fn jitter_stays_within_its_bounds_and_identities_name_the_process() {
    for _ in 0..1000 {
        let d = jittered(Duration::from_secs(2));
        assert!(
            d >= Duration::from_secs(2) && d <= Duration::from_millis(2400),
            "{d:?}"
        );
    }
    let identity = default_identity();
    assert!(
        identity.ends_with(&format!("_{}", std::process::id())),
        "{identity}"
    );
    assert!(!identity.starts_with('_'));
}

#[tokio::test]
async fn leadership_without_election_always_leads_and_never_loses() {
    let mut always = Leadership::always();
    assert!(always.is_leader());
    always.acquired().await;
    let lost = tokio::time::timeout(Duration::from_millis(50), always.lost()).await;
    assert!(lost.is_err(), "an unelected leader never loses");
    // An elector that is gone (a crash of its task) reads as lost, never as acquired.
    let (client, _server) = ApiServer::new();
    let (elector, mut leadership) = LeaderElector::new(client, config()).expect("valid");
    drop(elector);
    leadership.lost().await;
    let acquired = tokio::time::timeout(Duration::from_millis(50), leadership.acquired()).await;
    assert!(acquired.is_err());
}
