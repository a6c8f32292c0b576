-- The seed's TAKE, CLAIM, RECORD and FINISH, sent from the client.
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
DELETE FROM seed.workflow_queue WHERE namespace = 'bench' AND workflow = :workflow AND visible_at = :visible_at;
