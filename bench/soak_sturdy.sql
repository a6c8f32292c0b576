-- The churn soak's pass through pg_sturdy: take with claim, record, done, and
-- a new job scheduled, so the backlog stays where it started.
SELECT workflow, receipt, token FROM sturdy.take('soak', '1 minute', 1, true) \gset
SELECT recorded FROM sturdy.record(:workflow, 'step-1', '{"ok": true}', :token);
SELECT sturdy.done(:workflow, :receipt::timestamptz, 'soak');
SELECT sturdy.schedule('soak-' || gen_random_uuid(), now(), 'soak');
