-- The job cycle of bench/sturdy_cycle.sql on the queue named by -D q=...:
-- schedule a new workflow, take one, done it; three transactions.
\set w random(1, 9000000000000000000)
SELECT sturdy.schedule('c-' || :w, now(), :q);
SELECT workflow, receipt FROM sturdy.take(:q, '1 minute') \gset
SELECT sturdy.done(:workflow, :receipt::timestamptz, :q);
