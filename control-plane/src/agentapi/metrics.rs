//! Prometheus metrics of the agent API (low-cardinality labels: endpoint, code, result,
//! reason).

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry};

#[derive(Clone)]
pub struct AgentApiMetrics {
    /// `lifeboat_hub_agent_requests_total{endpoint,code}`
    pub requests: IntCounterVec,
    /// `lifeboat_hub_agent_request_duration_seconds{endpoint}`
    pub duration: HistogramVec,
    /// `lifeboat_hub_work_streams`
    pub work_streams: IntGauge,
    /// `lifeboat_hub_status_items_total{result}`: accepted, rejected, duplicate.
    pub status_items: IntCounterVec,
    /// `lifeboat_hub_agent_registration_wait_seconds`: how long registration waited for its
    /// credential to be live in the index.
    pub registration_wait: Histogram,
    /// `lifeboat_hub_agent_connections`: connections open now (admitted, until closed).
    pub connections: IntGauge,
    /// `lifeboat_hub_agent_connections_dropped_total{reason}`: connections the server refused
    /// (`per_ip_limit`, `total_limit`) or closed (`tls_handshake_timeout`,
    /// `tls_handshake_failed`, `header_timeout`, `idle_timeout`).
    pub connections_dropped: IntCounterVec,
}

impl AgentApiMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> Result<AgentApiMetrics, prometheus::Error> {
        let requests = IntCounterVec::new(
            Opts::new(
                "lifeboat_hub_agent_requests_total",
                "Agent API requests by endpoint (register, heartbeat, work, status) and HTTP code",
            ),
            &["endpoint", "code"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "lifeboat_hub_agent_request_duration_seconds",
                "Agent API request handling time by endpoint (for the work stream: until the \
                 response starts)",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
            &["endpoint"],
        )?;
        let work_streams = IntGauge::new(
            "lifeboat_hub_work_streams",
            "Open work streams (one per connected agent)",
        )?;
        let status_items = IntCounterVec::new(
            Opts::new(
                "lifeboat_hub_status_items_total",
                "Status items received over the agent API by result (accepted, rejected, \
                 duplicate: the same report again)",
            ),
            &["result"],
        )?;
        let registration_wait = Histogram::with_opts(
            HistogramOpts::new(
                "lifeboat_hub_agent_registration_wait_seconds",
                "Time a registration waited until the new credential was live",
            )
            .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]),
        )?;
        let connections = IntGauge::new(
            "lifeboat_hub_agent_connections",
            "Connections to the agent API open now",
        )?;
        let connections_dropped = IntCounterVec::new(
            Opts::new(
                "lifeboat_hub_agent_connections_dropped_total",
                "Agent API connections refused (per_ip_limit, total_limit) or closed by the hub \
                 (tls_handshake_timeout, tls_handshake_failed, header_timeout, idle_timeout)",
            ),
            &["reason"],
        )?;
        for reason in super::server::DropReason::ALL {
            connections_dropped.with_label_values(&[reason.label()]);
        }
        registry.register(Box::new(connections.clone()))?;
        registry.register(Box::new(connections_dropped.clone()))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(work_streams.clone()))?;
        registry.register(Box::new(status_items.clone()))?;
        registry.register(Box::new(registration_wait.clone()))?;
        Ok(AgentApiMetrics {
            requests,
            duration,
            work_streams,
            status_items,
            registration_wait,
            connections,
            connections_dropped,
        })
    }
}

/// Holds one open work stream on the gauge; dropping it (the stream ended or the agent went
/// away) takes it off.
pub struct OpenStream(IntGauge);

impl OpenStream {
    pub fn new(gauge: &IntGauge) -> OpenStream {
        gauge.inc();
        OpenStream(gauge.clone())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.dec();
    }
}
