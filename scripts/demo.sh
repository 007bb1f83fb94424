#!/usr/bin/env bash
# The Lifeboat demo on the embedded default fleet: one hub and three member clusters, started
# with `fleet up --lifeboat` (the lifeboat-hub and a lifeboat-agent per member, as processes
# registered with a bootstrap token). The upstream GPU AppWrapper sample is applied to the hub
# with a PropagationPolicy; the hub places it on a member, where its agent runs it; then a GPU
# that Autopilot flags as bad makes the agent reset it in place (no retry consumed). Then a
# training AppWrapper on spot GPUs, with a failover policy, loses every spot node of its member
# to a reclamation: the hub moves it to another member within the notice, and the demo prints
# the failover timeline as it happens (seen, decided, done) and the ledger's history.
# Runs until Ctrl-C, then tears everything down.
set -euo pipefail
cd "$(dirname "$0")/.."

state="${LIFEBOAT_DEMO_STATE_DIR:-target/fleet}"
shared="${LIFEBOAT_SHARED_DIR:-../shared}"
sample="$shared/testdata/appwrapper-samples/wrapped-gpu-job.yaml"
[[ -f "$sample" ]] || { echo "the AppWrapper sample $sample is missing (set LIFEBOAT_SHARED_DIR)" >&2; exit 1; }
# Two builds: `--bin fleet` would limit a single build to the fleet binary of every package.
cargo build -q -p lifeboat-hub -p lifeboat-agent -p lifeboatctl --bins
cargo build -q -p lifeboat-e2e --bin fleet
# LIFEBOAT_BIN_DIR (also read by the fleet for the hub and agent binaries) overrides where they are.
bin="${LIFEBOAT_BIN_DIR:-target/debug}"
fleet="$bin/fleet"

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

# Act 2: a failover across clusters.
train=spot-train
notice=90
echo
echo "on the hub: $train, one pod on a whole spot GPU node (8 GPUs, karpenter.sh/capacity-type=spot),"
echo "with a failover policy: move at once on an infrastructure failure, keep the old copy until"
echo "the new one is Healthy (Gracefully), keep the old cluster out for 10 minutes"
cat <<YAML | hub apply -f -
apiVersion: policy.lifeboat.dev/v1alpha1
kind: PropagationPolicy
metadata:
  name: $train
  namespace: default
spec:
  resourceSelectors:
  - apiVersion: workload.codeflare.dev/v1beta2
    kind: AppWrapper
    name: $train
  placement:
    clusterAffinity:
      clusterNames: [member-1, member-3]
  failover:
    application:
      decisionConditions:
        tolerationSeconds: 0
      purgeMode: Gracefully
      gracePeriodSeconds: 120
      blockPredecessorSeconds: 600
---
apiVersion: workload.codeflare.dev/v1beta2
kind: AppWrapper
metadata:
  name: $train
  namespace: default
spec:
  components:
  - template:
      apiVersion: batch/v1
      kind: Job
      metadata:
        name: $train
      spec:
        backoffLimit: 0
        template:
          spec:
            restartPolicy: Never
            nodeSelector:
              karpenter.sh/capacity-type: spot
            containers:
            - name: trainer
              image: busybox
              command: ["sh", "-c", "sleep 3600"]
              resources:
                limits:
                  nvidia.com/gpu: "8"
YAML
rb="$train-appwrapper"
placed_on() { hub get rb "$rb" -o jsonpath='{.spec.clusters[*].name}' 2>/dev/null; }
for _ in $(seq 1 120); do
  first="$(placed_on)"
  [[ -n "$first" && "$(hub get aw "$train" -o jsonpath='{.status.phase}' 2>/dev/null)" == Running ]] && break
  sleep 1
done
first="$(placed_on)"
at_first() { kubectl --kubeconfig "$state/$first/admin.kubeconfig" "$@"; }
echo "placed on $first, running on node $(at_first get pods -l workload.codeflare.dev/appwrapper="$train" -o jsonpath='{.items[0].spec.nodeName}')"
spot_nodes="$(at_first get nodes -l karpenter.sh/capacity-type=spot -o jsonpath='{.items[*].metadata.name}')"
echo
echo "$(date -u +%T) injecting a fault: the cloud reclaims every spot node of $first ($spot_nodes),"
echo "         a ${notice}s notice each, then the nodes go"
for node in $spot_nodes; do
  "$fleet" --state-dir "$state" reclaim-spot --cluster "$first" "$node" --notice-seconds "$notice" &
done
injected=$(date +%s%3N)
since() { local ms=$(( $(date +%s%3N) - injected )); printf '%4d.%02ds' $((ms / 1000)) $((ms % 1000 / 10)); }
seen="" decided="" done=""
for _ in $(seq 1 600); do
  health="$(hub get rb "$rb" -o jsonpath="{.status.aggregatedStatus[?(@.clusterName==\"$first\")].health}" 2>/dev/null)"
  if [[ -z "$seen" && "$health" == Unhealthy ]]; then
    seen=1
    echo "$(since)  seen     $first reports $train Unhealthy: $(hub get rb "$rb" -o jsonpath="{.status.aggregatedStatus[?(@.clusterName==\"$first\")].healthReason}")"
  fi
  now_on="$(placed_on)"
  if [[ -z "$decided" && -n "$now_on" && "$now_on" != "$first" ]]; then
    decided=1
    echo "$(since)  decided  evicted from $first, placed on $now_on: $(hub get rb "$rb" -o jsonpath='{.spec.evictionHistory[-1].message}')"
  fi
  if [[ -n "$decided" && -z "$done" && "$(kubectl --kubeconfig "$state/$now_on/admin.kubeconfig" get aw "$train" -o jsonpath='{.status.phase}' 2>/dev/null)" == Running ]]; then
    done=1
    echo "$(since)  done     $train Running in $now_on"
  fi
  if [[ -n "$done" && -z "$(hub get rb "$rb" -o jsonpath='{.spec.gracefulEvictionTasks[*].fromCluster}')" ]]; then
    echo "$(since)  settled  the eviction task is done: the old copy's work is withdrawn from $first (the new one is Healthy)"
    break
  fi
  sleep 0.2
done
echo
echo "the binding: $(hub get rb "$rb" -o jsonpath='clusters {.spec.clusters[*].name}; evicted from {.spec.evictionHistory[*].clusterName} ({.spec.evictionHistory[*].reason}, class {.spec.evictionHistory[*].failureClass}) until {.spec.evictionHistory[*].expiresAt}')"
echo
echo "the ledger's timeline of $rb (lifeboatctl history):"
"$bin/lifeboatctl" history binding "default/$rb" \
  --database-url "sqlite://$state/hub/lifeboat-ledger.db" || true
wait
echo
"$fleet" --state-dir "$state" status || true
echo
echo "the fleet and Lifeboat keep running (kubeconfigs and logs above; try"
echo "  $fleet --state-dir $state kill-lifeboat $target   # the hub marks it Unknown and tainted"
echo "  $fleet --state-dir $state restart-lifeboat $target"
echo "); press Ctrl-C to stop"
while true; do sleep 3600; done
