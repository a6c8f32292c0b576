-- A job's whole cycle: schedule a new workflow (ready now), take one, done it;
-- three transactions. The queue keeps a backlog, so a take always finds work.
\set w random(1, 9000000000000000000)
SELECT sturdy.schedule('cycle-' || :w, now(), 'cycle');
SELECT workflow, receipt FROM sturdy.take('cycle', '1 minute') \gset
SELECT sturdy.done(:workflow, :receipt::timestamptz, 'cycle');
