-- pgmq 1.5.1's batch: read 100 (visibility timeout 60 s), then delete all 100
-- by id in one call (two transactions), in the database pgmq's SQL was loaded into.
SELECT coalesce(array_agg(msg_id), '{}') AS ids FROM pgmq.read('bench', 60, 100) \gset
SELECT count(*) FROM pgmq.delete('bench', :ids::bigint[]);
