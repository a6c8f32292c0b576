-- take(max => 100)'s statement, sent with -M prepared so LIMIT is a parameter
-- as it is inside take; rolled back so the backlog stays. Run by bench.py
-- with plan_cache_mode = auto (the plan cache's own choice: it re-plans every
-- call) and force_generic_plan (what take now does), side by side.
\set n 100
BEGIN;
WITH due AS MATERIALIZED (
    SELECT ctid, workflow, visible_at FROM sturdy.queue
     WHERE queue = 'plan' AND visible_at <= now()
     ORDER BY visible_at
     LIMIT :n
       FOR UPDATE SKIP LOCKED),
taken AS (
    UPDATE sturdy.queue AS q
       SET visible_at = now() + interval '1 minute', taken_at = now(), takes = q.takes + 1
     WHERE q.ctid = ANY (ARRAY(SELECT ctid FROM due))
    RETURNING q.workflow, q.visible_at)
SELECT count(*) FROM taken;
ROLLBACK;
