#!/usr/bin/env bash
# Builds the chart tests' tools from their Go modules into the cache that holds the Kubernetes
# test-bed binaries (e2e/k8s/build.sh), each in its own versioned directory:
#   helm        ./cmd/helm of helm.sh/helm/v3 at HELM_VERSION                -> helm-<v>/helm
#   promtool    ./cmd/promtool of github.com/prometheus/prometheus at
#               PROMTOOL_VERSION, with PROMTOOL_TAGS                         -> promtool-<v>/promtool
#   chart-crds  the upstream CRDs of the kinds the charts render optionally (ServiceMonitor,
#               PrometheusRule; Certificate, Issuer), copied from the modules
#               github.com/prometheus-operator/prometheus-operator at
#               PROMETHEUS_OPERATOR_VERSION and github.com/cert-manager/cert-manager at
#               CERT_MANAGER_VERSION (downloaded, not built)   -> chart-crds-<v>-<v>/*.yaml
# Idempotent: a tool whose files and stamp are present is not rebuilt (one line says so).
#
#   e2e/tools/build.sh                  build (or confirm) every tool
#   e2e/tools/build.sh TOOL...          only these (helm, promtool, chart-crds)
#   e2e/tools/build.sh --print-dir TOOL only print the directory that holds TOOL
#
# Environment: LIFEBOAT_TOOLS_BIN_DIR overrides the cache directory (the tools' directories go
# inside it); CI=true or LIFEBOAT_K8S_DROP_GO_CACHES=1 use private Go caches removed afterwards.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

tools_dir="${LIFEBOAT_TOOLS_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lifeboat/tools}"
TOOLS=(helm promtool chart-crds)

# The CRDs chart-crds copies: "module version path-in-module CRD-name" (the file keeps its name).
CHART_CRDS=(
  "github.com/prometheus-operator/prometheus-operator $PROMETHEUS_OPERATOR_VERSION example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml servicemonitors.monitoring.coreos.com"
  "github.com/prometheus-operator/prometheus-operator $PROMETHEUS_OPERATOR_VERSION example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml prometheusrules.monitoring.coreos.com"
  "github.com/cert-manager/cert-manager $CERT_MANAGER_VERSION deploy/crds/cert-manager.io_certificates.yaml certificates.cert-manager.io"
  "github.com/cert-manager/cert-manager $CERT_MANAGER_VERSION deploy/crds/cert-manager.io_issuers.yaml issuers.cert-manager.io"
)

tool_dir() {
  case "$1" in
    helm) echo "$tools_dir/helm-$HELM_VERSION" ;;
    promtool) echo "$tools_dir/promtool-$PROMTOOL_VERSION" ;;
    chart-crds) echo "$tools_dir/chart-crds-$PROMETHEUS_OPERATOR_VERSION-$CERT_MANAGER_VERSION" ;;
    *) echo "unknown tool \"$1\" (helm|promtool|chart-crds)" >&2; return 2 ;;
  esac
}
want_stamp() {
  case "$1" in
    helm) echo "helm=$HELM_VERSION" ;;
    promtool) echo "promtool=$PROMTOOL_VERSION tags=$PROMTOOL_TAGS" ;;
    chart-crds)
      local crd path files=()
      for crd in "${CHART_CRDS[@]}"; do
        read -r _ _ path _ <<<"$crd"
        files+=("$(basename "$path")")
      done
      echo "prometheus-operator=$PROMETHEUS_OPERATOR_VERSION cert-manager=$CERT_MANAGER_VERSION files=${files[*]}"
      ;;
  esac
}
is_built() {
  local dir crd path
  dir="$(tool_dir "$1")"
  [[ -f "$dir/.lifeboat-build-stamp" && "$(cat "$dir/.lifeboat-build-stamp")" == "$(want_stamp "$1")" ]] ||
    return 1
  case "$1" in
    chart-crds)
      for crd in "${CHART_CRDS[@]}"; do
        read -r _ _ path _ <<<"$crd"
        [[ -s "$dir/$(basename "$path")" ]] || return 1
      done
      ;;
    *) [[ -x "$dir/$1" ]] ;;
  esac
}

case "${1:-}" in
  --print-dir)
    [[ $# -eq 2 ]] || { echo "usage: $0 --print-dir helm|promtool|chart-crds" >&2; exit 2; }
    tool_dir "$2"
    exit 0
    ;;
esac
if [[ $# -gt 0 ]]; then
  for tool in "$@"; do
    tool_dir "$tool" >/dev/null || { echo "usage: $0 [helm] [promtool] [chart-crds] | --print-dir TOOL" >&2; exit 2; }
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

# Writes the stamp only after the binary (or every file) is in place, so an interrupted build is redone.
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

# Only the modules' zips are downloaded (no go.mod, nothing built), from an empty directory so
# that no surrounding go.mod or go.work applies.
build_chart_crds() {
  local out_dir scratch crd module version path name json mod_root file
  out_dir="$(tool_dir chart-crds)"
  scratch="$(mktemp -d "${TMPDIR:-/tmp}/lifeboat-chart-crds.XXXXXX")"
  begin chart-crds
  for crd in "${CHART_CRDS[@]}"; do
    read -r module version path name <<<"$crd"
    step "chart-crds: $name from $module@$version/$path"
    json="$(cd "$scratch" && GOWORK=off go mod download -json "$module@$version")" || {
      echo "$json" >&2
      rm -rf "$scratch"
      fail "chart-crds: download $module@$version" \
        "check the Go module proxy ($(go env GOPROXY)) serves it: go list -m -json $module@$version"
    }
    mod_root="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")"
    file="$mod_root/$path"
    # A version whose file moved, or holds another object, must not pass as this CRD.
    if [[ ! -f "$file" ]] || ! grep -q '^kind: CustomResourceDefinition$' "$file" ||
      ! grep -q "^  name: $name\$" "$file"; then
      rm -rf "$scratch"
      fail "chart-crds: $path in $module@$version" \
        "the file is missing or is not the CRD $name: find where this version keeps it and update CHART_CRDS in $0"
    fi
    cp "$file" "$out_dir/" && chmod u+w "$out_dir/$(basename "$path")" ||
      fail "chart-crds: copy into $out_dir" "set LIFEBOAT_TOOLS_BIN_DIR to a writable directory"
  done
  rm -rf "$scratch"
  finish chart-crds
  echo "chart CRDs copied into $out_dir: $(cd "$out_dir" && echo *.yaml)"
}

for tool in "${to_build[@]}"; do
  "build_${tool//-/_}"
done
