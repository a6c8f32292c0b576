//! SQL written by the caller: fragments placed into a statement we build
//! (`batch`'s `set_clause`, `pending` and `order_by`), and statements whose
//! parameter types are inferred from context, as an untyped `PREPARE` infers
//! them.
//!
//! A fragment is code, not a value: it runs with the caller's rights and
//! `search_path`, and is the caller's to get right. What we check is that it
//! is one piece of the kind its place takes and nothing more: a predicate
//! parses as one expression, a `SET` list as one list of assignments, an
//! `ORDER BY` as one list of sort keys. A `;` and a second statement, a
//! comment that swallows what follows, or a fragment that closes our
//! parenthesis to add clauses of its own (`x) UNION SELECT ...`) is refused
//! before anything runs. Values never enter the SQL text: `$1..$n` in the
//! fragments are bound.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString};

use pgrx::pg_sys;

use crate::error::{Error, Result};

/// Where a fragment goes.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// A boolean expression (a `WHERE` condition).
    Predicate,
    /// The assignments of an `UPDATE ... SET`.
    SetList,
    /// The sort keys of an `ORDER BY`.
    OrderBy,
}

fn c_string(arg: &'static str, text: &str) -> Result<CString> {
    CString::new(text).map_err(|_| Error::Invalid {
        arg,
        why: "contains a NUL character".into(),
        hint: "Pass SQL text without NUL characters.",
    })
}

/// Check that `text` is exactly one fragment of `kind`.
pub fn check(kind: Kind, arg: &'static str, text: &str) -> Result<()> {
    let refuse = |what: &str| Error::Invalid {
        arg,
        why: format!("must be {what}, got {text:?}"),
        hint: "A fragment is one piece of SQL for its place: no ';', no second statement, no clauses of its own, no parenthesis it does not open.",
    };
    // The fragment sits on lines of its own, so a `--` comment in it ends
    // with its line; an unclosed `/*` swallows what follows and fails to
    // parse.
    let (fits, what) = match kind {
        Kind::Predicate => {
            // Placed inside our parentheses, `a) OR (b` parses too, and
            // takes the conditions after it out of their AND. So a
            // predicate must also stand alone, where that is a syntax
            // error and a `;` makes a second statement.
            // Going on after the first probe's syntax error is safe without
            // a subtransaction: the raw parser takes no lock, buffer or
            // other resource an abort would have to release.
            let what = "one boolean expression";
            match parses_as(kind, arg, &format!("SELECT WHERE\n{text}\n")) {
                Err(alone) => match parses_as(kind, arg, &format!("SELECT WHERE (\n{text}\n)")) {
                    // it parses only where it can close our parenthesis
                    Ok(_) => return Err(refuse(what)),
                    Err(_) => return Err(alone),
                },
                Ok(fits) => (fits, what),
            }
        }
        Kind::SetList => (
            parses_as(
                kind,
                arg,
                &format!("UPDATE sturdy_fragment_probe SET\n{text}\n"),
            )?,
            "a list of column assignments",
        ),
        Kind::OrderBy => (
            parses_as(kind, arg, &format!("SELECT ORDER BY\n{text}\n"))?,
            "a list of sort keys",
        ),
    };
    if fits { Ok(()) } else { Err(refuse(what)) }
}

/// Whether `probe`, a statement with a fragment of `kind` in its place,
/// parses as one statement with that fragment and nothing else; a syntax
/// error is returned as PostgreSQL raised it.
fn parses_as(kind: Kind, arg: &'static str, probe: &str) -> Result<bool> {
    let probe = c_string(arg, probe)?;
    crate::fmgr::catching(|| {
        // SAFETY: raw_parser only parses (no catalog access); a syntax error
        // raises, which `catching` turns into an Error. The nodes it returns
        // live in the current memory context and are only read here.
        unsafe {
            let list = pg_sys::raw_parser(probe.as_ptr(), pg_sys::RawParseMode::RAW_PARSE_DEFAULT);
            if list.is_null() || (*list).length != 1 {
                return Ok(false);
            }
            let raw = (*(*list).elements).ptr_value as *mut pg_sys::RawStmt;
            let stmt = (*raw).stmt;
            Ok(match kind {
                Kind::Predicate | Kind::OrderBy => {
                    if (*stmt).type_ != pg_sys::NodeTag::T_SelectStmt {
                        return Ok(false);
                    }
                    let s = stmt as *mut pg_sys::SelectStmt;
                    let only_where = !(*s).whereClause.is_null() && (*s).sortClause.is_null();
                    let only_sort = (*s).whereClause.is_null() && !(*s).sortClause.is_null();
                    (*s).op == pg_sys::SetOperation::SETOP_NONE
                        && (*s).targetList.is_null()
                        && (*s).fromClause.is_null()
                        && (*s).groupClause.is_null()
                        && (*s).havingClause.is_null()
                        && (*s).windowClause.is_null()
                        && (*s).distinctClause.is_null()
                        && (*s).intoClause.is_null()
                        && (*s).limitCount.is_null()
                        && (*s).limitOffset.is_null()
                        && (*s).lockingClause.is_null()
                        && (*s).withClause.is_null()
                        && (*s).valuesLists.is_null()
                        && match kind {
                            Kind::Predicate => only_where,
                            _ => only_sort,
                        }
                }
                Kind::SetList => {
                    if (*stmt).type_ != pg_sys::NodeTag::T_UpdateStmt {
                        return Ok(false);
                    }
                    let u = stmt as *mut pg_sys::UpdateStmt;
                    #[cfg(feature = "pg15")]
                    let returning = (*u).returningList.is_null();
                    #[cfg(not(feature = "pg15"))]
                    let returning = (*u).returningClause.is_null();
                    returning
                        && (*u).whereClause.is_null()
                        && (*u).fromClause.is_null()
                        && (*u).withClause.is_null()
                }
            })
        }
    })
}

/// The highest `$n` in `text`, outside string literals. (A `$n` inside a
/// quoted identifier or a dollar-quoted string still counts, which only
/// makes the check stricter.)
pub fn highest_param(text: &str) -> usize {
    let bytes = text.as_bytes();
    let (mut highest, mut quoted, mut i) = (0, false, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'\'' => quoted = !quoted,
            b'$' if !quoted => {
                let digits: String = text[i + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_digit())
                    .collect();
                if let Ok(n) = digits.parse::<usize>() {
                    highest = highest.max(n);
                }
                i += digits.len();
            }
            _ => {}
        }
        i += 1;
    }
    highest
}

/// A table and its key column, named for a statement we build: quoted,
/// schema-qualified, and with the key type's own operators.
pub struct Target {
    /// `"schema"."table"`.
    pub table: String,
    /// `"key"`.
    pub key: String,
    /// The key's type, qualified, for casting the keyset cursor back.
    pub key_type: String,
    /// `OPERATOR(schema.>)` and `OPERATOR(schema.=)` of the key type's
    /// default btree operator class.
    pub gt: String,
    pub eq: String,
}

/// `oid` must be an ordinary or partitioned table (or a view the caller can
/// update through), `key` one of its columns with a btree ordering.
pub fn target(oid: pg_sys::Oid, key: &str) -> Result<Target> {
    let key_c = c_string("key", key)?;
    // SAFETY: catalog lookups by OID and name; every returned C string is
    // palloc'd or a catalog copy, read at once. A missing relation or column
    // comes back as NULL / InvalidAttrNumber and is reported.
    unsafe {
        let rel_name = pg_sys::get_rel_name(oid);
        if rel_name.is_null() {
            return Err(Error::Raised {
                code: *b"42P01",
                message: format!("relation with OID {} does not exist", oid.to_u32()),
                detail: None,
                hint: Some("Pass an existing table, e.g. 'public.orders'::regclass.".into()),
            });
        }
        let nsp = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(oid));
        let table = CStr::from_ptr(pg_sys::quote_qualified_identifier(nsp, rel_name))
            .to_string_lossy()
            .into_owned();
        let attnum = pg_sys::get_attnum(oid, key_c.as_ptr());
        if attnum <= 0 {
            return Err(Error::Raised {
                code: *b"42703",
                message: format!("column {key:?} of relation {table} does not exist"),
                detail: None,
                hint: Some(
                    "key names a column of the table, usually its primary key (default 'id')."
                        .into(),
                ),
            });
        }
        let typ = pg_sys::get_atttype(oid, attnum);
        let tce = pg_sys::lookup_type_cache(
            typ,
            (pg_sys::TYPECACHE_EQ_OPR | pg_sys::TYPECACHE_GT_OPR) as i32,
        );
        if tce.is_null()
            || (*tce).gt_opr == pg_sys::InvalidOid
            || (*tce).eq_opr == pg_sys::InvalidOid
        {
            return Err(Error::Invalid {
                arg: "key",
                why: format!("column {key:?} has a type without a btree ordering"),
                hint: "Use a key column with a default btree operator class (integer, bigint, text, uuid, ...).",
            });
        }
        Ok(Target {
            table,
            key: CStr::from_ptr(pg_sys::quote_identifier(key_c.as_ptr()))
                .to_string_lossy()
                .into_owned(),
            key_type: CStr::from_ptr(pg_sys::format_type_be_qualified(typ))
                .to_string_lossy()
                .into_owned(),
            gt: operator((*tce).gt_opr),
            eq: operator((*tce).eq_opr),
        })
    }
}

/// `OPERATOR(schema.name)` for operator `oid`.
fn operator(oid: pg_sys::Oid) -> String {
    // SAFETY: `oid` is a valid operator from the type cache; the syscache
    // tuple is read and released here.
    unsafe {
        let tup = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::OPEROID as i32,
            pg_sys::Datum::from(oid),
        );
        let form = pg_sys::GETSTRUCT(tup) as *mut pg_sys::FormData_pg_operator;
        let name = CStr::from_ptr((*form).oprname.data.as_ptr())
            .to_string_lossy()
            .into_owned();
        let nsp = CStr::from_ptr(pg_sys::quote_identifier(pg_sys::get_namespace_name(
            (*form).oprnamespace,
        )))
        .to_string_lossy()
        .into_owned();
        pg_sys::ReleaseSysCache(tup);
        format!("OPERATOR({nsp}.{name})")
    }
}

/// A statement prepared once per backend with the parameter types its text
/// implies, and kept.
pub struct Inferred {
    plan: usize,
    pub types: Vec<pg_sys::Oid>,
}

thread_local! {
    static INFERRED: RefCell<HashMap<String, &'static Inferred>> = RefCell::new(HashMap::new());
}

/// The kept plan for `sql`, preparing it on first use: the text is parsed and
/// analysed with variable parameters (as `PREPARE` without types does), the
/// inferred types read back, and the statement prepared with them. A
/// parameter nothing gives a type to is `text`. Call inside an SPI
/// connection. The plan cache re-plans it when the tables it uses change,
/// or the `search_path` it was prepared under does.
pub fn prepare(sql: &str) -> Result<&'static Inferred> {
    if let Some(found) = INFERRED.with(|m| m.borrow().get(sql).copied()) {
        return Ok(found);
    }
    let text = c_string("statement", sql)?;
    let inferred = crate::fmgr::catching(|| {
        // SAFETY: raw_parser + parse_analyze_varparams is what PREPARE does;
        // the types array it allocates is read before anything frees it.
        // SPI_prepare then plans the same text with those types, inside the
        // caller's SPI connection, and SPI_keepplan moves it out of SPI's
        // memory for the backend's life.
        unsafe {
            let list = pg_sys::raw_parser(text.as_ptr(), pg_sys::RawParseMode::RAW_PARSE_DEFAULT);
            if list.is_null() || (*list).length != 1 {
                return Err(Error::Internal {
                    context: "batch statement",
                    cause: "not one statement".into(),
                });
            }
            let raw = (*(*list).elements).ptr_value as *mut pg_sys::RawStmt;
            let mut types: *mut pg_sys::Oid = std::ptr::null_mut();
            let mut n: std::ffi::c_int = 0;
            pg_sys::parse_analyze_varparams(
                raw,
                text.as_ptr(),
                &mut types,
                &mut n,
                std::ptr::null_mut(),
            );
            let mut types: Vec<pg_sys::Oid> = (0..n as usize)
                .map(|i| match *types.add(i) {
                    t if t == pg_sys::InvalidOid || t == pg_sys::UNKNOWNOID => pg_sys::TEXTOID,
                    t => t,
                })
                .collect();
            let plan = pg_sys::SPI_prepare(text.as_ptr(), types.len() as i32, types.as_mut_ptr());
            if plan.is_null() || pg_sys::SPI_keepplan(plan) != 0 {
                return Err(Error::Internal {
                    context: "SPI_prepare",
                    cause: format!("SPI_result {}", { pg_sys::SPI_result }),
                });
            }
            Ok(Inferred {
                plan: plan as usize,
                types,
            })
        }
    })?;
    let kept: &'static Inferred = Box::leak(Box::new(inferred));
    INFERRED.with(|m| m.borrow_mut().insert(sql.to_owned(), kept));
    Ok(kept)
}

impl Inferred {
    /// Run with `values`, one per parameter: text converted by each
    /// parameter's type input function (a bad value raises that type's own
    /// error, e.g. `22P02`), `None` for NULL. Call inside the SPI connection
    /// [`prepare`] was called in; the rows are then in SPI_tuptable.
    pub fn execute(&self, values: &[Option<&str>]) -> Result<()> {
        if values.len() != self.types.len() {
            return Err(Error::Internal {
                context: "batch statement",
                cause: format!(
                    "{} values for {} parameters",
                    values.len(),
                    self.types.len()
                ),
            });
        }
        let mut datums = Vec::with_capacity(values.len());
        let mut nulls = Vec::with_capacity(values.len());
        for (value, typ) in values.iter().zip(&self.types) {
            match value {
                None => {
                    datums.push(pg_sys::Datum::from(0));
                    nulls.push(b'n' as std::ffi::c_char);
                }
                Some(text) => {
                    let c = c_string("args", text)?;
                    // SAFETY: the type's input function on a NUL-terminated
                    // string; it raises on a bad value (caught by our
                    // caller's guard and passed on with its SQLSTATE).
                    let datum = unsafe {
                        let (mut input, mut ioparam) = (pg_sys::InvalidOid, pg_sys::InvalidOid);
                        pg_sys::getTypeInputInfo(*typ, &mut input, &mut ioparam);
                        pg_sys::OidInputFunctionCall(input, c.as_ptr().cast_mut(), ioparam, -1)
                    };
                    datums.push(datum);
                    nulls.push(b' ' as std::ffi::c_char);
                }
            }
        }
        // SAFETY: the kept plan for exactly these parameter types, run in the
        // open SPI connection.
        let rc = unsafe {
            pg_sys::SPI_execute_plan(
                self.plan as pg_sys::SPIPlanPtr,
                datums.as_mut_ptr(),
                nulls.as_ptr(),
                false,
                0,
            )
        };
        if rc < 0 {
            return Err(Error::Internal {
                context: "SPI_execute_plan",
                cause: format!("SPI error {rc}"),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::highest_param;

    #[test]
    fn highest_param_skips_literals() {
        assert_eq!(highest_param("a = $1 AND b = $12"), 12);
        assert_eq!(highest_param("a = '$9' AND b = $2"), 2);
        assert_eq!(highest_param("no params"), 0);
        assert_eq!(highest_param("x = $"), 0);
    }
}
