//! The stages of one failover, as `tracing` events (issue 20's latency budget).
//!
//! The agents and the hub each emit a DEBUG event with target [`TARGET`] when a failover passes
//! one of these stages, with the fields `stage` (one of the constants below), `cluster` (the
//! member the stage happened in or is about) and the object (`appwrapper` with `namespace`, or
//! `work`, the binding's `namespace/name`). With the target off (the default `info` filter),
//! they cost a disabled callsite each. `member-agent/benches/failover_e2e.rs` collects them
//! with a layer of its own and prints p50/p99 per stage.
//!
//! In the order a failover passes them; the first four happen in the member the workload
//! leaves, the last three in the member it moves to.

/// The `tracing` target of the stage events.
pub const TARGET: &str = "lifeboat::failover";

/// The agent's pod watch saw a pod of an AppWrapper turn Failed.
pub const POD_FAILED_SEEN: &str = "pod_failed_seen";
/// The agent wrote the AppWrapper's phase Failed (or Resetting).
pub const APPWRAPPER_FAILED_WRITTEN: &str = "appwrapper_failed_written";
/// The agent's status report with the object was answered by the hub.
pub const REPORT_SENT: &str = "report_sent";
/// The hub's agent API received a status report item.
pub const REPORT_RECEIVED: &str = "report_received";
/// The hub's status processor decided a new health for the binding in a cluster.
pub const HEALTH_DECIDED: &str = "health_decided";
/// The hub wrote an eviction into the binding's spec (`cluster`: the one evicted from).
pub const EVICTION_WRITTEN: &str = "eviction_written";
/// The hub published a new work revision for a cluster.
pub const WORK_DISPATCHED: &str = "work_dispatched";
/// An agent received a work revision from its stream.
pub const WORK_RECEIVED: &str = "work_received";
/// An agent applied a work's object (created it, or updated it) in its member.
pub const OBJECT_APPLIED: &str = "object_applied";

/// Every stage, in order.
pub const ALL: [&str; 9] = [
    POD_FAILED_SEEN,
    APPWRAPPER_FAILED_WRITTEN,
    REPORT_SENT,
    REPORT_RECEIVED,
    HEALTH_DECIDED,
    EVICTION_WRITTEN,
    WORK_DISPATCHED,
    WORK_RECEIVED,
    OBJECT_APPLIED,
];
