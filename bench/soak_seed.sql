-- The churn soak's pass written by hand (the seed's TAKE, CLAIM, RECORD,
-- FINISH) and a new job inserted, so the backlog stays where it started.
WITH due AS MATERIALIZED (
    SELECT workflow FROM seed.workflow_queue
    WHERE namespace = 'soak' AND visible_at <= now()
    ORDER BY visible_at
    FOR UPDATE SKIP LOCKED
    LIMIT 1
)
UPDATE seed.workflow_queue AS entry
SET visible_at = now() + interval '1 minute'
FROM due
WHERE entry.namespace = 'soak' AND entry.workflow = due.workflow
RETURNING entry.workflow, entry.visible_at \gset
INSERT INTO seed.workflow_claim AS held (workflow, token, held_until)
VALUES (:workflow, 1, now() + interval '1 minute')
ON CONFLICT (workflow) DO UPDATE
    SET token = held.token + 1, held_until = now() + interval '1 minute'
    WHERE held.held_until <= now()
RETURNING token \gset
WITH fence AS (
    SELECT token FROM seed.workflow_claim WHERE workflow = :workflow FOR UPDATE
)
INSERT INTO seed.workflow_checkpoint AS recorded (workflow, step, value)
SELECT :workflow, 'step-1', '{"ok": true}'::jsonb FROM fence WHERE fence.token <= :token
ON CONFLICT (workflow, step) DO UPDATE SET value = recorded.value
RETURNING recorded.value::text, recorded.value = '{"ok": true}'::jsonb;
DELETE FROM seed.workflow_queue WHERE namespace = 'soak' AND workflow = :workflow AND visible_at = :visible_at;
INSERT INTO seed.workflow_queue (namespace, workflow, visible_at) VALUES ('soak', 'soak-' || gen_random_uuid(), now());
