//! GangFit (Filter): the pods must fit nodes by their free allocatable, node by node (see
//! `fit`). A gang workload needs every pod of every component placed at once; any other
//! workload needs one pod of each of its templates to fit some node. Never decided by the
//! cluster's sum.

use super::{Candidate, FilterPlugin, Rejection};
use crate::fit::{FitFailure, explain};
use crate::request::SchedulingRequest;

pub struct GangFit;

impl GangFit {
    pub const NAME: &'static str = "GangFit";
}

impl FilterPlugin for GangFit {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn filter(
        &self,
        request: &SchedulingRequest,
        candidate: &Candidate<'_>,
    ) -> Result<(), Rejection> {
        match candidate.fit().outcome {
            Ok(()) => Ok(()),
            Err(failure @ FitFailure::NoCapacityReported) => Err(Rejection::new(
                explain(request, candidate.cluster, failure),
                "cluster(s) had not reported node capacity yet",
            )),
            Err(failure) => Err(Rejection::new(
                explain(request, candidate.cluster, failure),
                if request.gang {
                    "cluster(s) had no nodes to fit every pod of the gang"
                } else {
                    "cluster(s) had no node that fits a replica"
                },
            )),
        }
    }

    fn passes(&self, _request: &SchedulingRequest, candidate: &Candidate<'_>) -> bool {
        candidate.fit().outcome.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::*;
    use serde_json::json;

    fn appwrapper(workers: i32, gpus: &str) -> SchedulingRequest {
        request(json!({
            "resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
                         "namespace": "ml", "name": "train", "uid": "u1"},
            "replicas": 1, "gang": true,
            "components": [{"name": "worker", "replicas": workers,
                "replicaRequirements": {"resourceRequest": {"nvidia.com/gpu": gpus, "cpu": "8"}}}]
        }))
    }

    #[test]
    fn the_sum_fits_but_no_node_does() {
        // 8 nodes × 4 GPUs = 32 GPUs free, but a pod needs 8 on one node.
        let small = cluster(
            "small",
            json!({}),
            json!({"nodeGroups": [
            {"count": 8, "free": {"cpu": "64", "nvidia.com/gpu": "4"}}]}),
        );
        let err = run_filter(&GangFit, &appwrapper(2, "8"), &small).unwrap_err();
        assert_eq!(
            err.reason,
            "0 of 2 pod(s) of worker (nvidia.com/gpu: 8, cpu: 8 each) fit node by node; \
             largest free on one node: nvidia.com/gpu: 4, cpu: 64; \
             free in the whole cluster: nvidia.com/gpu: 32, cpu: 512"
        );
        assert_eq!(
            err.summary,
            "cluster(s) had no nodes to fit every pod of the gang"
        );
        // 4 pods of 4 GPUs do fit there.
        assert!(run_filter(&GangFit, &appwrapper(4, "4"), &small).is_ok());
    }

    #[test]
    fn packing_consumes_nodes_across_groups() {
        // 2 nodes × 8 GPUs + 1 node × 4 GPUs: 4 pods of 4 GPUs take the two big nodes,
        // a fifth goes to the small one, a sixth has nowhere to go.
        let c = cluster(
            "mixed",
            json!({}),
            json!({"nodeGroups": [
            {"count": 2, "free": {"cpu": "64", "nvidia.com/gpu": "8"}},
            {"count": 1, "free": {"cpu": "64", "nvidia.com/gpu": "4"}}]}),
        );
        assert!(run_filter(&GangFit, &appwrapper(5, "4"), &c).is_ok());
        let err = run_filter(&GangFit, &appwrapper(6, "4"), &c).unwrap_err();
        assert!(
            err.reason.starts_with("5 of 6 pod(s) of worker"),
            "{}",
            err.reason
        );
        // CPU runs out before GPUs: 64 CPUs per node hold 8 pods of 8 CPUs.
        let cpu_bound = cluster(
            "cpu",
            json!({}),
            json!({"nodeGroups": [
            {"count": 1, "free": {"cpu": "16", "nvidia.com/gpu": "8"}}]}),
        );
        let err = run_filter(&GangFit, &appwrapper(3, "1"), &cpu_bound).unwrap_err();
        assert!(err.reason.starts_with("2 of 3 pod(s)"), "{}", err.reason);
    }

    #[test]
    fn larger_pods_are_packed_first_across_components() {
        // One 8-GPU node and one 4-GPU node. Launcher (4 GPUs) listed first, worker (8 GPUs)
        // second: in listed order the launcher would take the 8-GPU node and the worker would
        // not fit; first-fit-decreasing places the worker first.
        let c = cluster(
            "two",
            json!({}),
            json!({"nodeGroups": [
            {"count": 1, "free": {"cpu": "64", "nvidia.com/gpu": "8"}},
            {"count": 1, "free": {"cpu": "64", "nvidia.com/gpu": "4"}}]}),
        );
        let r = request(json!({
            "resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "t"},
            "replicas": 1, "gang": true,
            "components": [
                {"name": "launcher", "replicas": 1, "replicaRequirements": {"resourceRequest": {"nvidia.com/gpu": "4"}}},
                {"name": "worker", "replicas": 1, "replicaRequirements": {"resourceRequest": {"nvidia.com/gpu": "8"}}}]
        }));
        assert!(run_filter(&GangFit, &r, &c).is_ok());
    }

    #[test]
    fn node_pod_limits_count_when_reported() {
        let c = cluster(
            "pods",
            json!({}),
            json!({"nodeGroups": [
            {"count": 2, "free": {"cpu": "64", "pods": "3"}}]}),
        );
        let r = request(json!({
            "resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "t"},
            "replicas": 7, "gang": true,
            "replicaRequirements": {"resourceRequest": {"cpu": "1"}}
        }));
        let err = run_filter(&GangFit, &r, &c).unwrap_err();
        assert!(
            err.reason.starts_with("6 of 7 pod(s) of t"),
            "{}",
            err.reason
        );
    }

    #[test]
    fn node_claims_restrict_node_groups() {
        let c = cluster(
            "gpus",
            json!({}),
            json!({"nodeGroups": [
            {"count": 4, "free": {"nvidia.com/gpu": "8"}, "labels": {"nvidia.com/gpu.product": "A100"}},
            {"count": 1, "free": {"nvidia.com/gpu": "8"}, "labels": {"nvidia.com/gpu.product": "H100"}}]}),
        );
        let r = |n: i32| {
            request(json!({
                "resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "t"},
                "replicas": n, "gang": true,
                "replicaRequirements": {"resourceRequest": {"nvidia.com/gpu": "8"},
                    "nodeClaim": {"nodeSelector": {"nvidia.com/gpu.product": "H100"}}}
            }))
        };
        assert!(run_filter(&GangFit, &r(1), &c).is_ok());
        assert!(
            run_filter(&GangFit, &r(2), &c).is_err(),
            "only one H100 node"
        );
    }

    #[test]
    fn replicas_of_other_workloads_fit_one_at_a_time() {
        let c = cluster(
            "m",
            json!({}),
            json!({"nodeGroups": [{"count": 2, "free": {"cpu": "4"}}]}),
        );
        // 100 replicas of 1 CPU do not fit at once, but a replica does: not a gang.
        let many = deployment(json!({"replicas": 100}));
        assert!(run_filter(&GangFit, &many, &c).is_ok());
        let big = deployment(json!({"replicaRequirements": {"resourceRequest": {"cpu": "6"}}}));
        let err = run_filter(&GangFit, &big, &c).unwrap_err();
        assert_eq!(err.summary, "cluster(s) had no node that fits a replica");
        assert!(
            err.reason.starts_with("0 of 1 pod(s) of web (cpu: 6 each)"),
            "{}",
            err.reason
        );
    }

    #[test]
    fn clusters_without_node_capacity_are_turned_down() {
        let c = cluster("new", json!({}), json!({"nodeGroups": []}));
        let err = run_filter(&GangFit, &deployment(json!({})), &c).unwrap_err();
        assert_eq!(err.reason, "node capacity not reported yet");
        // A workload without replicas (a ConfigMap) needs no nodes.
        let config =
            request(json!({"resource": {"apiVersion": "v1", "kind": "ConfigMap", "name": "c"}}));
        assert!(run_filter(&GangFit, &config, &c).is_ok());
    }
}
