//! Every error pg_sturdy raises: one enum, each variant with its SQLSTATE, a
//! message that names the argument, and a hint that says what to do.
//!
//! This module only describes errors. Raising them with their own SQLSTATE is
//! `fmgr`'s job (pgrx would re-code `SD001` to `XX000`; see `fmgr.rs`).

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
    /// A lease, count or size that must be positive was not. For an interval
    /// that means `now() + it` is not after `now()`, as the server adds it.
    NotPositive {
        arg: &'static str,
        got: String,
        /// An interval (its end must come after its start), not a number.
        interval: bool,
    },
    /// An argument of the right type whose value cannot be used (two arrays
    /// of different lengths, a multi-dimensional array).
    Invalid {
        arg: &'static str,
        why: String,
        hint: &'static str,
    },
    /// The pass's token is not the workflow's current claim (or there is none).
    Fenced {
        workflow: String,
        token: i64,
        current: Option<i64>,
    },
    /// `finish` asked to move an instance that is already in a terminal status.
    Terminal {
        workflow: String,
        status: String,
        to: String,
    },
    /// `transact`'s effect is not a plain `jsonb -> jsonb` function.
    EffectSignature { effect: String },
    /// The caller may not execute a function we were asked to call
    /// (`transact`'s effect, a subscriber).
    NotPermitted { function: String },
    /// A subscriber is not a function `(message sturdy.outbox, attempt integer)`.
    SubscriberSignature { subscriber: String },
    /// A subscriber that no longer exists (dropped after `subscribe`).
    SubscriberMissing { subscriber: String },
    /// `transact`'s effect returned SQL NULL.
    EffectReturnedNull { effect: String },
    /// `transact`'s effect inserted the very checkpoint row `transact` writes.
    EffectWroteStep { effect: String, step: String },
    /// An error Postgres (or caller code we ran) raised underneath us, passed
    /// on as it was: its own SQLSTATE, message, detail and hint.
    Raised {
        code: [u8; 5],
        message: String,
        detail: Option<String>,
        hint: Option<String>,
    },
    /// Something that is a bug in pg_sturdy, not the caller's input.
    Internal {
        context: &'static str,
        cause: String,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The five-character SQLSTATE the client sees.
    pub fn sqlstate(&self) -> [u8; 5] {
        match self {
            Error::Null { .. } | Error::EffectReturnedNull { .. } => *b"22004",
            Error::Empty { .. }
            | Error::TooLong { .. }
            | Error::NotPositive { .. }
            | Error::Invalid { .. }
            | Error::EffectSignature { .. }
            | Error::SubscriberSignature { .. }
            | Error::EffectWroteStep { .. } => *b"22023",
            Error::NotPermitted { .. } => *b"42501",
            Error::SubscriberMissing { .. } => *b"42883",
            Error::Fenced { .. } => *b"SD001",
            Error::Terminal { .. } => *b"SD002",
            Error::Raised { code, .. } => *code,
            Error::Internal { .. } => *b"XX000",
        }
    }

    /// The DETAIL line, where there is one.
    pub fn detail(&self) -> Option<String> {
        match self {
            Error::Raised { detail, .. } => detail.clone(),
            _ => None,
        }
    }

    /// The HINT line: what to do about it.
    pub fn hint(&self) -> Option<String> {
        Some(match self {
            Error::Null { arg } => format!("Pass a non-NULL {arg}."),
            Error::Empty { arg } => format!("Pass a non-empty {arg}."),
            Error::TooLong { arg, .. } => {
                format!(
                    "Use {} {arg} of at most {MAX_NAME_BYTES} bytes, e.g. a hash of the long key.",
                    article(arg)
                )
            }
            Error::NotPositive {
                arg,
                interval: true,
                ..
            } => format!(
                "Pass {} {arg} greater than zero: now() + {arg} must be later than now(), e.g. '30 seconds'.",
                article(arg)
            ),
            Error::NotPositive { arg, .. } => {
                format!("Pass {} {arg} greater than zero.", article(arg))
            }
            Error::Invalid { hint, .. } => (*hint).into(),
            Error::Fenced { current: None, .. } => {
                "Claim the workflow with sturdy.claim first and pass the token it returns. Nothing was written.".into()
            }
            Error::Fenced { token, current: Some(current), .. } if token > current => {
                "This token was never issued for this workflow: pass the token sturdy.claim returned. \
                 Nothing was written."
                    .into()
            }
            Error::Fenced { .. } => "Another pass has claimed this workflow since this token was issued: \
                 stop this pass and let the newer one carry on. Nothing was written."
                .into(),
            Error::Terminal { .. } => "A finished instance keeps its status: finish without a status, \
                 or start a new instance. Nothing was written."
                .into(),
            Error::EffectSignature { .. } => {
                "An effect is a function (arg jsonb) RETURNS jsonb, e.g. 'my_effect(jsonb)'::regprocedure."
                    .into()
            }
            Error::NotPermitted { .. } => {
                "GRANT EXECUTE on the function to this role, or pass a function it may call.".into()
            }
            Error::SubscriberSignature { .. } => {
                "A subscriber is a function (message sturdy.outbox, attempt integer), e.g. \
                 'app.on_order(sturdy.outbox, integer)'::regprocedure; its result is ignored."
                    .into()
            }
            Error::SubscriberMissing { .. } => {
                "Create the function again, or sturdy.unsubscribe it; then sturdy.redrive the dead deliveries."
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
            Error::Raised { hint, .. } => return hint.clone(),
            Error::Internal { .. } => "This is a bug in pg_sturdy; please report it with this message.".into(),
        })
    }
}

/// "a" or "an" before an argument's name, as it is said.
fn article(arg: &str) -> &'static str {
    match arg.as_bytes().first() {
        Some(b'a' | b'e' | b'i' | b'o' | b'u') => "an",
        _ => "a",
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
            Error::NotPositive { arg, got, .. } => write!(f, "{arg} must be positive, got {got}"),
            Error::Invalid { arg, why, .. } => write!(f, "{arg} {why}"),
            Error::Fenced {
                workflow,
                token,
                current: Some(current),
            } if token > current => write!(
                f,
                "workflow {workflow:?} is fenced: token {token} was never issued (the current claim is {current})"
            ),
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
            } => write!(
                f,
                "workflow {workflow:?} is fenced: token {token} was never issued (no claim exists)"
            ),
            Error::Terminal {
                workflow,
                status,
                to,
            } => write!(
                f,
                "the instance of workflow {workflow:?} is {status}, a terminal status, and cannot move to {to}"
            ),
            Error::EffectSignature { effect } => write!(
                f,
                "effect {effect} must be a plain function taking one jsonb argument and returning jsonb"
            ),
            Error::NotPermitted { function } => {
                write!(f, "permission denied for function {function}")
            }
            Error::SubscriberSignature { subscriber } => write!(
                f,
                "subscriber {subscriber} must be a plain function taking (sturdy.outbox, integer)"
            ),
            Error::SubscriberMissing { subscriber } => {
                write!(f, "subscriber function {subscriber} does not exist")
            }
            Error::EffectReturnedNull { effect } => write!(f, "effect {effect} returned NULL"),
            Error::EffectWroteStep { effect, step } => write!(
                f,
                "effect {effect} wrote the checkpoint of step {step:?} itself, so transact cannot record it"
            ),
            Error::Raised { message, .. } => f.write_str(message),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn fenced(token: i64, current: Option<i64>) -> Error {
        Error::Fenced {
            workflow: "w".into(),
            token,
            current,
        }
    }

    #[test]
    fn a_fence_says_which_kind_of_stale_token_it_saw() {
        assert!(
            fenced(1, Some(2))
                .hint()
                .unwrap()
                .starts_with("Another pass has claimed")
        );
        assert!(
            fenced(3, Some(2))
                .to_string()
                .contains("was never issued (the current claim is 2)")
        );
        assert!(
            fenced(3, Some(2))
                .hint()
                .unwrap()
                .starts_with("This token was never issued")
        );
        assert!(
            fenced(1, None)
                .hint()
                .unwrap()
                .starts_with("Claim the workflow")
        );
        assert_eq!(&fenced(1, None).sqlstate(), b"SD001");
    }

    #[test]
    fn a_passed_on_error_keeps_what_it_had() {
        let e = Error::Raised {
            code: *b"AB123",
            message: "m".into(),
            detail: Some("d".into()),
            hint: None,
        };
        assert_eq!(
            (&e.sqlstate(), e.to_string(), e.detail(), e.hint()),
            (b"AB123", "m".into(), Some("d".into()), None)
        );
    }
}
