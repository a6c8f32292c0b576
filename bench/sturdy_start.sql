-- Start an instance (scheduled on its queue), no idempotency key.
\set n random(1, 2000000000)
SELECT sturdy.start('bench-start', 'bk-' || :n);
