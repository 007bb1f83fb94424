use super::*;
use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::ObjectMeta;
use lifeboat_api::cluster::{AgentInfo, ClusterSpec, ClusterStatus};

/// `second` seconds after a fixed instant.
pub(crate) fn at(second: i64) -> Timestamp {
    Timestamp::from_second(1_780_000_000 + second).unwrap()
}

/// A Cluster created at `at(created)`, with an agent in its status when `registered`.
pub(crate) fn cluster(created: i64, registered: bool) -> Cluster {
    let mut c = Cluster::new("gpu-east", ClusterSpec::default());
    c.metadata.creation_timestamp = Some(Time(at(created)));
    if registered {
        c.status = Some(ClusterStatus {
            agent: Some(AgentInfo {
                identity: "agent-0".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    c
}

fn lease(renewed: i64, seconds: i32) -> Lease {
    Lease {
        metadata: ObjectMeta::default(),
        spec: Some(LeaseSpec {
            holder_identity: Some("agent-0".into()),
            lease_duration_seconds: Some(seconds),
            renew_time: Some(MicroTime(at(renewed))),
            ..Default::default()
        }),
    }
}

fn config() -> ClusterHealthConfig {
    ClusterHealthConfig::default()
}

fn health(v: Option<Verdict>) -> Option<ClusterHealth> {
    v.map(|v| v.health)
}

#[test]
fn a_lease_not_renewed_within_its_duration_makes_the_cluster_unreachable() {
    let c = cluster(0, true);
    let l = lease(100, 40);
    let j = |now| judge(&c, Some(&l), at(now), at(0), &config());
    assert_eq!(health(j(139)), Some(ClusterHealth::Ready));
    assert_eq!(j(139).unwrap().expires, Some(at(140)));
    assert_eq!(health(j(140)), Some(ClusterHealth::Unreachable));
    let message = j(141).unwrap().message;
    assert!(
        message.contains("agent-0") && message.contains("40s"),
        "{message}"
    );
    // renewed again: ready
    let renewed = lease(141, 40);
    assert_eq!(
        health(judge(&c, Some(&renewed), at(141), at(0), &config())),
        Some(ClusterHealth::Ready)
    );
}

#[test]
fn a_new_leader_gives_every_lease_a_full_duration() {
    let c = cluster(0, true);
    let l = lease(100, 40);
    // the hub was down from 100 to 200: the lease is long expired, but leading since 200
    assert_eq!(
        health(judge(&c, Some(&l), at(210), at(200), &config())),
        Some(ClusterHealth::Ready)
    );
    assert_eq!(
        health(judge(&c, Some(&l), at(240), at(200), &config())),
        Some(ClusterHealth::Unreachable)
    );
}

#[test]
fn clusters_without_a_lease() {
    // never registered: after the registration grace
    let c = cluster(100, false);
    assert_eq!(health(judge(&c, None, at(102), at(0), &config())), None);
    assert_eq!(
        health(judge(&c, None, at(105), at(0), &config())),
        Some(ClusterHealth::NotRegistered)
    );
    // registered but the lease is gone: after one duration
    let c = cluster(100, true);
    assert_eq!(health(judge(&c, None, at(139), at(0), &config())), None);
    assert_eq!(
        health(judge(&c, None, at(140), at(0), &config())),
        Some(ClusterHealth::Unreachable)
    );
}

#[test]
fn a_member_api_reported_silent_makes_a_renewed_cluster_not_ready() {
    let c = cluster(0, true);
    let mut l = lease(100, 40);
    l.metadata.annotations = Some(
        [(
            ANNOTATION_MEMBER_API_UNREACHABLE_SINCE.to_string(),
            at(70).to_string(),
        )]
        .into(),
    );
    let j = |now| judge(&c, Some(&l), at(now), at(0), &config());
    let verdict = j(110).unwrap();
    assert_eq!(verdict.health, ClusterHealth::MemberApiUnreachable);
    assert_eq!(verdict.expires, Some(at(140)));
    assert!(
        verdict.message.contains("agent-0") && verdict.message.contains(&at(70).to_string()),
        "{}",
        verdict.message
    );
    // the lease still runs out: the agent is then not heard from at all
    assert_eq!(health(j(140)), Some(ClusterHealth::Unreachable));
    // the next heartbeat without the annotation: Ready
    assert_eq!(
        health(judge(&c, Some(&lease(120, 40)), at(121), at(0), &config())),
        Some(ClusterHealth::Ready)
    );
}

#[test]
fn every_health_reads_back_from_its_condition_and_has_its_taint() {
    for health in [
        ClusterHealth::Ready,
        ClusterHealth::Unreachable,
        ClusterHealth::NotRegistered,
        ClusterHealth::MemberApiUnreachable,
    ] {
        let mut c = cluster(0, true);
        let condition = ready_condition(&verdict(health), &Shown::of(&c), None, at(1));
        c.status.as_mut().unwrap().conditions = vec![condition];
        c.spec.taints = health
            .taint_key()
            .map(|key| Taint {
                key: key.into(),
                effect: TAINT_EFFECT.into(),
                ..Default::default()
            })
            .into_iter()
            .collect();
        let shown = Shown::of(&c);
        assert_eq!(shown.health(), Some(health));
        assert!(shown.matches(health), "{health:?}");
    }
    assert_eq!(
        ClusterHealth::MemberApiUnreachable.condition_status(),
        "False"
    );
    assert_eq!(ClusterHealth::MemberApiUnreachable.metric_value(), 0);
}

#[test]
fn the_taint_must_be_the_one_of_the_health() {
    let mut c = cluster(0, true);
    c.status.as_mut().unwrap().conditions = vec![ready_condition(
        &verdict(ClusterHealth::MemberApiUnreachable),
        &Shown::of(&c),
        None,
        at(1),
    )];
    c.spec.taints = vec![Taint {
        key: TAINT_UNREACHABLE.into(),
        effect: TAINT_EFFECT.into(),
        ..Default::default()
    }];
    assert!(!Shown::of(&c).matches(ClusterHealth::MemberApiUnreachable));
    c.spec.taints[0].key = TAINT_NOT_READY.into();
    assert!(Shown::of(&c).matches(ClusterHealth::MemberApiUnreachable));
    // Unknown and False are different transitions: the time moves
    let unknown = ready_condition(
        &verdict(ClusterHealth::Unreachable),
        &Shown::of(&c),
        None,
        at(9),
    );
    assert_eq!(unknown.last_transition_time, Time(at(9)));
}

fn verdict(health: ClusterHealth) -> Verdict {
    Verdict {
        health,
        message: "m".into(),
        expires: None,
    }
}

#[test]
fn what_the_cluster_shows_decides_whether_to_write() {
    let mut c = cluster(0, true);
    let shown = Shown::of(&c);
    assert!(!shown.matches(ClusterHealth::Ready));
    let condition = ready_condition(&verdict(ClusterHealth::Unreachable), &shown, Some(1), at(5));
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("Unknown", "ClusterStatusUnknown")
    );
    assert_eq!(condition.last_transition_time, Time(at(5)));
    c.status.as_mut().unwrap().conditions = vec![condition];
    // the condition alone is not enough: the taint is missing
    assert!(!Shown::of(&c).matches(ClusterHealth::Unreachable));
    c.spec.taints = vec![Taint {
        key: TAINT_UNREACHABLE.into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    }];
    let shown = Shown::of(&c);
    assert!(shown.matches(ClusterHealth::Unreachable));
    assert_eq!(shown.health(), Some(ClusterHealth::Unreachable));
    assert!(!shown.matches(ClusterHealth::NotRegistered));
    // same status again: the transition time stays
    let again = ready_condition(&verdict(ClusterHealth::Unreachable), &shown, Some(1), at(9));
    assert_eq!(again.last_transition_time, Time(at(5)));
    let ready = ready_condition(&verdict(ClusterHealth::Ready), &shown, Some(1), at(9));
    assert_eq!(ready.last_transition_time, Time(at(9)));
}

#[test]
fn not_ready_since_keeps_the_transition_to_the_microsecond() {
    let mut c = cluster(0, true);
    let lost_at = at(5)
        .checked_add(k8s_openapi::jiff::SignedDuration::from_millis(300))
        .unwrap();
    let unreachable = verdict(ClusterHealth::Unreachable);
    let since = not_ready_since(&unreachable, &Shown::of(&c), lost_at).unwrap();
    assert_eq!(since, lifeboat_api::time::stored(lost_at));
    assert!(since.0 >= lost_at);
    let condition = ready_condition(&unreachable, &Shown::of(&c), None, lost_at);
    let status = c.status.as_mut().unwrap();
    status.conditions = vec![condition];
    status.not_ready_since = Some(since.clone());
    // a later pass with the same status keeps it
    assert_eq!(
        not_ready_since(&unreachable, &Shown::of(&c), at(9)),
        Some(since)
    );
    // another not-Ready status is a new transition, as the condition's time is
    let silent = verdict(ClusterHealth::MemberApiUnreachable);
    assert_eq!(
        not_ready_since(&silent, &Shown::of(&c), at(9)),
        Some(lifeboat_api::time::stored(at(9)))
    );
    assert_eq!(
        not_ready_since(&verdict(ClusterHealth::Ready), &Shown::of(&c), at(9)),
        None
    );
    // an older hub's not-Ready Cluster (no notReadySince) gets none until it changes
    c.status.as_mut().unwrap().not_ready_since = None;
    assert_eq!(not_ready_since(&unreachable, &Shown::of(&c), at(9)), None);
}

fn status_json(value: serde_json::Value) -> ClusterStatus {
    serde_json::from_value(value).expect("a ClusterStatus")
}

#[test]
fn fleet_gauges_read_the_gpus_and_unhealthy_nodes_of_the_reported_inventory() {
    let status = status_json(serde_json::json!({
        "resourceSummary": {
            "allocatable": {"cpu": "96", "nvidia.com/gpu": "16"},
            "allocated": {"cpu": "12500m", "nvidia.com/gpu": "5"}
        },
        "nodeHealth": {
            "notReady": 2, "autopilotFlagged": 1, "spotReclaiming": 3,
            "notReadyNodes": ["n1", "n2"]
        }
    }));
    assert_eq!(
        FleetGaugeValues::of(Some(&status)),
        FleetGaugeValues {
            gpus: Some([16, 5]),
            nodes: Some([2, 1, 3]),
        }
    );
    // A reported inventory without GPUs or bad nodes is zeros, not absent.
    let healthy = status_json(serde_json::json!({
        "resourceSummary": {"allocatable": {"cpu": "8"}, "allocated": {}},
        "nodeHealth": {"notReady": 0, "autopilotFlagged": 0, "spotReclaiming": 0}
    }));
    assert_eq!(
        FleetGaugeValues::of(Some(&healthy)),
        FleetGaugeValues {
            gpus: Some([0, 0]),
            nodes: Some([0, 0, 0]),
        }
    );
    // Nothing reported yet (registered, or no status at all): no values.
    let registered = cluster(0, true);
    assert_eq!(
        FleetGaugeValues::of(registered.status.as_ref()),
        FleetGaugeValues::default()
    );
    assert_eq!(FleetGaugeValues::of(None), FleetGaugeValues::default());
    // A fractional quantity counts whole GPUs, rounded up (Quantity.Value); one that does
    // not parse leaves the GPUs out rather than claiming zero.
    let odd = status_json(serde_json::json!({
        "resourceSummary": {
            "allocatable": {"nvidia.com/gpu": "1500m"},
            "allocated": {"nvidia.com/gpu": "two"}
        }
    }));
    assert_eq!(FleetGaugeValues::of(Some(&odd)).gpus, None);
    let fractional = status_json(serde_json::json!({
        "resourceSummary": {"allocatable": {"nvidia.com/gpu": "1500m"}, "allocated": {}}
    }));
    assert_eq!(FleetGaugeValues::of(Some(&fractional)).gpus, Some([2, 0]));
}

/// The samples of `name` in `registry`: label values (in label-name order) → value.
fn samples(registry: &Registry, name: &str) -> BTreeMap<Vec<String>, i64> {
    crate::test_metrics::series(registry, name)
        .into_iter()
        .map(|(labels, value)| (labels, value as i64))
        .collect()
}

#[test]
fn fleet_gauges_set_zeros_and_drop_what_is_no_longer_reported() {
    let registry = Registry::new();
    let gauges = FleetGauges::new(&registry).expect("registered");
    let key = |cluster: &str, value: &str| vec![cluster.to_string(), value.to_string()];
    gauges.set(
        "gpu-east",
        FleetGaugeValues {
            gpus: Some([8, 3]),
            nodes: Some([0, 1, 0]),
        },
    );
    gauges.set(
        "cpu-west",
        FleetGaugeValues {
            gpus: Some([0, 0]),
            nodes: None,
        },
    );
    let gpus = samples(&registry, "lifeboat_hub_cluster_gpus");
    assert_eq!(gpus.len(), 4, "{gpus:?}");
    assert_eq!(gpus[&key("gpu-east", "allocatable")], 8);
    assert_eq!(gpus[&key("gpu-east", "allocated")], 3);
    assert_eq!(gpus[&key("cpu-west", "allocatable")], 0);
    let nodes = samples(&registry, "lifeboat_hub_cluster_nodes");
    assert_eq!(
        nodes,
        [
            (key("gpu-east", "autopilot_flagged"), 1),
            (key("gpu-east", "not_ready"), 0),
            (key("gpu-east", "spot_reclaiming"), 0),
        ]
        .into_iter()
        .collect()
    );
    // A deleted cluster's series go; the other cluster's stay.
    gauges.remove("gpu-east");
    assert!(samples(&registry, "lifeboat_hub_cluster_nodes").is_empty());
    let gpus = samples(&registry, "lifeboat_hub_cluster_gpus");
    assert_eq!(
        gpus.keys().map(|k| k[0].as_str()).collect::<Vec<_>>(),
        ["cpu-west"; 2]
    );
    gauges.reset();
    assert!(samples(&registry, "lifeboat_hub_cluster_gpus").is_empty());
}
