-- take(max => 100)'s statement, sent with -M prepared so LIMIT is a parameter
-- as it is inside take; rolled back so the backlog stays. Run by bench.py
-- with plan_cache_mode = auto (the plan cache's own choice: it re-plans every
-- call) and force_generic_plan (what take now does), side by side.
\set n 100
BEGIN;
WITH due AS MATERIALIZED (
    SELECT ctid, workflow, visible_at, seq FROM sturdy.queue
     WHERE queue = 'plan' AND visible_at <= now()
       AND (leased_until IS NULL OR leased_until <= now())
     ORDER BY visible_at, seq
     LIMIT :n
       FOR UPDATE SKIP LOCKED),
taken AS (
    UPDATE sturdy.queue AS q
       SET leased_until = now() + interval '1 minute', taken_at = now(), takes = q.takes + 1
     WHERE q.ctid = ANY (ARRAY(SELECT ctid FROM due))
    RETURNING q.workflow, q.leased_until)
SELECT count(*) FROM taken;
ROLLBACK;
