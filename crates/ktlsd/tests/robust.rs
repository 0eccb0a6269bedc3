//! Robustness and HTTP/1.1 conformance through the real binary on real sockets:
//! the file-descriptor budget and the open-file cache, lingering close, HEAD
//! error responses, `Expect: 100-continue`, and the finer points of request
//! parsing (versions, Host, absolute-form, transfer codings, preconditions).

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const A_TXT: &[u8] = b"alpha\n";
const MIB: usize = 1024 * 1024;

fn server(extra: &[&str]) -> Server {
    Server::builder(BIN).file("a.txt", A_TXT).file("dir/index.html", b"index\n").args(extra).start()
}

/// Sends `request` on a fresh connection and reads one response (`head`: to a HEAD).
fn exchange(srv: &Server, request: &[u8], head: bool) -> RawResponse {
    let mut c = TlsClient::connect(srv.addr());
    c.send(request);
    c.try_read_response(head).unwrap_or_else(|e| {
        panic!("no response to {:?}: {e}", String::from_utf8_lossy(&request[..request.len().min(200)]))
    })
}

// ---------------------------------------------------------------------------
// File descriptors: the limit is raised, the open-file cache stays within budget.
// ---------------------------------------------------------------------------

/// A script that runs the server binary under `prlimit --nofile=SOFT:HARD`.
fn limited_bin(dir: &std::path::Path, soft: u64, hard: u64) -> PathBuf {
    let script = dir.join(format!("ktlsd-nofile-{soft}-{hard}"));
    let text = format!("#!/bin/sh\nexec prlimit --nofile={soft}:{hard} {} \"$@\"\n", BIN);
    std::fs::write(&script, text).expect("write wrapper script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod wrapper script");
    script
}

fn nofile_limits(pid: i32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("read /proc/PID/limits");
    let line = limits.lines().find(|l| l.starts_with("Max open files")).expect("Max open files line");
    let nums: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    (nums[0], nums[1])
}

#[test]
fn soft_fd_limit_is_raised_to_the_hard_limit_and_logged() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let srv = Server::builder(BIN).file("a.txt", A_TXT).bin(limited_bin(tmp.path(), 128, 700)).start();
    assert_eq!(nofile_limits(srv.pid()), (700, 700), "the soft limit should be raised to the hard limit");
    let line = srv.wait_stderr("file descriptors", Duration::from_secs(5)).unwrap_or_else(|| srv.stderr());
    assert!(line.contains("700") && line.contains("128"), "fd budget line should name both limits: {line}");
}

#[test]
fn open_file_cache_never_exhausts_a_low_fd_limit() {
    const FILES: usize = 400;
    const SPELLINGS: usize = 300;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut b = Server::builder(BIN).bin(limited_bin(tmp.path(), 256, 256));
    for i in 0..FILES {
        b = b.file(&format!("f{i}"), format!("file {i}\n"));
    }
    let srv = b.file("x", b"ex\n").start();

    // Many distinct files, pipelined on one connection so they all land within
    // the cache's validity time.
    let mut c = TlsClient::connect(srv.addr());
    let all: String = (0..FILES).map(|i| get_request(&format!("/f{i}"))).collect();
    c.send(all.as_bytes());
    for i in 0..FILES {
        let r = c.read_response();
        assert_eq!((r.status, r.body_str()), (200, format!("file {i}\n")), "file {i} of {FILES}");
    }
    // One file under many spellings: one cache entry, not hundreds.
    let spellings: String = (0..SPELLINGS)
        .map(|i| match i % 3 {
            0 => get_request(&format!("/{}x", "./".repeat(i / 3 + 1))),
            1 => get_request(&format!("/{}%78", "/".repeat(i / 3 + 1))),
            _ => get_request(&format!("/f0/..{}/x", "/.".repeat(i / 3))),
        })
        .collect();
    c.send(spellings.as_bytes());
    for i in 0..SPELLINGS {
        let r = c.read_response();
        assert_eq!((r.status, r.body.as_slice()), (200, b"ex\n".as_slice()), "spelling {i}");
    }
    drop(c);

    // New connections and normal requests still work, now and after expiry.
    for round in 0..2 {
        for i in 0..20 {
            let cfg = client_config(&[&rustls::version::TLS13]);
            let mut c = TlsClient::connect_with(srv.addr(), cfg)
                .unwrap_or_else(|e| panic!("round {round}: new connection {i} failed: {e}"));
            c.set_read_timeout(Duration::from_secs(10));
            let r = c.get(&format!("/f{}", FILES - 1 - i));
            assert_eq!(r.status, 200, "round {round}, connection {i}");
        }
        std::thread::sleep(Duration::from_millis(1500));
    }
    let r = fetch(&srv.url("/a.txt"), &[]);
    assert_eq!(r.status, 404, "a file that does not exist is still just missing");
    let r = fetch(&srv.url("/x"), &[]);
    assert_eq!((r.status, r.body.as_slice()), (200, b"ex\n".as_slice()));
    assert!(!srv.stderr().contains("accept failed"), "{}", srv.stderr());
}

// ---------------------------------------------------------------------------
// Lingering close.
// ---------------------------------------------------------------------------

/// Sends `request` followed by 20 kB of bytes the server never reads, in one
/// write (or, when `later`, once the server has answered), waits until the
/// server has closed its side, then reads everything.
fn lingering_case(request: &str, want: &[(u16, Option<&[u8]>)]) {
    lingering_case_with(request, want, false)
}

fn lingering_case_with(request: &str, want: &[(u16, Option<&[u8]>)], later: bool) {
    let big = pattern(MIB, 9);
    let srv = Server::builder(BIN).file("big", &big).file("a.txt", A_TXT).start();
    let mut c = TlsClient::connect(srv.addr());
    let extra = vec![b'z'; 20_000];
    if later {
        c.send(request.as_bytes());
        std::thread::sleep(Duration::from_millis(500));
        c.send(&extra);
    } else {
        c.send(&[request.as_bytes(), &extra].concat());
    }
    // The server writes, closes, and (before lingering close) reset the
    // connection while this client had not read yet.
    std::thread::sleep(Duration::from_millis(500));
    for (i, (status, body)) in want.iter().enumerate() {
        let r = c.try_read_response(false).unwrap_or_else(|e| panic!("response {i}: {e}"));
        assert_eq!(r.status, *status, "response {i}");
        if let Some(b) = body {
            assert_eq!(r.body.len(), b.len(), "response {i} length");
            assert_eq!(sha256(&r.body), sha256(b), "response {i} SHA-256");
        }
    }
    let (rest, how) = c.read_until_close();
    assert!(rest.is_empty(), "{} bytes after the last response", rest.len());
    assert_eq!(how, Closing::CloseNotify);
}

#[test]
fn lingering_close_after_connection_close() {
    let big = pattern(MIB, 9);
    lingering_case("GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &[(200, Some(&big))]);
}

#[test]
fn lingering_close_after_http10() {
    let big = pattern(MIB, 9);
    lingering_case("GET /big HTTP/1.0\r\n\r\n", &[(200, Some(&big))]);
}

#[test]
fn lingering_close_after_error_on_pipelined_request() {
    let big = pattern(MIB, 9);
    lingering_case(
        "GET /big HTTP/1.1\r\nHost: x\r\n\r\nGET /a.txt HTTP/1.1\r\nHost x\r\n\r\n",
        &[(200, Some(&big)), (400, None)],
    );
}

#[test]
fn lingering_close_when_extra_bytes_arrive_after_the_response() {
    // A socket already closed would answer the late bytes with a reset.
    let big = pattern(MIB, 9);
    lingering_case_with("GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &[(200, Some(&big))], true);
}

#[test]
fn lingering_close_ends_when_the_client_closes() {
    let srv = server(&[]);
    let mut c = TlsClient::connect(srv.addr());
    c.send(b"GET /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nextra");
    let r = c.read_response();
    assert_eq!(r.status, 200);
    drop(c);
    // The lingering connection goes as soon as the client does: the stop is quick.
    let st = srv.stop();
    st.assert_clean_exit();
    assert!(st.took < Duration::from_secs(3), "stop took {:?}", st.took);
}

// ---------------------------------------------------------------------------
// HEAD: error responses carry no body.
// ---------------------------------------------------------------------------

#[test]
fn head_error_responses_have_no_body() {
    let srv = server(&["--max-body-bytes", "100", "--max-header-bytes", "1024", "--header-timeout", "1"]);
    let long_line = format!("HEAD /{} HTTP/1.1\r\n", "a".repeat(2000));
    let big_headers = format!("HEAD / HTTP/1.1\r\nHost: x\r\nX: {}\r\n", "a".repeat(2000));
    let cases: Vec<(u16, Vec<u8>)> = vec![
        (400, b"HEAD /a.txt HTTP/1.1\r\nHost x\r\n\r\n".to_vec()),
        (408, b"HEAD /a.txt HTTP/1.1\r\nHost: x\r\n".to_vec()),
        (411, b"HEAD /a.txt HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec()),
        (413, b"HEAD /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n".to_vec()),
        (414, long_line.into_bytes()),
        (431, big_headers.into_bytes()),
        (505, b"HEAD /a.txt HTTP/2.0\r\nHost: x\r\n\r\n".to_vec()),
    ];
    for (status, request) in cases {
        let mut c = TlsClient::connect(srv.addr());
        c.send(&request);
        let r = c.read_head_response();
        assert_eq!(r.status, status);
        let len: usize = r.header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
        assert!(len > 0, "{status}: Content-Length of the GET's body expected, got {r:?}");
        let (rest, _) = c.read_until_close();
        assert!(rest.is_empty(), "{status} to HEAD carried a body: {:?}", String::from_utf8_lossy(&rest));
    }
}

// ---------------------------------------------------------------------------
// Expect: 100-continue.
// ---------------------------------------------------------------------------

#[test]
fn expect_100_continue_gets_100_before_the_body() {
    let srv = server(&[]);
    let mut c = TlsClient::connect(srv.addr());
    c.send(b"GET /a.txt HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
    assert!(c.poll_read(Duration::from_secs(3)).expect("read").is_some(), "no 100 Continue within 3 s");
    let r = c.read_response();
    assert_eq!((r.version.as_str(), r.status), ("HTTP/1.1", 100));
    c.send(b"hello");
    let r = c.read_response();
    assert_eq!((r.status, r.body.as_slice()), (200, A_TXT));
    // Same connection goes on.
    let r = c.get("/a.txt");
    assert_eq!(r.status, 200);
}

#[test]
fn expect_100_continue_over_the_limit_is_413_at_once() {
    let srv = server(&["--max-body-bytes", "100"]);
    let mut c = TlsClient::connect(srv.addr());
    c.send(b"PUT /a.txt HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1000\r\n\r\n");
    let r = c.read_response();
    assert_eq!(r.status, 413);
    assert_eq!(r.header("connection"), Some("close"));
    let (rest, how) = c.read_until_close();
    assert!(rest.is_empty());
    assert_eq!(how, Closing::CloseNotify);
}

#[test]
fn expect_100_continue_with_refused_method_is_405_without_reading_the_body() {
    let srv = server(&[]);
    let mut c = TlsClient::connect(srv.addr());
    let t = Instant::now();
    c.send(b"POST /a.txt HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 50\r\n\r\n");
    let r = c.read_response();
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, HEAD, OPTIONS"));
    assert_eq!(r.header("connection"), Some("close"));
    assert!(t.elapsed() < Duration::from_secs(3), "405 came after {:?}", t.elapsed());
    let (rest, how) = c.read_until_close();
    assert!(rest.is_empty());
    assert_eq!(how, Closing::CloseNotify);

    // curl waits for 100 Continue; the 405 comes at once instead, without the body.
    let body = srv.dir().join("body");
    std::fs::write(&body, vec![b'q'; 100_000]).expect("write body");
    let t = Instant::now();
    let r = fetch(
        &srv.url("/a.txt"),
        &[
            "-X",
            "POST",
            "--expect100-timeout",
            "20",
            "-H",
            "Expect: 100-continue",
            "--data-binary",
            &format!("@{}", body.display()),
        ],
    );
    assert_eq!(r.status, 405);
    assert!(t.elapsed() < Duration::from_secs(10), "curl waited {:?}", t.elapsed());
}

#[test]
fn other_expectations_are_417() {
    let srv = server(&[]);
    let r = exchange(&srv, b"GET /a.txt HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\n\r\n", false);
    assert_eq!(r.status, 417);
    let r = fetch(&srv.url("/a.txt"), &["--http1.1", "-H", "Expect: something"]);
    assert_eq!(r.status, 417);
}

// ---------------------------------------------------------------------------
// Smaller conformance points.
// ---------------------------------------------------------------------------

fn etag_of(srv: &Server) -> String {
    let r = exchange(srv, get_request("/a.txt").as_bytes(), false);
    r.header("etag").expect("ETag").to_string()
}

#[test]
fn repeated_if_none_match_and_if_match_lines_form_one_list() {
    let srv = server(&[]);
    let etag = etag_of(&srv);
    let req = get_request_with("/a.txt", &format!("If-None-Match: {etag}\r\nIf-None-Match: \"nope\"\r\n"));
    assert_eq!(exchange(&srv, req.as_bytes(), false).status, 304);
    let req = get_request_with("/a.txt", &format!("If-Match: {etag}\r\nIf-Match: \"nope\"\r\n"));
    assert_eq!(exchange(&srv, req.as_bytes(), false).status, 200);
    let r = fetch(&srv.url("/a.txt"), &["-H", &format!("If-None-Match: {etag}"), "-H", "If-None-Match: \"x\""]);
    assert_eq!(r.status, 304);
}

#[test]
fn trailing_slash_on_a_file_is_404() {
    let srv = server(&[]);
    assert_eq!(fetch(&srv.url("/a.txt/"), &[]).status, 404);
    assert_eq!(exchange(&srv, get_request("/a.txt/").as_bytes(), false).status, 404);
    // Also once the file is in the open-file cache.
    assert_eq!(fetch(&srv.url("/a.txt"), &[]).status, 200);
    assert_eq!(exchange(&srv, get_request("/a.txt/").as_bytes(), false).status, 404);
}

#[test]
fn http_versions() {
    let srv = server(&[]);
    for minor in ["2", "9", "10"] {
        let req = format!("GET /a.txt HTTP/1.{minor}\r\nHost: x\r\n\r\n");
        let r = exchange(&srv, req.as_bytes(), false);
        assert_eq!((r.version.as_str(), r.status, r.body.as_slice()), ("HTTP/1.1", 200, A_TXT), "HTTP/1.{minor}");
        assert_eq!(r.header("connection"), None, "HTTP/1.{minor} keeps the connection like 1.1");
    }
    for v in ["HTTP/2.0", "HTTP/3", "HTTP/3.0", "HTTP/2"] {
        let req = format!("GET /a.txt {v}\r\nHost: x\r\n\r\n");
        assert_eq!(exchange(&srv, req.as_bytes(), false).status, 505, "{v}");
    }
    for v in ["HTTP/1", "HTTP/1.", "HTTP/x.1", "HTTZ/1.1"] {
        let req = format!("GET /a.txt {v}\r\nHost: x\r\n\r\n");
        assert_eq!(exchange(&srv, req.as_bytes(), false).status, 400, "{v}");
    }
}

#[test]
fn http10_requests_get_an_http11_status_line_and_close() {
    let srv = server(&[]);
    let r = fetch(&srv.url("/a.txt"), &["--http1.0"]);
    assert_eq!((r.version.as_str(), r.status), ("HTTP/1.1", 200));
    assert_eq!(r.header("connection"), Some("close"));
    let mut c = TlsClient::connect(srv.addr());
    c.send(b"GET /a.txt HTTP/1.0\r\n\r\n");
    let r = c.read_response();
    assert_eq!((r.version.as_str(), r.status), ("HTTP/1.1", 200));
    let (rest, how) = c.read_until_close();
    assert!(rest.is_empty());
    assert_eq!(how, Closing::CloseNotify);
}

#[test]
fn if_range_holds_one_validator() {
    let srv = server(&[]);
    let etag = etag_of(&srv);
    let one = get_request_with("/a.txt", &format!("Range: bytes=0-1\r\nIf-Range: {etag}\r\n"));
    assert_eq!(exchange(&srv, one.as_bytes(), false).status, 206);
    let list = get_request_with("/a.txt", &format!("Range: bytes=0-1\r\nIf-Range: {etag}, \"other\"\r\n"));
    let r = exchange(&srv, list.as_bytes(), false);
    assert_eq!((r.status, r.body.as_slice()), (200, A_TXT));
    let r = fetch(&srv.url("/a.txt"), &["-r", "0-1", "-H", &format!("If-Range: \"other\", {etag}")]);
    assert_eq!((r.status, r.body.as_slice()), (200, A_TXT));
}

#[test]
fn directory_redirect_keeps_the_query() {
    let srv = server(&[]);
    let r = fetch(&srv.url("/dir?a=1&b=2"), &[]);
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("/dir/?a=1&b=2"));
    let r = exchange(&srv, get_request("/dir").as_bytes(), false);
    assert_eq!(r.header("location"), Some("/dir/"));
}

#[test]
fn invalid_host_is_400() {
    let srv = server(&[]);
    for host in
        ["Host: a b\r\n", "Host: a/b\r\n", "Host: \r\n", "Host: x\r\nHost: y\r\n", "Host: a\\b\r\n", "Host: u@h\r\n"]
    {
        let req = format!("GET /a.txt HTTP/1.1\r\n{host}\r\n");
        let r = exchange(&srv, req.as_bytes(), false);
        assert_eq!(r.status, 400, "{host:?}");
        assert_eq!(r.header("connection"), Some("close"));
    }
    for host in ["Host: localhost:8443\r\n", "Host: [::1]:8443\r\n", "Host: 127.0.0.1\r\n", "Host: EXAMPLE.com.\r\n"] {
        let req = format!("GET /a.txt HTTP/1.1\r\n{host}\r\n");
        assert_eq!(exchange(&srv, req.as_bytes(), false).status, 200, "{host:?}");
    }
    // HTTP/1.0 may leave Host out or empty.
    assert_eq!(exchange(&srv, b"GET /a.txt HTTP/1.0\r\nHost:\r\n\r\n", false).status, 200);
    let r = fetch(&srv.url("/a.txt"), &["--http1.1", "-H", "Host: bad host"]);
    assert_eq!(r.status, 400);
}

#[test]
fn scheme_and_range_unit_are_case_insensitive() {
    let srv = server(&[]);
    for target in ["HTTPS://localhost/a.txt", "Https://localhost:1/a.txt?q", "HTTP://x/a.txt"] {
        let req = format!("GET {target} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        let r = exchange(&srv, req.as_bytes(), false);
        assert_eq!((r.status, r.body.as_slice()), (200, A_TXT), "{target}");
    }
    let r = exchange(&srv, get_request_with("/a.txt", "Range: Bytes=0-1\r\n").as_bytes(), false);
    assert_eq!((r.status, r.body.as_slice()), (206, b"al".as_slice()));
    let r = fetch(&srv.url("/a.txt"), &["-H", "Range: BYTES=1-2"]);
    assert_eq!((r.status, r.body.as_slice()), (206, b"lp".as_slice()));
}

#[test]
fn userinfo_in_absolute_form_is_400() {
    let srv = server(&[]);
    for target in ["https://user@localhost/a.txt", "https://u:p@localhost/a.txt", "http://@x/a.txt"] {
        let req = format!("GET {target} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        let r = exchange(&srv, req.as_bytes(), false);
        assert_eq!(r.status, 400, "{target}");
    }
    // An @ in the path is fine.
    let srv2 = Server::builder(BIN).file("u@h", b"at\n").start();
    let r = exchange(&srv2, b"GET https://localhost/u@h HTTP/1.1\r\nHost: localhost\r\n\r\n", false);
    assert_eq!((r.status, r.body.as_slice()), (200, b"at\n".as_slice()));
}

#[test]
fn unknown_transfer_codings_are_501() {
    let srv = server(&[]);
    for te in ["gzip", "gzip, chunked", "foo", "chunked, chunked;x=1, identity"] {
        let req = format!("POST /a.txt HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: {te}\r\n\r\n");
        let r = exchange(&srv, req.as_bytes(), false);
        assert_eq!(r.status, 501, "{te}");
        assert_eq!(r.header("connection"), Some("close"));
    }
    let r = exchange(&srv, b"POST /a.txt HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n0\r\n\r\n", false);
    assert_eq!(r.status, 411);
    let r =
        fetch(&srv.url("/a.txt"), &["--http1.1", "-H", "Transfer-Encoding: gzip", "-X", "POST", "--data-binary", "x"]);
    assert_eq!(r.status, 501);
}
