-- take and done, each its own transaction (two per script).
SELECT workflow, receipt FROM sturdy.take('bench', '1 minute') \gset
SELECT sturdy.done(:workflow, :receipt::timestamptz, 'bench');
