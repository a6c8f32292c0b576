-- A worker's full pass through pg_sturdy: take with claim, record, done.
SELECT workflow, receipt, token FROM sturdy.take('bench', '1 minute', 1, true) \gset
SELECT recorded FROM sturdy.record(:workflow, 'step-1', '{"ok": true}', :token);
SELECT sturdy.done(:workflow, :receipt::timestamptz, 'bench');
