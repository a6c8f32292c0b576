-- The job cycle with a queue per client ('cq' || client): the same three
-- calls, with no two clients meeting at one queue's head. Beside the shared
-- queue it tells what the takers meeting at one head cost from what the
-- cycle itself gains or loses with more clients.
\set w random(1, 9000000000000000000)
SELECT sturdy.schedule('cycle-' || :w, now(), 'cq' || :client_id);
SELECT workflow, receipt FROM sturdy.take('cq' || :client_id, '1 minute') \gset
SELECT sturdy.done(:workflow, :receipt::timestamptz, 'cq' || :client_id);
