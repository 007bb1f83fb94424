//! Prometheus metrics of hub mode. Labels stay low-cardinality: the call, and a result class.

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

#[derive(Clone)]
pub struct HubMetrics {
    /// Calls to the hub by call (`register`, `heartbeat`, `work`, `status`) and result (`ok`,
    /// `unauthorized`, `forbidden`, `not_leader`, `rejected`, `server_error`, `transport`,
    /// `timeout`, `bad_response`).
    pub requests: IntCounterVec,
    /// Works assigned to this cluster, as the agent holds them.
    pub work_items: IntGauge,
    /// Server-side applies and deletions of works by result (`applied`, `failed`, `invalid`,
    /// `deleted`, `delete_failed`).
    pub applies: IntCounterVec,
    /// Status report batches by result (`ok`, `failed`).
    pub status_reports: IntCounterVec,
    /// 1 while the last heartbeat reached the hub, else 0.
    pub connected: IntGauge,
    /// 1 while the agent is fenced (cut off from the hub for its fencing period), else 0.
    pub fenced: IntGauge,
    /// 1 while the member's kube-apiserver has not answered the agent for its bound (the
    /// heartbeats say so), else 0.
    pub member_api_unreachable: IntGauge,
    /// 1 while hub mode stays stopped because the hub removed this cluster, else 0.
    pub removed: IntGauge,
}

impl HubMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let requests = IntCounterVec::new(
            Opts::new(
                "lifeboat_agent_hub_requests_total",
                "Calls to the hub's agent API, by call and result",
            ),
            &["call", "result"],
        )?;
        let work_items = IntGauge::new(
            "lifeboat_agent_work_items",
            "Works the hub assigns to this cluster",
        )?;
        let applies = IntCounterVec::new(
            Opts::new(
                "lifeboat_agent_applies_total",
                "Server-side applies and deletions of the hub's works, by result",
            ),
            &["result"],
        )?;
        let status_reports = IntCounterVec::new(
            Opts::new(
                "lifeboat_agent_status_reports_total",
                "Status report batches sent to the hub, by result",
            ),
            &["result"],
        )?;
        let connected = IntGauge::new(
            "lifeboat_agent_hub_connected",
            "1 while the last heartbeat reached the hub, else 0",
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(work_items.clone()))?;
        registry.register(Box::new(applies.clone()))?;
        registry.register(Box::new(status_reports.clone()))?;
        let fenced = IntGauge::new(
            "lifeboat_agent_fenced",
            "1 while the agent is fenced: cut off from the hub for its fencing period, it keeps the works with purgeMode Directly suspended",
        )?;
        let member_api_unreachable = IntGauge::new(
            "lifeboat_agent_member_api_unreachable",
            "1 while the member's kube-apiserver has not answered the agent for --member-api-timeout (its heartbeats tell the hub, which marks the cluster not Ready), else 0",
        )?;
        let removed = IntGauge::new(
            "lifeboat_agent_removed_from_hub",
            "1 while hub mode stays stopped because the hub deleted this cluster (until its credential Secret is deleted to join again), else 0",
        )?;
        registry.register(Box::new(removed.clone()))?;
        registry.register(Box::new(connected.clone()))?;
        registry.register(Box::new(fenced.clone()))?;
        registry.register(Box::new(member_api_unreachable.clone()))?;
        Ok(Self {
            requests,
            work_items,
            applies,
            status_reports,
            connected,
            fenced,
            member_api_unreachable,
            removed,
        })
    }
}
