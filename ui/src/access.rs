//! Who may see the pages and act: the Host check, the token, the login and
//! its session, the CSRF token, and the two actions.

use super::*;

pub(crate) const COOKIE: &str = "sturdy_ui";

/// The frame of the page being made: whether it shows a logout button, and
/// the CSRF token that button's form carries. Set by [`guard`] around the
/// handler, so that every page drawn while serving a request, error pages
/// included, has the same frame without each handler passing it along.
#[derive(Clone, Default)]
pub(crate) struct Frame {
    pub(crate) logout: Option<String>,
}

tokio::task_local! {
    pub(crate) static FRAME: Frame;
}

/// Every request passes here first. Without a token, its `Host` must name
/// this server on loopback ([`host_allowed`]). With a token, every request
/// but the login's carries it (a bearer header) or a session a login opened
/// (the cookie). A POST other than a login or logout must be allowed and
/// carry the CSRF token (checked by its handler, which reads the form).
pub(crate) async fn guard(State(app): State<Shared>, request: Request, next: Next) -> Response {
    let mut frame = Frame::default();
    match &app.config.token {
        None => {
            if let Err(why) = names_this_server(&request, app.config.listen) {
                return Failure::refused(StatusCode::MISDIRECTED_REQUEST, &why).into_response();
            }
        }
        Some(token) => {
            let by_session = session_of(request.headers(), &app.sessions, Instant::now()).is_some();
            if by_session {
                frame.logout = Some(app.csrf.clone());
            }
            if request.uri().path() != "/login" && !by_session && !bearer(request.headers(), token)
            {
                return (
                    StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, "Bearer")],
                    login_markup(None),
                )
                    .into_response();
            }
        }
    }
    if request.method() == axum::http::Method::POST
        && !matches!(request.uri().path(), "/login" | "/logout")
        && !app.config.allow_actions
    {
        return Failure::refused(
            StatusCode::FORBIDDEN,
            "This dashboard is read-only: start sturdy-ui with --allow-actions to redrive or cancel.",
        )
        .into_response();
    }
    let mut response =
        match tokio::time::timeout(REQUEST_WITHIN, FRAME.scope(frame, next.run(request))).await {
            Ok(response) => response,
            Err(_) => Failure::busy(&format!(
                "The database did not answer within {} s: it may be down, frozen or unreachable.",
                REQUEST_WITHIN.as_secs()
            ))
            .into_response(),
        };
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

/// Whether the request names this server: its one `Host`, and the
/// authority of its target where it has one (an absolute URI, which a
/// server must prefer to `Host`), each [`host_allowed`].
fn names_this_server(request: &Request, listen: SocketAddr) -> Result<(), String> {
    let hosts: Vec<_> = request.headers().get_all(header::HOST).iter().collect();
    let host = match hosts.as_slice() {
        [one] => one.to_str().unwrap_or(""),
        [] => "",
        _ => return Err("This request has more than one Host header.".into()),
    };
    let target = request.uri().authority().map(|a| a.as_str());
    if host_allowed(host, listen) && target.is_none_or(|t| host_allowed(t, listen)) {
        return Ok(());
    }
    Err(format!(
        "This server answers only requests for 127.0.0.1:{port}, localhost:{port} or [::1]:{port}, \
         not for {host:?}. Without --token it reads the Host a browser sends, so that a page of \
         another site whose name was pointed at this machine cannot read the dashboard. \
         Open http://127.0.0.1:{port}/, or start sturdy-ui with --token to serve other names \
         (through a reverse proxy, say).",
        port = listen.port()
    ))
}

/// Whether `host` (a `Host` header, or a target's authority) names this
/// server on loopback: `127.0.0.1`, `localhost`, `[::1]` or the address it
/// listens on, with the port it listens on. A browser sends the name the
/// user or the page gave it, so a page of another site whose name was
/// rebound to 127.0.0.1 (DNS rebinding) arrives here with its own name.
/// The port is required but when listening on 80, where a browser leaves
/// it out.
pub(crate) fn host_allowed(host: &str, listen: SocketAddr) -> bool {
    // "[v6]" or "[v6]:port"; else "name" or "name:port" (a name has no colon)
    let (name, port) = if host.starts_with('[') {
        match host.find(']') {
            Some(end) => match &host[end + 1..] {
                "" => (&host[..=end], None),
                rest => match rest.strip_prefix(':') {
                    Some(port) => (&host[..=end], Some(port)),
                    None => return false,
                },
            },
            None => return false,
        }
    } else {
        match host.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    let port_ok = match port {
        Some(port) => port == listen.port().to_string(),
        None => listen.port() == 80,
    };
    let own = match listen.ip() {
        std::net::IpAddr::V4(ip) => ip.to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
    };
    let name_ok = ["127.0.0.1", "localhost", "[::1]", own.as_str()]
        .iter()
        .any(|n| name.eq_ignore_ascii_case(n));
    port_ok && name_ok
}

/// Whether the request carries the token as a bearer, compared in
/// constant time.
pub(crate) fn bearer(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| same(given, token))
}

/// The values of the cookies named [`COOKIE`], in every `Cookie` header.
pub(crate) fn cookies(headers: &HeaderMap) -> Vec<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .collect()
}

/// The id of the live session a cookie of the request names.
pub(crate) fn session_of(headers: &HeaderMap, sessions: &Sessions, now: Instant) -> Option<String> {
    cookies(headers)
        .into_iter()
        .find(|id| sessions.holds(id, now))
        .map(str::to_string)
}

pub(crate) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The sessions logins opened, by their random id, with when each ends.
/// The cookie holds the id only: one that leaks (a browser's storage, a
/// log) is good for [`SESSION`] at most and ends at a logout, where the
/// token itself would be good until the process restarts with another.
/// They live in this process: a restart logs everybody out.
#[derive(Default)]
pub(crate) struct Sessions {
    live: std::sync::Mutex<HashMap<String, Instant>>,
}

impl Sessions {
    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        // a panic while holding the lock leaves the map whole (each change
        // is one call), so it can go on being used
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new session of [`SESSION`] from `now`: its id (32 random bytes as
    /// hex). Those that ended are forgotten meanwhile.
    pub(crate) fn open(&self, now: Instant) -> Result<String, getrandom::Error> {
        let id = random_hex(32)?;
        let mut live = self.live();
        live.retain(|_, until| *until > now);
        live.insert(id.clone(), now + SESSION);
        Ok(id)
    }

    /// Whether `id` is a session that has not ended at `now`. (The map's
    /// hashing is keyed at random per process, so how long the lookup takes
    /// tells a guesser nothing about the ids.)
    pub(crate) fn holds(&self, id: &str, now: Instant) -> bool {
        self.live().get(id).is_some_and(|until| *until > now)
    }

    pub(crate) fn close(&self, id: &str) {
        self.live().remove(id);
    }
}

/// Whether the browser reached us over TLS: sturdy-ui speaks plain HTTP, so
/// only through a TLS-terminating proxy that says so with
/// `X-Forwarded-Proto: https`. (A client that sends it without a proxy only
/// makes its own cookie `Secure`.)
pub(crate) fn over_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"))
}

/// The `Set-Cookie` value of a session: `id` for `max_age` seconds (0 ends
/// it in the browser).
pub(crate) fn session_cookie(id: &str, max_age: u64, secure: bool) -> String {
    format!(
        "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}{}",
        if secure { "; Secure" } else { "" }
    )
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

pub(crate) async fn login(
    State(app): State<Shared>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Result<Response, Failure> {
    match &app.config.token {
        Some(token) if same(&form.token, token) => {
            let id = app
                .sessions
                .open(Instant::now())
                .map_err(|_| Failure::internal("no randomness for a session id"))?;
            let cookie = session_cookie(&id, SESSION.as_secs(), over_tls(&headers));
            let mut response = Redirect::to("/").into_response();
            let v = HeaderValue::from_str(&cookie)
                .map_err(|_| Failure::internal("a session cookie that is not a header"))?;
            response.headers_mut().insert(header::SET_COOKIE, v);
            Ok(response)
        }
        Some(_) => Ok((
            StatusCode::UNAUTHORIZED,
            login_markup(Some("That is not the token.")),
        )
            .into_response()),
        None => Ok(Redirect::to("/").into_response()),
    }
}

#[derive(Deserialize)]
pub(crate) struct LogoutForm {
    csrf: String,
}

/// End the request's sessions here and in the browser.
pub(crate) async fn logout(
    State(app): State<Shared>,
    headers: HeaderMap,
    Form(form): Form<LogoutForm>,
) -> Result<Response, Failure> {
    if !same(&form.csrf, &app.csrf) {
        return Err(Failure::refused(
            StatusCode::FORBIDDEN,
            "The form's CSRF token is not this server's: reload the page and try again.",
        ));
    }
    for id in cookies(&headers) {
        app.sessions.close(id);
    }
    let mut response = Redirect::to("/login").into_response();
    if let Ok(v) = HeaderValue::from_str(&session_cookie("", 0, over_tls(&headers))) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(response)
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

#[derive(Deserialize)]
pub(crate) struct RedriveForm {
    csrf: String,
    queue: String,
    workflow: String,
}

/// A dead queue row ready again (`sturdy.redrive(workflow, queue)`).
pub(crate) async fn redrive_workflow(
    State(app): State<Shared>,
    Form(form): Form<RedriveForm>,
) -> Result<Response, Failure> {
    if !same(&form.csrf, &app.csrf) {
        return Err(Failure::refused(
            StatusCode::FORBIDDEN,
            "The form's CSRF token is not this server's: reload the page and try again.",
        ));
    }
    let c = app.pool.get().await?;
    let row = c
        .query_one(
            "SELECT sturdy.redrive($1::text, $2::text)",
            &[&form.workflow, &form.queue],
        )
        .await?;
    let done: Option<bool> = row.get(0);
    let note = if done == Some(true) {
        "workflow-redriven"
    } else {
        "workflow-not-dead"
    };
    Ok(Redirect::to(&format!(
        "/queue?name={}&note={note}",
        crate::pages::encode(&form.queue)
    ))
    .into_response())
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
            "WITH moved AS MATERIALIZED (
                 SELECT sturdy.transition($1, $2, 'cancelled', $3, error => 'cancelled from sturdy-ui') AS ok)
             SELECT m.ok, CASE WHEN m.ok THEN (SELECT sturdy.cancel(i.workflow, i.queue) FROM sturdy.instances i
                                                WHERE i.id = $1) END
               FROM moved m",
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn only_loopback_names_with_the_port_are_this_server() {
        let listen = at("127.0.0.1:8089");
        for ok in [
            "127.0.0.1:8089",
            "localhost:8089",
            "LocalHost:8089",
            "[::1]:8089",
        ] {
            assert!(host_allowed(ok, listen), "{ok}");
        }
        for refused in [
            "evil.example",
            "evil.example:8089",
            "127.0.0.1",
            "localhost",
            "127.0.0.1:8090",
            "localhost:80",
            "127.0.0.1:08089",
            "127.0.0.1:8089:8089",
            "localhost.:8089",
            "localhost.evil.example:8089",
            "[::1]",
            "[::1]8089",
            "[::1:8089",
            "[::2]:8089",
            "",
            ":8089",
        ] {
            assert!(!host_allowed(refused, listen), "{refused}");
        }
        // on port 80 a browser leaves the port out
        let listen = at("127.0.0.1:80");
        assert!(host_allowed("localhost", listen));
        assert!(host_allowed("127.0.0.1:80", listen));
        assert!(host_allowed("[::1]", listen));
        assert!(!host_allowed("evil.example", listen));
        // another loopback address, or IPv6 loopback, by its own literal
        assert!(host_allowed("127.0.0.2:8089", at("127.0.0.2:8089")));
        assert!(!host_allowed("127.0.0.2:8089", at("127.0.0.1:8089")));
        assert!(host_allowed("[::1]:8089", at("[::1]:8089")));
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, HeaderValue::from_str(value).unwrap());
        }
        h
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let h = headers(&[
            ("cookie", "a=1; sturdy_uix=no; sturdy_ui=first"),
            ("cookie", "sturdy_ui=second"),
        ]);
        assert_eq!(cookies(&h), vec!["first", "second"]);
        assert!(cookies(&headers(&[("cookie", "other=sturdy_ui=x")])).is_empty());
    }

    #[test]
    fn a_session_holds_until_it_ends_or_is_closed() {
        let sessions = Sessions::default();
        let t0 = Instant::now();
        let id = sessions.open(t0).unwrap();
        assert_eq!(id.len(), 64);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(sessions.holds(&id, t0 + SESSION - Duration::from_secs(1)));
        assert!(!sessions.holds(&id, t0 + SESSION), "ended");
        assert!(!sessions.holds("0".repeat(64).as_str(), t0), "forged");
        assert!(!sessions.holds("", t0));
        let h = headers(&[("cookie", &format!("sturdy_ui=forged; sturdy_ui={id}"))]);
        assert_eq!(session_of(&h, &sessions, t0), Some(id.clone()));
        sessions.close(&id);
        assert!(!sessions.holds(&id, t0), "logged out");
        assert_eq!(session_of(&h, &sessions, t0), None);
        // an ended session is forgotten at the next login
        let old = sessions.open(t0).unwrap();
        let new = sessions.open(t0 + SESSION).unwrap();
        assert_ne!(old, new);
        assert_eq!(sessions.live().len(), 1);
    }

    #[test]
    fn the_cookie_is_secure_behind_a_tls_proxy() {
        assert!(over_tls(&headers(&[("x-forwarded-proto", "https")])));
        assert!(over_tls(&headers(&[("x-forwarded-proto", "HTTPS, http")])));
        assert!(!over_tls(&headers(&[("x-forwarded-proto", "http")])));
        assert!(!over_tls(&HeaderMap::new()));
        let c = session_cookie("abc", SESSION.as_secs(), true);
        assert_eq!(
            c,
            "sturdy_ui=abc; HttpOnly; SameSite=Strict; Path=/; Max-Age=43200; Secure"
        );
        assert!(!session_cookie("abc", 0, false).contains("Secure"));
    }

    #[test]
    fn the_bearer_is_the_token_whole() {
        let token = "0123456789abcdef";
        assert!(bearer(
            &headers(&[("authorization", "Bearer 0123456789abcdef")]),
            token
        ));
        assert!(!bearer(
            &headers(&[("authorization", "Bearer 0123456789abcde")]),
            token
        ));
        assert!(!bearer(
            &headers(&[("authorization", "bearer 0123456789abcdef")]),
            token
        ));
        assert!(!bearer(&HeaderMap::new(), token));
    }
}
