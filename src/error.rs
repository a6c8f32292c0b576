//! Every error pg_sturdy raises, each with its SQLSTATE, a message that names
//! the argument, and a hint that says what to do.
//!
//! How an error reaches the client is the subtle part. pgrx's error code enum is
//! closed, and any SQLSTATE it does not know (our `SD001`) is re-coded to
//! `XX000` as it crosses a pgrx frame. So no function here raises while inside
//! pgrx: a function that fails *stores* its error and returns normally, and the
//! SQL-visible entry point (see [`entry_points!`]) raises the stored error with
//! its real SQLSTATE after pgrx's guard has returned. On the success path this
//! costs one thread-local check. Errors that Postgres raises underneath us
//! (a `timestamp out of range`, a unique violation inside a caller's effect)
//! carry standard SQLSTATEs and pass through pgrx unchanged.

use std::cell::RefCell;
use std::fmt;

/// The longest workflow, step, queue or owner name accepted, in bytes. Names
/// are primary-key columns, and a btree entry over ~2.7 kB is refused by
/// Postgres with a message about index rows; we say it first, about the name.
pub const MAX_NAME_BYTES: usize = 1024;

#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// An argument that must be given was SQL NULL.
    Null { arg: &'static str },
    /// A name that must not be empty was `''`.
    Empty { arg: &'static str },
    /// A name longer than [`MAX_NAME_BYTES`].
    TooLong { arg: &'static str, bytes: usize },
    /// A lease, count or size that must be positive was not.
    NotPositive { arg: &'static str, got: String },
    /// The pass's token is not the workflow's current claim (or there is none).
    Fenced {
        workflow: String,
        token: i64,
        current: Option<i64>,
    },
    /// `transact`'s effect is not a plain `jsonb -> jsonb` function.
    EffectSignature { effect: String },
    /// `transact`'s effect returned SQL NULL.
    EffectReturnedNull { effect: String },
    /// `transact`'s effect inserted the very checkpoint row `transact` writes.
    EffectWroteStep { effect: String, step: String },
    /// SPI failed in a way that is a bug in pg_sturdy, not the caller's input.
    Internal {
        context: &'static str,
        cause: String,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The five-character SQLSTATE the client sees.
    pub fn sqlstate(&self) -> &'static [u8; 5] {
        match self {
            Error::Null { .. } | Error::EffectReturnedNull { .. } => b"22004",
            Error::Empty { .. }
            | Error::TooLong { .. }
            | Error::NotPositive { .. }
            | Error::EffectSignature { .. }
            | Error::EffectWroteStep { .. } => b"22023",
            Error::Fenced { .. } => b"SD001",
            Error::Internal { .. } => b"XX000",
        }
    }

    pub fn hint(&self) -> String {
        match self {
            Error::Null { arg } => format!("Pass a non-NULL {arg}."),
            Error::Empty { arg } => format!("Pass a non-empty {arg}."),
            Error::TooLong { arg, .. } => {
                format!("Use a {arg} of at most {MAX_NAME_BYTES} bytes, e.g. a hash of the long key.")
            }
            Error::NotPositive { arg, .. } => format!("Pass a {arg} greater than zero."),
            Error::Fenced { current: Some(_), .. } => "Another pass has claimed this workflow since this token \
                 was issued: stop this pass and let the newer one carry on. Nothing was written."
                .into(),
            Error::Fenced { current: None, .. } => {
                "Claim the workflow with sturdy.claim first and pass the token it returns. Nothing was written.".into()
            }
            Error::EffectSignature { .. } => {
                "An effect is a function (arg jsonb) RETURNS jsonb, e.g. \
                 'my_effect(jsonb)'::regprocedure."
                    .into()
            }
            Error::EffectReturnedNull { .. } => {
                "Return 'null'::jsonb to record a JSON null; a STRICT effect returns NULL when arg is NULL.".into()
            }
            Error::EffectWroteStep { .. } => {
                "An effect writes the application's tables and returns the step's value; \
                 sturdy.transact records it."
                    .into()
            }
            Error::Internal { .. } => "This is a bug in pg_sturdy; please report it with this message.".into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Null { arg } => write!(f, "{arg} must not be NULL"),
            Error::Empty { arg } => write!(f, "{arg} must not be empty"),
            Error::TooLong { arg, bytes } => {
                write!(
                    f,
                    "{arg} is {bytes} bytes long; the limit is {MAX_NAME_BYTES}"
                )
            }
            Error::NotPositive { arg, got } => write!(f, "{arg} must be positive, got {got}"),
            Error::Fenced {
                workflow,
                token,
                current: Some(current),
            } => write!(
                f,
                "workflow {workflow:?} is fenced: token {token} is not the current claim ({current})"
            ),
            Error::Fenced {
                workflow,
                token,
                current: None,
            } => {
                write!(
                    f,
                    "workflow {workflow:?} is fenced: token {token} was never issued (no claim exists)"
                )
            }
            Error::EffectSignature { effect } => {
                write!(
                    f,
                    "effect {effect} must be a plain function taking one jsonb argument and returning jsonb"
                )
            }
            Error::EffectReturnedNull { effect } => write!(f, "effect {effect} returned NULL"),
            Error::EffectWroteStep { effect, step } => write!(
                f,
                "effect {effect} wrote the checkpoint of step {step:?} itself, so transact cannot record it"
            ),
            Error::Internal { context, cause } => {
                write!(f, "pg_sturdy internal error in {context}: {cause}")
            }
        }
    }
}

impl From<pgrx::spi::Error> for Error {
    fn from(e: pgrx::spi::Error) -> Self {
        Error::Internal {
            context: "SPI",
            cause: e.to_string(),
        }
    }
}

// ---------------------------------------------------------------------------
// Argument checks shared by every capability.

/// A required argument: NULL is refused.
pub fn required<T>(arg: &'static str, v: Option<T>) -> Result<T> {
    v.ok_or(Error::Null { arg })
}

/// A required name: NULL, empty and over-long are refused.
pub fn name<'a>(arg: &'static str, v: Option<&'a str>) -> Result<&'a str> {
    let v = required(arg, v)?;
    if v.is_empty() {
        return Err(Error::Empty { arg });
    }
    if v.len() > MAX_NAME_BYTES {
        return Err(Error::TooLong {
            arg,
            bytes: v.len(),
        });
    }
    Ok(v)
}

/// An optional name: NULL passes, empty and over-long are refused.
pub fn optional_name<'a>(arg: &'static str, v: Option<&'a str>) -> Result<Option<&'a str>> {
    v.map(|v| name(arg, Some(v))).transpose()
}

/// A required, strictly positive interval. Compared the way Postgres compares
/// intervals (a month is 30 days), so `'1 month -29 days'` is positive and
/// `'1 day -24 hours'` is not.
pub fn lease(arg: &'static str, v: Option<pgrx::datum::Interval>) -> Result<pgrx::datum::Interval> {
    let v = required(arg, v)?;
    if v.as_micros() <= 0 {
        return Err(Error::NotPositive {
            arg,
            got: crate::spi::interval_text(v),
        });
    }
    Ok(v)
}

// ---------------------------------------------------------------------------
// Deferred raising.

thread_local! {
    static PENDING: RefCell<Option<Error>> = const { RefCell::new(None) };
}

/// Turn a result into what a `#[pg_extern]` returns: the value, or `None`
/// with the error stored for the entry point to raise once pgrx has returned.
pub fn deliver<T>(r: Result<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            PENDING.with(|p| *p.borrow_mut() = Some(e));
            None
        }
    }
}

/// Forget an error left by a call that never reached its entry point's raise.
pub fn clear_pending() {
    PENDING.with(|p| p.borrow_mut().take());
}

/// Take the stored error, if the call that just returned failed.
pub fn take_pending() -> Option<Error> {
    PENDING.with(|p| p.borrow_mut().take())
}

/// Declare SQL-visible entry points: for each `symbol => wrapper`, a V1 C
/// function `symbol` that clears any stale error, runs pgrx's generated
/// `wrapper` (which converts arguments and catches panics and Postgres errors),
/// and then raises the error the call stored, with its own SQLSTATE. The SQL
/// scripts in `sql/` point `CREATE FUNCTION ... AS 'MODULE_PATHNAME', 'symbol'`
/// here.
#[macro_export]
macro_rules! entry_points {
    ($($symbol:ident, $finfo:ident => $wrapper:path;)*) => {$(
        #[unsafe(no_mangle)]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
            const V1: ::pgrx::pg_sys::Pg_finfo_record = ::pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }
        #[unsafe(no_mangle)]
        #[doc(hidden)]
        pub unsafe extern "C-unwind" fn $symbol(fcinfo: ::pgrx::pg_sys::FunctionCallInfo) -> ::pgrx::pg_sys::Datum {
            $crate::error::clear_pending();
            // SAFETY: `fcinfo` is the call Postgres made to `$symbol`, handed on unchanged
            // to the wrapper pgrx generated for the same SQL signature.
            let datum = unsafe { $wrapper(fcinfo) };
            if let Some(e) = $crate::error::take_pending() {
                $crate::spi::raise(e);
            }
            datum
        }
    )*};
}
