-- A worker's pass in two calls: take with a claim, then finish, which records
-- the one step, releases the claim and removes the queue row.
SELECT workflow, receipt, token FROM sturdy.take('bench', '1 minute', 1, true) \gset
SELECT sturdy.finish(:workflow, :token, :receipt::timestamptz, 'step-1', '{"ok": true}', queue => 'bench');
