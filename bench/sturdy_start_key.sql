-- Start an instance with an idempotency key (a new key almost every time).
\set n random(1, 2000000000)
SELECT sturdy.start('bench-start', 'bk-' || :n, idempotency_key => 'key-' || :n);
