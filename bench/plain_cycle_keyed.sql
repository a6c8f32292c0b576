-- The job cycle of bench/plain_cycle.sql with a per-key limit of 1 the way a
-- team writes one today: rows under one of 1,000 keys, a counter row per
-- key raised with the take (only under the limit: the upsert waits for a
-- concurrent raise of the same key, then skips it) and lowered after the
-- delete, each step from the client in its own transaction. (Not
-- crash-safe: a worker that dies between the two leaves the count raised;
-- pg_sturdy's places lapse with the lease.)
\set w random(1, 9000000000000000000)
\set k random(1, 1000)
INSERT INTO seed.keyed_queue (namespace, workflow, visible_at, key) VALUES ('keyed', 'c-' || :w, now(), 'tenant-' || :k)
ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = EXCLUDED.visible_at;
WITH due AS MATERIALIZED (
    SELECT q.workflow, q.key FROM seed.keyed_queue q
    WHERE q.namespace = 'keyed' AND q.visible_at <= now()
      AND NOT EXISTS (SELECT FROM seed.key_running r WHERE r.key = q.key AND r.running >= 1)
    ORDER BY q.visible_at
    FOR UPDATE OF q SKIP LOCKED
    LIMIT 1
), raised AS (
    INSERT INTO seed.key_running (key, running) SELECT key, 1 FROM due
    ON CONFLICT (key) DO UPDATE SET running = seed.key_running.running + 1 WHERE seed.key_running.running < 1
    RETURNING key
), taken AS (
    UPDATE seed.keyed_queue AS entry
    SET visible_at = now() + interval '1 minute'
    FROM due JOIN raised USING (key)
    WHERE entry.namespace = 'keyed' AND entry.workflow = due.workflow
    RETURNING entry.workflow, entry.visible_at, entry.key
)
SELECT count(*) AS got, max(workflow) AS workflow, max(visible_at) AS visible_at, max(key) AS key FROM taken \gset
\if :got
DELETE FROM seed.keyed_queue WHERE namespace = 'keyed' AND workflow = :workflow AND visible_at = :visible_at;
UPDATE seed.key_running SET running = running - 1 WHERE key = :key;
\endif
