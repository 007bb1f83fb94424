#!/usr/bin/env bash
# Builds the chart tests' tools from their Go modules into the cache that holds the Kubernetes
# test-bed binaries (e2e/k8s/build.sh), each in its own versioned directory:
#   helm      ./cmd/helm of helm.sh/helm/v3 at HELM_VERSION                  -> helm-<v>/helm
#   promtool  ./cmd/promtool of github.com/prometheus/prometheus at
#             PROMTOOL_VERSION, with PROMTOOL_TAGS                           -> promtool-<v>/promtool
# Idempotent: a tool whose binary and stamp are present is not rebuilt (one line says so).
#
#   e2e/tools/build.sh                  build (or confirm) every tool
#   e2e/tools/build.sh TOOL...          only these (helm, promtool)
#   e2e/tools/build.sh --print-dir TOOL only print the directory that holds TOOL
#
# Environment: LIFEBOAT_TOOLS_BIN_DIR overrides the cache directory (the tools' directories go
# inside it); CI=true or LIFEBOAT_K8S_DROP_GO_CACHES=1 use private Go caches removed afterwards.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

tools_dir="${LIFEBOAT_TOOLS_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lifeboat/tools}"
TOOLS=(helm promtool)

tool_dir() {
  case "$1" in
    helm) echo "$tools_dir/helm-$HELM_VERSION" ;;
    promtool) echo "$tools_dir/promtool-$PROMTOOL_VERSION" ;;
    *) echo "unknown tool \"$1\" (helm|promtool)" >&2; return 2 ;;
  esac
}
want_stamp() {
  case "$1" in
    helm) echo "helm=$HELM_VERSION" ;;
    promtool) echo "promtool=$PROMTOOL_VERSION tags=$PROMTOOL_TAGS" ;;
  esac
}
is_built() {
  local dir
  dir="$(tool_dir "$1")"
  [[ -f "$dir/.lifeboat-build-stamp" && "$(cat "$dir/.lifeboat-build-stamp")" == "$(want_stamp "$1")" &&
    -x "$dir/$1" ]]
}

case "${1:-}" in
  --print-dir)
    [[ $# -eq 2 ]] || { echo "usage: $0 --print-dir helm|promtool" >&2; exit 2; }
    tool_dir "$2"
    exit 0
    ;;
esac
if [[ $# -gt 0 ]]; then
  for tool in "$@"; do
    tool_dir "$tool" >/dev/null || { echo "usage: $0 [helm] [promtool] | --print-dir TOOL" >&2; exit 2; }
  done
  TOOLS=("$@")
fi

step() { printf '[tools-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() {
  # $1 = step, $2 = fix
  printf 'tools-build: FAILED at step "%s"\n  fix: %s\n' "$1" "$2" >&2
  exit 1
}

to_build=()
for tool in "${TOOLS[@]}"; do
  if is_built "$tool"; then
    echo "$tool ($(want_stamp "$tool")) already built in $(tool_dir "$tool"), nothing to do"
  else
    to_build+=("$tool")
  fi
done
[[ ${#to_build[@]} -gt 0 ]] || exit 0

command -v go >/dev/null 2>&1 ||
  fail "check Go" "install Go >= 1.26.7 (https://go.dev/dl) and put it on PATH"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
step "using $(go env GOVERSION), cache dir $tools_dir"

# shellcheck source=../go-caches.sh
source "$here/../go-caches.sh"
private_go_caches tools

# Writes the stamp only after the binary is in place, so an interrupted build is redone.
begin() {
  mkdir -p "$(tool_dir "$1")" ||
    fail "create $(tool_dir "$1")" "set LIFEBOAT_TOOLS_BIN_DIR to a writable directory"
  rm -f "$(tool_dir "$1")/.lifeboat-build-stamp"
}
finish() {
  want_stamp "$1" >"$(tool_dir "$1")/.lifeboat-build-stamp"
}

build_helm() {
  local bin_dir mod_dir
  bin_dir="$(tool_dir helm)"
  # The wrapper module's go.mod pins helm; a version bump re-derives it.
  mod_dir="$here/helm"
  if ! grep -q "helm.sh/helm/v3 $HELM_VERSION\$" "$mod_dir/go.mod" 2>/dev/null; then
    step "helm: deriving go.mod for helm.sh/helm/v3@$HELM_VERSION"
    rm -f "$mod_dir/go.mod" "$mod_dir/go.sum"
    (cd "$mod_dir" && go mod init lifeboat.dev/e2e/tools/helm >/dev/null 2>&1 && go mod edit -go=1.26.0 &&
      go mod edit -require="helm.sh/helm/v3@$HELM_VERSION" && go mod tidy) ||
      fail "helm: resolve helm.sh/helm/v3@$HELM_VERSION" "check the Go module proxy ($(go env GOPROXY))"
  fi
  begin helm
  step "helm: go build helm.sh/helm/v3/cmd/helm"
  (cd "$mod_dir" && go mod download helm.sh/helm/v3) ||
    fail "helm: module download" "check the Go module proxy ($(go env GOPROXY))"
  (cd "$mod_dir" && go build -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    -o "$bin_dir/helm" helm.sh/helm/v3/cmd/helm) ||
    fail "helm: go build" "see the compiler output above"
  finish helm
  echo "tools built in $bin_dir: helm $("$bin_dir/helm" version --short 2>/dev/null)"
}

build_promtool() {
  local bin_dir mod_dir pkg release minor patch
  bin_dir="$(tool_dir promtool)"
  mod_dir="$here/promtool"
  pkg=github.com/prometheus/prometheus/cmd/promtool
  # v0.316.0 -> 3.16.0, the version Prometheus publishes it as.
  IFS=. read -r minor patch <<<"${PROMTOOL_VERSION#v0.}"
  release="$((10#$minor / 100)).$((10#$minor % 100)).$patch"
  # `go get` (not `go mod tidy`, which adds every test dependency of Prometheus, 1.9 GB) pins
  # the modules cmd/promtool imports; a version bump re-derives go.mod and go.sum.
  if ! grep -q "github.com/prometheus/prometheus $PROMTOOL_VERSION\b" "$mod_dir/go.mod" 2>/dev/null; then
    step "promtool: deriving go.mod for github.com/prometheus/prometheus@$PROMTOOL_VERSION"
    rm -f "$mod_dir/go.mod" "$mod_dir/go.sum"
    (cd "$mod_dir" && go mod init lifeboat.dev/e2e/tools/promtool >/dev/null 2>&1 &&
      go mod edit -go=1.26.0 && go get "$pkg@$PROMTOOL_VERSION") ||
      fail "promtool: resolve $pkg@$PROMTOOL_VERSION" "check the Go module proxy ($(go env GOPROXY))"
  fi
  begin promtool
  # -mod=readonly: the committed go.mod and go.sum must cover the build (reproducible); listing
  # the dependencies downloads only the modules the tagged build compiles.
  step "promtool: module download (-tags $PROMTOOL_TAGS)"
  (cd "$mod_dir" && go list -mod=readonly -deps -tags "$PROMTOOL_TAGS" "$pkg" >/dev/null) ||
    fail "promtool: module download" \
      "check the Go module proxy ($(go env GOPROXY)); a missing go.sum entry means e2e/tools/promtool/go.mod is stale: delete it and rerun"
  step "promtool: go build $pkg"
  (cd "$mod_dir" && go build -mod=readonly -trimpath -tags "$PROMTOOL_TAGS" \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$release" \
    -o "$bin_dir/promtool" "$pkg") ||
    fail "promtool: go build" "see the compiler output above"
  finish promtool
  echo "tools built in $bin_dir: $("$bin_dir/promtool" --version 2>&1 | head -1)"
}

for tool in "${to_build[@]}"; do
  "build_$tool"
done
