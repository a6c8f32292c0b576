# The fixture that builds the store, put in place of nl2data-workflow-postgres
# 0.1.0's own in its integration tests (test_nl2data.py does the swap; the
# rest of that file runs as published). The same unique namespace, pool and
# skip rule as the original; the store is pg_sturdy's, and the module's name
# PostgreSQLStateStore is pg_sturdy's for the module's tests, so the test
# that opens a second store on the pool opens one of ours.
@pytest.fixture(scope="module")
def shared_backend(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    """pg_sturdy's store over a unique namespace; skipped when unavailable."""
    from pg_sturdy.nl2data import SturdyStateStore

    if not driver_available():
        pytest.skip("the psycopg driver is not installed; the real postgres profile is skipped")
    namespace = f"workflow_{uuid4().hex[:10]}"
    pool = build_pool(
        DSN,
        pool_size=2,
        connect_timeout_seconds=2.0,
        command_timeout_seconds=10.0,
        acquire_timeout_seconds=2.0,
        schema=namespace,
    )
    try:
        with pool.connection() as conn:
            conn.execute("SELECT 1")
            conn.commit()
    except Exception:
        with contextlib.suppress(Exception):
            pool.close()
        pytest.skip("postgres service is unavailable; the real postgres profile is skipped")
    original = request.module.PostgreSQLStateStore
    request.module.PostgreSQLStateStore = SturdyStateStore
    store = SturdyStateStore(
        pool=pool,
        config=WorkflowPostgresConfig(namespace=namespace, clock_tolerance_seconds=0.5),
    )
    try:
        yield store, pool
    finally:
        request.module.PostgreSQLStateStore = original
        with contextlib.suppress(Exception):
            pool.close()
