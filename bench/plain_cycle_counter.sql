-- The job cycle of bench/plain_cycle.sql with a running limit the way a team
-- writes one today: a counter row per queue, raised before the take (only
-- under the limit) and lowered after the delete, each step from the client
-- in its own transaction. (Not crash-safe: a worker that dies between the
-- two leaves the count raised; pg_sturdy's places lapse with the lease.)
\set w random(1, 9000000000000000000)
INSERT INTO seed.workflow_queue (namespace, workflow, visible_at) VALUES ('counted', 'c-' || :w, now())
ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = EXCLUDED.visible_at;
WITH raised AS (UPDATE seed.queue_running SET running = running + 1
                 WHERE namespace = 'counted' AND running < 64 RETURNING 1)
SELECT count(*) AS placed FROM raised \gset
\if :placed
WITH due AS MATERIALIZED (
    SELECT workflow FROM seed.workflow_queue
    WHERE namespace = 'counted' AND visible_at <= now()
    ORDER BY visible_at
    FOR UPDATE SKIP LOCKED
    LIMIT 1
)
UPDATE seed.workflow_queue AS entry
SET visible_at = now() + interval '1 minute'
FROM due
WHERE entry.namespace = 'counted' AND entry.workflow = due.workflow
RETURNING entry.workflow, entry.visible_at \gset
DELETE FROM seed.workflow_queue WHERE namespace = 'counted' AND workflow = :workflow AND visible_at = :visible_at;
UPDATE seed.queue_running SET running = running - 1 WHERE namespace = 'counted';
\endif
