//! The canonical-host phase: a site with `canonical = "example.com"` answers a
//! request naming any other host (`www.example.com`, an address) with a 301 to
//! the same path and query on the canonical host, the port kept. nginx writes it
//! as a `server` block with `return 301 https://example.com$request_uri`, Caddy as
//! `redir https://example.com{uri}`.
//!
//! A request without a Host (HTTP/1.0) is served as it is. That the canonical name
//! is one of the site's own, so that the redirect cannot loop, is checked at load.

use super::{Header, Request, Response, Status};
use crate::names::host_of;

/// The 301 to `canonical` when `req` names another host.
pub fn phase(req: &Request, canonical: Option<&str>) -> Option<Response> {
    let canonical = canonical?;
    let authority = req.authority.as_deref()?;
    // `OPTIONS *` names no resource to send the client to.
    if !req.path.starts_with('/') {
        return None;
    }
    let host = host_of(authority);
    if host == canonical {
        return None;
    }
    // The port the client used, kept: `host_of` dropped it.
    let port = match authority.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(':') => {
            format!(":{p}")
        }
        _ => String::new(),
    };
    let mut location = format!("https://{canonical}{port}{}", req.path);
    if let Some(q) = &req.query {
        location.push('?');
        location.push_str(q);
    }
    Some(Response::page(Status::MOVED_PERMANENTLY).with(Header::Location(location)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::Method;

    #[test]
    fn other_names_go_to_the_canonical_host() {
        for (authority, target, want) in [
            (Some("example.com"), "/a", None),
            (Some("EXAMPLE.com."), "/a", None),
            (Some("example.com:8443"), "/a", None),
            (Some("www.example.com"), "/a/b?x=1", Some("https://example.com/a/b?x=1")),
            (Some("www.example.com:8443"), "/", Some("https://example.com:8443/")),
            (Some("192.0.2.1"), "/p", Some("https://example.com/p")),
            (Some("[::1]:8443"), "/p", Some("https://example.com:8443/p")),
            (Some("[::1]"), "/p", Some("https://example.com/p")),
            (None, "/a", None),
        ] {
            let (path, query) = match target.split_once('?') {
                Some((p, q)) => (p, Some(q.to_string())),
                None => (target, None),
            };
            let req = Request { authority: authority.map(String::from), query, ..Request::new(Method::Get, path) };
            let got = phase(&req, Some("example.com"));
            assert_eq!(got.as_ref().map(|r| r.status), want.map(|_| Status::MOVED_PERMANENTLY), "{authority:?}");
            let location = got.as_ref().and_then(|r| r.header("Location")).map(|h| h.to_string());
            assert_eq!(location.as_deref(), want, "{authority:?} {target}");
        }
        assert!(phase(&Request { authority: Some("a".into()), ..Request::new(Method::Get, "/") }, None).is_none());
        let star = Request { authority: Some("a".into()), ..Request::new(Method::Options, "*") };
        assert!(phase(&star, Some("example.com")).is_none());
    }
}
