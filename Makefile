# pg_sturdy: one entry point. `make demo` and `make test` bootstrap a fresh
# machine themselves (Debian packages, cargo-pgrx 0.18.1, pgrx init).

PG_CONFIG   ?= /usr/bin/pg_config
PGRX_PGDATA ?= /tmp/pg_sturdy_pgrx

.PHONY: demo test bench bootstrap install install-debug unit suites fmt clean

bootstrap:
	scripts/bootstrap.sh

# Build (release) and install into Debian's PostgreSQL 15.
install: bootstrap
	cargo pgrx install --release --pg-config $(PG_CONFIG)

# The suites use the debug build that `cargo pgrx test` just compiled.
install-debug: bootstrap
	cargo pgrx install --pg-config $(PG_CONFIG)

# The main job: a readable scenario on a scratch cluster of its own.
demo: install
	scripts/demo.sh

# Every suite: #[pg_test]s in a pgrx-managed cluster, then the regress and
# isolation suites against a scratch cluster.
test: bootstrap unit install-debug suites

unit:
	mkdir -p $(PGRX_PGDATA)
	if [ "$$(id -u)" = 0 ]; then chown postgres: $(PGRX_PGDATA); fi
	cargo pgrx test pg15 --runas postgres --pgdata $(PGRX_PGDATA)

suites:
	scripts/suites.sh

bench: install
	scripts/bench.py

fmt:
	cargo fmt --all

clean:
	cargo clean
