-- pgmq 1.5.1's whole cycle of jobs with a payload: send_batch 100 messages of
-- about 256 bytes, read 100 (visibility timeout 60 s), delete all 100 by id
-- (three transactions), in the database pgmq's SQL was loaded into.
SELECT count(*) FROM pgmq.send_batch('jobs',
  (SELECT array_agg(jsonb_build_object('payload', repeat('x', 240), 'n', g)) FROM generate_series(1, 100) g));
SELECT coalesce(array_agg(msg_id), '{}') AS ids, count(message) AS inputs FROM pgmq.read('jobs', 60, 100) \gset
SELECT count(*) FROM pgmq.delete('jobs', :ids::bigint[]);
