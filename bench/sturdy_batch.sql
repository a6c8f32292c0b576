-- Batches: take 100, then mark all 100 done with one done_many (two transactions).
SELECT coalesce(array_agg(workflow), '{}') AS ws, coalesce(array_agg(receipt), '{}') AS rs FROM sturdy.take('bench', '1 minute', 100) \gset
SELECT sturdy.done_many(:ws::text[], :rs::timestamptz[], 'bench');
