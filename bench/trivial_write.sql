-- The commit-rate floor: one single-row UPDATE, one transaction.
\set id random(1, 10000)
UPDATE bench_counter SET n = n + 1 WHERE id = :id;
