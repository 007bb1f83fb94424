//! Prometheus metrics of the agent. Labels stay low-cardinality: namespace and phase (as
//! upstream's `appwrapper_phase_total`), result, error kind.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

/// Buckets of the reconcile time and queue wait histograms (the same, so they compare).
const LATENCY_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Clone)]
pub struct Metrics {
    /// Upstream-compatible: incremented on every phase change.
    pub phase_total: IntCounterVec,
    pub reconciles: IntCounter,
    /// Reconciles not run because the cached AppWrapper was older than this agent's last write.
    pub reconciles_skipped_stale: IntCounter,
    pub reconcile_errors: IntCounterVec,
    pub reconcile_duration: Histogram,
    /// From the first watch event that asked for a reconcile to its start.
    pub reconcile_queue_wait: Histogram,
    /// Round trip of the API requests a reconcile waits for, by request (status write,
    /// finalizer write, Event, confirming read, ...): what a reconcile's time is made of.
    pub api_request_duration: HistogramVec,
    /// Resets started, by cause (Unhealthy reason).
    pub resets: IntCounterVec,
    /// 1 while this replica leads (reconciles), 0 while it stands by.
    pub leader: IntGauge,
}

impl Metrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let phase_total = IntCounterVec::new(
            Opts::new("appwrapper_phase_total", "AppWrapper phase transitions"),
            &["namespace", "phase"],
        )?;
        let reconciles = IntCounter::new(
            "lifeboat_agent_reconciles_total",
            "AppWrapper reconciles run",
        )?;
        let reconciles_skipped_stale = IntCounter::new(
            "lifeboat_agent_reconciles_skipped_stale_total",
            "Reconciles skipped because the cached AppWrapper was older than the agent's own last write",
        )?;
        let reconcile_errors = IntCounterVec::new(
            Opts::new(
                "lifeboat_agent_reconcile_errors_total",
                "AppWrapper reconciles that failed, by error kind",
            ),
            &["error"],
        )?;
        let latency = |name: &str, help: &str| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()))
        };
        let reconcile_duration = latency(
            "lifeboat_agent_reconcile_duration_seconds",
            "Time spent in one AppWrapper reconcile",
        )?;
        let reconcile_queue_wait = latency(
            "lifeboat_agent_reconcile_queue_wait_seconds",
            "Time from the first watch event that asked for an AppWrapper reconcile to its start",
        )?;
        let api_request_duration = HistogramVec::new(
            HistogramOpts::new(
                "lifeboat_agent_api_request_duration_seconds",
                "Round trip of the API requests a reconcile makes, by request",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["request"],
        )?;
        let resets = IntCounterVec::new(
            Opts::new(
                "lifeboat_agent_appwrapper_resets_total",
                "AppWrapper resets and failures, by cause",
            ),
            &["reason", "outcome"],
        )?;
        let leader = IntGauge::new(
            "lifeboat_agent_leader",
            "1 while this replica holds the leader lease and reconciles, else 0",
        )?;
        registry.register(Box::new(phase_total.clone()))?;
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(reconciles_skipped_stale.clone()))?;
        registry.register(Box::new(reconcile_errors.clone()))?;
        registry.register(Box::new(reconcile_duration.clone()))?;
        registry.register(Box::new(reconcile_queue_wait.clone()))?;
        registry.register(Box::new(api_request_duration.clone()))?;
        registry.register(Box::new(resets.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        Ok(Self {
            phase_total,
            reconciles,
            reconciles_skipped_stale,
            reconcile_errors,
            reconcile_duration,
            reconcile_queue_wait,
            api_request_duration,
            resets,
            leader,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Encoder;

    #[test]
    fn metrics_register_and_render() {
        let registry = Registry::new();
        let m = Metrics::new(&registry).unwrap();
        m.phase_total.with_label_values(&["ns", "Running"]).inc();
        m.reconcile_errors.with_label_values(&["kube"]).inc();
        m.reconcile_queue_wait.observe(0.02);
        m.api_request_duration
            .with_label_values(&["status"])
            .observe(0.004);
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("appwrapper_phase_total{namespace=\"ns\",phase=\"Running\"} 1"));
        assert!(text.contains("lifeboat_agent_reconcile_errors_total{error=\"kube\"} 1"));
        assert!(text.contains("lifeboat_agent_reconcile_queue_wait_seconds_bucket{le=\"0.01\"} 0"));
        assert!(
            text.contains("lifeboat_agent_reconcile_queue_wait_seconds_bucket{le=\"0.025\"} 1")
        );
        assert!(text.contains(
            "lifeboat_agent_api_request_duration_seconds_bucket{request=\"status\",le=\"0.005\"} 1"
        ));
        // Registering twice in one registry is refused (no silent duplicate series).
        assert!(Metrics::new(&registry).is_err());
    }
}
