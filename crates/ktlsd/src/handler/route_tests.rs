//! The request phases through [`super::handle`] against a real file tree, no
//! sockets: their order (canonical, redirect, access, rate limit, static) and
//! `try_files` with hostile paths.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::access::{AccessRule, Addresses};
use super::limit::Limiter;
use super::location::{Locations, Rules, SiteWide};
use super::pattern::PathPattern;
use super::redirect::Redirect;
use super::*;
use crate::files::Options;

const PLAIN: Options = Options { dotfiles: false, autoindex: false, cache_entries: 0 };

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// DIR/root is ROOT; DIR/secret.html lies outside it, and ROOT/leak.html links to it.
fn tree() -> (tempfile::TempDir, Root) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().canonicalize().unwrap();
    let r = d.join("root");
    write(&d.join("secret.html"), b"SECRET");
    for (p, b) in [
        ("about.html", &b"about"[..]),
        ("docs/index.html", b"docs"),
        ("docs/guide.html", b"guide"),
        (".hidden.html", b"hidden"),
        ("index.html", b"home"),
        ("f.txt", b"f"),
        ("admin/x.html", b"admin"),
    ] {
        write(&r.join(p), b);
    }
    std::os::unix::fs::symlink("../secret.html", r.join("leak.html")).unwrap();
    let root = Root::new(&r).unwrap();
    (dir, root)
}

fn body(r: &Response) -> Vec<u8> {
    match &r.body {
        Body::File { found, range } => {
            let mut buf = vec![0; (range.end - range.start) as usize];
            std::os::unix::fs::FileExt::read_exact_at(&*found.file, &mut buf, range.start).unwrap();
            buf
        }
        Body::Bytes(b) => b.clone(),
        Body::Empty => Vec::new(),
        Body::Parts { .. } => panic!("a multipart body was not expected here"),
    }
}

fn request(method: Method, target: &str, host: Option<&str>, client: &str) -> Request {
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q.to_string())),
        None => (target, None),
    };
    Request {
        query,
        authority: host.map(String::from),
        client: Some(client.parse::<IpAddr>().unwrap()),
        ..Request::new(method, path)
    }
}

#[test]
fn try_files_serves_clean_urls_and_nothing_else() {
    let (_dir, root) = tree();
    let candidates = ["{path}", "{path}.html", "{path}/index.html"];
    let site_wide = SiteWide { try_files: candidates.iter().map(|s| s.to_string()).collect(), ..SiteWide::default() };
    let content = Content { locations: Locations::new(Rules::default(), site_wide), ..Content::NONE };
    let site = Site::new(&root, PLAIN, None, &content);
    for (target, status, want) in [
        ("/about", 200, Some(&b"about"[..])),
        ("/about.html", 200, Some(b"about")),
        ("/docs", 200, Some(b"docs")),
        ("/docs/", 200, Some(b"docs")),
        ("/docs/guide", 200, Some(b"guide")),
        ("/", 200, Some(b"home")),
        ("/nothing", 404, None),
        // The dot-file rule holds for candidates: `/.hidden` is not served as `.hidden.html`.
        ("/.hidden", 404, None),
        ("/%2ehidden", 404, None),
        // A candidate that would leave ROOT (a symlink out) is skipped, never served.
        ("/leak", 404, None),
        ("/leak.html", 403, None),
        // `..` never climbs out through a candidate.
        ("/../secret", 400, None),
        ("/docs/%2e%2e/%2e%2e/secret", 400, None),
        ("/docs/..%2f..%2fsecret", 400, None),
        ("/a%00", 400, None),
    ] {
        let r = handle(&request(Method::Get, target, None, "192.0.2.1"), &site);
        assert_eq!(r.status.0, status, "{target}");
        if let Some(want) = want {
            assert_eq!(body(&r), want, "{target}");
        }
        assert!(!body(&r).windows(6).any(|w| w == b"SECRET" || w == b"hidden"), "{target}");
    }
    // HEAD takes the same candidate, without a body.
    let r = handle(&request(Method::Head, "/about", None, "192.0.2.1"), &site);
    assert_eq!((r.status.0, body(&r).len()), (200, 0));
    // After the candidates, the site's fallback still answers.
    let spa = Content { fallback: Some("/index.html".into()), ..content.clone() };
    let site = site.with_content(&spa);
    let r = handle(&request(Method::Get, "/app/route", None, "192.0.2.1"), &site);
    assert_eq!((r.status.0, body(&r)), (200, b"home".to_vec()));
}

#[test]
fn phases_run_in_order() {
    let (_dir, root) = tree();
    let redirect = |path: &str, to: &str| Redirect {
        path: PathPattern::new(path).unwrap(),
        to: to.into(),
        status: Status::MOVED_PERMANENTLY,
    };
    let rules = Rules {
        redirects: vec![redirect("/admin/old", "/new")],
        access: vec![AccessRule {
            path: Some(PathPattern::new("/admin/*").unwrap()),
            rules: vec![(true, Addresses::parse("10.0.0.0/8").unwrap()), (false, Addresses::All)],
        }],
        ..Rules::default()
    };
    let site_wide = SiteWide {
        rate_limit: Some(Arc::new(Limiter::new(1, Duration::from_secs(60), 1, 64))),
        try_files: vec!["{path}.html".into()],
        error_pages: vec![(429, "/f.txt".into())],
        ..SiteWide::default()
    };
    let content =
        Content { canonical: Some("example.com".into()), locations: Locations::new(rules, site_wide), ..Content::NONE };
    let site = Site::new(&root, PLAIN, Some("max-age=1"), &content);
    let host = Some("example.com");
    let location = |r: &Response| r.header("Location").map(|h| h.to_string());
    let steps: Vec<(Request, u16, Option<&str>)> = vec![
        // 1. canonical before anything: even a redirect's or a denied path.
        (
            request(Method::Get, "/admin/old?a", Some("www.example.com"), "192.0.2.1"),
            301,
            Some("https://example.com/admin/old?a"),
        ),
        (
            request(Method::Get, "/admin/x", Some("www.example.com"), "192.0.2.1"),
            301,
            Some("https://example.com/admin/x"),
        ),
        // 2. redirect before access: the rule's path is inside /admin/.
        (request(Method::Get, "/admin/old", host, "192.0.2.1"), 301, Some("/new")),
        // 3. access before the rate limit: a denied request costs no allowance.
        (request(Method::Get, "/admin/x", host, "192.0.2.1"), 403, None),
        (request(Method::Get, "/admin/x", host, "192.0.2.1"), 403, None),
        (request(Method::Get, "/admin/x", host, "10.0.0.1"), 200, None),
        // 4. the rate limit before the static answer, for every method.
        (request(Method::Get, "/about", host, "192.0.2.1"), 200, None),
        (request(Method::Get, "/about", host, "192.0.2.1"), 429, None),
        (request(Method::Options, "*", host, "192.0.2.1"), 429, None),
        (request(Method::Get, "/admin/x", host, "10.0.0.1"), 429, None),
    ];
    for (i, (req, status, loc)) in steps.into_iter().enumerate() {
        let r = handle(&req, &site);
        assert_eq!(r.status.0, status, "step {i}: {req:?}");
        assert_eq!(location(&r).as_deref(), loc, "step {i}");
        // Every answer, redirects and refusals included, carries HSTS.
        assert!(r.header("Strict-Transport-Security").is_some(), "step {i}");
        if status == 429 {
            assert!(r.header("Retry-After").is_some(), "step {i}");
            assert_eq!(body(&r), b"f", "step {i}: the site's error page for 429");
        }
    }
    // A HEAD redirect has no body.
    let r = handle(&request(Method::Head, "/x", Some("www.example.com"), "192.0.2.1"), &site);
    assert_eq!((r.status.0, body(&r).len()), (301, 0));
}

#[test]
fn guard_answers_as_handle_does_and_lets_the_rest_through() {
    let (_dir, root) = tree();
    let rules = Rules {
        access: vec![AccessRule {
            path: Some(PathPattern::new("/api/*").unwrap()),
            rules: vec![(false, Addresses::parse("192.0.2.0/24").unwrap())],
        }],
        ..Rules::default()
    };
    let site_wide =
        SiteWide { rate_limit: Some(Arc::new(Limiter::new(1, Duration::from_secs(60), 1, 64))), ..SiteWide::default() };
    let content = Content { locations: Locations::new(rules, site_wide), ..Content::NONE };
    let site = Site::new(&root, PLAIN, Some("max-age=1"), &content);
    for (target, client, want) in [
        ("/api/x", "192.0.2.1", Some(403)),
        ("/api/x", "10.0.0.1", None),
        // The guard counts against the rate limit once, as `handle` does.
        ("/api/x", "10.0.0.1", Some(429)),
        ("/api/x", "192.0.2.1", Some(403)),
    ] {
        let req = request(Method::Get, target, None, client);
        let path = super::pattern::route_path(&req.path);
        let route = site.content.locations.find(path.as_deref());
        let r = super::guard(&req, &site.at(&route), &route, path.as_deref());
        assert_eq!(r.as_ref().map(|r| r.status.0), want, "{target} from {client}");
        if let Some(r) = r {
            assert!(r.header("Strict-Transport-Security").is_some(), "{target}: finished as handle finishes");
        }
    }
}
