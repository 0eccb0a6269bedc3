//! The reverse proxy's response cache end to end: the real binary in front of the
//! Python origin (`crates/testkit/src/origin.py`), which counts the requests it reads and
//! sends the response fields each test asks for in the query, with curl as the
//! client over HTTP/1.1 and HTTP/2. Each rule is shown by the origin's count and the
//! `Cache-Status` field: a max-age hit, responses never stored (no-store, private,
//! Set-Cookie, Authorization), s-maxage, Vary, revalidation by ETag (a 304
//! refreshes), stale-while-revalidate, stale-if-error with the origin down, a range
//! from a stored response, 100 concurrent misses coalesced into one upstream
//! request, a short upstream body never stored, purge, and entries kept across a
//! restart.

use std::path::Path;
use std::time::Duration;

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const PROTOCOLS: [&str; 2] = ["--http1.1", "--http2"];

/// ktlsd (one worker) caching `/api/**` from `origin` in `cache` (a directory), with
/// an admin socket `admin.sock` in its own directory.
fn server(origin: &Origin, cache: &Path) -> Server {
    let config = format!(
        "[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\ncache = true\n\n[cache]\ndir = {:?}\nmax_size = \"256M\"\n",
        origin.url(),
        cache.display().to_string()
    );
    let b = Server::builder(BIN).workers(Some(1)).file("index.txt", "static file");
    let sock = b.dir().join("admin.sock");
    b.config(&config).arg("--admin").arg(sock).arg("--log-level").arg("debug").start()
}

/// The origin target `/api/set/NAME` sending `fields` (each `Name:value`).
fn target(name: &str, fields: &[&str]) -> String {
    let encode = |f: &str| -> String {
        f.bytes()
            .map(|b| match b.is_ascii_alphanumeric() || b"-_.".contains(&b) {
                true => (b as char).to_string(),
                false => format!("%{b:02X}"),
            })
            .collect()
    };
    let q: Vec<String> = fields.iter().map(|f| format!("h={}", encode(f))).collect();
    format!("/api/set/{name}?{}", q.join("&"))
}

fn get(srv: &Server, path: &str, proto: &str, extra: &[&str]) -> Response {
    let mut args = vec![proto];
    args.extend_from_slice(extra);
    fetch(&srv.url(path), &args)
}

fn status(r: &Response) -> &str {
    r.header("cache-status").unwrap_or("(none)")
}

#[test]
fn fresh_responses_are_hits_and_uncacheable_ones_are_not_stored() {
    let origin = Origin::start("a");
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&origin, dir.path());
    for proto in PROTOCOLS {
        let t = target(&format!("max-age{proto}"), &["Cache-Control:max-age=60"]);
        let first = get(&srv, &t, proto, &[]);
        assert_eq!((first.status, status(&first)), (200, "ktlsd; fwd=miss; stored"), "{proto}");
        let second = get(&srv, &t, proto, &[]);
        assert_eq!((second.status, status(&second)), (200, "ktlsd; hit"), "{proto}");
        assert_eq!(second.body, first.body, "{proto}");
        assert!(second.header("age").is_some(), "{proto}");
        assert_eq!(origin.count(&t), 1, "two client requests, one upstream request ({proto})");

        let t = target(&format!("s-maxage{proto}"), &["Cache-Control:s-maxage=60"]);
        get(&srv, &t, proto, &[]);
        assert_eq!(status(&get(&srv, &t, proto, &[])), "ktlsd; hit", "s-maxage ({proto})");

        for (name, fields) in [
            ("no-store", &["Cache-Control:no-store, max-age=60"][..]),
            ("private", &["Cache-Control:private, max-age=60"]),
            ("cookie", &["Cache-Control:max-age=60", "Set-Cookie:id=1"]),
        ] {
            let t = target(&format!("{name}{proto}"), fields);
            for _ in 0..2 {
                let r = get(&srv, &t, proto, &[]);
                assert_eq!((r.status, status(&r)), (200, "ktlsd; fwd=miss"), "{name} ({proto})");
            }
            assert_eq!(origin.count(&t), 2, "{name} is never stored ({proto})");
        }

        // A request with Authorization: stored only when the response allows it (RFC 9111 section 3.5).
        let auth = ["-H", "Authorization: Bearer x"];
        let t = target(&format!("auth{proto}"), &["Cache-Control:max-age=60"]);
        get(&srv, &t, proto, &auth);
        assert_eq!(status(&get(&srv, &t, proto, &auth)), "ktlsd; fwd=miss", "{proto}");
        let t = target(&format!("auth-public{proto}"), &["Cache-Control:public, max-age=60"]);
        get(&srv, &t, proto, &auth);
        assert_eq!(status(&get(&srv, &t, proto, &auth)), "ktlsd; hit", "{proto}");
    }
}

#[test]
fn vary_keeps_one_entry_per_accept_encoding_and_ranges_come_from_the_entry() {
    let origin = Origin::start("a");
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&origin, dir.path());
    for proto in PROTOCOLS {
        let t = target(&format!("vary{proto}"), &["Cache-Control:max-age=60", "Vary:Accept-Encoding"]);
        let gzip = ["-H", "Accept-Encoding: gzip"];
        let br = ["-H", "Accept-Encoding: br"];
        assert_eq!(status(&get(&srv, &t, proto, &gzip)), "ktlsd; fwd=miss; stored", "{proto}");
        assert_eq!(status(&get(&srv, &t, proto, &br)), "ktlsd; fwd=vary-miss; stored", "{proto}");
        let r = get(&srv, &t, proto, &gzip);
        assert_eq!((status(&r), r.body_str()), ("ktlsd; hit", "a 1 gzip".to_string()), "{proto}");
        let r = get(&srv, &t, proto, &br);
        assert_eq!((status(&r), r.body_str()), ("ktlsd; hit", "a 2 br".to_string()), "{proto}");
        assert_eq!(origin.count(&t), 2, "{proto}");

        let t = target(&format!("range{proto}"), &["Cache-Control:max-age=60"]);
        let full = get(&srv, &t, proto, &[]);
        let r = get(&srv, &t, proto, &["-r", "2-4"]);
        assert_eq!((r.status, status(&r)), (206, "ktlsd; hit"), "{proto}");
        assert_eq!(r.body, full.body[2..5], "{proto}");
        assert_eq!(origin.count(&t), 1, "{proto}");
    }
}

#[test]
fn large_responses_are_stored_as_they_stream_and_hit_whole() {
    let origin = Origin::start("a");
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&origin, dir.path());
    // Over 8 MiB: HTTP/2 streams it to the client while storing it, as HTTP/1.1 does.
    let n = 9 << 20;
    for proto in PROTOCOLS {
        let t = format!("{}&n={n}", target(&format!("large{proto}"), &["Cache-Control:max-age=60"]));
        let first = get(&srv, &t, proto, &[]);
        assert_eq!((first.status, first.body.len(), status(&first)), (200, n, "ktlsd; fwd=miss"), "{proto}");
        for again in PROTOCOLS {
            let r = get(&srv, &t, again, &[]);
            assert_eq!((r.status, status(&r)), (200, "ktlsd; hit"), "{proto} then {again}");
            assert!(r.body == first.body, "the stored body is the one sent ({proto} then {again})");
        }
        assert_eq!(origin.count(&t), 1, "{proto}");
    }
}

#[test]
fn stale_entries_are_revalidated_or_served_while_revalidating() {
    let origin = Origin::start("a");
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&origin, dir.path());
    let etag = "ETag:\"v1\"";
    let targets: Vec<_> = PROTOCOLS
        .iter()
        .map(|p| {
            let revalidated = target(&format!("etag{p}"), &["Cache-Control:max-age=1", etag]);
            let swr = target(&format!("swr{p}"), &["Cache-Control:max-age=1, stale-while-revalidate=60", etag]);
            (p, revalidated, swr)
        })
        .collect();
    for (proto, t, swr) in &targets {
        get(&srv, t, proto, &[]);
        get(&srv, swr, proto, &[]);
    }
    std::thread::sleep(Duration::from_millis(2100));
    for (proto, t, swr) in &targets {
        let r = get(&srv, t, proto, &[]);
        assert_eq!((r.status, status(&r)), (200, "ktlsd; fwd=stale; fwd-status=304"), "{proto}");
        assert_eq!(r.body_str(), "a 1 -", "the stored body, refreshed ({proto})");
        assert_eq!(status(&get(&srv, t, proto, &[])), "ktlsd; hit", "{proto}");
        assert_eq!(origin.count(t), 2, "{proto}");

        let r = get(&srv, swr, proto, &[]);
        assert_eq!((r.status, status(&r)), (200, "ktlsd; hit; detail=stale-while-revalidate"), "{proto}");
        assert_eq!(r.body_str(), "a 1 -", "{proto}");
        let waited = std::time::Instant::now();
        while origin.count(swr) < 2 && waited.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(origin.count(swr), 2, "revalidated in the background ({proto})");
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(status(&get(&srv, swr, proto, &[])), "ktlsd; hit", "{proto}");
    }
}

#[test]
fn stale_if_error_answers_while_the_upstream_is_down() {
    let mut origin = Origin::start("a");
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&origin, dir.path());
    let sie = target("sie", &["Cache-Control:max-age=1, stale-if-error=60"]);
    let plain = target("plain", &["Cache-Control:max-age=1"]);
    get(&srv, &sie, "--http1.1", &[]);
    get(&srv, &plain, "--http1.1", &[]);
    origin.stop();
    std::thread::sleep(Duration::from_millis(2100));
    for proto in PROTOCOLS {
        let r = get(&srv, &sie, proto, &[]);
        assert_eq!((r.status, r.body_str()), (200, "a 1 -".to_string()), "{proto}");
        assert_eq!(status(&r), "ktlsd; fwd=stale; detail=stale-if-error", "{proto}");
        let r = get(&srv, &plain, proto, &[]);
        assert_eq!((r.status, status(&r)), (502, "ktlsd; fwd=stale; detail=connect"), "{proto}");
    }
}

#[test]
fn concurrent_misses_make_one_upstream_request() {
    let origin = Origin::start("a");
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&origin, dir.path());
    for proto in PROTOCOLS {
        let t = format!("{}&delay=0.5", target(&format!("herd{proto}"), &["Cache-Control:max-age=60"]));
        let url = srv.url(&t);
        let mut args: Vec<String> =
            ["--parallel", "--parallel-immediate", "--parallel-max", "100", proto].map(String::from).to_vec();
        for _ in 0..100 {
            args.extend(["-o".to_string(), "/dev/null".to_string(), "-w".into(), "%{http_code}\n".into(), url.clone()]);
        }
        let out = curl(&args);
        let codes = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(codes.lines().filter(|c| *c == "200").count(), 100, "{proto}: {codes}");
        assert_eq!(origin.count(&t), 1, "100 concurrent misses, one upstream request ({proto})");
    }
}

#[test]
fn a_short_body_is_never_stored_and_purge_and_restart_work() {
    let origin = Origin::start("a");
    let dir = tempfile::tempdir().unwrap();
    let srv = server(&origin, dir.path());
    for proto in PROTOCOLS {
        let t = format!("{}&short=1", target(&format!("short{proto}"), &["Cache-Control:max-age=60"]));
        for _ in 0..2 {
            // Cut after the head (HTTP/1.1 streams the body), or 502 (HTTP/2 reads a body being stored first).
            let out = curl(&["-o", "/dev/null", "-w", "%{http_code}", proto, &srv.url(&t)]);
            let code = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(!out.status.success() || code == "502", "a cut body is not passed off as whole ({proto}): {code}");
        }
        assert_eq!(origin.count(&t), 2, "nothing was stored ({proto})");
    }
    let t = target("kept", &["Cache-Control:max-age=600"]);
    get(&srv, &t, "--http2", &[]);
    assert_eq!(status(&get(&srv, &t, "--http2", &[])), "ktlsd; hit");
    drop(srv);
    // A new process over the same directory: its index is rebuilt from the files.
    let srv = server(&origin, dir.path());
    for proto in PROTOCOLS {
        let r = get(&srv, &t, proto, &[]);
        assert_eq!((status(&r), r.body_str()), ("ktlsd; hit", "a 1 -".to_string()), "{proto}");
    }
    let sock = srv.dir().join("admin.sock");
    let encoded: String = t.bytes().map(|b| format!("%{b:02X}")).collect();
    let (code, body) = admin_post(&sock, &format!("/cache/purge?url={encoded}"));
    assert_eq!(code, 200, "{body}");
    let r = get(&srv, &t, "--http1.1", &[]);
    assert_eq!(status(&r), "ktlsd; fwd=miss; stored", "after a purge");
    assert_eq!(origin.count(&t), 2);
}

/// `POST target` on the admin Unix socket: the status and the body.
fn admin_post(sock: &Path, target: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "POST {target} HTTP/1.1\r\nHost: admin\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no response head in {reply:?}"));
    (parse_head(head).1, body.to_string())
}

#[test]
fn cache_key_bypass_and_valid_steer_the_cache() {
    let origin = Origin::start("o");
    let cache = tempfile::tempdir().unwrap();
    let config = format!(
        "[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\ncache = true\ncache_key = \"$http_user_agent $request_uri\"\n\
         cache_bypass = {{ header = [\"X-Fresh\"], cookie = [\"nocache\"], query = [\"refresh\"] }}\n\
         cache_valid = {{ \"200\" = \"10m\", \"404\" = \"1m\" }}\n\n[cache]\ndir = {:?}\n",
        origin.url(),
        cache.path().display().to_string()
    );
    let srv = origin::ktlsd(BIN, &config, &[]);
    let body = |r: &Response| r.body_str();
    for proto in PROTOCOLS {
        let t = |name: &str| format!("/api/set/{name}{}", proto.trim_start_matches("--"));
        // No Cache-Control, no validator: cache_valid makes it fresh for ten minutes.
        let first = get(&srv, &t("valid"), proto, &[]);
        assert_eq!((first.status, body(&first).as_str()), (200, "o 1 -"), "{proto}");
        let again = get(&srv, &t("valid"), proto, &[]);
        assert_eq!(body(&again), "o 1 -", "a hit ({proto}): {}", status(&again));
        assert_eq!(status(&again), "ktlsd; hit", "{proto}");
        assert_eq!(again.header("ktlsd-cache-valid"), None, "{proto}");
        // A 404 for a minute.
        let path = format!("{}?status=404", t("missing"));
        assert_eq!(get(&srv, &path, proto, &[]).status, 404, "{proto}");
        let again = get(&srv, &path, proto, &[]);
        assert_eq!((again.status, status(&again)), (404, "ktlsd; hit"), "{proto}");
        // The origin's own freshness wins.
        let path = target(&format!("zero{proto}"), &["Cache-Control:max-age=0"]);
        get(&srv, &path, proto, &[]);
        let again = get(&srv, &path, proto, &[]);
        assert!(body(&again).starts_with("o 2 "), "max-age=0 is stale at once ({proto}): {}", status(&again));

        // The key: another User-Agent is another entry.
        let other = get(&srv, &t("valid"), proto, &["-A", "other-agent"]);
        assert_eq!((body(&other).as_str(), status(&other)), ("o 2 -", "ktlsd; fwd=miss; stored"), "{proto}");
        assert_eq!(body(&get(&srv, &t("valid"), proto, &["-A", "other-agent"])), "o 2 -", "{proto}");

        // Bypass: to the origin whatever is stored, the answer stored for the next.
        for (i, how) in [&["-H", "X-Fresh: 1"][..], &["-b", "a=1; nocache=yes"], &[]].into_iter().enumerate() {
            let path = if how.is_empty() { format!("{}?refresh=1", t("valid")) } else { t("valid") };
            let r = get(&srv, &path, proto, how);
            assert_eq!(body(&r), format!("o {} -", if how.is_empty() { 1 } else { 3 + i }), "{proto} {how:?}");
            assert!(status(&r).starts_with("ktlsd; fwd=bypass"), "{proto} {how:?}: {}", status(&r));
        }
        let after = get(&srv, &t("valid"), proto, &[]);
        assert_eq!(
            (body(&after).as_str(), status(&after)),
            ("o 4 -", "ktlsd; hit"),
            "the bypass's answer was stored ({proto})"
        );
        let zeroed = get(&srv, &t("valid"), proto, &["-H", "X-Fresh: 0"]);
        assert_eq!(status(&zeroed), "ktlsd; hit", "0 bypasses nothing ({proto})");
    }
}
