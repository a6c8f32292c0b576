-- A pass through pg_sturdy: claim a fresh workflow, record its first step.
\set w random(1, 9000000000000000000)
SELECT sturdy.claim('bench-' || :w, '1 minute');
SELECT recorded, first FROM sturdy.record('bench-' || :w, 'step-1', '{"ok": true}', 1);
