-- Jobs with a payload, the whole cycle: enqueue 100 jobs of about 256 bytes
-- each with schedule_many, take 100 (their input with them), mark all 100
-- done with done_many (three transactions).
\set n random(1, 1000000000)
SELECT sturdy.schedule_many(array_agg('job/' || :client_id || '/' || :n || '/' || g),
                            array_agg(jsonb_build_object('payload', repeat('x', 240), 'n', g)), 'jobs')
  FROM generate_series(1, 100) g;
SELECT coalesce(array_agg(workflow), '{}') AS ws, coalesce(array_agg(receipt), '{}') AS rs,
       count(input) AS inputs FROM sturdy.take('jobs', '1 minute', 100) \gset
SELECT sturdy.done_many(:ws::text[], :rs::timestamptz[], 'jobs');
