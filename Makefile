# Lifeboat: `make demo` sets everything up and runs the demo; `make test` runs every test.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CARGO ?= cargo
# Every cargo command of `make test` selects the whole workspace: with -p, Cargo unifies the
# dependencies' features over that package alone and builds them again with other features
# (kube, hyper, sqlx: 2 min 13 s of a cold CI run for the ledger suite alone). The binaries are
# built once (workspace-bins) and run from here.
DEBUG_BIN_DIR := $(abspath $(or $(CARGO_TARGET_DIR),target))/debug
# CI builds once from a clean clone: incremental state would only take disk (gigabytes across
# the test binaries).
ifeq ($(CI),true)
export CARGO_INCREMENTAL := 0
endif
# Shared test data beside the project root (../shared); override with LIFEBOAT_SHARED_DIR.
LIFEBOAT_SHARED_DIR ?= $(firstword $(wildcard $(abspath ../shared) /work/shared) $(abspath ../shared))
export LIFEBOAT_SHARED_DIR

.PHONY: help
help:
	@echo "make demo    build what is needed, start a local fleet (hub + 3 members) with the Lifeboat hub and an"
	@echo "             agent per member, place a GPU AppWrapper from the hub, run it through a failure and its"
	@echo "             reset, keep running until Ctrl-C"
	@echo "make test    format and lint checks, unit tests, conformance, e2e tests on the local fleet"
	@echo "make ledger  the event ledger's tests (crate lifeboat-ledger) on SQLite and a throwaway PostgreSQL (part of make test)"
	@echo "make k8s-bins  build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok (cached)"
	@echo "make tools   build helm and promtool and fetch the Prometheus Operator and cert-manager CRDs (pinned,"
	@echo "             cached beside the k8s binaries) for the chart tests"
	@echo "make image-check  build the release hub and agent (as the Containerfile does) and check their link mode"
	@echo "             against the runtime image: --help in an empty environment, only distroless/cc's libraries"
	@echo "             (not part of make test: see the Makefile)"
	@echo "make bench   benchmarks (see BENCHMARKS.md)"
	@echo "make structure  check the hub's module structure (layers, no import circle, no file over 600 lines"
	@echo "             of code) and print its drawing"

.PHONY: k8s-bins
k8s-bins:
	@bash e2e/k8s/build.sh

# Helm and promtool from their Go modules, and the upstream CRDs of the charts' optional kinds
# (ServiceMonitor, PrometheusRule, Certificate, Issuer) from theirs (e2e/tools/versions.env), for
# the chart suite e2e/tests/charts.rs.
.PHONY: tools
tools:
	@bash e2e/tools/build.sh

.PHONY: demo
demo: k8s-bins
	bash scripts/demo.sh

.PHONY: test
test: check unit ledger e2e

.PHONY: check
check: fmt-check lint crds-check

# The committed CRDs must match the Rust types they are generated from.
.PHONY: crds-check
crds-check: workspace-bins
	$(DEBUG_BIN_DIR)/crdgen --check

.PHONY: crds
crds:
	$(CARGO) run -q -p lifeboat-api --bin crdgen

.PHONY: fmt-check
fmt-check:
	$(CARGO) fmt --all -- --check

# The hub's module structure (control-plane/tests/structure.rs; also part of e2e's --test '*'),
# with its drawing printed.
.PHONY: structure
structure:
	$(CARGO) test -q -p lifeboat-hub --test structure -- --nocapture

.PHONY: lint
lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Unit tests of every crate (pure logic, no cluster), then the Lua interpreter conformance:
# Karmada's third-party interpreters with their own test cases, and Lifeboat's built-ins.
.PHONY: unit
unit: workspace-bins
	$(CARGO) test --workspace --lib --bins
	$(DEBUG_BIN_DIR)/lifeboatctl interpret test $(LIFEBOAT_SHARED_DIR)/testdata/karmada-interpreter
	$(DEBUG_BIN_DIR)/lifeboatctl interpret test --strict interpreter-scripts

# The event ledger (crate lifeboat-ledger) on both databases: SQLite (temporary files) and PostgreSQL.
# scripts/postgres.sh uses LIFEBOAT_TEST_DATABASE_URL when set; otherwise it starts a throwaway
# server (installing Debian's postgresql package when absent) and stops and removes it afterwards.
.PHONY: ledger
ledger:
	bash scripts/postgres.sh $(CARGO) test --workspace --test ledger

# End-to-end tests: each test binary starts its own fleet of real control planes. The suites
# that run Lifeboat as processes (e2e/tests/lifeboat.rs, fleet_cli.rs, charts.rs; reset.rs and
# dead_agents.rs run lifeboatctl) start the binaries built here (cargo test builds only the test
# binaries); e2e/tests/link_mode.rs checks their link mode against the runtime image, and that
# the release profile links the same way (see image-check). The ledger's suite runs in `make ledger`, where PostgreSQL is up.
.PHONY: e2e
e2e: k8s-bins tools workspace-bins
	$(CARGO) test --workspace --exclude lifeboat-ledger --test '*'

# The dev binaries of every crate (hub, agent, lifeboatctl, crdgen, the fleet's), with the
# workspace's features.
.PHONY: workspace-bins lifeboat-bins
workspace-bins lifeboat-bins:
	$(CARGO) build --workspace --bins

# The link-mode check on the release binaries the Containerfile ships: built as the Containerfile
# builds them, then started with --help in an empty environment. Not part of `make test`: its
# cold release build took 9 min of a CI run (BENCHMARKS.md, CI budget); `make test` checks the
# dev binaries the same way and that the release profile cannot link differently.
.PHONY: image-check
image-check:
	$(CARGO) build --release --locked -p lifeboat-hub -p lifeboat-agent --bins
	LIFEBOAT_BIN_DIR=$(abspath $(or $(CARGO_TARGET_DIR),target))/release $(CARGO) test -p lifeboat-e2e --test link_mode

.PHONY: bench
bench: k8s-bins
	$(CARGO) run --release -q -p lifeboat-e2e --bin fleet-bench -- --runs 3
	$(CARGO) bench -p lifeboat-interpreter
	$(CARGO) bench -p lifeboat-agent --bench agent -- --appwrappers 1000 --pods 4 --failures 100 --window 330
	$(CARGO) bench -p lifeboat-agent --bench agent -- --appwrappers 100 --pods 1 --failures 0 --burst 100 --window 0
	$(CARGO) bench -p lifeboat-agent --bench agent -- --appwrappers 1000 --pods 1 --failures 20 --burst 200 --window 0
	$(CARGO) bench -p lifeboat-scheduler --bench schedule
# Status ingestion through the agent API (HTTPS) into the status processor and a SQLite ledger:
# every item a health transition (--flip), then the steady case.
	$(CARGO) bench -p lifeboat-hub --bench agent_api -- --runs 3 --processor --flip
	$(CARGO) bench -p lifeboat-hub --bench agent_api -- --runs 3 --processor
# The ledger on SQLite and on a throwaway PostgreSQL that scripts/postgres.sh starts (or the
# server in LIFEBOAT_TEST_DATABASE_URL); without the script only SQLite is measured.
	bash scripts/postgres.sh $(CARGO) bench -p lifeboat-ledger --bench ledger
# The hub end to end on a fleet: 1,000 AppWrappers to bindings Scheduled=True with 100 simulated
# agents, then the hub's memory at 10,000 bindings on 10 clusters.
	$(CARGO) bench -p lifeboat-hub --bench hub_e2e -- --runs 3
	$(CARGO) bench -p lifeboat-hub --bench hub_e2e -- --memory
# Failover (issue 9), dev profile (BENCHMARKS.md says why): the hub's decision latency with
# 1,000 bindings over 10 simulated clusters (spaced and burst), 1,000 bindings moved off a lost
# cluster, and end to end on the fleet with the real hub and agents.
	$(CARGO) bench --profile dev -p lifeboat-hub --bench failover -- --decision
	$(CARGO) bench --profile dev -p lifeboat-hub --bench failover -- --cluster-loss
# Issue 20, the hub's share as recorded: first the floor of a burst (100, then 1,000 binding
# writes at once), then decisions spaced, in bursts of 100 and one of 1,000;
# a killed agent in the fast profile (lease 3 s, heartbeat 1 s, cluster toleration 0).
	$(CARGO) bench --profile dev -p lifeboat-hub --bench failover -- --decision --templates 1300 --spaced 100 --bursts 2 --burst 100 --big-burst 1000
	$(CARGO) bench --profile dev -p lifeboat-hub --bench failover -- --cluster-loss --lease 3 --heartbeat 1 --toleration 0 --templates 100
# Issue 20: the burst of 100 resets (each AppWrapper's Job deleted) as recorded, dev profile.
	$(CARGO) bench --profile dev -p lifeboat-agent --bench agent -- --appwrappers 100 --pods 1 --failures 0 --burst 100 --window 0
# Issue 20: each row of its table (the five failover paths, `--mode all`), with the latency
# budget per stage and the floor of Kubernetes' share (bare Jobs created to pods Running).
	$(CARGO) bench --profile dev -p lifeboat-agent --bench failover_e2e -- --runs 6 --mode all --floor 10
# Issue 20, release profile: the toleration-0 and Directly rows as recorded.
	$(CARGO) bench -p lifeboat-agent --bench failover_e2e -- --runs 6 --mode failed --floor 10
	$(CARGO) bench -p lifeboat-agent --bench failover_e2e -- --runs 6 --mode directly --floor 1
