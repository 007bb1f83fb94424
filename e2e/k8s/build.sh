#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok from their
# published Go modules into a cache outside the repository. Idempotent: a second run with the
# binaries present does nothing and says so in one line.
#
#   e2e/k8s/build.sh            build (or confirm) the binaries
#   e2e/k8s/build.sh --print-dir  only print where the binaries live
#   e2e/k8s/build.sh --regenerate  re-derive the wrapper modules' go.mod (after a version bump)
#
# Environment: LIFEBOAT_K8S_BIN_DIR overrides the cache directory.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

bin_dir="${LIFEBOAT_K8S_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lifeboat/k8s/$K8S_VERSION}"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
stamp="$bin_dir/.lifeboat-build-stamp"
want_stamp="k8s=$K8S_VERSION etcd=$ETCD_VERSION kwok=$KWOK_VERSION"

mode="${1:-build}"
case "$mode" in
  --print-dir) echo "$bin_dir"; exit 0 ;;
  build|--regenerate) ;;
  *) echo "usage: $0 [--print-dir|--regenerate]" >&2; exit 2 ;;
esac

step() { printf '[k8s-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() {
  # $1 = step, $2 = fix
  printf 'k8s-build: FAILED at step "%s"\n  fix: %s\n' "$1" "$2" >&2
  exit 1
}

all_present() {
  [[ -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]] || return 1
  for b in "${binaries[@]}"; do [[ -x "$bin_dir/$b" ]] || return 1; done
}

if [[ "$mode" == build ]] && all_present; then
  echo "k8s binaries ($want_stamp) already built in $bin_dir, nothing to do"
  exit 0
fi

command -v go >/dev/null 2>&1 ||
  fail "check Go" "install Go >= 1.26 (https://go.dev/dl) and put it on PATH"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
go_have="$(go env GOVERSION)"
step "using $go_have, cache dir $bin_dir"

# shellcheck source=../go-caches.sh
source "$here/../go-caches.sh"
private_go_caches k8s

# Each wrapper module pins one upstream module. Their go.mod files are committed; --regenerate
# (or a version mismatch) derives them again from the upstream tags.
module_version() {
  # $1 dir, $2 module: the version the wrapper's go.mod requires (either require form)
  awk -v m="$2" '($1 == m) { print $2; exit } ($1 == "require" && $2 == m) { print $3; exit }' "$here/$1/go.mod"
}

regen_kubernetes() {
  local dir="$here/kubernetes" minor="${K8S_VERSION#v1.}"
  local staging="v0.${minor}"
  step "kubernetes: deriving go.mod for k8s.io/kubernetes@$K8S_VERSION (staging modules at $staging)"
  rm -f "$dir/go.mod" "$dir/go.sum"
  (cd "$dir" && go mod init lifeboat.dev/e2e/k8s/kubernetes >/dev/null 2>&1 && go mod edit -go=1.26.0) ||
    fail "kubernetes: go mod init" "check that $dir is writable"
  local upstream_mod
  upstream_mod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" 2>&1)" ||
    fail "kubernetes: download k8s.io/kubernetes@$K8S_VERSION" "check GOPROXY reachability and that $K8S_VERSION exists: curl \$(go env GOPROXY | cut -d, -f1)/k8s.io/kubernetes/@v/list"
  local gomod
  gomod="$(printf '%s' "$upstream_mod" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')"
  [[ -f "$gomod" ]] || fail "kubernetes: read upstream go.mod" "go mod download did not report a GoMod path"
  # Every staging module replaced with ./staging/src/... upstream is published at v0.X.Y.
  local mods
  mods="$(sed -n 's#^\s*\(k8s\.io/[^ ]*\) => \./staging/src/.*#\1#p' "$gomod" | sort -u)"
  [[ -n "$mods" ]] || fail "kubernetes: find staging modules" "upstream go.mod of $K8S_VERSION has no ./staging replaces; the recipe needs updating"
  local args=()
  for m in $mods; do args+=("-replace=$m=$m@$staging"); done
  (cd "$dir" && go mod edit "${args[@]}" && go mod edit -require="k8s.io/kubernetes@$K8S_VERSION") ||
    fail "kubernetes: go mod edit" "see the error above"
  step "kubernetes: go mod tidy (first run downloads ~1-2 GB of modules)"
  (cd "$dir" && go mod tidy) ||
    fail "kubernetes: go mod tidy" "module download failed; check the Go module proxy ($(go env GOPROXY)) and disk space"
}

regen_simple() {
  # $1 = dir, $2 = module, $3 = version
  local dir="$here/$1"
  step "$1: deriving go.mod for $2@$3"
  rm -f "$dir/go.mod" "$dir/go.sum"
  (cd "$dir" && go mod init "lifeboat.dev/e2e/k8s/$1" >/dev/null 2>&1 && go mod edit -go=1.26.0 &&
    go mod edit -require="$2@$3" && go mod tidy) ||
    fail "$1: resolve $2@$3" "check that $2@$3 exists on the module proxy and that its go directive <= $go_have"
}

need_regen() {
  # $1 dir, $2 module, $3 version
  [[ "$mode" == --regenerate ]] && return 0
  [[ -f "$here/$1/go.mod" && -f "$here/$1/go.sum" ]] || return 0
  [[ "$(module_version "$1" "$2")" == "$3" ]] || return 0
  return 1
}

if need_regen kubernetes k8s.io/kubernetes "$K8S_VERSION"; then regen_kubernetes; fi
if need_regen etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION"; then regen_simple etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION"; fi
if need_regen kwok sigs.k8s.io/kwok "$KWOK_VERSION"; then regen_simple kwok sigs.k8s.io/kwok "$KWOK_VERSION"; fi

mkdir -p "$bin_dir" || fail "create $bin_dir" "set LIFEBOAT_K8S_BIN_DIR to a writable directory"
rm -f "$stamp"
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"

build() {
  # $1 dir, $2 ldflags, $3 output (a file, or the bin dir with a trailing /), rest = packages
  local dir="$1" ldflags="$2" out="$3"; shift 3
  step "$dir: go build $* (long on a cold cache)"
  (cd "$here/$dir" && go mod download) ||
    fail "$dir: module download" "check the Go module proxy ($(go env GOPROXY)); GOMODCACHE=$(go env GOMODCACHE)"
  (cd "$here/$dir" && go build -trimpath -ldflags "$ldflags" -o "$out" "$@") ||
    fail "$dir: go build" "see the compiler output above; Go $go_have must satisfy the module's go directive"
}

# etcd's main package is server/v3, which go build would name "server".
build etcd "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=${ETCD_VERSION}" "$bin_dir/etcd" go.etcd.io/etcd/server/v3
build kwok "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" "$bin_dir/kwok" sigs.k8s.io/kwok/cmd/kwok
build kubernetes "$k8s_ldflags" "$bin_dir/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler

for b in "${binaries[@]}"; do
  [[ -x "$bin_dir/$b" ]] || fail "check $b" "the build produced no $bin_dir/$b"
done
echo "$want_stamp" >"$stamp"
echo "k8s binaries built in $bin_dir: $("$bin_dir/kube-apiserver" --version 2>/dev/null), etcd $("$bin_dir/etcd" --version 2>/dev/null | head -n1 | awk '{print $3}'), kwok $KWOK_VERSION"
