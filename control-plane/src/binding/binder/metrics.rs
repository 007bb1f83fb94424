//! The binder's metrics: passes by result, pass stages, bindings by state.

use super::*;

/// The binder's metrics.
#[derive(Clone)]
pub struct BinderMetrics {
    pub reconciles: prometheus::IntCounterVec,
    pub scheduling_seconds: prometheus::Histogram,
    pub bindings: prometheus::IntGaugeVec,
    /// Bindings whose `FailoverBlocked` condition is True now, by its reason.
    pub blocked: prometheus::IntGaugeVec,
    /// Time spent per stage of a pass ([`PASS_STAGES`]).
    pub stage_seconds: prometheus::HistogramVec,
}

/// The stages of a binder pass, as `lifeboat_hub_binder_stage_duration_seconds{stage}` counts
/// them: the template read for the pass (serialised, replica scripts), the decision (failover
/// phase and scheduler), the spec write, the dispatch, and the report after it (conditions,
/// Events, ledger: off the worker).
pub const PASS_STAGES: [&str; 5] = ["template", "decide", "spec_write", "dispatch", "report"];

impl BinderMetrics {
    pub fn new(registry: &prometheus::Registry) -> Result<BinderMetrics, prometheus::Error> {
        let reconciles = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_binder_reconciles_total",
                "Template reconciles by result (ok, or the error kind)",
            ),
            &["result"],
        )?;
        let scheduling_seconds = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "lifeboat_hub_scheduling_duration_seconds",
                "Time to choose the clusters of one binding (the scheduler's decision alone)",
            )
            .buckets(vec![
                0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1,
            ]),
        )?;
        let bindings = prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_bindings",
                "Bindings by state: Scheduled, Unschedulable, Applied, Healthy, Unhealthy, Unknown",
            ),
            &["state"],
        )?;
        let blocked = prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_bindings_failover_blocked",
                "Bindings whose FailoverBlocked condition is True now, by its reason (WaitingForFence: a Directly failover waits for evidence that the old copy no longer runs)",
            ),
            &["reason"],
        )?;
        for reason in api_binding::FAILOVER_BLOCKED_REASONS {
            blocked.with_label_values(&[reason]);
        }
        let stage_seconds = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new(
                "lifeboat_hub_binder_stage_duration_seconds",
                "Time of one stage of a binder pass: template (serialised, replica scripts), decide (failover phase, scheduler), spec_write, dispatch, report (conditions, Events, ledger)",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5,
            ]),
            &["stage"],
        )?;
        for stage in PASS_STAGES {
            stage_seconds.with_label_values(&[stage]);
        }
        registry.register(Box::new(stage_seconds.clone()))?;
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(scheduling_seconds.clone()))?;
        registry.register(Box::new(bindings.clone()))?;
        registry.register(Box::new(blocked.clone()))?;
        Ok(BinderMetrics {
            reconciles,
            scheduling_seconds,
            bindings,
            blocked,
            stage_seconds,
        })
    }
}
