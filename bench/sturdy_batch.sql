-- Batches: take 100, then mark all 100 done in one statement (two transactions).
SELECT coalesce(array_agg(workflow), '{}') AS ws, coalesce(array_agg(receipt), '{}') AS rs FROM sturdy.take('bench', '1 minute', 100) \gset
SELECT count(*) FILTER (WHERE sturdy.done(w, r, 'bench'))
  FROM unnest(:ws::text[], :rs::timestamptz[]) AS u(w, r);
