//! Who may see the pages and act: the token, the login, the CSRF token,
//! and the two actions.

use super::*;

pub(crate) const COOKIE: &str = "sturdy_ui";

/// With a token, every request but the login's carries it (a bearer
/// header or the cookie the login set); a POST must be allowed and carry
/// the CSRF token (checked by its handler, which reads the form).
pub(crate) async fn guard(State(app): State<Shared>, request: Request, next: Next) -> Response {
    if let Some(token) = &app.config.token
        && request.uri().path() != "/login"
        && !carries(request.headers(), token)
    {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            login_markup(None),
        )
            .into_response();
    }
    if request.method() == axum::http::Method::POST
        && request.uri().path() != "/login"
        && !app.config.allow_actions
    {
        return Failure::refused(
            StatusCode::FORBIDDEN,
            "This dashboard is read-only: start sturdy-ui with --allow-actions to redrive or cancel.",
        )
        .into_response();
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// Whether the request carries the token, compared in constant time.
pub(crate) fn carries(headers: &HeaderMap, token: &str) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| {
            c.trim()
                .strip_prefix(&format!("{COOKIE}="))
                .map(str::to_string)
        })
        .next();
    [bearer.map(str::to_string), cookie]
        .into_iter()
        .flatten()
        .any(|given| same(&given, token))
}

pub(crate) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

pub(crate) fn login_markup(wrong: Option<&str>) -> Markup {
    layout(
        "Log in",
        html! {
            h1 { "sturdy-ui" }
            @if let Some(wrong) = wrong { p.error { (wrong) } }
            form method="post" action="/login" {
                label { "Token " input type="password" name="token" autocomplete="off"; }
                " " button type="submit" { "Log in" }
            }
        },
    )
}

pub(crate) async fn login_form() -> Markup {
    login_markup(None)
}

#[derive(Deserialize)]
pub(crate) struct LoginForm {
    token: String,
}

pub(crate) async fn login(State(app): State<Shared>, Form(form): Form<LoginForm>) -> Response {
    match &app.config.token {
        Some(token) if same(&form.token, token) => {
            let cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/");
            let mut response = Redirect::to("/").into_response();
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, v);
            }
            response
        }
        Some(_) => (
            StatusCode::UNAUTHORIZED,
            login_markup(Some("That is not the token.")),
        )
            .into_response(),
        None => Redirect::to("/").into_response(),
    }
}

#[derive(Deserialize)]
pub(crate) struct ActionForm {
    csrf: String,
    /// cancel: the status the instance was shown in
    from: Option<String>,
    /// cancel: the revision it was shown at
    revision: Option<i64>,
}

pub(crate) fn checked(app: &App, form: &ActionForm) -> Result<(), Failure> {
    if !same(&form.csrf, &app.csrf) {
        return Err(Failure::refused(
            StatusCode::FORBIDDEN,
            "The form's CSRF token is not this server's: reload the page and try again.",
        ));
    }
    Ok(())
}

pub(crate) async fn redrive(
    State(app): State<Shared>,
    Path(id): Path<i64>,
    Form(form): Form<ActionForm>,
) -> Result<Response, Failure> {
    checked(&app, &form)?;
    let c = app.pool.get().await?;
    let row = c.query_one("SELECT sturdy.redrive($1)", &[&id]).await?;
    let done: Option<bool> = row.get(0);
    let note = if done == Some(true) {
        "redriven"
    } else {
        "not-dead"
    };
    Ok(Redirect::to(&format!("/dead?note={note}&id={id}")).into_response())
}

pub(crate) async fn cancel(
    State(app): State<Shared>,
    Path(id): Path<i64>,
    Form(form): Form<ActionForm>,
) -> Result<Response, Failure> {
    checked(&app, &form)?;
    let from = form.from.unwrap_or_default();
    let c = app.pool.get().await?;
    let row = c
        .query_one(
            "SELECT sturdy.transition($1, $2, 'cancelled', $3, error => 'cancelled from sturdy-ui')",
            &[&id, &from, &form.revision],
        )
        .await?;
    let moved: Option<bool> = row.get(0);
    let note = if moved == Some(true) {
        "cancelled"
    } else {
        "moved-on"
    };
    Ok(Redirect::to(&format!("/instance?q={id}&note={note}")).into_response())
}
