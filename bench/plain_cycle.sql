-- The same cycle as the plain statements a team would write (the seed's shape):
-- insert the job, take the oldest ready one with SKIP LOCKED, delete it.
\set w random(1, 9000000000000000000)
INSERT INTO seed.workflow_queue (namespace, workflow, visible_at) VALUES ('cycle', 'cycle-' || :w, now())
ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = EXCLUDED.visible_at;
WITH due AS MATERIALIZED (
    SELECT workflow FROM seed.workflow_queue
    WHERE namespace = 'cycle' AND visible_at <= now()
    ORDER BY visible_at
    FOR UPDATE SKIP LOCKED
    LIMIT 1
)
UPDATE seed.workflow_queue AS entry
SET visible_at = now() + interval '1 minute'
FROM due
WHERE entry.namespace = 'cycle' AND entry.workflow = due.workflow
RETURNING entry.workflow, entry.visible_at \gset
DELETE FROM seed.workflow_queue WHERE namespace = 'cycle' AND workflow = :workflow AND visible_at = :visible_at;
