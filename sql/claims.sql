-- Claims: who may write a workflow's checkpoints, under which fencing token,
-- until when. One row per workflow, kept after release so tokens only go up.
--
-- The C functions below carry no SET search_path clause, yet run under a
-- pinned search path: each pushes PostgreSQL's override search path
-- (pg_catalog alone) around its work (src/spi.rs, `pinned`). Same protection
-- against a caller's search_path, without the per-call GUC save and restore
-- the clause costs.

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
    claimed_at timestamptz NOT NULL
);
SELECT pg_catalog.pg_extension_config_dump('sturdy.claims', '');

COMMENT ON TABLE sturdy.claims IS
    'One row per workflow ever claimed: the current fencing token and its lease. Kept after release so the next token is higher.';
COMMENT ON COLUMN sturdy.claims.workflow IS 'The workflow id, any non-empty text up to 1024 bytes.';
COMMENT ON COLUMN sturdy.claims.token IS 'The current fencing token; each claim takes the previous one plus one.';
COMMENT ON COLUMN sturdy.claims.held_until IS 'When the lease lapses (server clock); after it, anyone may claim.';
COMMENT ON COLUMN sturdy.claims.owner IS 'Free-form label of the current holder, as given to claim (for operators, never checked).';
COMMENT ON COLUMN sturdy.claims.claimed_at IS 'When the current token was issued.';

CREATE FUNCTION sturdy.claim(workflow text, lease interval DEFAULT '1 minute', owner text DEFAULT NULL)
    RETURNS bigint
    LANGUAGE c VOLATILE PARALLEL UNSAFE SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_claim';
COMMENT ON FUNCTION sturdy.claim(text, interval, text) IS
    'Take the workflow if nobody holds it (never claimed, released, or lease lapsed). Returns the new fencing token, higher than every earlier one, or NULL when someone else holds it.';

CREATE FUNCTION sturdy.renew(workflow text, token bigint, lease interval)
    RETURNS timestamptz
    LANGUAGE c VOLATILE PARALLEL UNSAFE SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_renew';
COMMENT ON FUNCTION sturdy.renew(text, bigint, interval) IS
    'Extend a live claim to now() + lease. Returns the new expiry, or NULL when the token is no longer current or its lease already lapsed.';

CREATE FUNCTION sturdy.release(workflow text, token bigint)
    RETURNS boolean
    LANGUAGE c VOLATILE PARALLEL UNSAFE SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_release';
COMMENT ON FUNCTION sturdy.release(text, bigint) IS
    'Hand a live claim back early, keeping its token so the next claim gets the next number. True when this call let go of a live claim.';

CREATE FUNCTION sturdy.fence(workflow text, token bigint)
    RETURNS void
    LANGUAGE c VOLATILE PARALLEL UNSAFE SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_fence';
COMMENT ON FUNCTION sturdy.fence(text, bigint) IS
    'Lock the claim row (FOR UPDATE) and raise SD001 unless token is the current one: the first statement of a hand-written exactly-once transaction.';
