#!/usr/bin/env bash
# The Lifeboat demo on the embedded default fleet: one hub and three member clusters, a
# lifeboat-agent per member, and a GPU training AppWrapper moved off a node whose GPU Autopilot
# flags as bad (reset in place, no retry consumed).
# Runs until Ctrl-C, then tears everything down.
set -euo pipefail
cd "$(dirname "$0")/.."

state="${LIFEBOAT_DEMO_STATE_DIR:-target/fleet}"
cargo build -q -p lifeboat-e2e --bin fleet -p lifeboat-agent --bin lifeboat-agent
fleet=target/debug/fleet
agent=target/debug/lifeboat-agent
pids=()

cleanup() {
  trap - EXIT INT TERM
  echo
  echo "stopping the agents and the fleet"
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  "$fleet" --state-dir "$state" down || true
}
trap cleanup EXIT
trap 'cleanup; exit 0' INT TERM

"$fleet" --state-dir "$state" up --members 3
for i in 1 2 3; do
  member="member-$i"
  "$agent" --kubeconfig "$state/$member/admin.kubeconfig" --cluster-name "$member" \
    --metrics-bind "127.0.0.1:$((9463 + i))" \
    --webhook-url-host 127.0.0.1 --webhook-bind "127.0.0.1:$((9443 + i))" \
    >"$state/lifeboat-agent-$member.log" 2>&1 &
  pids+=("$!")
done

kc="$state/member-1/admin.kubeconfig"
if ! command -v kubectl >/dev/null; then
  echo "kubectl not found: the fleet and agents run; install kubectl to see the demo workload"
  sleep infinity
fi
k() { kubectl --kubeconfig "$kc" "$@"; }

echo "waiting for the agents (CRD and admission webhook)"
for _ in $(seq 1 120); do
  k get validatingwebhookconfiguration lifeboat-appwrapper-validating >/dev/null 2>&1 && break
  sleep 1
done

cat <<'YAML' | k apply -f -
apiVersion: workload.codeflare.dev/v1beta2
kind: AppWrapper
metadata:
  name: llm-finetune
  namespace: default
  annotations:
    workload.codeflare.dev.appwrapper/failureGracePeriodDuration: "5s"
    workload.codeflare.dev.appwrapper/retryPausePeriodDuration: "5s"
    workload.codeflare.dev.appwrapper/retryLimit: "3"
spec:
  components:
  - template:
      apiVersion: batch/v1
      kind: Job
      metadata:
        name: llm-finetune
      spec:
        parallelism: 2
        completions: 2
        backoffLimit: 0
        template:
          spec:
            restartPolicy: Never
            containers:
            - name: trainer
              image: nvcr.io/nvidia/pytorch:24.05-py3
              command: ["sh", "-c", "sleep 60"]
              resources:
                limits:
                  nvidia.com/gpu: 4
YAML

echo "waiting for the AppWrapper to run"
for _ in $(seq 1 60); do
  [[ "$(k get aw llm-finetune -o jsonpath='{.status.phase}')" == Running ]] && break
  sleep 1
done
sleep 2
node="$(k get pods -l workload.codeflare.dev/appwrapper=llm-finetune -o jsonpath='{.items[0].spec.nodeName}')"
echo "injecting a fault: Autopilot finds a bad GPU on $node and flags it EVICT"
"$fleet" --state-dir "$state" gpu-health --cluster member-1 "$node" EVICT

for _ in $(seq 1 40); do
  k get aw llm-finetune --no-headers
  [[ "$(k get aw llm-finetune -o jsonpath='{.status.transitions[-1].phase}')" == Running &&
     "$(k get aw llm-finetune -o jsonpath='{.status.transitions[*].reason}')" == *AutopilotNoExecute* ]] && break
  sleep 1
done
echo
echo "the trainer pods now run on: $(k get pods -l workload.codeflare.dev/appwrapper=llm-finetune \
  -o jsonpath='{range .items[*]}{.spec.nodeName} {end}')(not $node); retries used: \
$(k get aw llm-finetune -o jsonpath='{.status.resettingCount}' | sed 's/^$/0/')"
"$fleet" --state-dir "$state" gpu-health --cluster member-1 "$node" PASS
echo
echo "what happened (status.transitions):"
k get aw llm-finetune -o jsonpath='{range .status.transitions[*]}{.time}  {.phase}  {.reason}  {.message}{"\n"}{end}'
echo
"$fleet" --state-dir "$state" status || true
echo
echo "the fleet and agents keep running (kubeconfigs above; agent logs in $state); press Ctrl-C to stop"
while true; do sleep 3600; done
