-- Claims: who may write a workflow's checkpoints, under which fencing token,
-- until when. One row per workflow, kept after release so tokens only go up.
--
-- Tables and their comments live here; each SQL function is declared once,
-- next to its Rust body (`#[sql_function]` in src/claim.rs and its siblings).

-- No CHECK constraint: the executor compiles a table's CHECKs on every
-- statement that writes it (measured: ~5% of claim + record throughput), and
-- tokens are only ever written by the claim upsert (1, then the previous
-- plus one).
--
-- Names (workflow, step, queue) are keys, compared byte for byte: COLLATE "C"
-- on every name column. Index lookups then compare with memcmp instead of the
-- locale's strcoll (measured: 3-6% of claim and record), and an operating
-- system upgrade that changes the locale's sort order cannot corrupt these
-- indexes. Joining a name to a column of another non-default collation needs
-- an explicit COLLATE.
CREATE TABLE sturdy.claims (
    workflow   text        COLLATE "C" PRIMARY KEY,
    token      bigint      NOT NULL,
    held_until timestamptz NOT NULL,
    owner      text,
    claimed_at timestamptz NOT NULL,
    place      text        COLLATE "C"
) WITH (vacuum_truncate = false);
SELECT pg_catalog.pg_extension_config_dump('sturdy.claims', '');

COMMENT ON TABLE sturdy.claims IS
    'One row per workflow ever claimed: the current fencing token and its lease. Kept after release so the next token is higher.';
COMMENT ON COLUMN sturdy.claims.workflow IS 'The workflow id, any non-empty text up to 1024 bytes.';
COMMENT ON COLUMN sturdy.claims.token IS 'The current fencing token; each claim takes the previous one plus one.';
COMMENT ON COLUMN sturdy.claims.held_until IS 'When the lease lapses (server clock); after it, anyone may claim.';
COMMENT ON COLUMN sturdy.claims.owner IS 'Free-form label of the current holder, as given to claim (for operators, never checked).';
COMMENT ON COLUMN sturdy.claims.claimed_at IS 'When the current token was issued.';
COMMENT ON COLUMN sturdy.claims.place IS 'Under Citus, distributed with queues (sturdy.distribute()): sturdy.workflow_place(workflow), the value the row is placed by. NULL otherwise.';

