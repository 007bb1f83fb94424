//! The fleet gauges: each cluster's GPUs and unhealthy nodes from the inventory its agent
//! reports.

use super::*;

/// The `state` label values of `lifeboat_hub_cluster_gpus`, in the order of
/// [`FleetGaugeValues::gpus`].
pub const GPU_STATES: [&str; 2] = ["allocatable", "allocated"];
/// The `condition` label values of `lifeboat_hub_cluster_nodes`, in the order of
/// [`FleetGaugeValues::nodes`].
pub const NODE_CONDITIONS: [&str; 3] = ["not_ready", "autopilot_flagged", "spot_reclaiming"];

/// What the fleet gauges show of one cluster, from the inventory its agent reports into the
/// Cluster's status. `None`: not reported yet (no series, rather than a zero that would claim a
/// cluster without GPUs or without bad nodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FleetGaugeValues {
    /// `nvidia.com/gpu` allocatable and allocated (whole GPUs), by [`GPU_STATES`]; a reported
    /// summary without GPUs is zero. `None` too when a quantity does not parse.
    pub gpus: Option<[i64; 2]>,
    /// Nodes NotReady, Autopilot-flagged and with a spot reclamation notice, by
    /// [`NODE_CONDITIONS`].
    pub nodes: Option<[i64; 3]>,
}

impl FleetGaugeValues {
    pub fn of(status: Option<&ClusterStatus>) -> FleetGaugeValues {
        let gpus = status
            .and_then(|s| s.resource_summary.as_ref())
            .and_then(|summary| {
                let whole =
                    |list: &lifeboat_api::cluster::ResourceList| match list.get(GPU_RESOURCE) {
                        None => Some(0),
                        Some(q) => Quantity::parse(&q.0).ok().map(|q| q.value()),
                    };
                Some([whole(&summary.allocatable)?, whole(&summary.allocated)?])
            });
        let nodes = status.and_then(|s| s.node_health.as_ref()).map(|health| {
            [
                i64::from(health.not_ready),
                i64::from(health.autopilot_flagged),
                i64::from(health.spot_reclaiming),
            ]
        });
        FleetGaugeValues { gpus, nodes }
    }
}

/// `lifeboat_hub_cluster_gpus{cluster,state}` and `lifeboat_hub_cluster_nodes{cluster,condition}`.
/// One label set per cluster and value (bounded by the fleet, like `lifeboat_hub_cluster_ready`;
/// no node names).
#[derive(Clone)]
pub(super) struct FleetGauges {
    pub(super) gpus: IntGaugeVec,
    pub(super) nodes: IntGaugeVec,
}

impl FleetGauges {
    pub(super) fn new(registry: &Registry) -> Result<FleetGauges, prometheus::Error> {
        let gpus = IntGaugeVec::new(
            Opts::new(
                "lifeboat_hub_cluster_gpus",
                "nvidia.com/gpu of each member cluster as its agent reports it: allocatable (ready, \
                 schedulable nodes) and allocated (requests of the pods bound to them)",
            ),
            &["cluster", "state"],
        )?;
        let nodes = IntGaugeVec::new(
            Opts::new(
                "lifeboat_hub_cluster_nodes",
                "Nodes of each member cluster that cannot or soon will not run work, as its agent \
                 reports them: not_ready, autopilot_flagged, spot_reclaiming",
            ),
            &["cluster", "condition"],
        )?;
        registry.register(Box::new(gpus.clone()))?;
        registry.register(Box::new(nodes.clone()))?;
        Ok(FleetGauges { gpus, nodes })
    }

    /// Sets every value of `cluster`, zeros included (so the series exist), and removes those
    /// not reported.
    pub(super) fn set(&self, cluster: &str, values: FleetGaugeValues) {
        set_or_remove(&self.gpus, cluster, &GPU_STATES, values.gpus.as_ref());
        set_or_remove(
            &self.nodes,
            cluster,
            &NODE_CONDITIONS,
            values.nodes.as_ref(),
        );
    }

    pub(super) fn remove(&self, cluster: &str) {
        self.set(cluster, FleetGaugeValues::default());
    }

    pub(super) fn reset(&self) {
        self.gpus.reset();
        self.nodes.reset();
    }
}

pub(super) fn set_or_remove<const N: usize>(
    gauge: &IntGaugeVec,
    cluster: &str,
    labels: &[&str; N],
    values: Option<&[i64; N]>,
) {
    for (i, label) in labels.iter().enumerate() {
        match values {
            Some(values) => gauge.with_label_values(&[cluster, label]).set(values[i]),
            None => {
                let _ = gauge.remove_label_values(&[cluster, label]);
            }
        }
    }
}
