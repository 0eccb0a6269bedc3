//! The admin listener's actions: `POST /upstreams/drain?upstream=HOST:PORT` and
//! `POST /upstreams/enable?upstream=HOST:PORT`, allowed only to a user of the
//! `admin_auth` htpasswd file (Basic credentials, checked off the admin's event
//! loop), refused with 403 when no `admin_auth` is configured or when a browser
//! sends them from another origin; each one done is logged with who did what.
//!
//! Draining sets the upstream's shared flag (`handler::proxy::shared`), which every
//! worker reads when it picks an upstream: no new request goes to it from the next
//! pick on, requests already sent to it finish. Not the drain itself, nor the HTTP
//! of the admin listener (`super`).

use super::{Reply, Request, State};
use crate::handler::proxy::Upstream;

/// The realm of the admin's Basic authentication.
const REALM: &str = "ktlsd admin";

/// Most credential checks under way at once (each a bcrypt or argon2 hash on the
/// blocking pool); more get 503 rather than a thread each.
const MAX_CHECKS: usize = 4;

/// Credential checks under way.
static CHECKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Longest `upstream=` value taken.
const MAX_UPSTREAM: usize = 300;

/// Which action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Drain,
    Enable,
}

impl Action {
    pub fn of(path: &str) -> Option<Action> {
        match path {
            "/upstreams/drain" => Some(Action::Drain),
            "/upstreams/enable" => Some(Action::Enable),
            _ => None,
        }
    }

    fn done(self) -> &'static str {
        match self {
            Action::Drain => "drained",
            Action::Enable => "enabled",
        }
    }
}

/// Why a query was refused (400).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("give the upstream: ?upstream=HOST:PORT")]
    Missing,
    #[error("give upstream once")]
    Repeated,
    #[error("unknown query parameter {0:?}: only upstream=HOST:PORT")]
    Unknown(String),
    #[error("the upstream is not valid percent-encoded UTF-8")]
    Encoding,
    #[error("the upstream is longer than {MAX_UPSTREAM} bytes")]
    TooLong,
}

/// The `upstream=` value of `query` (percent-decoded), the only parameter taken.
pub fn upstream_param(query: Option<&str>) -> Result<String, QueryError> {
    let mut found = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != "upstream" {
            let shown: String = k.chars().take(40).collect();
            return Err(QueryError::Unknown(shown));
        }
        if found.is_some() {
            return Err(QueryError::Repeated);
        }
        if v.len() > MAX_UPSTREAM * 3 {
            return Err(QueryError::TooLong);
        }
        let v = percent_encoding::percent_decode_str(v).decode_utf8().map_err(|_| QueryError::Encoding)?;
        if v.len() > MAX_UPSTREAM {
            return Err(QueryError::TooLong);
        }
        found = Some(v.into_owned());
    }
    found.filter(|v| !v.is_empty()).ok_or(QueryError::Missing)
}

/// Whether `name` (from the query) names `u`: its `HOST:PORT`, or its URL.
fn names(u: &Upstream, name: &str) -> bool {
    let name = name.trim_end_matches('/');
    u.address().eq_ignore_ascii_case(name) || u.url.eq_ignore_ascii_case(name) || u.authority.eq_ignore_ascii_case(name)
}

/// Whether a browser's `Origin` is the admin listener's own (`Host`): a page of
/// another origin must not act with credentials the browser remembers.
pub(super) fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host else { return false };
    origin.strip_prefix("http://").is_some_and(|o| o.eq_ignore_ascii_case(host))
}

/// Answers an action request (`action` from its path).
pub async fn act(req: &Request<'_>, state: &State, action: Action) -> Reply {
    if req.method != "POST" {
        return Reply::text("405 Method Not Allowed", "admin actions take POST\n").header("Allow", "POST".into());
    }
    let current = state.current.borrow().clone();
    let Some(auth) = current.shared.config.admin_auth.clone() else {
        return Reply::text(
            "403 Forbidden",
            "admin actions are off: set admin_auth = \"FILE\" (an htpasswd file) to allow them\n",
        );
    };
    if let Some(origin) = req.header("origin") {
        if !same_origin(origin, req.header("host")) {
            return Reply::text("403 Forbidden", "an admin action from another origin is refused\n");
        }
    }
    let challenge = || {
        Reply::text("401 Unauthorized", "admin actions need the credentials of a user of admin_auth\n")
            .header("WWW-Authenticate", format!("Basic realm=\"{REALM}\", charset=\"UTF-8\""))
    };
    let Some((user, password)) = req.header("authorization").and_then(crate::handler::auth::credentials) else {
        return challenge();
    };
    // bcrypt and argon2 take milliseconds: off the admin's event loop, a few at a time.
    use std::sync::atomic::Ordering::Relaxed;
    if CHECKS.fetch_add(1, Relaxed) >= MAX_CHECKS {
        CHECKS.fetch_sub(1, Relaxed);
        return Reply::text("503 Service Unavailable", "too many admin credential checks at once; try again\n")
            .header("Retry-After", "1".into());
    }
    let users = auth.users.clone();
    let checked_user = user.clone();
    let ok = tokio::task::spawn_blocking(move || users.check(&checked_user, &password)).await.unwrap_or(false);
    CHECKS.fetch_sub(1, Relaxed);
    if !ok {
        crate::stats::AUTH_FAILURES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!("admin: refused {} for user {user:?}: wrong credentials", req.path());
        return challenge();
    }
    let name = match upstream_param(req.query()) {
        Ok(n) => n,
        Err(e) => return Reply::text("400 Bad Request", format!("{e}\n")),
    };
    let matching: Vec<Upstream> =
        super::document::upstreams(&current).into_iter().map(|(u, _)| u).filter(|u| names(u, &name)).collect();
    if matching.is_empty() {
        return Reply::text("404 Not Found", "no [[proxy]] upstream has that address\n");
    }
    let mut out = String::new();
    for u in &matching {
        let changed = u.shared.set_drained(action == Action::Drain);
        let what = action.done();
        tracing::info!(
            "admin: user {user:?} {what} upstream {} ({}){}",
            u.url,
            u.address(),
            if changed { "" } else { "; it already was" }
        );
        out.push_str(&format!("{what} {}\n", u.url));
    }
    Reply::text("200 OK", out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries() {
        assert_eq!(upstream_param(Some("upstream=127.0.0.1:8080")), Ok("127.0.0.1:8080".into()));
        assert_eq!(upstream_param(Some("upstream=%5B%3A%3A1%5D%3A80")), Ok("[::1]:80".into()));
        assert_eq!(upstream_param(None), Err(QueryError::Missing));
        assert_eq!(upstream_param(Some("upstream=")), Err(QueryError::Missing));
        assert_eq!(upstream_param(Some("&&")), Err(QueryError::Missing));
        assert_eq!(upstream_param(Some("upstream=a&upstream=b")), Err(QueryError::Repeated));
        assert_eq!(upstream_param(Some("x=1")), Err(QueryError::Unknown("x".into())));
        assert_eq!(upstream_param(Some("upstream=%ff%fe")), Err(QueryError::Encoding));
        assert_eq!(upstream_param(Some(&format!("upstream={}", "a".repeat(400)))), Err(QueryError::TooLong));
        assert_eq!(upstream_param(Some(&format!("upstream={}", "%41".repeat(400)))), Err(QueryError::TooLong));
    }

    #[test]
    fn names_and_origins() {
        let u = Upstream::parse("http://Origin.test:8080/").unwrap();
        assert!(names(&u, "origin.test:8080"));
        assert!(names(&u, "http://origin.test:8080"));
        assert!(!names(&u, "origin.test:8081"));
        let v6 = Upstream::parse("http://[::1]:81").unwrap();
        assert!(names(&v6, "[::1]:81"));
        let default_port = Upstream::parse("http://a.test").unwrap();
        assert!(names(&default_port, "a.test:80"));
        assert!(same_origin("http://127.0.0.1:9443", Some("127.0.0.1:9443")));
        assert!(!same_origin("http://evil.test", Some("127.0.0.1:9443")));
        assert!(!same_origin("null", Some("127.0.0.1:9443")));
        assert!(!same_origin("http://127.0.0.1:9443", None));
    }
}
