# Sourced by e2e/k8s/build.sh and e2e/tools/build.sh (which define `step`).
# On CI (CI=true) or with LIFEBOAT_K8S_DROP_GO_CACHES=1 the Go build and module caches are private
# to this run and removed afterwards: they hold gigabytes once the binaries are built and serve
# nothing after that (the binaries themselves are cached), and a CI machine's disk is shared with
# the Cargo target directory.
#   private_go_caches NAME   NAME goes into the scratch directory's name
private_go_caches() {
  [[ "${CI:-}" == true || "${LIFEBOAT_K8S_DROP_GO_CACHES:-}" == 1 ]] || return 0
  go_scratch="$(mktemp -d "${TMPDIR:-/tmp}/lifeboat-$1-go.XXXXXX")"
  export GOCACHE="$go_scratch/build" GOMODCACHE="$go_scratch/mod"
  drop_go_caches() {
    # Module cache files are read-only: let go remove them, then the rest.
    go clean -modcache >/dev/null 2>&1 || chmod -R u+w "$go_scratch" 2>/dev/null
    rm -rf "$go_scratch"
  }
  trap drop_go_caches EXIT
  step "private Go caches in $go_scratch (removed when done)"
}
