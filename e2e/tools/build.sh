#!/usr/bin/env bash
# Builds helm (./cmd/helm of helm.sh/helm/v3 at HELM_VERSION) from its Go module into the cache
# that holds the Kubernetes test-bed binaries (e2e/k8s/build.sh). Idempotent: with the binary and
# its stamp present it does nothing and says so in one line.
#
#   e2e/tools/build.sh              build (or confirm) the tools
#   e2e/tools/build.sh --print-dir  only print where the tools live
#
# Environment: LIFEBOAT_TOOLS_BIN_DIR overrides the cache directory; CI=true or
# LIFEBOAT_K8S_DROP_GO_CACHES=1 use private Go caches removed afterwards.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

bin_dir="${LIFEBOAT_TOOLS_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lifeboat/tools/helm-$HELM_VERSION}"
stamp="$bin_dir/.lifeboat-build-stamp"
want_stamp="helm=$HELM_VERSION"

case "${1:-build}" in
  --print-dir) echo "$bin_dir"; exit 0 ;;
  build) ;;
  *) echo "usage: $0 [--print-dir]" >&2; exit 2 ;;
esac

step() { printf '[tools-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() {
  # $1 = step, $2 = fix
  printf 'tools-build: FAILED at step "%s"\n  fix: %s\n' "$1" "$2" >&2
  exit 1
}

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" && -x "$bin_dir/helm" ]]; then
  echo "tools ($want_stamp) already built in $bin_dir, nothing to do"
  exit 0
fi

command -v go >/dev/null 2>&1 ||
  fail "check Go" "install Go >= 1.26 (https://go.dev/dl) and put it on PATH"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
step "using $(go env GOVERSION), cache dir $bin_dir"

# shellcheck source=../go-caches.sh
source "$here/../go-caches.sh"
private_go_caches tools

# The wrapper module's go.mod pins helm; a version bump re-derives it.
mod_dir="$here/helm"
if ! grep -q "helm.sh/helm/v3 $HELM_VERSION\$" "$mod_dir/go.mod" 2>/dev/null; then
  step "helm: deriving go.mod for helm.sh/helm/v3@$HELM_VERSION"
  rm -f "$mod_dir/go.mod" "$mod_dir/go.sum"
  (cd "$mod_dir" && go mod init lifeboat.dev/e2e/tools/helm >/dev/null 2>&1 && go mod edit -go=1.26.0 &&
    go mod edit -require="helm.sh/helm/v3@$HELM_VERSION" && go mod tidy) ||
    fail "helm: resolve helm.sh/helm/v3@$HELM_VERSION" "check the Go module proxy ($(go env GOPROXY))"
fi

mkdir -p "$bin_dir" || fail "create $bin_dir" "set LIFEBOAT_TOOLS_BIN_DIR to a writable directory"
rm -f "$stamp"
step "helm: go build helm.sh/helm/v3/cmd/helm"
(cd "$mod_dir" && go mod download helm.sh/helm/v3) ||
  fail "helm: module download" "check the Go module proxy ($(go env GOPROXY))"
(cd "$mod_dir" && go build -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
  -o "$bin_dir/helm" helm.sh/helm/v3/cmd/helm) ||
  fail "helm: go build" "see the compiler output above"
echo "$want_stamp" >"$stamp"
echo "tools built in $bin_dir: helm $("$bin_dir/helm" version --short 2>/dev/null)"
