//! Claims: fencing tokens.
//!
//! A claim says which pass may write a workflow's checkpoints. Taking one
//! returns a token, a per-workflow counter that only goes up; every fenced
//! write compares its token with the current one under `FOR UPDATE`, so a pass
//! that stalled past its lease and was superseded can never write again, even
//! though it does not know it was superseded. The lease only decides when
//! somebody else may take over; safety comes from the token.
//!
//! Leases are measured on the server clock (`now()`, the transaction's start),
//! never a client's. `release` hands the workflow back early but keeps the
//! token, so the next claim still gets the next number.

use pg_sturdy_macros::sql_function;
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::{IntoDatum, pg_sys};

use crate::access;
use crate::args::{self, Name};
use crate::datum::Text;
use crate::error::{Error, Result};
use crate::placement::Placed;
use crate::plan::{Statement, first_value, null, run_one};

/// The claims table, for writes without a statement (see `access`): its
/// columns by position.
pub(crate) static CLAIMS: access::Table = access::Table::new(
    c"sturdy",
    c"claims",
    &[
        c"workflow",
        c"token",
        c"held_until",
        c"owner",
        c"claimed_at",
        c"place",
    ],
);
const C_WORKFLOW: access::Col = access::Col(0);
const C_TOKEN: access::Col = access::Col(1);
const C_HELD_UNTIL: access::Col = access::Col(2);
const C_OWNER: access::Col = access::Col(3);
const C_CLAIMED_AT: access::Col = access::Col(4);
const C_PLACE: access::Col = access::Col(5);

/// The fence without a statement: the claim row of `workflow` (a `text`
/// datum) locked as `SELECT ... FOR UPDATE` locks it, and its token. `None`
/// where `access` cannot do it, with nothing locked.
fn lock_claim(
    claims: &access::Opened,
    place: Option<pg_sys::Datum>,
    workflow: pg_sys::Datum,
) -> Result<Option<(Option<access::Locked>, Option<i64>)>> {
    let found = match place {
        Some(place) => claims.lock(&[(C_PLACE, place), (C_WORKFLOW, workflow)])?,
        None => claims.lock(&[(C_WORKFLOW, workflow)])?,
    };
    let Some(row) = found else {
        return Ok(None);
    };
    let current = row.as_ref().and_then(|row| claims.int8(row, C_TOKEN));
    Ok(Some((row, current)))
}

/// The claims table opened for a fenced write without a statement: a
/// workflow's claim row locked as `SELECT ... FOR UPDATE` locks it (the
/// fence), and, where `release` was asked for, that claim released.
pub(crate) struct Fence(access::Opened, Option<pg_sys::Datum>);

impl Fence {
    /// `None` where `access` cannot do it (see there), with nothing locked
    /// but the table, as a statement writing it locks it.
    pub(crate) fn open(workflow: Name, release: bool) -> Option<Fence> {
        let (at, place) = crate::placement::kept_at(workflow.bytes());
        let claims = CLAIMS.opened(&[pg_sys::ACL_UPDATE], at)?;
        let key: &[access::Col] = if place.is_some() {
            &[C_PLACE, C_WORKFLOW]
        } else {
            &[C_WORKFLOW]
        };
        (claims.can_lock(key)
            && (!release || claims.can_update(&[(C_HELD_UNTIL, pg_sys::TIMESTAMPTZOID, false)])))
        .then_some(Fence(claims, place))
    }

    /// The claim row of `workflow` (a `text` datum, the one it was opened
    /// for) locked, and its token (see [`lock_claim`]).
    pub(crate) fn lock(
        &self,
        workflow: pg_sys::Datum,
    ) -> Result<Option<(Option<access::Locked>, Option<i64>)>> {
        lock_claim(&self.0, self.1, workflow)
    }

    /// The claim `row` ([`Fence::lock`]) released at `now`, as `release`
    /// does: its lease ended where it runs past `now`. `None` where it
    /// cannot be written here, with nothing written.
    pub(crate) fn release(
        &self,
        row: &access::Locked,
        now: pg_sys::TimestampTz,
    ) -> Result<Option<()>> {
        if self
            .0
            .timestamptz(row, C_HELD_UNTIL)
            .is_none_or(|held| held <= now)
        {
            return Ok(Some(()));
        }
        Ok(self
            .0
            .update(
                row,
                &[(
                    C_HELD_UNTIL,
                    pg_sys::TIMESTAMPTZOID,
                    Some(pg_sys::Datum::from(now)),
                )],
            )?
            .map(|_| ()))
    }
}

/// The arm of [`CLAIM`]'s upsert on a claim row already there, in both
/// forms: a new token and lease where the old lease ran out.
macro_rules! claim_if_free {
    () => {
        " DO UPDATE
                 SET token = held.token OPERATOR(pg_catalog.+) 1, held_until = EXCLUDED.held_until,
                     owner = EXCLUDED.owner, claimed_at = EXCLUDED.claimed_at
               WHERE held.held_until OPERATOR(pg_catalog.<=) $4
              RETURNING held.token"
    };
}

/// Take the workflow when it is free. The `WHERE` on `DO UPDATE` is the "is it
/// free" test: a live lease fails it, nothing is written and no row returns.
/// Two first claims race on the primary key; the loser waits, then takes the
/// `DO UPDATE` arm and finds the lease live.
static CLAIM: Placed = Placed {
    by_workflow: Statement {
        sql: concat!(
            "INSERT INTO sturdy.claims AS held (workflow, token, held_until, owner, claimed_at)
              VALUES ($1, 1, $4 OPERATOR(pg_catalog.+) $2, $3, $4)
              ON CONFLICT (workflow)",
            claim_if_free!()
        ),
        // $4 is `now()`, passed in: Citus refuses a function that is not
        // IMMUTABLE in an upsert's WHERE on a distributed table
        args: CLAIM_ARGS,
        writes: true,
        generic: false,
    },
    with_queues: Statement {
        sql: concat!(
            "INSERT INTO sturdy.claims AS held (place, workflow, token, held_until, owner, claimed_at)
              VALUES (sturdy.workflow_place($1), $1, 1, $4 OPERATOR(pg_catalog.+) $2, $3, $4)
              ON CONFLICT ON CONSTRAINT claims_pkey",
            claim_if_free!()
        ),
        args: CLAIM_ARGS,
        writes: true,
        generic: false,
    },
};

const CLAIM_ARGS: &[pg_sys::Oid] = &[
    pg_sys::TEXTOID,
    pg_sys::INTERVALOID,
    pg_sys::TEXTOID,
    pg_sys::TIMESTAMPTZOID,
];

static RENEW: Placed = Placed {
    by_workflow: Statement {
        sql: "UPDATE sturdy.claims SET held_until = pg_catalog.now() OPERATOR(pg_catalog.+) $3
               WHERE workflow OPERATOR(pg_catalog.=) $1 AND token OPERATOR(pg_catalog.=) $2
                 AND held_until OPERATOR(pg_catalog.>) pg_catalog.now()
              RETURNING held_until",
        args: &[pg_sys::TEXTOID, pg_sys::INT8OID, pg_sys::INTERVALOID],
        writes: true,
        generic: false,
    },
    with_queues: Statement {
        sql: "UPDATE sturdy.claims SET held_until = pg_catalog.now() OPERATOR(pg_catalog.+) $3
               WHERE place OPERATOR(pg_catalog.=) sturdy.workflow_place($1)
                 AND workflow OPERATOR(pg_catalog.=) $1 AND token OPERATOR(pg_catalog.=) $2
                 AND held_until OPERATOR(pg_catalog.>) pg_catalog.now()
              RETURNING held_until",
        args: &[pg_sys::TEXTOID, pg_sys::INT8OID, pg_sys::INTERVALOID],
        writes: true,
        generic: false,
    },
};

static RELEASE: Placed = Placed {
    by_workflow: Statement {
        sql: "UPDATE sturdy.claims SET held_until = pg_catalog.now()
               WHERE workflow OPERATOR(pg_catalog.=) $1 AND token OPERATOR(pg_catalog.=) $2
                 AND held_until OPERATOR(pg_catalog.>) pg_catalog.now()",
        args: &[pg_sys::TEXTOID, pg_sys::INT8OID],
        writes: true,
        generic: false,
    },
    with_queues: Statement {
        sql: "UPDATE sturdy.claims SET held_until = pg_catalog.now()
               WHERE place OPERATOR(pg_catalog.=) sturdy.workflow_place($1)
                 AND workflow OPERATOR(pg_catalog.=) $1 AND token OPERATOR(pg_catalog.=) $2
                 AND held_until OPERATOR(pg_catalog.>) pg_catalog.now()",
        args: &[pg_sys::TEXTOID, pg_sys::INT8OID],
        writes: true,
        generic: false,
    },
};

/// The claim fenced out: a token no pass was given, so every write of the
/// pass that held the claim is refused (SD001); the claim free to take.
static FENCE_OUT: Placed = Placed {
    by_workflow: Statement {
        sql: "UPDATE sturdy.claims
                 SET token = token OPERATOR(pg_catalog.+) 1, held_until = LEAST(held_until, pg_catalog.now())
               WHERE workflow OPERATOR(pg_catalog.=) $1",
        args: &[pg_sys::TEXTOID],
        writes: true,
        generic: false,
    },
    with_queues: Statement {
        sql: "UPDATE sturdy.claims
                 SET token = token OPERATOR(pg_catalog.+) 1, held_until = LEAST(held_until, pg_catalog.now())
               WHERE place OPERATOR(pg_catalog.=) sturdy.workflow_place($1)
                 AND workflow OPERATOR(pg_catalog.=) $1",
        args: &[pg_sys::TEXTOID],
        writes: true,
        generic: false,
    },
};

/// Lock `workflow`'s claim row, where there is one, as `SELECT ... FOR
/// UPDATE` does: `cancel` and `fail` lock the claim before the queue row,
/// the order of every call on a pass (docs/internals.md, "Lock order").
pub(crate) fn lock(workflow: Name) -> Result<()> {
    run_one(FENCE.get(), &[workflow.into()], |_| Ok(()))
}

/// Fence out whoever holds `workflow`'s claim, live or lapsed: its token
/// is no longer the current one (a pass cancelled under its worker).
pub(crate) fn fence_out(workflow: Name) -> Result<()> {
    run_one(FENCE_OUT.get(), &[workflow.into()], |_| Ok(()))
}

/// The current token, as [`FENCE`] reads it and [`CURRENT`] without the
/// lock: its text by placement.
macro_rules! token_of {
    (by_workflow) => {
        "SELECT token FROM sturdy.claims WHERE workflow OPERATOR(pg_catalog.=) $1"
    };
    (with_queues) => {
        "SELECT token FROM sturdy.claims
          WHERE place OPERATOR(pg_catalog.=) sturdy.workflow_place($1)
            AND workflow OPERATOR(pg_catalog.=) $1"
    };
}

/// Lock the claim row and read its token.
static FENCE: Placed = Placed {
    by_workflow: Statement {
        sql: concat!(token_of!(by_workflow), " FOR UPDATE"),
        args: &[pg_sys::TEXTOID],
        writes: true,
        generic: false,
    },
    with_queues: Statement {
        sql: concat!(token_of!(with_queues), " FOR UPDATE"),
        args: &[pg_sys::TEXTOID],
        writes: true,
        generic: false,
    },
};

/// The current token, unlocked: only read to explain a refusal.
static CURRENT: Placed = Placed {
    by_workflow: Statement {
        sql: token_of!(by_workflow),
        args: &[pg_sys::TEXTOID],
        writes: true,
        generic: false,
    },
    with_queues: Statement {
        sql: token_of!(with_queues),
        args: &[pg_sys::TEXTOID],
        writes: true,
        generic: false,
    },
};

/// Compare a pass's token with the workflow's current one (read under lock).
/// Only the current token passes: an older one was superseded, and a newer one
/// was never issued.
pub fn check_token(workflow: Name, token: i64, current: Option<i64>) -> Result<()> {
    if current == Some(token) {
        return Ok(());
    }
    Err(Error::Fenced {
        workflow: workflow.lossy(),
        token,
        current,
    })
}

/// The error for a fenced write found by a statement that returned no row:
/// reads the current token to say which kind of stale token it was.
pub fn fenced(workflow: Name, token: i64) -> Error {
    match run_one(CURRENT.get(), &[workflow.into()], first_value::<i64>) {
        Ok(current) => Error::Fenced {
            workflow: workflow.lossy(),
            token,
            current,
        },
        Err(lookup) => lookup,
    }
}

/// `SELECT ... FOR UPDATE` on the claim row, then the token check: the fence
/// every hand-written or composed exactly-once write starts with.
pub fn fence_current(workflow: Name, token: i64) -> Result<()> {
    let current = run_one(FENCE.get(), &[workflow.into()], first_value)?;
    check_token(workflow, token, current)
}

/// `claim` for validated arguments and no owner: `take(claim => true)`'s
/// claim of the row it leased (the lease and the claim end together, both
/// `now() + lease`).
pub fn claim_for(workflow: Name, lease: Interval) -> Result<Option<i64>> {
    if let Some(token) = claim_here(workflow, lease, None, true)? {
        return Ok(token);
    }
    run_one(
        CLAIM.get(),
        &[
            workflow.into(),
            lease.into(),
            null::<Text>(),
            pgrx::datum::now().into(),
        ],
        first_value,
    )
}

#[sql_function(
    "sturdy.claim(workflow text, lease interval DEFAULT '1 minute', owner text DEFAULT NULL)
     RETURNS bigint VOLATILE PARALLEL UNSAFE",
    comment = "Take the workflow if nobody holds it (never claimed, released, or lease lapsed). Returns the new fencing token, higher than every earlier one, or NULL when someone else holds it."
)]
fn claim(
    workflow: Option<Text>,
    lease: Option<Interval>,
    owner: Option<Text>,
) -> Result<Option<i64>> {
    let workflow = args::name("workflow", workflow)?;
    let lease = args::lease("lease", lease)?;
    let owner = args::optional_name("owner", owner)?;
    if let Some(token) = claim_here(workflow, lease, owner, false)? {
        return Ok(token);
    }
    let owner = owner.map_or_else(null::<Text>, Into::into);
    let now = pgrx::datum::now();
    run_one(
        CLAIM.get(),
        &[workflow.into(), lease.into(), owner, now.into()],
        first_value,
    )
}

/// [`CLAIM`]'s upsert without the statement, where `access` can do it as the
/// statement would: the new token, or `None` where the lease is live (the
/// row kept, and locked, as `DO UPDATE ... WHERE` leaves it). `None` outside:
/// nothing done, the statement's turn.
///
/// `skip_locked` (a take's claim): a claim row another transaction holds
/// locked is held, `None`, without waiting for it. The take holds the rows
/// it leased, and every other call on a pass locks the claim before the row
/// (docs/internals.md, "Lock order"): a stale worker's transaction that
/// wrote under its claim and then ends its row would wait for the take,
/// which would wait for it.
fn claim_here(
    workflow: Name,
    lease: Interval,
    owner: Option<Name>,
    skip_locked: bool,
) -> Result<Option<Option<i64>>> {
    let Some(w) = workflow.into_datum() else {
        return Ok(None);
    };
    // as the statement computes them: `now()` and `now() + lease`
    let now = pgrx::datum::now();
    let until = pg_sys::TimestampTz::from(args::plus(now, lease));
    let now = pg_sys::TimestampTz::from(now);
    let set = [
        (C_TOKEN, pg_sys::INT8OID, Some(pg_sys::Datum::from(1_i64))),
        (
            C_HELD_UNTIL,
            pg_sys::TIMESTAMPTZOID,
            Some(pg_sys::Datum::from(until)),
        ),
        (
            C_OWNER,
            pg_sys::TEXTOID,
            owner.and_then(IntoDatum::into_datum),
        ),
        (
            C_CLAIMED_AT,
            pg_sys::TIMESTAMPTZOID,
            Some(pg_sys::Datum::from(now)),
        ),
    ];
    let (at, place) = crate::placement::kept_at(workflow.bytes());
    let by_place;
    let key: &[(access::Col, pg_sys::Datum)] = match place {
        Some(place) => {
            by_place = [(C_PLACE, place), (C_WORKFLOW, w)];
            &by_place
        }
        None => &[(C_WORKFLOW, w)],
    };
    let upserted = CLAIMS.with(&[pg_sys::ACL_INSERT, pg_sys::ACL_UPDATE], at, |table| {
        table.upsert(&access::Upsert {
            key,
            set: &set,
            fill: &[],
            insert_only: &[],
            only_if: Some((C_HELD_UNTIL, now)),
            increment: Some(C_TOKEN),
            skip_locked,
        })
    })?;
    Ok(upserted.map(|done| match done {
        access::Upserted::Inserted => Some(1),
        access::Upserted::Updated(token) => token,
        access::Upserted::Kept => None,
    }))
}

#[sql_function(
    "sturdy.renew(workflow text, token bigint, lease interval) RETURNS timestamptz VOLATILE PARALLEL UNSAFE",
    comment = "Extend a live claim to now() + lease. Returns the new expiry, or NULL when the token is no longer current or its lease already lapsed."
)]
fn renew(
    workflow: Option<Text>,
    token: Option<i64>,
    lease: Option<Interval>,
) -> Result<Option<TimestampWithTimeZone>> {
    let workflow = args::name("workflow", workflow)?;
    let token = args::required("token", token)?;
    let lease = args::lease("lease", lease)?;
    run_one(
        RENEW.get(),
        &[workflow.into(), token.into(), lease.into()],
        first_value,
    )
}

#[sql_function(
    "sturdy.release(workflow text, token bigint) RETURNS boolean VOLATILE PARALLEL UNSAFE",
    comment = "Hand a live claim back early, keeping its token so the next claim gets the next number. True when this call let go of a live claim."
)]
fn release(workflow: Option<Text>, token: Option<i64>) -> Result<bool> {
    let workflow = args::name("workflow", workflow)?;
    let token = args::required("token", token)?;
    release_current(workflow, token)
}

/// `release` for validated arguments: whether a live claim of this token
/// was let go.
pub fn release_current(workflow: Name, token: i64) -> Result<bool> {
    run_one(RELEASE.get(), &[workflow.into(), token.into()], |t| {
        Ok(!t.is_empty())
    })
}

#[sql_function(
    "sturdy.fence(workflow text, token bigint) RETURNS void VOLATILE PARALLEL UNSAFE",
    comment = "Lock the claim row (FOR UPDATE) and raise SD001 unless token is the current one: the first statement of a hand-written exactly-once transaction."
)]
fn fence(workflow: Option<Text>, token: Option<i64>) -> Result<()> {
    let workflow = args::name("workflow", workflow)?;
    let token = args::required("token", token)?;
    fence_current(workflow, token)
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::testing::{count, sqlstate_of};
    use pgrx::prelude::*;

    fn one_i64(sql: &str) -> Option<i64> {
        Spi::get_one::<i64>(sql).unwrap()
    }

    #[pg_test]
    fn first_claim_is_token_one_and_a_held_claim_returns_null() {
        assert_eq!(one_i64("SELECT sturdy.claim('w1')"), Some(1));
        assert_eq!(one_i64("SELECT sturdy.claim('w1')"), None);
        assert_eq!(
            one_i64("SELECT token FROM sturdy.claims WHERE workflow = 'w1'"),
            Some(1)
        );
    }

    #[pg_test]
    fn a_lapsed_lease_is_taken_with_the_next_token() {
        assert_eq!(one_i64("SELECT sturdy.claim('w2', '1 hour', 'a')"), Some(1));
        // now() is frozen inside a test transaction: lapse the lease by hand.
        Spi::run("UPDATE sturdy.claims SET held_until = now() - interval '1 second' WHERE workflow = 'w2'").unwrap();
        assert_eq!(one_i64("SELECT sturdy.claim('w2', '1 hour', 'b')"), Some(2));
        let owner = Spi::get_one::<String>("SELECT owner FROM sturdy.claims WHERE workflow = 'w2'")
            .unwrap();
        assert_eq!(owner.as_deref(), Some("b"));
    }

    /// A claim that inserts before it looks (among new workflows: at most
    /// four of its backend's last 32 claims found a row, access/insert.rs) and meets
    /// the workflow's row there fences by that row as a look would: a held
    /// claim is refused, a lapsed one taken with the next token.
    #[pg_test]
    fn a_claim_among_new_workflows_still_fences_by_the_row_there() {
        let blind = || crate::access::INSERTED_FIRST.with(|n| n.get());
        assert_eq!(one_i64("SELECT sturdy.claim('cf-held', '1 hour')"), Some(1));
        assert_eq!(
            one_i64("SELECT sturdy.claim('cf-lapsed', '1 hour')"),
            Some(1)
        );
        Spi::run("UPDATE sturdy.claims SET held_until = now() - interval '1 second' WHERE workflow = 'cf-lapsed'").unwrap();
        // 28 new ones: whatever came before, at most four of the last 32 found a row
        for i in 0..28 {
            assert_eq!(
                one_i64(&format!("SELECT sturdy.claim('cf-new-{i}')")),
                Some(1)
            );
        }
        let (tried, missed) = blind();
        assert_eq!(
            one_i64("SELECT sturdy.claim('cf-lapsed', '1 hour')"),
            Some(2)
        );
        assert_eq!(
            blind(),
            (tried + 1, missed + 1),
            "inserted first, met the row"
        );
        assert_eq!(one_i64("SELECT sturdy.claim('cf-held')"), None);
        assert_eq!(blind(), (tried + 2, missed + 2));
        assert_eq!(
            Spi::get_one::<String>(
                "SELECT string_agg(workflow || '=' || token, ',' ORDER BY workflow)
                   FROM sturdy.claims WHERE workflow IN ('cf-held', 'cf-lapsed')"
            )
            .unwrap()
            .as_deref(),
            Some("cf-held=1,cf-lapsed=2"),
            "one row each, the tokens a look would have written"
        );
    }

    /// `claim` through `access` (no statement) and through its statement
    /// where the table asks for more (a trigger): the same tokens, the same
    /// rows, the same refusals; and the same error at the last token.
    #[pg_test]
    fn claim_upserts_without_a_statement_and_with_one_where_a_trigger_must_fire() {
        let served = crate::access::served;
        let row = |w: &str| {
            Spi::get_one::<String>(&format!(
                "SELECT concat_ws(' ', token, held_until - now(), owner, claimed_at = now())
                   FROM sturdy.claims WHERE workflow = '{w}'"
            ))
            .unwrap()
        };
        let lapse = |w: &str| {
            Spi::run(&format!(
                "UPDATE sturdy.claims SET held_until = now() - interval '1 second' WHERE workflow = '{w}'"
            ))
            .unwrap()
        };
        for through_statement in [false, true] {
            let w = if through_statement { "ct" } else { "ca" };
            let before = served();
            assert_eq!(
                one_i64(&format!("SELECT sturdy.claim('{w}', '2 minutes', 'x')")),
                Some(1)
            );
            assert_eq!(row(w).as_deref(), Some("1 00:02:00 x t"), "{w}");
            assert_eq!(
                one_i64(&format!("SELECT sturdy.claim('{w}')")),
                None,
                "held"
            );
            assert_eq!(row(w).as_deref(), Some("1 00:02:00 x t"), "kept as it was");
            lapse(w);
            assert_eq!(one_i64(&format!("SELECT sturdy.claim('{w}')")), Some(2));
            assert_eq!(
                row(w).as_deref(),
                Some("2 00:01:00 t"),
                "owner gone, lease anew"
            );
            Spi::run(&format!(
                "UPDATE sturdy.claims SET token = 9223372036854775807 WHERE workflow = '{w}'"
            ))
            .unwrap();
            lapse(w);
            assert_eq!(
                sqlstate_of(&format!("SELECT sturdy.claim('{w}')")),
                "22003",
                "no token after the last"
            );
            assert_eq!(
                served() == before,
                through_statement,
                "{w}: served here only without the trigger"
            );
            if !through_statement {
                crate::testing::trigger_noop("sturdy.claims", "INSERT OR UPDATE");
            }
        }
    }

    #[pg_test]
    fn release_keeps_the_token_and_frees_the_workflow() {
        assert_eq!(one_i64("SELECT sturdy.claim('w3')"), Some(1));
        assert_eq!(
            Spi::get_one::<bool>("SELECT sturdy.release('w3', 2)").unwrap(),
            Some(false)
        );
        assert_eq!(
            Spi::get_one::<bool>("SELECT sturdy.release('w3', 1)").unwrap(),
            Some(true)
        );
        assert_eq!(
            Spi::get_one::<bool>("SELECT sturdy.release('w3', 1)").unwrap(),
            Some(false)
        );
        assert_eq!(one_i64("SELECT sturdy.claim('w3')"), Some(2));
    }

    #[pg_test]
    fn renew_extends_only_the_current_live_token() {
        assert_eq!(one_i64("SELECT sturdy.claim('w4', '1 minute')"), Some(1));
        let extended = Spi::get_one::<bool>(
            "SELECT sturdy.renew('w4', 1, '1 hour') = now() + interval '1 hour'",
        )
        .unwrap();
        assert_eq!(extended, Some(true));
        assert_eq!(
            Spi::get_one::<bool>(
                "SELECT held_until = now() + interval '1 hour' FROM sturdy.claims WHERE workflow = 'w4'"
            )
            .unwrap(),
            Some(true),
            "the row holds the new expiry"
        );
        assert_eq!(
            Spi::get_one::<bool>("SELECT sturdy.renew('w4', 7, '1 hour') IS NULL").unwrap(),
            Some(true)
        );
        assert_eq!(
            Spi::get_one::<bool>(
                "SELECT held_until = now() + interval '1 hour' FROM sturdy.claims WHERE workflow = 'w4'"
            )
            .unwrap(),
            Some(true),
            "a refused renew leaves the row as it was"
        );
        Spi::run("UPDATE sturdy.claims SET held_until = now() WHERE workflow = 'w4'").unwrap();
        assert_eq!(
            Spi::get_one::<bool>("SELECT sturdy.renew('w4', 1, '1 hour') IS NULL").unwrap(),
            Some(true)
        );
    }

    #[pg_test]
    fn fence_refuses_old_unknown_and_future_tokens() {
        assert_eq!(sqlstate_of("SELECT sturdy.fence('never', 1)"), "SD001");
        assert_eq!(one_i64("SELECT sturdy.claim('w5')"), Some(1));
        assert_eq!(sqlstate_of("SELECT sturdy.fence('w5', 1)"), "00000");
        assert_eq!(sqlstate_of("SELECT sturdy.fence('w5', 2)"), "SD001");
        assert_eq!(sqlstate_of("SELECT sturdy.fence('w5', 0)"), "SD001");
    }

    #[pg_test]
    fn claim_bad_arguments_are_refused_and_write_nothing() {
        for (sql, state) in [
            ("SELECT sturdy.claim(NULL)", "22004"),
            ("SELECT sturdy.claim('')", "22023"),
            ("SELECT sturdy.claim(repeat('x', 1025))", "22023"),
            ("SELECT sturdy.claim('b', NULL)", "22004"),
            ("SELECT sturdy.claim('b', '0 seconds')", "22023"),
            ("SELECT sturdy.claim('b', '-1 minute')", "22023"),
            ("SELECT sturdy.claim('b', '1 day -24 hours')", "22023"),
            // compared as Postgres compares intervals (a month is 30 days)
            // these are positive, yet now() + lease is in the past
            (
                "SELECT sturdy.claim('b', '-12 mons 360 days 00:00:01')",
                "22023",
            ),
            ("SELECT sturdy.claim('b', '-1 year 365 days')", "22023"),
            (
                "SELECT sturdy.renew('b', 1, '-12 mons 360 days 00:00:01')",
                "22023",
            ),
            ("SELECT sturdy.claim('b', '1 minute', '')", "22023"),
            ("SELECT sturdy.renew('b', NULL, '1 minute')", "22004"),
            ("SELECT sturdy.renew('b', 1, '0 s')", "22023"),
            ("SELECT sturdy.release(NULL, 1)", "22004"),
            ("SELECT sturdy.fence('b', NULL)", "22004"),
        ] {
            assert_eq!(sqlstate_of(sql), state, "{sql}");
        }
        assert_eq!(count("sturdy.claims"), 0);
    }

    #[pg_test]
    fn claim_hostile_names_are_data() {
        let name = "x'); DROP TABLE sturdy.claims; --";
        let token =
            Spi::get_one_with_args::<i64>("SELECT sturdy.claim($1)", &[name.into()]).unwrap();
        assert_eq!(token, Some(1));
        assert_eq!(count("sturdy.claims"), 1);
    }

    /// Every name column compares byte for byte (sql/claims.sql says why),
    /// and still joins an application's ordinary text column without help.
    #[pg_test]
    fn name_columns_are_collate_c_and_join_plain_text() {
        let not_c = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_attribute
              WHERE attrelid IN ('sturdy.claims'::regclass, 'sturdy.checkpoints'::regclass,
                                 'sturdy.queue'::regclass)
                AND attname IN ('workflow', 'step', 'queue')
                AND attcollation <> 'pg_catalog.\"C\"'::regcollation",
        )
        .unwrap();
        assert_eq!(not_c, Some(0));
        Spi::run("SELECT sturdy.claim('Order-1'), sturdy.claim('order-1')").unwrap();
        let joined = Spi::get_one::<i64>(
            "SELECT count(*) FROM (VALUES ('order-1'::text)) app(id)
               JOIN sturdy.claims c ON c.workflow = app.id",
        )
        .unwrap();
        assert_eq!(joined, Some(1));
    }
}
