//! Values passed through as Postgres holds them.
//!
//! - [`Text`]: a `text` argument, never converted to a Rust `&str`. Names are
//!   keys we hand back to SPI untouched, so they work in any server encoding
//!   (a `SQL_ASCII` database may hold any bytes) and cost no conversion; a
//!   message that quotes one decodes it lossily.
//! - [`Jsonb`]: a `jsonb` datum, untouched. pgrx's own `JsonB` goes through
//!   text and `serde_json` in both directions; checkpoint values are the
//!   caller's and we never look inside them.
//! - [`Record`]: a composite datum (an outbox message), likewise untouched.

use pgrx::pg_sys;
use pgrx::{FromDatum, IntoDatum, PgMemoryContexts};

/// A non-null `text` datum, detoasted (a short header is kept).
#[derive(Clone, Copy, Debug)]
pub struct Text(pg_sys::Datum);

impl Text {
    /// A new `text` value holding `s`, allocated in the current memory context.
    pub fn new(s: &str) -> Text {
        Text(s.into_datum().unwrap_or(pg_sys::Datum::from(0)))
    }

    /// A new `text` value holding `bytes` (in the server encoding, which
    /// need not be UTF-8), allocated in the current memory context.
    pub fn from_bytes(bytes: &[u8]) -> Text {
        // SAFETY: copies `bytes.len()` bytes into a new varlena.
        unsafe {
            Text(pg_sys::Datum::from(pg_sys::cstring_to_text_with_len(
                bytes.as_ptr().cast(),
                bytes.len() as i32,
            )))
        }
    }

    /// A copy, in the current memory context, of the `text` datum `d` (one
    /// that points into a buffer about to be released).
    pub fn copied(d: pg_sys::Datum) -> Text {
        // SAFETY: `d` is a live `text` datum; the copy is detoasted.
        unsafe {
            let copy = pg_sys::pg_detoast_datum_copy(d.cast_mut_ptr());
            Text(pg_sys::Datum::from(copy))
        }
    }

    /// The text's bytes, in the server encoding.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the datum is a detoasted varlena (from_polymorphic_datum),
        // alive for the call that passed it.
        unsafe {
            let ptr = self.0.cast_mut_ptr::<pg_sys::varlena>();
            std::slice::from_raw_parts(
                pgrx::varlena::vardata_any(ptr).cast::<u8>(),
                pgrx::varlena::varsize_any_exhdr(ptr),
            )
        }
    }

    /// For messages: the text as UTF-8, with anything else replaced.
    pub fn lossy(&self) -> String {
        String::from_utf8_lossy(self.bytes()).into_owned()
    }
}

/// The payload of a `NOTIFY` that names `name` (a queue, an event), which
/// every client decodes whatever its encoding and the database's: printable
/// ASCII as it is, every other byte and the backslash as `\xHH` (two
/// lowercase hex digits). A name's raw bytes broke a listening client where
/// they were not valid in its encoding (any bytes are a name in a
/// `SQL_ASCII` database), or could not be converted to it: the client got a
/// decoding error, with no SQLSTATE, on whatever statement received it.
pub fn notify_payload(name: &[u8]) -> Text {
    let mut out = String::with_capacity(name.len());
    for &b in name {
        if (0x20..0x7f).contains(&b) && b != b'\\' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    Text::new(&out)
}

impl FromDatum for Text {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        if is_null {
            return None;
        }
        // SAFETY: a non-null text datum points at a varlena, possibly toasted.
        let plain = unsafe { pg_sys::pg_detoast_datum_packed(datum.cast_mut_ptr()) };
        Some(Text(pg_sys::Datum::from(plain)))
    }
}

impl IntoDatum for Text {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::TEXTOID
    }
}

/// A detoasted copy of varlena `datum` in `memory_context` (the caller's, as
/// SPI hands it to a reader), so the value outlives the SPI connection.
///
/// # Safety
/// `datum` points at a varlena.
unsafe fn copy_varlena(
    mut memory_context: PgMemoryContexts,
    datum: pg_sys::Datum,
) -> pg_sys::Datum {
    // SAFETY: per the contract; the copy is palloc'd in `memory_context`.
    unsafe {
        memory_context
            .switch_to(|_| pg_sys::Datum::from(pg_sys::pg_detoast_datum_copy(datum.cast_mut_ptr())))
    }
}

/// A `jsonb` value as Postgres holds it. Read from SPI it is copied (and
/// detoasted) into the caller's memory context, so it outlives the connection.
#[derive(Clone, Copy, Debug)]
pub struct Jsonb(pub(crate) pg_sys::Datum);

impl FromDatum for Jsonb {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        (!is_null).then_some(Jsonb(datum))
    }

    unsafe fn from_datum_in_memory_context(
        memory_context: PgMemoryContexts,
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        // SAFETY: a non-null jsonb datum points at a varlena.
        (!is_null).then(|| Jsonb(unsafe { copy_varlena(memory_context, datum) }))
    }
}

impl Jsonb {
    /// A copy, in the current memory context and detoasted, of the `jsonb`
    /// datum `d` (one that points into a buffer about to be released).
    pub fn copied(d: pg_sys::Datum) -> Jsonb {
        // SAFETY: `d` is a live `jsonb` datum.
        Jsonb(pg_sys::Datum::from(unsafe {
            pg_sys::pg_detoast_datum_copy(d.cast_mut_ptr())
        }))
    }

    /// The JSON type of the top-level value, as `jsonb_typeof` names it for
    /// containers: `object`, `array`, or `scalar` for a string, number,
    /// boolean or null.
    pub fn kind(&self) -> &'static str {
        // JsonbContainer's header (jsonb.h): the first 4 bytes after the
        // varlena header, with one flag bit per container kind; a top-level
        // scalar is stored as a one-element array flagged scalar.
        const JB_FSCALAR: u32 = 0x1000_0000;
        const JB_FOBJECT: u32 = 0x2000_0000;
        // SAFETY: a non-null jsonb datum; detoasted (or its short header
        // kept) so the container header follows the varlena header.
        let header = unsafe {
            let plain = pg_sys::pg_detoast_datum_packed(self.0.cast_mut_ptr());
            let data = pgrx::varlena::vardata_any(plain).cast::<u8>();
            u32::from_ne_bytes(std::ptr::read_unaligned(data.cast::<[u8; 4]>()))
        };
        if header & JB_FOBJECT != 0 {
            "object"
        } else if header & JB_FSCALAR != 0 {
            "scalar"
        } else {
            "array"
        }
    }
}

impl IntoDatum for Jsonb {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

/// A composite value (a whole table row, e.g. an outbox message) as Postgres
/// holds it: read from SPI it is copied into the caller's memory context, so
/// it can be handed to a function after the connection is closed.
#[derive(Clone, Copy, Debug)]
pub struct Record(pub(crate) pg_sys::Datum);

impl FromDatum for Record {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        (!is_null).then_some(Record(datum))
    }

    unsafe fn from_datum_in_memory_context(
        memory_context: PgMemoryContexts,
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        // SAFETY: a non-null composite datum is a varlena (a HeapTupleHeader
        // with its length set).
        (!is_null).then(|| Record(unsafe { copy_varlena(memory_context, datum) }))
    }
}

impl IntoDatum for Record {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::RECORDOID
    }
}

/// A one-dimensional array argument, passed through whole; only its length is
/// read here (the statement unnests it).
macro_rules! array_type {
    ($(#[$doc:meta])* $name:ident, $oid:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug)]
        pub struct $name(pg_sys::Datum);

        impl $name {
            /// The number of elements, or `None` for an array of more than one
            /// dimension.
            pub fn elements(&self) -> Option<usize> {
                // SAFETY: the datum is a detoasted array (from_polymorphic_datum);
                // its dimensions follow the fixed header, `ndim` of them.
                unsafe {
                    let array = self.0.cast_mut_ptr::<pg_sys::ArrayType>();
                    let ndim = (*array).ndim;
                    let dims = array.cast::<u8>().add(std::mem::size_of::<pg_sys::ArrayType>()).cast::<i32>();
                    match ndim {
                        0 => Some(0),
                        1 => Some(pg_sys::ArrayGetNItems(ndim, dims) as usize),
                        _ => None,
                    }
                }
            }
        }

        impl FromDatum for $name {
            unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _: pg_sys::Oid) -> Option<Self> {
                if is_null {
                    return None;
                }
                // SAFETY: a non-null array datum points at a varlena, possibly toasted.
                let plain = unsafe { pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) };
                Some($name(pg_sys::Datum::from(plain)))
            }
        }

        impl IntoDatum for $name {
            fn into_datum(self) -> Option<pg_sys::Datum> {
                Some(self.0)
            }
            fn type_oid() -> pg_sys::Oid {
                $oid
            }
        }
    };
}

array_type!(
    /// A `text[]` argument.
    TextArray,
    pg_sys::TEXTARRAYOID
);
impl TextArray {
    /// The elements as strings (`None` for NULL), in order. Elements not
    /// valid in UTF-8 are replaced lossily.
    pub fn strings(&self) -> Vec<Option<String>> {
        // SAFETY: a one-dimensional text[] datum (checked by the caller with
        // `elements`), deconstructed by pgrx's array reader.
        unsafe { <Vec<Option<String>> as FromDatum>::from_datum(self.0, false) }.unwrap_or_default()
    }

    /// A new text[] of `values` (`None` for NULL).
    pub fn from_strings(values: &[Option<String>]) -> TextArray {
        TextArray(
            values
                .to_vec()
                .into_datum()
                .unwrap_or(pg_sys::Datum::from(0)),
        )
    }
}

/// A `name` argument (an identifier, at most 63 bytes), as a string.
#[derive(Clone, Debug)]
pub struct SqlName(pub String);

impl FromDatum for SqlName {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        if is_null {
            return None;
        }
        // SAFETY: a non-null `name` datum points at a NUL-terminated NameData.
        let name = unsafe { std::ffi::CStr::from_ptr(datum.cast_mut_ptr::<std::ffi::c_char>()) };
        Some(SqlName(name.to_string_lossy().into_owned()))
    }
}

array_type!(
    /// A `timestamptz[]` argument.
    TimestampArray,
    pg_sys::TIMESTAMPTZARRAYOID
);

array_type!(
    /// A `jsonb[]` argument.
    JsonbArray,
    pg_sys::JSONBARRAYOID
);

/// One-dimensional arrays read element by element, without copies: the
/// elements point into the array, which lives as long as the call's argument.
impl TextArray {
    /// Each element's bytes (`None` for NULL), in order. Only for an array
    /// [`elements`](Self::elements) found one-dimensional.
    pub fn each_bytes(&self) -> Vec<Option<&[u8]>> {
        // SAFETY: a detoasted text[] (from_polymorphic_datum); text elements
        // in an array are never compressed or external, and
        // `varlena_to_byte_slice` reads 1- and 4-byte headers alike.
        deconstruct(self.0, pg_sys::TEXTOID, -1, false, pg_sys::TYPALIGN_INT)
            .into_iter()
            .map(|d| d.map(|d| unsafe { pgrx::varlena::varlena_to_byte_slice(d.cast_mut_ptr()) }))
            .collect()
    }
}

impl JsonbArray {
    /// Each element (`None` for NULL), in order, pointing into the array
    /// (an array's elements are stored whole, never toasted). Only for an
    /// array [`elements`](Self::elements) found one-dimensional.
    pub fn each(&self) -> Vec<Option<pg_sys::Datum>> {
        deconstruct(self.0, pg_sys::JSONBOID, -1, false, pg_sys::TYPALIGN_INT)
    }
}

impl TimestampArray {
    /// Each element (`None` for NULL), in order.
    pub fn each(&self) -> Vec<Option<pg_sys::TimestampTz>> {
        // timestamptz is 8 bytes, passed by value
        deconstruct(
            self.0,
            pg_sys::TIMESTAMPTZOID,
            8,
            true,
            pg_sys::TYPALIGN_DOUBLE,
        )
        .into_iter()
        .map(|d| d.map(|d| d.value() as pg_sys::TimestampTz))
        .collect()
    }
}

fn deconstruct(
    array: pg_sys::Datum,
    elmtype: pg_sys::Oid,
    elmlen: i32,
    byval: bool,
    align: u8,
) -> Vec<Option<pg_sys::Datum>> {
    let mut elems: *mut pg_sys::Datum = std::ptr::null_mut();
    let mut nulls: *mut bool = std::ptr::null_mut();
    let mut n: std::ffi::c_int = 0;
    // SAFETY: `array` is a detoasted array of `elmtype`, whose length, by-value
    // flag and alignment are the ones passed; the two arrays deconstruct_array
    // pallocs hold `n` entries each.
    unsafe {
        pg_sys::deconstruct_array(
            array.cast_mut_ptr(),
            elmtype,
            elmlen,
            byval,
            align as std::ffi::c_char,
            &mut elems,
            &mut nulls,
            &mut n,
        );
        (0..n as usize)
            .map(|i| (!*nulls.add(i)).then(|| *elems.add(i)))
            .collect()
    }
}

array_type!(
    /// A `tid[]`: where row versions live, for a statement that goes straight
    /// to them.
    TidArray,
    pg_sys::TIDARRAYOID
);
impl TidArray {
    /// A new tid[] of `tids`, allocated in the current memory context.
    pub fn new(tids: &[pg_sys::ItemPointerData]) -> TidArray {
        let mut datums: Vec<pg_sys::Datum> = tids
            .iter()
            .map(|t| pg_sys::Datum::from(t as *const pg_sys::ItemPointerData))
            .collect();
        // SAFETY: each datum points at a 6-byte ItemPointerData (tid is passed
        // by reference, short-aligned); construct_array copies them.
        let array = unsafe {
            pg_sys::construct_array(
                datums.as_mut_ptr(),
                datums.len() as i32,
                pg_sys::TIDOID,
                std::mem::size_of::<pg_sys::ItemPointerData>() as i32,
                false,
                pg_sys::TYPALIGN_SHORT as std::ffi::c_char,
            )
        };
        TidArray(pg_sys::Datum::from(array))
    }
}
