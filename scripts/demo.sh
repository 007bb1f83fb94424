#!/usr/bin/env bash
# The Lifeboat demo on the embedded default fleet: one hub and three member clusters, started
# with `fleet up --lifeboat` (the lifeboat-hub and a lifeboat-agent per member, as processes
# registered with a bootstrap token). The upstream GPU AppWrapper sample is applied to the hub
# with a PropagationPolicy; the hub places it on a member, where its agent runs it; then a GPU
# that Autopilot flags as bad makes the agent reset it in place (no retry consumed).
# Runs until Ctrl-C, then tears everything down.
set -euo pipefail
cd "$(dirname "$0")/.."

state="${LIFEBOAT_DEMO_STATE_DIR:-target/fleet}"
shared="${LIFEBOAT_SHARED_DIR:-../shared}"
sample="$shared/testdata/appwrapper-samples/wrapped-gpu-job.yaml"
[[ -f "$sample" ]] || { echo "the AppWrapper sample $sample is missing (set LIFEBOAT_SHARED_DIR)" >&2; exit 1; }
cargo build -q -p lifeboat-e2e --bin fleet -p lifeboat-hub -p lifeboat-agent
fleet=target/debug/fleet

cleanup() {
  trap - EXIT INT TERM
  echo
  echo "stopping Lifeboat and the fleet"
  "$fleet" --state-dir "$state" down || true
}
trap cleanup EXIT
trap 'cleanup; exit 0' INT TERM

"$fleet" --state-dir "$state" up --members 3 --lifeboat

if ! command -v kubectl >/dev/null; then
  echo "kubectl not found: the fleet and Lifeboat run; install kubectl to see the demo workload"
  while true; do sleep 3600; done
fi
hub() { kubectl --kubeconfig "$state/hub/admin.kubeconfig" "$@"; }
target=member-2
member() { kubectl --kubeconfig "$state/$target/admin.kubeconfig" "$@"; }
aw=sample-gpu-job

echo
echo "on the hub: a PropagationPolicy placing $aw on $target, and the sample itself ($sample)"
cat <<YAML | hub apply -f -
apiVersion: policy.lifeboat.dev/v1alpha1
kind: PropagationPolicy
metadata:
  name: $aw
  namespace: default
spec:
  resourceSelectors:
  - apiVersion: workload.codeflare.dev/v1beta2
    kind: AppWrapper
    name: $aw
  placement:
    clusterAffinity:
      clusterNames: [$target]
YAML
# Short fault-tolerance periods, so that the reset below takes seconds rather than minutes.
hub annotate --local -f "$sample" -o yaml \
  workload.codeflare.dev.appwrapper/failureGracePeriodDuration=5s \
  workload.codeflare.dev.appwrapper/retryPausePeriodDuration=5s |
  hub apply -n default -f -

echo "waiting for the hub's AppWrapper to show Running"
for _ in $(seq 1 120); do
  [[ "$(hub get aw "$aw" -o jsonpath='{.status.phase}' 2>/dev/null)" == Running ]] && break
  sleep 1
done
hub get aw "$aw"
echo
echo "its ResourceBinding (clusters and health per cluster):"
hub get rb
hub get rb -o jsonpath='{range .items[*]}{.metadata.name}: clusters {.spec.clusters[*].name}; {range .status.aggregatedStatus[*]}{.clusterName} applied={.applied} health={.health}{end}{"\n"}{end}'
echo
echo "in $target, run by its agent:"
member get aw "$aw"

node="$(member get pods -l workload.codeflare.dev/appwrapper="$aw" -o jsonpath='{.items[0].spec.nodeName}')"
echo
echo "injecting a fault: Autopilot finds a bad GPU on $node ($target) and flags it EVICT"
"$fleet" --state-dir "$state" gpu-health --cluster "$target" "$node" EVICT
for _ in $(seq 1 60); do
  member get aw "$aw" --no-headers
  [[ "$(member get aw "$aw" -o jsonpath='{.status.transitions[-1].phase}')" == Running &&
     "$(member get aw "$aw" -o jsonpath='{.status.transitions[*].reason}')" == *AutopilotNoExecute* ]] && break
  sleep 1
done
retries="$(member get aw "$aw" -o jsonpath='{.status.resettingCount}')"
echo
echo "the pod now runs on: $(member get pods -l workload.codeflare.dev/appwrapper="$aw" \
  -o jsonpath='{range .items[*]}{.spec.nodeName} {end}')(not $node); retries used: ${retries:-0}"
"$fleet" --state-dir "$state" gpu-health --cluster "$target" "$node" PASS
echo
echo "what happened in $target (status.transitions):"
member get aw "$aw" -o jsonpath='{range .status.transitions[*]}{.time}  {.phase}  {.reason}  {.message}{"\n"}{end}'
echo
echo "on the hub, once the member reports it Running again:"
for _ in $(seq 1 60); do
  [[ "$(hub get aw "$aw" -o jsonpath='{.status.phase}')" == Running ]] && break
  sleep 1
done
hub get aw "$aw"
hub get lbc
echo
"$fleet" --state-dir "$state" status || true
echo
echo "the fleet and Lifeboat keep running (kubeconfigs and logs above; try"
echo "  $fleet --state-dir $state kill-lifeboat $target   # the hub marks it Unknown and tainted"
echo "  $fleet --state-dir $state restart-lifeboat $target"
echo "); press Ctrl-C to stop"
while true; do sleep 3600; done
