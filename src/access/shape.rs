//! A table's shape: its columns, indexes, defaults and constraints as a
//! call here needs them, read from the relation cache; `None` where the table
//! is one a statement must serve (see the module comment of `access`).

use super::*;

#[derive(Clone)]
pub(super) struct Shape {
    /// The attribute number of each of the table's `columns`, and its type.
    pub(super) attnums: Vec<pg_sys::AttrNumber>,
    pub(super) types: Vec<pg_sys::Oid>,
    /// Every index.
    pub(super) indexes: Vec<Index>,
    /// The primary key.
    pub(super) pkey: pg_sys::Oid,
    /// Every attribute, by attribute number less one, as an insert sees it.
    pub(super) attrs: Vec<Attr>,
    /// Whether the table has `CHECK` constraints.
    pub(super) checks: bool,
    /// Whether it has a stored generated column, which every insert and
    /// update computes.
    pub(super) generated: bool,
    /// This backend's last 32 upserts into the table, a bit each (the
    /// latest lowest): 1 where a row with the key was there. Where few were
    /// ([`FOUND_AT_MOST`]), the next upsert inserts before it looks (see
    /// [`Opened::insert`]).
    pub(super) found: Cell<u32>,
}

#[derive(Clone)]
pub(super) struct Index {
    pub(super) oid: pg_sys::Oid,
    /// Its key columns' attribute numbers, in order.
    pub(super) keys: Vec<pg_sys::AttrNumber>,
    pub(super) unique: bool,
    /// A partial index's predicate, where it has one.
    pub(super) only: Option<Only>,
}

/// The partial indexes a call here keeps: a row version gets an entry only
/// where its attribute (an attribute number) is
#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Only {
    /// above 0 (an `integer` column, `WHERE a > 0`);
    Positive(pg_sys::AttrNumber),
    /// not NULL (`WHERE a IS NOT NULL`).
    NotNull(pg_sys::AttrNumber),
}

/// An attribute of the table, for an insert.
#[derive(Clone, Copy)]
pub(super) struct Attr {
    pub(super) dropped: bool,
    pub(super) not_null: bool,
    pub(super) generated: bool,
    pub(super) default: Stored,
}

/// A column's default, as far as an insert here can give it.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Stored {
    None,
    /// An `integer` constant.
    Int4(i32),
    /// `nextval` of the sequence with this OID.
    Next(pg_sys::Oid),
    /// Anything else: only a statement can give it.
    Other,
}

impl Shape {
    /// Whether an update of a row can be written here: no `CHECK` to test,
    /// no generated column to compute (a statement's update does both).
    pub(super) fn rewritable(&self) -> bool {
        !self.checks && !self.generated
    }

    /// The index whose key columns are exactly `cols`, in that order.
    pub(super) fn index_on(&self, cols: &[Col]) -> Option<pg_sys::Oid> {
        self.indexes
            .iter()
            .find(|index| {
                index.keys.len() == cols.len()
                    && index
                        .keys
                        .iter()
                        .zip(cols)
                        .all(|(k, c)| *k == self.attnums[c.0])
            })
            .map(|index| index.oid)
    }
}

/// Whether `relid` can be served here, and how: the attribute number and type
/// of each of `columns` (all must exist), every index a btree on plain columns
/// with immediate uniqueness, and a primary key.
///
/// # Safety
/// Inside a transaction.
pub(super) unsafe fn shape(relid: pg_sys::Oid, columns: &[&CStr]) -> Option<Shape> {
    // SAFETY: within the contract above: Inside a transaction.
    unsafe {
        // locked first: the catalog as of now, and no ALTER TABLE until the
        // transaction ends
        let rel = Open(pg_sys::table_open(relid, pg_sys::AccessShareLock as _));
        let mut attnums = Vec::with_capacity(columns.len());
        let mut types = Vec::with_capacity(columns.len());
        for name in columns {
            let attnum = pg_sys::get_attnum(relid, name.as_ptr());
            if attnum == pg_sys::InvalidAttrNumber as pg_sys::AttrNumber {
                return None;
            }
            attnums.push(attnum);
            types.push(pg_sys::get_atttype(relid, attnum));
        }
        #[cfg(feature = "pg18")]
        let pkey = pg_sys::RelationGetPrimaryKeyIndex(rel.0, false);
        #[cfg(not(feature = "pg18"))]
        let pkey = pg_sys::RelationGetPrimaryKeyIndex(rel.0);
        if pkey == pg_sys::InvalidOid {
            return None;
        }
        let list = pg_sys::RelationGetIndexList(rel.0);
        let oids: Vec<pg_sys::Oid> = if list.is_null() {
            Vec::new()
        } else {
            (0..(*list).length as usize)
                .map(|i| (*(*list).elements.add(i)).oid_value)
                .collect()
        };
        pg_sys::list_free(list);
        let mut indexes = Vec::with_capacity(oids.len());
        for oid in oids {
            let index = Open(pg_sys::index_open(oid, pg_sys::AccessShareLock as _));
            let form = &*(*index.0).rd_index;
            let plain = (*(*index.0).rd_rel).relam == pg_sys::BTREE_AM_OID
                && form.indimmediate
                && !form.indisexclusion
                && form.indnatts == form.indnkeyatts
                && pg_sys::RelationGetIndexExpressions(index.0).is_null()
                && form.indisvalid
                && form.indisready;
            let keys = form.indkey.values.as_slice(form.indnatts as usize).to_vec();
            if !plain || keys.contains(&0) || !ordered_as_assumed(index.0, relid, &keys) {
                return None;
            }
            let predicate = pg_sys::RelationGetIndexPredicate(index.0);
            let only = if predicate.is_null() {
                None
            } else {
                // a predicate an entry can be decided on here, else only a
                // statement can keep the index
                Some(only_where(predicate).filter(|_| !form.indisunique)?)
            };
            indexes.push(Index {
                oid,
                keys,
                unique: form.indisunique,
                only,
            });
        }
        let desc = (*rel.0).rd_att;
        let constr = (*desc).constr;
        let defaults: &[pg_sys::AttrDefault] = if constr.is_null() || (*constr).defval.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts((*constr).defval, (*constr).num_defval as usize)
        };
        let attrs = (0..(*desc).natts as usize)
            .map(|i| {
                let a = &*attribute(desc, i);
                let default = match defaults.iter().find(|d| d.adnum as usize == i + 1) {
                    Some(d) => default_of(d.adbin),
                    // without a default of its own, a column takes its
                    // type's (a domain's), and a domain's constraints are
                    // checked on what it is given, NULL included: only a
                    // statement does either
                    None if !a.attisdropped
                        && (pg_sys::get_typtype(a.atttypid) as u8 == pg_sys::TYPTYPE_DOMAIN
                            || !pg_sys::get_typdefault(a.atttypid).is_null()) =>
                    {
                        Stored::Other
                    }
                    None => Stored::None,
                };
                Attr {
                    dropped: a.attisdropped,
                    not_null: a.attnotnull,
                    generated: a.attgenerated != 0,
                    default,
                }
            })
            .collect();
        Some(Shape {
            attnums,
            types,
            indexes,
            pkey,
            attrs,
            checks: !constr.is_null() && (*constr).num_check > 0,
            generated: !constr.is_null() && (*constr).has_generated_stored,
            found: Cell::new(u32::MAX),
        })
    }
}

/// An index predicate that is exactly `a > 0` with `a` an `integer`
/// column (`sturdy.queue`'s `queue_prioritized`), or `a IS NOT NULL`;
/// `None` for any other.
///
/// # Safety
/// `predicate` is an index's predicate as the relation cache gives it (a
/// list of clauses, their functions set).
unsafe fn only_where(predicate: *mut pg_sys::List) -> Option<Only> {
    // SAFETY: within the contract above: nodes of a planned expression, read
    // by their tags before their casts.
    unsafe {
        if (*predicate).length != 1 {
            return None;
        }
        let clause = (*(*predicate).elements).ptr_value.cast::<pg_sys::Node>();
        let column = |node: *mut pg_sys::Node| {
            ((*node).type_ == pg_sys::NodeTag::T_Var)
                .then(|| node.cast::<pg_sys::Var>())
                .filter(|v| (**v).varattno > 0 && (**v).varlevelsup == 0)
        };
        match (*clause).type_ {
            pg_sys::NodeTag::T_NullTest => {
                let test = clause.cast::<pg_sys::NullTest>();
                let var = column((*test).arg.cast())?;
                ((*test).nulltesttype == pg_sys::NullTestType::IS_NOT_NULL && !(*test).argisrow)
                    .then_some(Only::NotNull((*var).varattno))
            }
            pg_sys::NodeTag::T_OpExpr => {
                let op = clause.cast::<pg_sys::OpExpr>();
                if pg_sys::get_opcode((*op).opno) != pg_sys::Oid::from(pg_sys::F_INT4GT)
                    || (*op).args.is_null()
                    || (*(*op).args).length != 2
                {
                    return None;
                }
                let var = column((*(*(*op).args).elements).ptr_value.cast())?;
                let right = (*(*(*op).args).elements.add(1))
                    .ptr_value
                    .cast::<pg_sys::Node>();
                if (*right).type_ != pg_sys::NodeTag::T_Const {
                    return None;
                }
                let constant = right.cast::<pg_sys::Const>();
                ((*var).vartype == pg_sys::INT4OID
                    && (*constant).consttype == pg_sys::INT4OID
                    && !(*constant).constisnull
                    && (*constant).constvalue.value() as i32 == 0)
                    .then_some(Only::Positive((*var).varattno))
            }
            _ => None,
        }
    }
}

/// Whether the btree `index` on `relid`'s columns `keys` orders and
/// compares as the calls here assume: every column ascending with NULLs
/// last, by its type's default operator class (the scan keys name those
/// classes' comparison functions), and text under a deterministic collation
/// (equal only where the bytes are, which is how keys and queues are
/// compared here).
///
/// # Safety
/// `index` is open; `keys` are its key columns' attribute numbers.
pub(super) unsafe fn ordered_as_assumed(
    index: pg_sys::Relation,
    relid: pg_sys::Oid,
    keys: &[pg_sys::AttrNumber],
) -> bool {
    // SAFETY: within the contract above: `index` is open; `keys` are its key columns'
    // attribute numbers.
    unsafe {
        keys.iter().enumerate().all(|(i, &attnum)| {
            let type_ = pg_sys::get_atttype(relid, attnum);
            let class = pg_sys::GetDefaultOpClass(type_, pg_sys::BTREE_AM_OID);
            let collation = *(*index).rd_indcollation.add(i);
            *(*index).rd_indoption.add(i) == 0
                && class != pg_sys::InvalidOid
                && *(*index).rd_opfamily.add(i) == pg_sys::get_opclass_family(class)
                && *(*index).rd_opcintype.add(i) == pg_sys::get_opclass_input_type(class)
                && (collation == pg_sys::InvalidOid
                    || pg_sys::get_collation_isdeterministic(collation))
        })
    }
}

/// Attribute `i` (from 0) of `desc`.
///
/// # Safety
/// `i` is below `desc`'s `natts`.
pub(super) unsafe fn attribute(
    desc: pg_sys::TupleDesc,
    i: usize,
) -> *const pg_sys::FormData_pg_attribute {
    // SAFETY: within the contract above: `i` is below `desc`'s `natts`.
    unsafe {
        #[cfg(feature = "pg18")]
        let a = pg_sys::TupleDescAttr(desc, i as i32).cast_const();
        #[cfg(not(feature = "pg18"))]
        let a = (*desc).attrs.as_ptr().add(i);
        a
    }
}

/// What the stored default expression `adbin` is, for an insert here.
///
/// # Safety
/// `adbin` is a node tree's string form, from `pg_attrdef`.
pub(super) unsafe fn default_of(adbin: *const std::ffi::c_char) -> Stored {
    // SAFETY: within the contract above: `adbin` is a node tree's string form, from
    // `pg_attrdef`.
    unsafe {
        let node = pg_sys::stringToNode(adbin).cast::<pg_sys::Node>();
        if node.is_null() {
            return Stored::Other;
        }
        let constant = |node: *mut pg_sys::Node, type_: pg_sys::Oid| {
            let c = node.cast::<pg_sys::Const>();
            ((*node).type_ == pg_sys::NodeTag::T_Const
                && (*c).consttype == type_
                && !(*c).constisnull)
                .then(|| (*c).constvalue)
        };
        if let Some(v) = constant(node, pg_sys::INT4OID) {
            return Stored::Int4(v.value() as i32);
        }
        if (*node).type_ == pg_sys::NodeTag::T_FuncExpr {
            let f = node.cast::<pg_sys::FuncExpr>();
            let args = (*f).args;
            if (*f).funcid == pg_sys::Oid::from(pg_sys::F_NEXTVAL)
                && !args.is_null()
                && (*args).length == 1
                && let Some(seq) = constant(
                    (*(*args).elements).ptr_value.cast::<pg_sys::Node>(),
                    pg_sys::REGCLASSOID,
                )
            {
                return Stored::Next(pg_sys::Oid::from(seq.value() as u32));
            }
        }
        Stored::Other
    }
}
