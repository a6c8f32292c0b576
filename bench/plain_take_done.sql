-- Not in make bench: the seed's TAKE and a DELETE, each its own transaction (two
-- per script), as a reference for bench/sturdy_take_done.sql (docs/benchmarks.md).
WITH due AS MATERIALIZED (
    SELECT workflow FROM seed.workflow_queue
    WHERE namespace = 'bench' AND visible_at <= now()
    ORDER BY visible_at
    FOR UPDATE SKIP LOCKED
    LIMIT 1
)
UPDATE seed.workflow_queue AS entry
SET visible_at = now() + interval '1 minute'
FROM due
WHERE entry.namespace = 'bench' AND entry.workflow = due.workflow
RETURNING entry.workflow, entry.visible_at \gset
DELETE FROM seed.workflow_queue WHERE namespace = 'bench' AND workflow = :workflow AND visible_at = :visible_at;
