"""sturdy-ui, the operator dashboard, against a database this file fills:
its pages, its actions and its refusals over HTTP; its queries bounded on a
database of a million queue rows; and in a real browser (headless Chromium
through WebDriver), each page kept as a screenshot under target/ui/.

The binary comes from STURDY_UI (default target/ui/release/sturdy-ui,
which `make test` builds), Chromium and its driver from the bootstrap.
"""
import base64
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.parse

import psycopg
import pytest

from sturdy import SERVER

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("STURDY_UI", os.path.join(ROOT, "target", "ui", "release", "sturdy-ui"))
SHOTS = os.path.join(ROOT, "target", "ui", "screenshots")
DB = "sturdy_ui"
TOKEN = "a-token-of-sixteen-or-more"
HOSTILE = "<script>alert(1)</script>\"'\x07"

pytestmark = pytest.mark.skipif(not os.path.exists(BIN), reason=f"no sturdy-ui binary at {BIN} (make test builds it)")


def dsn(db=DB, user=None):
    return f"{SERVER} dbname={db}" + (f" user={user}" if user else "")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ui:
    """A sturdy-ui process on a port of its own: connecting to the test's
    database (as `user`, with `settings` added to the DSN), or to `to` (a
    whole DSN)."""

    def __init__(self, *args, user=None, settings="", to=None):
        self.port = free_port()
        self.proc = subprocess.Popen([BIN, "--dsn", to or f"{dsn(user=user)} {settings}",
                                      "--listen", f"127.0.0.1:{self.port}", "--sample-every", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.proc.kill()
        raise AssertionError(f"sturdy-ui did not listen: {self.proc.stderr.read()}")

    def request(self, method, path, body=None, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        h = dict(headers or {})
        if body is not None:
            body = urllib.parse.urlencode(body)
            h["Content-Type"] = "application/x-www-form-urlencoded"
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        out = (r.status, r.read().decode(), dict(r.getheaders()))
        c.close()
        return out

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def raw(self, request):
        """The status of the answer to `request`, sent as it is."""
        with socket.create_connection(("127.0.0.1", self.port), 30) as s:
            s.sendall(request.encode())
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        return int(answer.split(b" ", 2)[1]), answer.decode(errors="replace")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


def admin(db="postgres"):
    return psycopg.connect(dsn(db), autocommit=True)


@pytest.fixture(scope="module")
def db():
    """A database with what an operator looks at: two queues (one limited,
    one named with markup), a dead letter, a stuck instance, a running batch
    job, and a sample of it all."""
    with admin() as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {DB}")
        for role in ("sturdy_ui_nobody", "sturdy_ui_reader"):
            if not c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                c.execute(f"CREATE ROLE {role} LOGIN")
    with admin(DB) as c:
        c.execute("CREATE EXTENSION pg_sturdy")
        c.execute("GRANT USAGE ON SCHEMA sturdy TO sturdy_ui_reader")
        c.execute("GRANT SELECT ON ALL TABLES IN SCHEMA sturdy TO sturdy_ui_reader")
        c.execute("GRANT EXECUTE ON ALL ROUTINES IN SCHEMA sturdy TO sturdy_ui_reader")
        c.execute("SELECT sturdy.schedule('job-' || i, now() - interval '1 minute', 'emails') FROM generate_series(1, 30) i")
        c.execute("SELECT sturdy.limit_queue('emails', running => 5)")
        c.execute("SELECT count(*) FROM sturdy.take('emails', '10 minutes', 2)")
        c.execute("SELECT sturdy.schedule(%s, now(), %s)", (HOSTILE, HOSTILE))
        # a dead letter: a subscriber that always fails, one attempt
        c.execute("""CREATE FUNCTION public.fails(m sturdy.outbox, attempt int) RETURNS void LANGUAGE plpgsql AS
                     $$ BEGIN RAISE EXCEPTION 'smtp down: %', m.payload->>'to' USING ERRCODE = '08006'; END $$""")
        c.execute("SELECT sturdy.subscribe('order.placed', 'public.fails(sturdy.outbox, integer)', 1)")
        c.execute("SELECT * FROM sturdy.emit('order.placed', %s::jsonb, 'order-1')", (json.dumps({"to": HOSTILE}),))
        c.execute("SELECT * FROM sturdy.pump()")
        # a dead workflow: its one attempt failed
        c.execute("SELECT sturdy.retry_queue('retrying', max_attempts => 1)")
        c.execute("SELECT sturdy.schedule('poison', now() - interval '1 minute', 'retrying')")
        c.execute("SELECT sturdy.fail(workflow, receipt, %s, 'retrying', code => 'PX001') FROM sturdy.take('retrying')",
                  ("bad payload: " + HOSTILE,))
        # a stuck instance: running, no change for two hours
        c.execute("SELECT sturdy.start('ship', 'order-7', '{}') AS id")
        c.execute("SELECT sturdy.start('ship', %s, '{}')", (HOSTILE,))
        c.execute("UPDATE sturdy.instances SET status = 'running', revision = 2,"
                  " updated_at = now() - interval '2 hours' WHERE business_key = 'order-7'")
        # a batch job, one chunk in
        c.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, status text)")
        c.execute("INSERT INTO public.orders SELECT i, 'new' FROM generate_series(1, 5000) i")
        c.execute("SELECT sturdy.batch_start('archive orders', 'public.orders', 'status = $1', 'status = $2',"
                  " ARRAY['archived', 'new'], chunk => 500)")
        c.execute("SELECT * FROM sturdy.batch_tick('archive orders')")
        c.execute("SELECT sturdy.sample()")
    yield
    with admin() as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


@pytest.fixture(scope="module")
def ui(db):
    u = Ui("--allow-actions")
    yield u
    u.stop()


def test_the_overview_shows_queues_outbox_instances_batches_and_health(ui):
    status, page, headers = ui.get("/")
    assert status == 200, page
    for seen in ["emails", "running 5", "order.placed", "fails(sturdy.outbox",
                 "archive orders", "stuck", "oldest ready job", "as of the last sample"]:
        assert seen in page, seen
    assert "default-src 'none'" in headers["content-security-policy"]
    assert "<svg" in page, "sparklines"
    assert "<script" not in page.lower(), "no script at all, the hostile names included"


def test_every_value_is_shown_as_text(ui):
    pages = [ui.get("/")[1], ui.get("/queue?name=" + urllib.parse.quote(HOSTILE))[1],
             ui.get("/dead")[1], ui.get("/instance?q=" + urllib.parse.quote(HOSTILE))[1]]
    for page in pages:
        assert "<script>alert(1)" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "\\u{0007}" in pages[0], "a control character written as its escape"
    assert "\x07" not in "".join(pages)


def test_a_queue_page_shows_its_rows_and_their_leases(ui):
    status, page, _ = ui.get("/queue?name=emails")
    assert status == 200
    assert page.count("leased") >= 2 and "job-30" in page
    status, page, _ = ui.get("/queue?name=nobody")
    assert status == 200 and "No rows." in page


def test_an_instance_is_found_by_business_key_and_by_id(ui):
    status, page, _ = ui.get("/instance?q=order-7")
    assert status == 200 and "Instance " in page and "running" in page
    iid = re.search(r"<h1>Instance (\d+)</h1>", page).group(1)
    assert ui.get(f"/instance?q={iid}")[1].count("order-7") >= 1
    assert "No instance has" in ui.get("/instance?q=nothing-by-that-name")[1]


def csrf_of(page):
    return re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)


def test_redrive_and_cancel_change_the_rows_and_need_the_csrf_token(ui):
    page = ui.get("/dead")[1]
    assert "smtp down" in page and "08006" in page
    did = re.search(r'action="/deliveries/(\d+)/redrive"', page).group(1)
    assert ui.request("POST", f"/deliveries/{did}/redrive", {"csrf": "0" * 48})[0] == 403
    with admin(DB) as c:
        assert c.execute("SELECT state FROM sturdy.deliveries WHERE id = %s", (did,)).fetchone()[0] == "dead"
    status, _, headers = ui.request("POST", f"/deliveries/{did}/redrive", {"csrf": csrf_of(page)})
    assert status == 303 and "redriven" in headers["location"]
    with admin(DB) as c:
        assert c.execute("SELECT state FROM sturdy.deliveries WHERE id = %s", (did,)).fetchone()[0] == "pending"
    page = ui.get("/stuck")[1]
    assert "order-7" in page
    iid = re.search(r'action="/instances/(\d+)/cancel"', page).group(1)
    form = {"csrf": csrf_of(page), "from": "running", "revision": "2"}
    status, _, headers = ui.request("POST", f"/instances/{iid}/cancel", form)
    assert status == 303 and "cancelled" in headers["location"]
    with admin(DB) as c:
        assert c.execute("SELECT status FROM sturdy.instances WHERE id = %s", (iid,)).fetchone()[0] == "cancelled"
        assert c.execute("SELECT count(*) FROM sturdy.queue q JOIN sturdy.instances i ON i.workflow = q.workflow"
                         " WHERE i.id = %s", (iid,)).fetchone()[0] == 0, "its queue row is cancelled with it"
    # the same form again: the instance moved on, nothing changes
    status, _, headers = ui.request("POST", f"/instances/{iid}/cancel", form)
    assert "moved-on" in headers["location"]


def test_a_queue_page_lists_its_dead_rows_with_their_errors_and_redrives_them(ui):
    page = ui.get("/queue?name=retrying")[1]
    assert "Dead" in page and "poison" in page and "PX001" in page and "bad payload" in page
    assert "<script>" not in page
    form = {"csrf": "0" * 48, "queue": "retrying", "workflow": "poison"}
    assert ui.request("POST", "/queue/redrive", form)[0] == 403
    form["csrf"] = csrf_of(page)
    status, _, headers = ui.request("POST", "/queue/redrive", form)
    assert status == 303 and "workflow-redriven" in headers["location"]
    with admin(DB) as c:
        assert c.execute("SELECT visible_at <= now(), attempts FROM sturdy.queue WHERE workflow = 'poison'"
                         ).fetchone() == (True, None)
    status, _, headers = ui.request("POST", "/queue/redrive", form)
    assert "workflow-not-dead" in headers["location"]


def test_a_read_only_dashboard_refuses_every_action(db):
    u = Ui()
    try:
        page = u.get("/dead")[1]
        assert "Redrive" not in page and 'name="csrf"' not in page
        status, page, _ = u.request("POST", "/deliveries/1/redrive", {"csrf": "x"})
        assert status == 403 and "--allow-actions" in page
        page = u.get("/queue?name=retrying")[1]
        assert "Redrive" not in page and 'name="csrf"' not in page
        status, page, _ = u.request("POST", "/queue/redrive", {"csrf": "x", "queue": "retrying", "workflow": "poison"})
        assert status == 403 and "--allow-actions" in page
    finally:
        u.stop()


def test_a_token_is_asked_of_every_request_and_a_login_sets_a_cookie(db):
    u = Ui("--token", TOKEN)
    try:
        assert u.get("/")[0] == 401
        assert u.get("/", headers={"Authorization": "Bearer wrong-token-wrong-token"})[0] == 401
        assert u.get("/", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
        assert u.request("POST", "/login", {"token": "nope"})[0] == 401
        status, _, headers = u.request("POST", "/login", {"token": TOKEN})
        assert status == 303
        cookie = headers["set-cookie"].split(";")[0]
        assert "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
        assert u.get("/dead", headers={"Cookie": cookie})[0] == 200
    finally:
        u.stop()


def test_a_login_opens_a_session_whose_cookie_is_not_the_token_and_a_logout_ends_it(db):
    u = Ui("--token", TOKEN)  # read-only: a logout is still allowed
    try:
        status, _, headers = u.request("POST", "/login", {"token": TOKEN})
        assert status == 303
        set_cookie = headers["set-cookie"]
        cookie = set_cookie.split(";")[0]
        session = cookie.split("=", 1)[1]
        assert TOKEN not in set_cookie and len(session) == 64, set_cookie
        for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"]:
            assert attribute in set_cookie, attribute
        assert "Secure" not in set_cookie, "plain HTTP, no proxy said https"
        status, page, _ = u.get("/dead", headers={"Cookie": cookie})
        assert status == 200 and 'action="/logout"' in page
        csrf = csrf_of(page)
        # the token where the cookie was, a forged session, a second login's own session
        assert u.get("/", headers={"Cookie": f"sturdy_ui={TOKEN}"})[0] == 401
        assert u.get("/", headers={"Cookie": "sturdy_ui=" + "0" * 64})[0] == 401
        other = u.request("POST", "/login", {"token": TOKEN})[2]["set-cookie"].split(";")[0]
        assert other != cookie and u.get("/", headers={"Cookie": other})[0] == 200
        # a logout needs the CSRF token, then ends this session only, here and in the browser
        assert u.request("POST", "/logout", {"csrf": "0" * 48}, headers={"Cookie": cookie})[0] == 403
        assert u.get("/", headers={"Cookie": cookie})[0] == 200
        status, _, headers = u.request("POST", "/logout", {"csrf": csrf}, headers={"Cookie": cookie})
        assert status == 303 and headers["location"] == "/login"
        assert headers["set-cookie"].startswith("sturdy_ui=;") and "Max-Age=0" in headers["set-cookie"]
        assert u.get("/", headers={"Cookie": cookie})[0] == 401
        assert u.get("/", headers={"Cookie": other})[0] == 200
        # a bearer opens no session: its pages have no logout
        status, page, _ = u.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and "/logout" not in page
        # behind a TLS-terminating proxy the cookie is Secure
        headers = u.request("POST", "/login", {"token": TOKEN}, headers={"X-Forwarded-Proto": "https"})[2]
        assert headers["set-cookie"].endswith("; Secure")
        # with a token, the token is the guard: any Host (a reverse proxy's name)
        assert u.get("/", headers={"Host": "ops.example", "Authorization": f"Bearer {TOKEN}"})[0] == 200
    finally:
        u.stop()


def sturdy_ui_connections(name):
    with admin() as c:
        return c.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)).fetchone()[0]


def test_without_a_token_only_requests_for_this_server_on_loopback_are_served(db):
    """A page of another site whose name was rebound to 127.0.0.1 sends its
    own name as Host: refused (421), before anything is read."""
    u = Ui(settings="application_name=sturdy-ui-hosts")
    try:
        port = u.port
        for host in ["evil.example", f"evil.example:{port}", f"127.0.0.1:{port + 1}", "127.0.0.1", "localhost"]:
            status, page, _ = u.get("/", headers={"Host": host})
            assert status == 421, (host, status)
            assert f"127.0.0.1:{port}" in page and "--token" in page
        assert u.request("POST", "/login", {"token": "x"}, headers={"Host": "evil.example"})[0] == 421
        assert u.raw("GET / HTTP/1.0\r\n\r\n")[0] == 421, "no Host at all"
        assert u.raw(f"GET http://evil.example/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n")[0] == 421
        assert sturdy_ui_connections("sturdy-ui-hosts") == 0, "no query was run for them"
        for host in [f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"LOCALHOST:{port}"]:
            assert u.get("/", headers={"Host": host})[0] == 200, host
        assert sturdy_ui_connections("sturdy-ui-hosts") == 1
    finally:
        u.stop()


def test_the_dsns_own_options_are_kept_and_the_statement_timeout_still_bounds_every_query(db):
    u = Ui(settings="options='-c TimeZone=Pacific/Chatham -c statement_timeout=600000'")
    try:
        status, page, _ = u.get("/queue?name=emails")
        assert status == 200
        assert re.search(r"\+1[23]:45", page), "times in the DSN's time zone (Chatham, +12:45 or +13:45)"
        with admin(DB) as c, c.transaction():
            c.execute("LOCK TABLE sturdy.samples IN ACCESS EXCLUSIVE MODE")
            start = time.monotonic()
            status, page, _ = u.get("/")
            took = time.monotonic() - start
        assert status == 500 and "57014" in page, page[:800]
        assert took < 20, f"cancelled by the dashboard's 5 s, not the DSN's 600 s: {took:.1f} s"
    finally:
        u.stop()


def test_a_database_that_never_answers_gets_a_page_saying_so_not_a_hang(db):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # accepts connections (the kernel does), never says a word
        u = Ui(to=f"host=127.0.0.1 port={silent.getsockname()[1]} dbname=x user=x")
        try:
            start = time.monotonic()
            status, page, _ = u.get("/")
            took = time.monotonic() - start
            assert status == 503 and "Could not connect to the database within 5 s" in page, (status, page[:800])
            assert took < 15, took
        finally:
            u.stop()


def test_a_public_address_without_a_token_is_refused_at_start():
    run = subprocess.run([BIN, "--dsn", dsn(), "--listen", "0.0.0.0:0"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and "without --token" in run.stderr


def test_a_role_without_rights_sees_nothing_and_a_reader_redrives_nothing(db):
    u = Ui("--allow-actions", user="sturdy_ui_nobody")
    try:
        status, page, _ = u.get("/")
        assert status == 403 and "42501" in page and "grant_usage" in page
    finally:
        u.stop()
    u = Ui("--allow-actions", user="sturdy_ui_reader")
    try:
        status, page, _ = u.get("/dead")
        assert status == 200
        with admin(DB) as c:
            did = c.execute("SELECT id FROM sturdy.deliveries LIMIT 1").fetchone()[0]
            c.execute("UPDATE sturdy.deliveries SET state = 'dead' WHERE id = %s", (did,))
        page = u.get("/dead")[1]
        status, page, _ = u.request("POST", f"/deliveries/{did}/redrive", {"csrf": csrf_of(page)})
        assert status == 403 and "42501" in page
        with admin(DB) as c:
            assert c.execute("SELECT state FROM sturdy.deliveries WHERE id = %s", (did,)).fetchone()[0] == "dead"
    finally:
        u.stop()


def seq_scans():
    """Sequential scans of each table of ours, as the statistics have them
    (a fresh connection: no snapshot of them kept)."""
    with admin(DB) as c:
        return dict(c.execute("SELECT relname, seq_scan FROM pg_stat_user_tables WHERE schemaname = 'sturdy'")
                    .fetchall())


# A backend reports its counts at a transaction's end at most once a second,
# and when idle at most every 10 s: waited for around the page loads, so that
# the loads' scans (and nothing before them) land between the two readings.
REPORTED = 11


def test_pages_of_a_large_database_scan_no_table_whole(db, ui):
    """1,000,000 queue rows, 2,000,000 instances stalled for two hours and
    100,000 deliveries: sturdy.sample() reads neither the queue nor the
    instances sequentially, and no page reads one of the large tables
    sequentially (pg_stat_user_tables around each; the small ones, a few
    rows each here, the planner may read whole). The times are printed, not
    judged (docs/benchmarks.md has sample()'s)."""
    with admin(DB) as c:
        c.execute("INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)"
                  " SELECT 'big', 'w' || i, now() - interval '1 hour', now()"
                  " FROM generate_series(1, 1000000) i")
        c.execute("INSERT INTO sturdy.instances (process, business_key, workflow, queue, variables, updated_at)"
                  " SELECT 'p', 'bk-' || i, 'i-' || i, 'big', '{}', now() - interval '2 hours'"
                  " FROM generate_series(1, 2000000) i")
        c.execute("INSERT INTO sturdy.outbox (event, payload) SELECT 'bulk', '{}' FROM generate_series(1, 100000)")
        c.execute("INSERT INTO sturdy.deliveries (outbox_id, subscriber, state, max_attempts)"
                  " SELECT id, 'public.fails(sturdy.outbox, integer)', 'done', 1 FROM sturdy.outbox WHERE event = 'bulk'")
        c.execute("SELECT sturdy.sample()")  # the one a minute before
        c.execute("VACUUM ANALYZE sturdy.queue")
        c.execute("VACUUM ANALYZE sturdy.instances")
        c.execute("ANALYZE")
        c.execute("SELECT pg_stat_force_next_flush()")  # this connection's scans: reported now
        c.execute("SELECT 1")
    ui.get("/")  # warm the connection
    time.sleep(REPORTED)
    before = seq_scans()
    with admin(DB) as c:
        start = time.monotonic()
        c.execute("SELECT sturdy.sample()")
        sampled = round((time.monotonic() - start) * 1000, 1)
        c.execute("SELECT pg_stat_force_next_flush()")
        c.execute("SELECT 1")
        big, stuck, pending = [c.execute(
            "SELECT figures FROM sturdy.samples WHERE kind = %s AND name = %s ORDER BY sampled_at DESC LIMIT 1",
            k).fetchone()[0] for k in [("queue", "big"), ("instances", "stuck"), ("instances", "pending")]]
    time.sleep(REPORTED)
    after = seq_scans()
    scanned = {t: after[t] - before.get(t, 0) for t in after if after[t] != before.get(t, 0)}
    print(f"    sturdy.sample(): {sampled} ms; sequential scans: {scanned}")
    assert not {t: n for t, n in scanned.items() if t in {"queue", "instances"}}, scanned
    # past 10,000 rows a figure is the planner's estimate, and says so
    assert big["estimated"] and big["ended"] is None, big
    assert 900_000 < big["ready"] < 1_100_000, big
    assert pending["estimated"] and 1_800_000 < pending["count"] < 2_200_000, pending
    assert stuck == {"count": 1000, "more": True}, stuck
    with admin(DB) as c:
        assert c.execute("SELECT value FROM sturdy.health WHERE signal = 'stuck instances'").fetchone()[0] == "over 1000"

    before = after
    took = []
    for path in ["/", "/queue?name=big", "/dead", "/stuck", "/batches", "/instance?q=bk-77", "/instance?q=5"]:
        start = time.monotonic()
        status, page, _ = ui.get(path)
        took.append((path, round((time.monotonic() - start) * 1000, 1)))
        assert status == 200, (path, page[:500])
        if path == "/stuck":
            assert page.count("/instances/") <= 50 * 2 and "there are more" in page, page[:2000]
        if path == "/":
            assert "≈ " in page and "1000+" in page, "the overview marks estimates and a stopped count"
    time.sleep(REPORTED)
    after = seq_scans()
    scanned = {t: after[t] - before.get(t, 0) for t in after if after[t] != before.get(t, 0)}
    print(f"    page loads (ms): {took}")
    print(f"    sequential scans meanwhile (small tables, where the planner prefers them): {scanned}")
    large = {"queue", "instances", "deliveries", "outbox"}
    assert not {t: n for t, n in scanned.items() if t in large}, f"sequential scans: {scanned}"


def test_long_lists_say_there_is_more(db, ui):
    """Each list is read one row past what it shows, and says so where that
    row came: 600 queues on the overview (the outbox and health still
    shown), 202 checkpoints of an instance (and the next of them), 21
    instances of one business key."""
    with admin(DB) as c:
        c.execute("SELECT sturdy.schedule('many-' || i, now(), 'many-' || lpad(i::text, 3, '0'))"
                  " FROM generate_series(1, 600) i")
        c.execute("SELECT sturdy.sample()")
        iid = c.execute("SELECT sturdy.start('ship', 'cp-many', '{}')").fetchone()[0]
        workflow = c.execute("SELECT workflow FROM sturdy.instances WHERE id = %s", (iid,)).fetchone()[0]
        c.execute("INSERT INTO sturdy.checkpoints (workflow, step, value, recorded_at)"
                  " SELECT %s, 'step-' || lpad(i::text, 3, '0'), to_jsonb(i), clock_timestamp()"
                  " FROM generate_series(1, 201) i", (workflow,))
        c.execute("INSERT INTO sturdy.checkpoints (workflow, step, value, recorded_at)"
                  " VALUES (%s, 'zz-large', jsonb_build_object('s', repeat('x', 100000)), now())", (workflow,))
        c.execute("INSERT INTO sturdy.instances (process, business_key, workflow, queue, variables)"
                  " SELECT 'p', 'twins', 'twin-' || i, 'twins', '{}' FROM generate_series(1, 21) i")
    status, page, _ = ui.get("/")
    assert status == 200
    assert "Showing the first 500 queues by name; there are more." in page
    assert "many-400" in page and "many-600" not in page
    assert "order.placed" in page and "oldest ready job" in page, "the outbox and the health signals are still shown"
    status, page, _ = ui.get(f"/instance?q={iid}")
    assert status == 200
    assert "<td>step-001</td>" in page and "<td>step-200</td>" in page and "step-201" not in page
    assert "Showing the first 200 checkpoints; there are more." in page
    nxt = re.search(r'href="(/instance\?q=\d+&amp;after=step-200)"', page).group(1).replace("&amp;", "&")
    status, page, _ = ui.get(nxt)
    assert status == 200 and "<td>step-201</td>" in page and "<td>step-200</td>" not in page
    assert "there are more" not in page
    large = len(json.dumps({"s": "x" * 100000}))
    assert f"… ({large} characters)" in page, "a large value: its start, and its length"
    status, page, _ = ui.get("/instance?q=twins")
    assert status == 200 and page.count('href="/instance?q=') >= 20
    assert "Showing the first 20 instances" in page and "there are more" in page


# --- In a real browser ----------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


class Browser:
    """Headless Chromium through WebDriver's HTTP protocol."""

    def __init__(self):
        self.port = free_port()
        self.driver = subprocess.Popen([DRIVER, f"--port={self.port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": CHROMIUM, "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1000"]}}}}
        self.session = self.call("POST", "/session", caps)["sessionId"]

    def call(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request(method, path, body=json.dumps(body) if body is not None else None,
                  headers={"Content-Type": "application/json"})
        out = json.loads(c.getresponse().read())
        c.close()
        if isinstance(out.get("value"), dict) and "error" in out["value"]:
            raise AssertionError(out["value"])
        return out.get("value") if "sessionId" not in out else out

    def s(self, method, path, body=None):
        return self.call(method, f"/session/{self.session}{path}", body)

    def go(self, url):
        self.s("POST", "/url", {"url": url})

    def text(self):
        return self.s("POST", "/execute/sync", {"script": "return document.body.innerText", "args": []})

    def shows(self, text, seconds=10):
        """Whether the page shows `text`, waiting for a navigation a click began."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if text in self.text():
                return True
            time.sleep(0.1)
        return False

    def click(self, css):
        element = self.s("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]
        self.s("POST", f"/element/{element}/click", {})

    def shot(self, name):
        os.makedirs(SHOTS, exist_ok=True)
        with open(os.path.join(SHOTS, f"{name}.png"), "wb") as f:
            f.write(base64.b64decode(self.s("GET", "/screenshot")))

    def quit(self):
        try:
            self.s("DELETE", "")
        finally:
            self.driver.terminate()
            self.driver.wait(10)


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="no chromium and chromedriver (the bootstrap installs them)")
def test_in_a_browser_the_overview_shows_it_all_and_redrive_and_cancel_work(db):
    with admin(DB) as c:
        c.execute("SELECT * FROM sturdy.emit('order.placed', '{\"to\": \"b@example.com\"}', 'order-2')")
        c.execute("SELECT * FROM sturdy.pump()")
        c.execute("SELECT sturdy.start('ship', 'order-9', '{}')")
        c.execute("UPDATE sturdy.instances SET updated_at = now() - interval '3 hours' WHERE business_key = 'order-9'")
        c.execute("SELECT sturdy.sample()")
    u = Ui("--allow-actions")
    b = Browser()
    base = f"http://127.0.0.1:{u.port}"
    try:
        b.go(base + "/")
        seen = b.text()
        for text in ["Queues", "emails", "order.placed", "archive orders", "Health", HOSTILE[:20]]:
            assert text in seen, text
        b.shot("overview")
        b.go(base + "/queue?name=emails")
        assert "job-1" in b.text()
        b.shot("queue")
        b.go(base + "/batches")
        assert "archive orders" in b.text()
        b.shot("batches")
        b.go(base + "/dead")
        assert "smtp down: b@example.com" in b.text()
        b.shot("dead-letters")
        with admin(DB) as c:
            pending = "SELECT count(*) FROM sturdy.deliveries WHERE state = 'pending'"
            before = c.execute(pending).fetchone()[0]
            b.click('form[action^="/deliveries/"] button')
            assert b.shows("Redriven")
            assert c.execute(pending).fetchone()[0] == before + 1
        b.go(base + "/stuck")
        assert "order-9" in b.text()
        b.shot("stuck")
        b.click('form[action^="/instances/"] button')
        assert b.shows("Cancelled.")
        b.shot("instance")
        with admin(DB) as c:
            assert c.execute("SELECT status FROM sturdy.instances WHERE business_key = 'order-9'").fetchone()[0] == "cancelled"
    finally:
        b.quit()
        u.stop()
