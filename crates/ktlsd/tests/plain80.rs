//! The plain-HTTP listener (`--http-listen`): redirects to HTTPS, ACME HTTP-01
//! challenges from ROOT, bounded reads; `/.well-known/` over HTTPS with dot-files
//! hidden; `--hsts` on HTTPS responses only. Real binary, curl and raw sockets.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const TOKEN: &str = "LoqXcYV8q5ONbJQxbmR7SCTNo3tiAXDfowyjxAjEuX0";
const HSTS: &str = "max-age=31536000; includeSubDomains";

/// A server with a plain listener on an ephemeral port; returns it with that port's address.
fn start(b: ServerBuilder) -> (Server, SocketAddr) {
    let s = b.args(["--http-listen", "127.0.0.1:0"]).start();
    let line = s.wait_stderr("listening on http://", Duration::from_secs(5)).expect("no plain listener line");
    let addr = line.split("listening on http://").nth(1).and_then(|a| a.split_whitespace().next()).unwrap_or("");
    let addr = addr.parse().unwrap_or_else(|e| panic!("bad address in {line:?}: {e}"));
    (s, addr)
}

/// Sends `req` on a fresh connection and reads until the server closes.
fn raw(addr: SocketAddr, req: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(req).expect("send");
    let (got, closed) = read_raw_until_closed(&mut s, Duration::from_secs(10));
    assert!(closed, "the server did not close the connection; got {:?}", String::from_utf8_lossy(&got));
    String::from_utf8_lossy(&got).into_owned()
}

fn status_of(resp: &str) -> u16 {
    parse_head(resp.split("\r\n\r\n").next().unwrap_or("")).1
}

fn header<'a>(resp: &'a str, name: &str) -> Option<&'a str> {
    let head = resp.split("\r\n\r\n").next().unwrap_or("");
    head.split("\r\n").skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[test]
fn redirects_to_https_with_port_path_and_query() {
    let (s, http) = start(Server::builder(BIN));
    let https_port = s.port();
    let url = format!("http://{http}/a/b%20c?x=1&y=%2F");
    let r = fetch(&url, &[]);
    assert_eq!(r.status, 301, "{r:?}");
    let want = format!("https://127.0.0.1:{https_port}/a/b%20c?x=1&y=%2F");
    assert_eq!(r.header("location"), Some(want.as_str()));
    assert_eq!(r.header("connection"), Some("close"));
    assert!(r.body.len() < 200, "body {} bytes", r.body.len());

    // The Host's name is kept, its port replaced by the HTTPS one; no query, no `?`.
    let resp = raw(http, b"GET /x HTTP/1.1\r\nHost: www.example.com:80\r\n\r\n");
    assert_eq!(status_of(&resp), 301, "{resp}");
    assert_eq!(header(&resp, "location"), Some(format!("https://www.example.com:{https_port}/x").as_str()));
    let resp = raw(http, b"GET /x?q HTTP/1.1\r\nHost: [::1]\r\n\r\n");
    assert_eq!(header(&resp, "location"), Some(format!("https://[::1]:{https_port}/x?q").as_str()));

    // Following the redirect with curl lands on the HTTPS file.
    s.write("f.txt", "over https\n");
    let r = fetch(&format!("http://{http}/f.txt"), &["-L"]);
    assert_eq!((r.status, r.body_str().as_str()), (200, "over https\n"));

    // HEAD: the same head, no body.
    let resp = raw(http, b"HEAD /h HTTP/1.1\r\nHost: e.example\r\n\r\n");
    assert_eq!(status_of(&resp), 301);
    assert!(resp.ends_with("\r\n\r\n"), "HEAD answer has a body: {resp:?}");

    // SIGTERM stops the plain listener too.
    s.stop().assert_clean_exit();
    assert!(TcpStream::connect_timeout(&http, Duration::from_secs(1)).is_err(), "plain listener still open");
}

#[test]
fn redirect_omits_port_443() {
    // Binding 443 needs privileges (root, or CAP_NET_BIND_SERVICE).
    let b = Server::builder(BIN).listen(&["127.0.0.1:443"]).args(["--http-listen", "127.0.0.1:0"]);
    let s = b.try_start().unwrap_or_else(|e| panic!("this test binds 127.0.0.1:443 and needs privileges for it: {e}"));
    let line = s.wait_stderr("listening on http://", Duration::from_secs(5)).expect("plain listener line");
    let http: SocketAddr =
        line.split("listening on http://").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    let resp = raw(http, b"GET /p?q=1 HTTP/1.1\r\nHost: example.com\r\n\r\n");
    assert_eq!(header(&resp, "location"), Some("https://example.com/p?q=1"));
}

#[test]
fn bad_or_missing_host_and_garbage_get_400() {
    let (_s, http) = start(Server::builder(BIN));
    for (req, want) in [
        (&b"GET / HTTP/1.1\r\n\r\n"[..], 400),
        (b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: u@h\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400),
        (b"GET / HTTP/1.0\r\n\r\n", 400),
        (b"GET / HTTP/1.0\r\nHost:\r\n\r\n", 400),
        (b"\x16\x03\x01\x00\x05hello\r\n\r\n", 400),
        (b"\x00\x01\x02\x03\r\n\r\n", 400),
        (b"GET\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505),
    ] {
        let resp = raw(http, req);
        assert_eq!(status_of(&resp), want, "{:?}: {resp}", String::from_utf8_lossy(req));
        assert_eq!(header(&resp, "location"), None);
    }
    // A head larger than 8 KiB is refused without waiting for its end.
    let big = format!("GET / HTTP/1.1\r\nHost: x\r\nX: {}\r\n", "a".repeat(9000));
    assert_eq!(status_of(&raw(http, big.as_bytes())), 431);
    let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(9000));
    assert_eq!(status_of(&raw(http, long.as_bytes())), 414);
    // Still serving.
    assert_eq!(status_of(&raw(http, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")), 301);
}

#[test]
fn acme_challenge_over_plain_http() {
    let key_auth = format!("{TOKEN}.9jg46WB3rR_AHD-EBXdN7cBkH1WOu0tA3M9fm21mqTI");
    let b = Server::builder(BIN)
        .file(&format!(".well-known/acme-challenge/{TOKEN}"), &key_auth)
        .file(".well-known/acme-challenge/.hidden", "no")
        .file(".well-known/other", "no")
        .file("secret/x", "no");
    let (_s, http) = start(b);
    let r = fetch(&format!("http://{http}/.well-known/acme-challenge/{TOKEN}"), &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body_str(), key_auth);
    assert_eq!(r.header("content-type"), Some("text/plain"));
    assert_eq!(r.header("strict-transport-security"), None);

    for path in [
        "/.well-known/acme-challenge/absent",
        "/.well-known/acme-challenge/.hidden",
        "/.well-known/acme-challenge/..%2F..%2Fsecret%2Fx",
        "/.well-known/acme-challenge/a.b",
        "/.well-known/acme-challenge/",
        "/.well-known/acme-challenge/a/b",
    ] {
        let resp = raw(http, format!("GET {path} HTTP/1.1\r\nHost: h\r\n\r\n").as_bytes());
        assert_eq!(status_of(&resp), 404, "{path}: {resp}");
    }
    // Outside the challenge directory, everything is redirected.
    let resp = raw(http, b"GET /.well-known/other HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_eq!(status_of(&resp), 301);
}

#[test]
fn well_known_over_https_while_dotfiles_stay_hidden() {
    let b = Server::builder(BIN)
        .file(".well-known/security.txt", "Contact: mailto:security@example.com\n")
        .file(".well-known/.private", "no")
        .file(".hidden", "no")
        .file("d/.well-known/x", "no");
    let s = b.start();
    let r = fetch(&s.url("/.well-known/security.txt"), &[]);
    assert_eq!((r.status, r.body_str().as_str()), (200, "Contact: mailto:security@example.com\n"));
    for path in ["/.hidden", "/.well-known/.private", "/d/.well-known/x"] {
        assert_eq!(fetch(&s.url(path), &[]).status, 404, "{path}");
    }
}

#[test]
fn hsts_on_every_https_response_and_not_on_plain() {
    let (s, http) = start(Server::builder(BIN).file("a.txt", "a").args(["--hsts", HSTS]));
    let ok = fetch(&s.url("/a.txt"), &[]);
    assert_eq!(ok.status, 200);
    let etag = ok.header("etag").expect("etag").to_string();
    let not_modified = fetch(&s.url("/a.txt"), &["-H", &format!("If-None-Match: {etag}")]);
    let missing = fetch(&s.url("/nope"), &[]);
    let post = fetch(&s.url("/a.txt"), &["-X", "POST"]);
    for (what, r, status) in
        [("200", &ok, 200), ("304", &not_modified, 304), ("404", &missing, 404), ("405", &post, 405)]
    {
        assert_eq!(r.status, status, "{what}");
        assert_eq!(r.header("strict-transport-security"), Some(HSTS), "{what}: {:?}", r.headers);
        assert_eq!(r.header_count("strict-transport-security"), 1, "{what}");
    }
    let plain = raw(http, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_eq!(status_of(&plain), 301);
    assert_eq!(header(&plain, "strict-transport-security"), None, "{plain}");

    // Off by default.
    let s = Server::builder(BIN).file("a.txt", "a").start();
    assert_eq!(fetch(&s.url("/a.txt"), &[]).header("strict-transport-security"), None);
}

#[test]
fn slow_plain_client_times_out_without_blocking_others() {
    let (_s, http) = start(Server::builder(BIN).args(["--header-timeout", "1s"]));
    let started = Instant::now();
    let mut slow = TcpStream::connect(http).expect("connect");
    slow.write_all(b"GET / HTTP/1.1\r\nHo").expect("send");
    // Others are answered at once meanwhile.
    for _ in 0..5 {
        let t = Instant::now();
        assert_eq!(status_of(&raw(http, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")), 301);
        assert!(t.elapsed() < Duration::from_millis(500), "took {:?}", t.elapsed());
    }
    let (got, closed) = read_raw_until_closed(&mut slow, Duration::from_secs(5));
    let got = String::from_utf8_lossy(&got);
    assert!(closed, "slow client not closed");
    assert_eq!(status_of(&got), 408, "{got}");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(4), "closed after {took:?}");

    // A client that connects and sends nothing is closed too, without an answer.
    let mut idle = TcpStream::connect(http).expect("connect");
    let (got, closed) = read_raw_until_closed(&mut idle, Duration::from_secs(5));
    assert!(closed && got.is_empty(), "{got:?}");
    let mut buf = [0u8; 1];
    assert!(matches!(idle.read(&mut buf), Ok(0) | Err(_)));
}

#[test]
fn options_are_validated_at_start_and_by_check() {
    for (args, needles) in [
        (&["--hsts", "includeSubDomains"][..], &["hsts", "max-age="][..]),
        (&["--hsts", "max-age=abc"][..], &["hsts", "max-age="][..]),
        (&["--hsts", "max-age=1\u{7}"][..], &["hsts"][..]),
        (&["--http-listen", "80"][..], &["http_listen", "\"80\""][..]),
    ] {
        for sub in ["serve", "check"] {
            let out = std::process::Command::new(BIN)
                .arg(sub)
                .args(allow_root_args())
                .args(args)
                .arg("--listen")
                .arg("127.0.0.1:0")
                .output()
                .expect("run ktlsd");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{sub} {args:?} succeeded");
            let line =
                stderr.lines().find(|l| l.contains("error")).unwrap_or_else(|| panic!("{sub} {args:?}: {stderr}"));
            for n in needles {
                assert!(line.contains(n), "{sub} {args:?}: {line:?} lacks {n:?}");
            }
        }
    }
    // A port someone else listens on is refused by check too.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = busy.local_addr().unwrap().to_string();
    let out = std::process::Command::new(BIN)
        .args(["check", "--listen", "127.0.0.1:0", "--http-listen", &port])
        .args(allow_root_args())
        .output()
        .expect("run ktlsd");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already in use"));
    // The same address for HTTPS and plain HTTP.
    let out = std::process::Command::new(BIN)
        .args(["check", "--listen", "127.0.0.1:8443", "--http-listen", "127.0.0.1:8443"])
        .args(allow_root_args())
        .output()
        .expect("run ktlsd");
    assert!(String::from_utf8_lossy(&out.stderr).contains("also a listen"), "{out:?}");
}

#[test]
fn file_keys_and_reload() {
    let b = Server::builder(BIN).file("a.txt", "a");
    let cfg = b.write_config("http_listen = [\"127.0.0.1:0\"]\nhsts = \"max-age=60\"\n");
    let s = b.arg("--config").arg(&cfg).start();
    let line = s.wait_stderr("listening on http://", Duration::from_secs(5)).expect("plain listener from the file");
    let http: SocketAddr =
        line.split("listening on http://").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert_eq!(fetch(&s.url("/a.txt"), &[]).header("strict-transport-security"), Some("max-age=60"));

    // HSTS follows a reload; the plain listener's addresses need a restart.
    std::fs::write(&cfg, "http_listen = [\"127.0.0.1:1\"]\nhsts = \"max-age=120; preload\"\n").expect("write config");
    s.signal(libc::SIGHUP);
    s.wait_stderr("reloaded configuration", Duration::from_secs(10)).expect("reload");
    assert!(s.stderr().contains("http_listen addresses changed"), "{}", s.stderr());
    assert_eq!(fetch(&s.url("/a.txt"), &[]).header("strict-transport-security"), Some("max-age=120; preload"));
    assert_eq!(status_of(&raw(http, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")), 301);
}
