//! Routing and per-client limits through the real binary, over HTTP/1.1 and
//! HTTP/2 with curl: redirects (globs, `{*}`, the query), clean URLs
//! (`try_files`) that never reach outside ROOT or a dot-file, the canonical host,
//! `[[access]]` rules by the TCP peer's address (other loopback addresses with
//! `curl --interface 127.0.0.N`), the per-address rate limit (429 and Retry-After,
//! shared by the workers, deaf to X-Forwarded-For) and `max_connections_per_ip`
//! refused at accept and counted; then the start-up refusal of bad rules.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const PROTOCOLS: [&str; 2] = ["--http1.1", "--http2"];

/// The status codes of several GETs of `urls` made by one curl (one connection:
/// keep-alive requests over HTTP/1.1, streams over HTTP/2), with `extra` arguments.
fn statuses(urls: &[String], extra: &[&str]) -> Vec<u16> {
    let mut cmd = Command::new("curl");
    cmd.args(["-sk", "--max-time", "30", "-w", "%{http_code}\\n"]).args(extra);
    for u in urls {
        cmd.args(["-o", "/dev/null", u]);
    }
    let out = run_with_timeout(&mut cmd, None, CLIENT_TIMEOUT);
    String::from_utf8_lossy(&out.stdout).lines().map(|l| l.trim().parse().unwrap_or(0)).collect()
}

#[test]
fn redirects_and_clean_urls_over_http1_and_http2() {
    let srv = Server::builder(BIN)
        .file("about.html", "about page")
        .file("docs/index.html", "docs index")
        .file("docs/guide.html", "guide")
        .file("index.html", "home")
        .file(".secret.html", "dot-file")
        .file("posts/a/b.html", "post b")
        .config(
            r#"
try_files = ["{path}", "{path}.html", "{path}/index.html"]

[[redirect]]
path = "/old"
to = "/about"

[[redirect]]
path = "/blog/*"
to = "/posts/{*}"
status = 308

[[redirect]]
path = "/search"
to = "/find?q=all"
status = 302

[[redirect]]
path = "/ext/*"
to = "https://example.com/{*}"
status = 307

[[redirect]]
path = "/go/*"
to = "/{*}"
"#,
        )
        .start();
    std::fs::write(srv.dir().join("outside.html"), "OUTSIDE-ROOT").unwrap();
    for proto in PROTOCOLS {
        for (path, status, location) in [
            ("/old", 301, Some("/about")),
            ("/old?x=1&y=2", 301, Some("/about?x=1&y=2")),
            ("/blog/a/b.html?c", 308, Some("/posts/a/b.html?c")),
            ("/%62log/a", 308, Some("/posts/a")),
            ("/search?q=1", 302, Some("/find?q=all")),
            ("/ext/x%20y", 307, Some("https://example.com/x%20y")),
            // Hostile: no protocol-relative Location, whatever the capture.
            ("/go//evil.example/", 301, Some("/evil.example/")),
            ("/go/%2F%2Fevil.example", 301, Some("/evil.example")),
            ("/go/%5Cevil.example", 301, Some("/%5Cevil.example")),
        ] {
            let r = fetch(&srv.url(path), &[proto, "--path-as-is"]);
            assert_eq!(r.status, status, "{proto} {path}: {:?}", r.headers);
            assert_eq!(r.header("location"), location, "{proto} {path}");
        }
        // curl follows a redirect into a clean URL.
        let r = fetch(&srv.url("/blog/a/b"), &[proto, "-L"]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "post b"), "{proto}");
        for (path, status, body) in [
            ("/about", 200, Some("about page")),
            ("/about.html", 200, Some("about page")),
            ("/docs", 200, Some("docs index")),
            ("/docs/", 200, Some("docs index")),
            ("/docs/guide", 200, Some("guide")),
            ("/", 200, Some("home")),
            ("/nothing", 404, None),
            // The dot-file rule holds for every candidate: `/.secret` is not `.secret.html`.
            ("/.secret", 404, None),
            ("/%2esecret", 404, None),
            // `..` (plain or encoded) never leads out of ROOT through a candidate.
            ("/../outside", 400, None),
            ("/%2e%2e/outside", 400, None),
            ("/docs/..%2f..%2foutside", 400, None),
            ("/docs/%2e%2e/%2e%2e/outside", 400, None),
        ] {
            let r = fetch(&srv.url(path), &[proto, "--path-as-is"]);
            assert_eq!(r.status, status, "{proto} {path}");
            if let Some(b) = body {
                assert_eq!(r.body_str(), b, "{proto} {path}");
            }
            assert!(!r.body_str().contains("OUTSIDE-ROOT") && !r.body_str().contains("dot-file"), "{proto} {path}");
        }
    }
}

#[test]
fn canonical_host_redirects_other_names() {
    let b = Server::builder(BIN).file("p.txt", "site a");
    let root = b.root().to_path_buf();
    let srv = b
        .config(&format!(
            "canonical = \"localhost\"\n\n[[site]]\nnames = [\"a.test\", \"www.a.test\"]\nroot = \"{}\"\ncanonical = \"a.test\"\n",
            root.display()
        ))
        .start();
    let port = srv.port();
    for proto in PROTOCOLS {
        let resolve = |name: &str| format!("{name}:{port}:127.0.0.1");
        let www = resolve("www.a.test");
        let r = fetch(&format!("https://www.a.test:{port}/p.txt?x=1"), &[proto, "--resolve", &www]);
        assert_eq!(r.status, 301, "{proto}");
        assert_eq!(r.header("location"), Some(format!("https://a.test:{port}/p.txt?x=1").as_str()), "{proto}");
        let apex = resolve("a.test");
        let r = fetch(&format!("https://a.test:{port}/p.txt"), &[proto, "--resolve", &apex]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "site a"), "{proto}");
        // The default site's canonical name: an address or another name goes there.
        let r = fetch(&srv.url("/p.txt"), &[proto]);
        assert_eq!(r.status, 301, "{proto}");
        assert_eq!(r.header("location"), Some(format!("https://localhost:{port}/p.txt").as_str()), "{proto}");
        let r = fetch(&format!("https://localhost:{port}/p.txt"), &[proto, "--resolve", &resolve("localhost")]);
        assert_eq!(r.status, 200, "{proto}");
    }
}

#[test]
fn access_rules_follow_the_peer_address_not_forwarded_headers() {
    let srv = Server::builder(BIN)
        .file("admin/panel.html", "panel")
        .file("public.html", "public")
        .config(
            r#"
[[access]]
path = "/admin/*"
allow = ["127.0.0.2", "10.0.0.0/8"]
deny = ["all"]

[[access]]
deny = ["127.0.0.9"]
"#,
        )
        .start();
    for proto in PROTOCOLS {
        for (from, path, forged, want) in [
            (None, "/admin/panel.html", None, 403),
            (None, "/%61dmin/panel.html", None, 403),
            (None, "/public/../admin/panel.html", None, 403),
            (None, "/admin/panel.html", Some("127.0.0.2"), 403),
            (None, "/admin/panel.html", Some("10.1.1.1"), 403),
            (Some("127.0.0.2"), "/admin/panel.html", None, 200),
            (None, "/public.html", None, 200),
            (Some("127.0.0.9"), "/public.html", None, 403),
            (Some("127.0.0.9"), "/public.html", Some("127.0.0.1"), 403),
        ] {
            let mut extra = vec![proto, "--path-as-is"];
            if let Some(ip) = from {
                extra.extend(["--interface", ip]);
            }
            let forged_header = forged.map(|ip| format!("X-Forwarded-For: {ip}"));
            let real_ip = forged.map(|ip| format!("X-Real-IP: {ip}"));
            for h in forged_header.iter().chain(real_ip.iter()) {
                extra.extend(["-H", h.as_str()]);
            }
            let r = fetch(&srv.url(path), &extra);
            assert_eq!(r.status, want, "{proto} from {from:?} {path} forged {forged:?}");
        }
    }
}

#[test]
fn rate_limit_per_address_over_both_protocols_and_all_workers() {
    let srv = Server::builder(BIN)
        .workers(Some(2))
        .file("f.txt", "x")
        .config("rate_limit = { requests = 1, per = \"60s\", burst = 3 }\n")
        .start();
    let url = srv.url("/f.txt");
    // Over one HTTP/2 connection (streams) and one HTTP/1.1 connection (keep-alive).
    let five: Vec<String> = (0..5).map(|_| url.clone()).collect();
    assert_eq!(statuses(&five, &["--http2", "--interface", "127.0.0.3"]), [200, 200, 200, 429, 429]);
    assert_eq!(statuses(&five, &["--http1.1", "--interface", "127.0.0.4"]), [200, 200, 200, 429, 429]);
    // New connections (spread over both workers) share the client's count.
    let r = fetch(&url, &["--http1.1", "--interface", "127.0.0.3"]);
    assert_eq!(r.status, 429);
    let after: u64 = r.header("retry-after").and_then(|v| v.parse().ok()).expect("Retry-After");
    assert!((1..=60).contains(&after), "Retry-After {after}");
    for _ in 0..4 {
        assert_eq!(fetch(&url, &["--http2", "--interface", "127.0.0.4"]).status, 429);
    }
    // A forged X-Forwarded-For changes nothing: the address is the TCP peer's.
    for i in 0..5 {
        let forged = format!("X-Forwarded-For: 192.0.2.{i}");
        assert_eq!(fetch(&url, &["--interface", "127.0.0.3", "-H", &forged]).status, 429, "{forged}");
    }
    // Another address has its own allowance.
    assert_eq!(statuses(&five[..3], &["--http2", "--interface", "127.0.0.5"]), [200, 200, 200]);
}

/// Opens a TCP connection to `addr` from `from` (a loopback address).
fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let local: SocketAddr = format!("{from}:0").parse().unwrap();
    s.bind(&local.into()).unwrap();
    s.connect(&addr.into()).unwrap();
    s.into()
}

/// Whether the server ends `s` at once (reset or close) rather than waiting for a handshake.
fn closed_at_once(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut buf = [0u8; 1];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    }
}

#[test]
fn max_connections_per_ip_refuses_at_accept_and_counts() {
    let srv = Server::builder(BIN).workers(Some(2)).file("f.txt", "x").args(["--max-connections-per-ip", "2"]).start();
    let addr = srv.addr();
    let held: Vec<TcpStream> = (0..2).map(|_| connect_from("127.0.0.6", addr)).collect();
    // Give the workers time to accept both before the third arrives.
    std::thread::sleep(Duration::from_millis(300));
    let mut third = connect_from("127.0.0.6", addr);
    assert!(closed_at_once(&mut third), "a third connection from one address is refused at accept");
    assert_eq!(fetch(&srv.url("/f.txt"), &["--interface", "127.0.0.7"]).status, 200, "another address");
    let out = curl(&["--interface", "127.0.0.6", srv.url("/f.txt").as_str()]);
    assert!(!out.status.success(), "curl from the full address must fail");
    drop(held);
    // The places are given back when the connections end.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = curl(&["--interface", "127.0.0.6", srv.url("/f.txt").as_str()]);
        if out.status.success() {
            break;
        }
        assert!(Instant::now() < deadline, "the address never got its connections back");
        std::thread::sleep(Duration::from_millis(100));
    }
    let stopped = srv.stop();
    stopped.assert_clean_exit();
    assert_eq!(stopped.stat("connections_refused_per_ip"), 2, "{}", stopped.stderr);
}

#[test]
fn bad_rules_stop_start_up_with_what_to_write() {
    for (config, want) in [
        (
            "[[redirect]]\npath = \"/a/*\"\nto = \"/a/b/{*}\"\n",
            "redirect 1: to \"/a/b/{*}\" is matched by redirect 1's path",
        ),
        (
            "[[redirect]]\npath = \"/a\"\nto = \"/b\"\nstatus = 303\n",
            "redirect 1: status 303: expected 301, 302, 307 or 308",
        ),
        ("[[redirect]]\npath = \"/a\"\nto = \"//evil.example\"\n", "expected a path beneath the site"),
        ("[[redirect]]\npath = \"/a\"\nto = \"/b/{*}\"\n", "has no single * to fill it"),
        ("[[redirect]]\npath = \"/a/*\"\nto = \"/b/../../{*}\"\n", "climbs with .."),
        ("[[access]]\npath = \"/admin/*\"\nallow = [\"10.0.0.0/33\"]\n", "access 1: allow: \"10.0.0.0/33\" is not"),
        ("rate_limit = { requests = 0 }\n", "rate_limit: requests = 0: give at least 1"),
        ("try_files = [\"{path}/../x\"]\n", "try_files \"{path}/../x\""),
        ("canonical = \"https://example.com\"\n", "canonical \"https://example.com\": expected a host name"),
        ("max_connections_per_ip = 0\n", "max_connections_per_ip 0: give at least 1"),
    ] {
        let Err(e) = Server::builder(BIN).config(config).try_start() else { panic!("{config}: started") };
        assert!(e.contains(want), "{config}: {e}");
    }
}
