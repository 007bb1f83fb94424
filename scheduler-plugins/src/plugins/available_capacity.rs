//! AvailableCapacity (Score): more free capacity relative to what the workload asks for scores
//! higher: 100 × (1 − need / free) on the tightest requested resource (GPUs, CPU, memory, ...),
//! so a cluster the workload would fill scores 0 and one it barely dents scores near 100.

use super::{Candidate, ScorePlugin};
use crate::request::SchedulingRequest;

pub struct AvailableCapacity;

impl AvailableCapacity {
    pub const NAME: &'static str = "AvailableCapacity";
}

impl ScorePlugin for AvailableCapacity {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn score(&self, request: &SchedulingRequest, candidate: &Candidate<'_>) -> i64 {
        crate::fit::headroom(request, candidate.cluster)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::*;
    use serde_json::json;

    #[test]
    fn more_free_gpus_score_higher() {
        let r = request(json!({
            "resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "t"},
            "replicas": 2, "gang": true,
            "replicaRequirements": {"resourceRequest": {"nvidia.com/gpu": "8", "cpu": "1"}}
        }));
        let gpus = |nodes: i32| {
            cluster(
                "c",
                json!({}),
                json!({"nodeGroups": [
            {"count": nodes, "free": {"cpu": "64", "nvidia.com/gpu": "8"}}]}),
            )
        };
        // 16 of 16 GPUs needed: nothing left.
        assert_eq!(run_score(&AvailableCapacity, &r, &gpus(2)), 0);
        // 16 of 32: half left.
        assert_eq!(run_score(&AvailableCapacity, &r, &gpus(4)), 50);
        // 16 of 160.
        assert_eq!(run_score(&AvailableCapacity, &r, &gpus(20)), 90);
    }
}
