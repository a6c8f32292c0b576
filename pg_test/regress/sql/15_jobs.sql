-- Jobs with their input: schedule_many enqueues a batch, take hands each
-- input out, done_many ends them; under a hostile search_path
-- (04_hostile.sql) in a fresh backend. Then what schedule_many refuses,
-- each with its message and hint, and nothing written.
\c
SET search_path = evil, pg_catalog;
SELECT sturdy.schedule_many(ARRAY['mail/1', 'mail/2', 'mail/3'],
                            ARRAY['{"to": "a@example.com"}', NULL, '[1, 2]']::jsonb[], 'jq') AS scheduled;
SELECT workflow, input, attempt FROM sturdy.take('jq', max => 10);
SELECT count(*) AS none_left_ready FROM sturdy.take('jq', max => 10);
RESET search_path;
SELECT sturdy.done_many(ARRAY(SELECT workflow FROM sturdy.queue WHERE queue = 'jq' ORDER BY workflow),
                        ARRAY(SELECT leased_until FROM sturdy.queue WHERE queue = 'jq' ORDER BY workflow), 'jq') AS done;
-- what it refuses
SELECT sturdy.schedule_many(NULL);
SELECT sturdy.schedule_many(ARRAY['a', NULL]);
SELECT sturdy.schedule_many(ARRAY['a', '']);
SELECT sturdy.schedule_many(ARRAY['a', 'b'], ARRAY['1']::jsonb[]);
SELECT sturdy.schedule_many(ARRAY['a'], keys => ARRAY['x', 'y']);
SELECT sturdy.schedule_many(ARRAY[['a'], ['b']]);
SELECT sturdy.schedule_many(ARRAY['a'], priority => -1);
SELECT sturdy.schedule_many(ARRAY['a'], visible_at => 'infinity');
SELECT sturdy.schedule_many(ARRAY(SELECT 'w' || g FROM generate_series(1, 10001) g));
SELECT sturdy.schedule_many(ARRAY['a'], ARRAY['"\u0000"']::jsonb[]);
SELECT count(*) AS written FROM sturdy.queue WHERE workflow IN ('a', 'b', 'w1');
