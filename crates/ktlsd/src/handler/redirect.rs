//! The redirect phase: `[[redirect]]` rules, tried in order against the normalised
//! request path (by the site's location tree); the first that matches answers with its status and a Location
//! built from its `to` (`{*}` replaced by what the path's `*` matched, re-encoded;
//! the request's query kept unless `to` has one). Before the static answer, as
//! nginx's `return 301` and Caddy's `redir`.
//!
//! It only builds the answer: the rules are checked (status, `to`, loops) when the
//! configuration is loaded, in `config::routing`.

use super::pattern::PathPattern;
use super::{Header, Request, Response, Status};
use percent_encoding::{AsciiSet, CONTROLS};

/// One `[[redirect]]` rule, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    pub path: PathPattern,
    /// A path beneath the site (`/new/{*}`) or an absolute `http(s)://` URL.
    pub to: String,
    /// 301, 302, 307 or 308.
    pub status: Status,
}

/// Bytes of a captured path re-encoded in a Location: controls, space, the
/// delimiters that would end or change a path (`?`, `#`, `%`) and those a browser
/// may read as a slash or quote (`\`, `"`, `<`, `>`, `` ` ``, `{`, `|`, `}`, `^`).
const CAPTURE: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'\\')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// The redirect for `req` (whose normalised path is `path`) by `rule`, the first that
/// matches it (the location tree's choice).
pub fn phase(req: &Request, path: Option<&str>, rule: Option<&Redirect>) -> Option<Response> {
    let (path, rule) = (path?, rule?);
    let location = location(rule, path, req.query.as_deref())?;
    Some(Response::page(rule.status).with(Header::Location(location)))
}

/// The Location of `rule` for `path`; `None` when the result would leave the
/// site through a protocol-relative URL (`//host`, `/\host`).
pub fn location(rule: &Redirect, path: &str, query: Option<&str>) -> Option<String> {
    let mut location = match rule.path.capture(path) {
        Some(captured) if rule.to.contains("{*}") => {
            let encoded = percent_encoding::utf8_percent_encode(captured, CAPTURE).to_string();
            rule.to.replace("{*}", &encoded)
        }
        _ => rule.to.clone(),
    };
    if location.starts_with("//") || location.starts_with("/\\") {
        return None;
    }
    if let (false, Some(q)) = (rule.to.contains('?'), query) {
        location.push('?');
        location.push_str(q);
    }
    Some(location)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::location::{Locations, Rules, SiteWide};
    use crate::handler::pattern::route_path;

    fn rule(path: &str, to: &str, status: u16) -> Redirect {
        Redirect { path: PathPattern::new(path).unwrap(), to: to.into(), status: Status(status) }
    }

    #[test]
    fn redirects() {
        let rules = [
            rule("/old", "/new", 301),
            rule("/blog/*", "/posts/{*}", 308),
            rule("/docs/*.htm", "/docs/{*}.html", 302),
            rule("/search", "/find?q=all", 307),
            rule("/ext/*", "https://example.com/{*}", 301),
            rule("/go/*", "/{*}", 301),
            rule("/blog/*", "/never", 301),
        ];
        let redirects = rules.to_vec();
        let tree = Locations::new(Rules { redirects, ..Rules::default() }, SiteWide::default());
        for (target, want) in [
            ("/old", Some((301, "/new"))),
            ("/old?a=1", Some((301, "/new?a=1"))),
            ("/old/", None),
            ("/blog", Some((308, "/posts/"))),
            ("/blog/2024/a.html?x", Some((308, "/posts/2024/a.html?x"))),
            ("/%62log/a", Some((308, "/posts/a"))),
            ("/x/../blog/a", Some((308, "/posts/a"))),
            ("/blog/a%20b", Some((308, "/posts/a%20b"))),
            ("/blog/a%3Fb%23c", Some((308, "/posts/a%3Fb%23c"))),
            ("/blog/a%5C", Some((308, "/posts/a%5C"))),
            ("/docs/a/b.htm", Some((302, "/docs/a/b.html"))),
            ("/search?q=1", Some((307, "/find?q=all"))),
            ("/ext/a/b?c", Some((301, "https://example.com/a/b?c"))),
            // Hostile: a capture cannot make a protocol-relative URL or climb above the rule.
            ("/go//evil.example", Some((301, "/evil.example"))),
            ("/go/%2F%2Fevil.example", Some((301, "/evil.example"))),
            ("/go/%5Cevil.example", Some((301, "/%5Cevil.example"))),
            ("/go/..%2F..%2Fetc", None),
            ("/blog/..%2f..%2fsecret", None),
            ("/other", None),
        ] {
            let (p, q) = match target.split_once('?') {
                Some((p, q)) => (p, Some(q.to_string())),
                None => (target, None),
            };
            let req = Request { query: q, ..Request::new(crate::vocab::Method::Get, p) };
            let path = route_path(p);
            let got = phase(&req, path.as_deref(), tree.find(path.as_deref()).redirect);
            let got =
                got.as_ref().map(|r| (r.status.0, r.header("Location").map(|h| h.to_string()).unwrap_or_default()));
            assert_eq!(got, want.map(|(s, l)| (s, l.to_string())), "{target}");
        }
    }

    #[test]
    fn protocol_relative_results_are_dropped() {
        // `to = "/{*}"` with an empty capture cannot give `//`, but a rule written
        // `/{*}` for a captured `/x` could: the check is on the result.
        let r = rule("/p*", "/{*}", 301);
        assert_eq!(location(&r, "/p/evil", None), None);
        assert_eq!(location(&r, "/pa", None).as_deref(), Some("/a"));
    }
}
