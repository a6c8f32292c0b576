-- The seed's CLAIM and RECORD statements, sent from the client (-M prepared),
-- on tables of the same shape.
\set w random(1, 9000000000000000000)
INSERT INTO seed.workflow_claim AS held (workflow, token, held_until)
VALUES ('bench-' || :w, 1, now() + interval '1 minute')
ON CONFLICT (workflow) DO UPDATE
    SET token = held.token + 1, held_until = now() + interval '1 minute'
    WHERE held.held_until <= now()
RETURNING token;
WITH fence AS (
    SELECT token FROM seed.workflow_claim WHERE workflow = 'bench-' || :w FOR UPDATE
)
INSERT INTO seed.workflow_checkpoint AS recorded (workflow, step, value)
SELECT 'bench-' || :w, 'step-1', '{"ok": true}'::jsonb FROM fence WHERE fence.token <= 1
ON CONFLICT (workflow, step) DO UPDATE SET value = recorded.value
RETURNING recorded.value::text, recorded.value = '{"ok": true}'::jsonb;
