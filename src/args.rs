//! Argument checks shared by every capability: validate first, write second.
//!
//! A check turns a raw argument (`Option<...>`, since every function takes
//! NULLs in order to refuse them by name) into a value that is known good.
//! Capabilities that share work share core functions taking these validated
//! types, never raw arguments.

use pgrx::IntoDatum;
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys;

use crate::datum::Text;
use crate::error::{Error, MAX_NAME_BYTES, Result};

/// A name (workflow, step, queue, owner) that passed [`name`]: not NULL, not
/// empty, at most [`MAX_NAME_BYTES`] bytes.
#[derive(Clone, Copy, Debug)]
pub struct Name(Text);

impl Name {
    /// For messages: the name as UTF-8, with anything else replaced.
    pub fn lossy(&self) -> String {
        self.0.lossy()
    }

    /// The name's bytes, in the server encoding.
    pub fn bytes(&self) -> &[u8] {
        self.0.bytes()
    }
}

impl IntoDatum for Name {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        self.0.into_datum()
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::TEXTOID
    }
}

/// A required argument: NULL is refused.
pub fn required<T>(arg: &'static str, v: Option<T>) -> Result<T> {
    v.ok_or(Error::Null { arg })
}

/// A required name: NULL, empty and over-long are refused.
pub fn name(arg: &'static str, v: Option<Text>) -> Result<Name> {
    let v = required(arg, v)?;
    match v.bytes().len() {
        0 => Err(Error::Empty { arg }),
        n if n > MAX_NAME_BYTES => Err(Error::TooLong { arg, bytes: n }),
        _ => Ok(Name(v)),
    }
}

/// An optional name: NULL passes, empty and over-long are refused.
pub fn optional_name(arg: &'static str, v: Option<Text>) -> Result<Option<Name>> {
    v.map(|v| name(arg, Some(v))).transpose()
}

/// A required interval that ends after it begins: `now() + v > now()`,
/// computed as the statements compute it (calendar months and years, days
/// across a daylight-saving change in the session's time zone). Comparing
/// the interval itself is not enough: Postgres orders intervals counting a
/// month as 30 days, so `'-1 mon 31 days'` compares positive yet may end
/// now, and `'-12 mons 360 days'` ends five days ago.
pub fn lease(arg: &'static str, v: Option<Interval>) -> Result<Interval> {
    let v = required(arg, v)?;
    let now = pgrx::datum::now();
    if pg_sys::TimestampTz::from(plus(now, v)) <= pg_sys::TimestampTz::from(now) {
        return Err(Error::NotPositive {
            arg,
            got: v.to_string(),
            interval: true,
        });
    }
    Ok(v)
}

/// `at + v`, as the server's `+` adds them: where `v` has no days or months
/// (a lease is most often seconds or minutes) and `at` is finite, the sum of
/// their microseconds, without a call into the server (its addition works
/// through the session's time zone, a few microseconds a call); otherwise, or
/// where the sum leaves `timestamptz`'s range, the server's own addition
/// (which raises that).
pub fn plus(at: TimestampWithTimeZone, v: Interval) -> TimestampWithTimeZone {
    if v.months() == 0
        && v.days() == 0
        && at.is_finite()
        && let Some(t) = pg_sys::TimestampTz::from(at).checked_add(v.micros())
        && let Ok(sum) = TimestampWithTimeZone::try_from(t)
        && sum.is_finite()
    {
        return sum;
    }
    at + v
}

/// A required count that must be at least one.
pub fn positive(arg: &'static str, v: Option<i32>) -> Result<i32> {
    match required(arg, v)? {
        n if n > 0 => Ok(n),
        n => Err(Error::NotPositive {
            arg,
            got: n.to_string(),
            interval: false,
        }),
    }
}

/// The most rows one call of `take`, `done_many` or `pump` handles: a batch
/// past it holds more row locks, and a longer transaction, than a worker's
/// batch should; call again for more.
pub const MAX_BATCH: i32 = 10_000;

/// `v` (already checked positive) no larger than `max`, a documented
/// maximum of an argument that sizes work: past it a clear error, never a
/// statement that runs until it is cancelled.
pub fn at_most(arg: &'static str, v: i32, max: i32, hint: &'static str) -> Result<i32> {
    if v > max {
        return Err(Error::Invalid {
            arg,
            why: format!("must be at most {max}, got {v}"),
            hint,
        });
    }
    Ok(v)
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::datum::{Interval, TimestampWithTimeZone};
    use pgrx::pg_sys;
    use pgrx::prelude::*;

    /// [`super::plus`] gives what the server's `now() + v` gives, by the sum
    /// of microseconds or by the server's own addition.
    #[pg_test]
    fn plus_adds_as_the_server_does() {
        for v in [
            "1 minute",
            "30 seconds",
            "1 microsecond",
            "-1 minute",
            "0",
            "1 day",
            "1 mon",
            "1 day -24 hours",
            "-12 mons 360 days 00:00:01",
            "100 years",
        ] {
            let (interval, server) = Spi::get_two::<Interval, TimestampWithTimeZone>(&format!(
                "SELECT interval '{v}', now() + interval '{v}'"
            ))
            .unwrap();
            let ours = super::plus(pgrx::datum::now(), interval.unwrap());
            assert_eq!(
                pg_sys::TimestampTz::from(ours),
                pg_sys::TimestampTz::from(server.unwrap()),
                "now() + '{v}'"
            );
        }
    }
}
