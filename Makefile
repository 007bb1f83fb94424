# Lifeboat: `make demo` sets everything up and runs the demo; `make test` runs every test.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CARGO ?= cargo
# Shared test data beside the project root (../shared); override with LIFEBOAT_SHARED_DIR.
LIFEBOAT_SHARED_DIR ?= $(firstword $(wildcard $(abspath ../shared) /work/shared) $(abspath ../shared))
export LIFEBOAT_SHARED_DIR

.PHONY: help
help:
	@echo "make demo    build what is needed, start a local fleet (hub + 3 members), run until Ctrl-C"
	@echo "make test    format and lint checks, unit tests, conformance, e2e tests on the local fleet"
	@echo "make k8s-bins  build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok (cached)"
	@echo "make bench   benchmarks (see BENCHMARKS.md)"

.PHONY: k8s-bins
k8s-bins:
	@bash e2e/k8s/build.sh

.PHONY: demo
demo: k8s-bins
	$(CARGO) build -p lifeboat-e2e --bin fleet
	$(CARGO) run -q -p lifeboat-e2e --bin fleet -- run

.PHONY: test
test: check unit e2e

.PHONY: check
check: fmt-check lint

.PHONY: fmt-check
fmt-check:
	$(CARGO) fmt --all -- --check

.PHONY: lint
lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Unit tests of every crate (pure logic, no cluster).
.PHONY: unit
unit:
	$(CARGO) test --workspace --lib --bins

# End-to-end tests: each test binary starts its own fleet of real control planes.
.PHONY: e2e
e2e: k8s-bins
	$(CARGO) test --workspace --test '*'

.PHONY: bench
bench: k8s-bins
	$(CARGO) run --release -q -p lifeboat-e2e --bin fleet-bench -- --runs 3
