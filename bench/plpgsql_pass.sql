-- The seed's CLAIM and RECORD again, each called through a PL/pgSQL function
-- (bench/setup.sql): what a function layer costs over the bare statement.
\set w random(1, 9000000000000000000)
SELECT seed.claim('bench-' || :w, '1 minute');
SELECT recorded, first FROM seed.record('bench-' || :w, 'step-1', '{"ok": true}', 1);
