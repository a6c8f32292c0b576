//! `#[sql_function]`: one declaration per pg_sturdy SQL function.
//!
//! ```ignore
//! #[sql_function(
//!     "sturdy.claim(workflow text, lease interval DEFAULT '1 minute', owner text DEFAULT NULL)
//!      RETURNS bigint VOLATILE PARALLEL UNSAFE",
//!     comment = "Take the workflow if nobody holds it ..."
//! )]
//! fn claim(workflow: Option<Text>, lease: Option<Interval>, owner: Option<Text>) -> Result<Option<i64>> { .. }
//! ```
//!
//! From that one item follow:
//! - the Rust function itself, unchanged;
//! - its C entry point `sturdy_<fn>` (and the `pg_finfo_` record Postgres
//!   looks for), which hands the call to `crate::fmgr::call`: arguments read
//!   by position, errors raised with their own SQLSTATE;
//! - its `CREATE FUNCTION ... LANGUAGE c SECURITY INVOKER AS 'MODULE_PATHNAME',
//!   'sturdy_<fn>'` and `COMMENT ON FUNCTION`, in the install script through
//!   pgrx's `extension_sql!`.
//!
//! Checked at compile time: the declaration labels volatility and parallel
//! safety and says nothing about language, security or the symbol (this macro
//! does); the SQL arguments and the Rust parameters agree in name, number and,
//! by a fixed table, type. A function whose first parameter is named `call`
//! gets the call's `&fmgr::Args` there (set-returning functions fill their
//! result through it).

use proc_macro::TokenStream;
use proc_macro2::Span;
use quote::{format_ident, quote};
use syn::parse::{Parse, ParseStream};
use syn::{FnArg, GenericArgument, ItemFn, LitStr, Pat, PathArguments, Token, Type};

struct Attr {
    decl: LitStr,
    comment: LitStr,
}

impl Parse for Attr {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let decl: LitStr = input.parse()?;
        input.parse::<Token![,]>()?;
        let key: syn::Ident = input.parse()?;
        if key != "comment" {
            return Err(syn::Error::new(key.span(), "expected `comment = \"...\"`"));
        }
        input.parse::<Token![=]>()?;
        let comment: LitStr = input.parse()?;
        let _: Option<Token![,]> = input.parse()?;
        Ok(Attr { decl, comment })
    }
}

/// The SQL type an argument may have for each Rust type it is read as.
fn sql_types_for(rust: &str) -> &'static [&'static str] {
    match rust {
        "Text" => &["text"],
        "Jsonb" => &["jsonb"],
        "i64" => &["bigint"],
        "i32" => &["integer", "int"],
        "bool" => &["boolean"],
        "Interval" => &["interval"],
        "TimestampWithTimeZone" => &["timestamptz"],
        "Oid" => &["regprocedure", "regclass", "oid"],
        "TextArray" => &["text[]"],
        "TimestampArray" => &["timestamptz[]"],
        "JsonbArray" => &["jsonb[]"],
        "SqlName" => &["name"],
        "f64" => &["float8"],
        _ => &[],
    }
}

/// Split `a, b(c, d), 'e, f'` at the commas outside parentheses and quotes.
fn split_top_level(s: &str) -> Vec<String> {
    let (mut parts, mut cur, mut depth, mut quoted) = (Vec::new(), String::new(), 0i32, false);
    for ch in s.chars() {
        match ch {
            '\'' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    if !cur.trim().is_empty() {
        parts.push(cur);
    }
    parts
        .into_iter()
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// `sturdy.f(a text, b int DEFAULT 1) RETURNS ...` into (`sturdy.f`, the
/// argument list inside the parentheses, what follows them).
fn split_decl(decl: &str) -> Option<(&str, &str, &str)> {
    let open = decl.find('(')?;
    let (mut depth, mut quoted) = (0i32, false);
    for (i, ch) in decl[open..].char_indices() {
        match ch {
            '\'' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => {
                depth -= 1;
                if depth == 0 {
                    let close = open + i;
                    return Some((
                        decl[..open].trim(),
                        &decl[open + 1..close],
                        &decl[close + 1..],
                    ));
                }
            }
            _ => {}
        }
    }
    None
}

/// The inner type name of `Option<T>` (its last path segment).
fn option_inner(ty: &Type) -> Option<String> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    if last.ident != "Option" {
        return None;
    }
    let PathArguments::AngleBracketed(a) = &last.arguments else {
        return None;
    };
    match a.args.first()? {
        GenericArgument::Type(Type::Path(inner)) => {
            Some(inner.path.segments.last()?.ident.to_string())
        }
        _ => None,
    }
}

#[proc_macro_attribute]
pub fn sql_function(attr: TokenStream, item: TokenStream) -> TokenStream {
    let attr = syn::parse_macro_input!(attr as Attr);
    let func = syn::parse_macro_input!(item as ItemFn);
    match expand(attr, func) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn expand(attr: Attr, func: ItemFn) -> syn::Result<proc_macro2::TokenStream> {
    let err = |msg: String| syn::Error::new(attr.decl.span(), msg);
    let decl = attr
        .decl
        .value()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let (sql_name, sql_args, rest) =
        split_decl(&decl).ok_or_else(|| err("expected `sturdy.name(args) RETURNS ...`".into()))?;
    if !sql_name.starts_with("sturdy.") {
        return Err(err(format!(
            "{sql_name}: pg_sturdy's functions live in schema sturdy"
        )));
    }
    let upper = rest.to_uppercase();
    if !upper.trim_start().starts_with("RETURNS ") {
        return Err(err("the arguments must be followed by RETURNS".into()));
    }
    if !["VOLATILE", "STABLE", "IMMUTABLE"]
        .iter()
        .any(|v| upper.contains(v))
    {
        return Err(err(
            "label the function VOLATILE, STABLE or IMMUTABLE".into()
        ));
    }
    if !upper.contains("PARALLEL ") {
        return Err(err(
            "label the function's parallel safety (PARALLEL UNSAFE, ...)".into(),
        ));
    }
    for word in ["LANGUAGE", "SECURITY", " AS ", "STRICT", "SET "] {
        if upper.contains(word) {
            return Err(err(format!(
                "leave out {}: every function is LANGUAGE c SECURITY INVOKER, takes NULLs to refuse \
                 them with a named error, and carries no SET clause",
                word.trim()
            )));
        }
    }

    // Arguments: SQL side and Rust side, pairwise.
    let sql_args = split_top_level(sql_args);
    let mut params: Vec<(String, Type)> = Vec::new();
    for input in &func.sig.inputs {
        let FnArg::Typed(pt) = input else {
            return Err(syn::Error::new_spanned(
                input,
                "a SQL function takes no self",
            ));
        };
        let Pat::Ident(id) = &*pt.pat else {
            return Err(syn::Error::new_spanned(&pt.pat, "name each parameter"));
        };
        params.push((id.ident.to_string(), (*pt.ty).clone()));
    }
    let takes_call = params.first().is_some_and(|(n, _)| n == "call");
    let values = if takes_call {
        &params[1..]
    } else {
        &params[..]
    };
    if values.len() != sql_args.len() {
        return Err(err(format!(
            "{sql_name} declares {} arguments in SQL and {} in Rust",
            sql_args.len(),
            values.len()
        )));
    }
    let mut identity = Vec::new();
    for (i, ((rust_name, ty), sql_arg)) in values.iter().zip(&sql_args).enumerate() {
        let sql_upper = sql_arg.to_uppercase();
        let without_default = match sql_upper.find(" DEFAULT ") {
            Some(at) => &sql_arg[..at],
            None => sql_arg.as_str(),
        };
        let mut words = without_default.split_whitespace();
        let (Some(sql_arg_name), Some(sql_type), None) = (words.next(), words.next(), words.next())
        else {
            return Err(err(format!(
                "argument {} must read `name type [DEFAULT value]`",
                i + 1
            )));
        };
        if sql_arg_name != rust_name {
            return Err(err(format!(
                "argument {} is {sql_arg_name} in SQL and {rust_name} in Rust",
                i + 1
            )));
        }
        let inner = option_inner(ty).ok_or_else(|| {
            syn::Error::new_spanned(
                ty,
                "every argument is an Option<T>: NULLs are refused by name",
            )
        })?;
        if !sql_types_for(&inner).contains(&sql_type) {
            return Err(syn::Error::new_spanned(
                ty,
                format!("{sql_arg_name} is {sql_type} in SQL; Option<{inner}> cannot read it"),
            ));
        }
        identity.push(without_default.to_owned());
    }

    let rust_fn = &func.sig.ident;
    let symbol = format_ident!("sturdy_{}", rust_fn);
    let finfo = format_ident!("pg_finfo_sturdy_{}", rust_fn);
    let comment = attr.comment.value().replace('\'', "''");
    let sql = format!(
        "CREATE FUNCTION {decl}\n    LANGUAGE c SECURITY INVOKER\n    AS 'MODULE_PATHNAME', '{symbol}';\n\
         COMMENT ON FUNCTION {sql_name}({}) IS\n    '{comment}';\n",
        identity.join(", ")
    );
    let sql = LitStr::new(&sql, Span::call_site());
    let name = LitStr::new(&symbol.to_string(), Span::call_site());
    let indexes = 0..values.len();
    let call_arg = takes_call.then(|| quote! { args, });

    Ok(quote! {
        #func

        #[doc(hidden)]
        #[allow(unsafe_code)]
        #[unsafe(no_mangle)]
        pub extern "C" fn #finfo() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
            const V1: ::pgrx::pg_sys::Pg_finfo_record = ::pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }

        #[doc(hidden)]
        #[allow(unsafe_code)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C-unwind" fn #symbol(
            fcinfo: ::pgrx::pg_sys::FunctionCallInfo,
        ) -> ::pgrx::pg_sys::Datum {
            // SAFETY: Postgres calls this symbol only through the CREATE
            // FUNCTION generated beside it, whose arguments this macro checked
            // against the Rust parameters, position by position.
            unsafe { crate::fmgr::call(fcinfo, |args| #rust_fn(#call_arg #( args.get(#indexes) ),*)) }
        }

        ::pgrx::extension_sql!(#sql, name = #name);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_arguments_outside_quotes_and_parentheses() {
        assert_eq!(
            split_top_level("a text, b interval DEFAULT '1 minute, more', c numeric(10, 2)"),
            vec![
                "a text",
                "b interval DEFAULT '1 minute, more'",
                "c numeric(10, 2)"
            ]
        );
        assert!(split_top_level("  ").is_empty());
    }

    #[test]
    fn splits_a_declaration() {
        let (name, args, rest) =
            split_decl("sturdy.f(a text DEFAULT '(x)') RETURNS TABLE (b int) VOLATILE").unwrap();
        assert_eq!((name, args), ("sturdy.f", "a text DEFAULT '(x)'"));
        assert_eq!(rest, " RETURNS TABLE (b int) VOLATILE");
    }
}
