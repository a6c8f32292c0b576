-- The job cycle of bench/sturdy_cycle_queue.sql with each row under one of
-- 1,000 keys (a tenant), on the queue named by -D q=...: schedule a new
-- workflow with its key, take one, done it; three transactions.
\set w random(1, 9000000000000000000)
\set k random(1, 1000)
SELECT sturdy.schedule('c-' || :w, now(), :q, key => 'tenant-' || :k);
-- (a take the limit leaves empty hands out nothing, and the cycle skips done)
SELECT count(*) AS got, max(workflow) AS workflow, max(receipt) AS receipt FROM sturdy.take(:q, '1 minute') \gset
\if :got
SELECT sturdy.done(:workflow, :receipt::timestamptz, :q);
\endif
