//! HTTP behaviour through real clients: curl for the everyday cases, the rustls
//! client where the exact bytes on the wire matter. One or two cases per feature;
//! the full tables run in-process (`handler::tests`, `http::h1::tests`).

use std::time::Duration;

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const HELLO: &[u8] = b"hello\n";

fn hello_server(extra: &[&str]) -> Server {
    Server::builder(BIN).file("a.txt", HELLO).args(extra).start()
}

#[test]
fn get_http11() {
    let srv = hello_server(&[]);
    let r = fetch(&srv.url("/a.txt"), &["--http1.1"]);
    assert_eq!(r.version, "HTTP/1.1");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, HELLO);
    assert_eq!(r.header("content-length"), Some("6"));
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    assert_eq!(r.header("server"), Some("ktlsd"));
    // HTTP/1.1 keeps the connection open by default: no Connection header needed.
    assert_eq!(r.header("connection"), None);
}

#[test]
fn get_http10() {
    let srv = hello_server(&[]);
    let r = fetch(&srv.url("/a.txt"), &["--http1.0"]);
    assert_eq!(r.version, "HTTP/1.1", "the status line names the server's version, as nginx's does");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, HELLO);
    assert_eq!(r.header("connection"), Some("close"));
}

#[test]
fn http10_keep_alive_on_request() {
    let srv = hello_server(&[]);
    srv.write("b.txt", b"bee");
    let mut c = TlsClient::connect(srv.addr());
    c.send(b"GET /a.txt HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    let r = c.read_response();
    assert_eq!((r.version.as_str(), r.status), ("HTTP/1.1", 200));
    assert_eq!(r.header("connection"), Some("keep-alive"));
    assert_eq!(r.body, HELLO);
    // Same connection, second request without keep-alive: answered, then closed cleanly.
    c.send(b"GET /b.txt HTTP/1.0\r\n\r\n");
    let r = c.read_response();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"bee");
    assert_eq!(r.header("connection"), Some("close"));
    let (rest, how) = c.read_until_close();
    assert!(rest.is_empty());
    assert_eq!(how, Closing::CloseNotify);
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("connections"), 1);
}

#[test]
fn standard_headers_present() {
    let srv = hello_server(&[]);
    let path = srv.root().join("a.txt");
    set_mtime(&path, 1_700_000_000); // Tue, 14 Nov 2023 22:13:20 GMT
    let before = std::time::SystemTime::now();
    let r = fetch(&srv.url("/a.txt"), &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("last-modified"), Some("Tue, 14 Nov 2023 22:13:20 GMT"));
    let date = r.header("date").expect("Date header");
    let date = httpdate::parse_http_date(date).unwrap_or_else(|e| panic!("Date {date:?}: {e}"));
    let skew = |a: std::time::SystemTime, b: std::time::SystemTime| {
        a.duration_since(b).or_else(|_| b.duration_since(a)).unwrap()
    };
    assert!(skew(date, before) < Duration::from_secs(5), "Date {date:?} is not now");
    let etag = r.header("etag").expect("ETag header");
    assert!(etag.starts_with('"') && etag.ends_with('"') && etag.len() > 2, "ETag {etag:?} is not a quoted strong tag");
    for h in ["date", "last-modified", "etag", "content-length", "content-type"] {
        assert_eq!(r.header_count(h), 1, "{h} must appear exactly once: {:?}", r.headers);
    }
    // The ETag changes with the content.
    srv.write("a.txt", b"hello, changed\n");
    let r2 = fetch(&srv.url("/a.txt"), &[]);
    assert_ne!(r2.header("etag"), Some(etag));
}

#[test]
fn range_single() {
    let data = pattern(1000, 7);
    let srv = Server::builder(BIN).file("r.bin", &data).start();
    let r = fetch(&srv.url("/r.bin"), &["-r", "100-199"]);
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 100-199/1000"));
    assert_eq!(r.header("content-length"), Some("100"));
    assert_eq!(r.body, &data[100..200]);

    let r = fetch(&srv.url("/r.bin"), &["-r", "990-"]);
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 990-999/1000"));
    assert_eq!(r.body, &data[990..]);

    let r = fetch(&srv.url("/r.bin"), &["-r", "-5"]);
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 995-999/1000"));
    assert_eq!(r.body, &data[995..]);

    // An end past the file is clamped.
    let r = fetch(&srv.url("/r.bin"), &["-r", "998-5000"]);
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 998-999/1000"));
    assert_eq!(r.body, &data[998..]);

    let r = fetch(&srv.url("/r.bin"), &["-r", "0-0"]);
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 0-0/1000"));
    assert_eq!(r.body, &data[..1]);
}

#[test]
fn range_across_record_boundaries() {
    let data = pattern(100_000, 8);
    let srv = Server::builder(BIN).file("r.bin", &data).start();
    let r = fetch(&srv.url("/r.bin"), &["-r", "16000-70000"]);
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 16000-70000/100000"));
    assert_eq!(sha256(&r.body), sha256(&data[16000..70001]));
}

#[test]
fn conditional_if_none_match() {
    let srv = hello_server(&[]);
    let first = fetch(&srv.url("/a.txt"), &[]);
    let etag = first.header("etag").unwrap().to_string();
    let r = fetch(&srv.url("/a.txt"), &["-H", &format!("If-None-Match: {etag}")]);
    assert_eq!(r.status, 304);
    assert!(r.body.is_empty());
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    // In a list, and weakly compared.
    let r = fetch(&srv.url("/a.txt"), &["-H", &format!("If-None-Match: \"nope\", W/{etag}")]);
    assert_eq!(r.status, 304);
    let r = fetch(&srv.url("/a.txt"), &["-H", "If-None-Match: *"]);
    assert_eq!(r.status, 304);
    let r = fetch(&srv.url("/a.txt"), &["-H", "If-None-Match: \"other\""]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, HELLO);
}

#[test]
fn keep_alive_several_urls_one_connection() {
    let srv = Server::builder(BIN).file("a.txt", HELLO).file("b.txt", b"bb").file("c.txt", b"ccc").start();
    let tmp = tempfile::tempdir().unwrap();
    let outs: Vec<_> = ["a", "b", "c"].iter().map(|n| tmp.path().join(n)).collect();
    let out = curl(&[
        "-v".as_ref(),
        "--http1.1".as_ref(),
        srv.url("/a.txt").as_ref(),
        "-o".as_ref(),
        outs[0].as_os_str(),
        srv.url("/b.txt").as_ref(),
        "-o".as_ref(),
        outs[1].as_os_str(),
        srv.url("/c.txt").as_ref(),
        "-o".as_ref(),
        outs[2].as_os_str(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches("Re-using existing connection").count(), 2, "curl -v:\n{stderr}");
    assert_eq!(std::fs::read(&outs[0]).unwrap(), HELLO);
    assert_eq!(std::fs::read(&outs[1]).unwrap(), b"bb");
    assert_eq!(std::fs::read(&outs[2]).unwrap(), b"ccc");

    let log = srv.wait_access_log(3, Duration::from_secs(10));
    assert_eq!(log.len(), 3, "access log: {log:?}");
    for (line, (path, bytes)) in log.iter().zip([("/a.txt", 6), ("/b.txt", 2), ("/c.txt", 3)]) {
        assert_access_line(line, "GET", path, "HTTP/1.1", 200, bytes);
    }
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("connections"), 1, "three requests must share one connection");
}

/// Checks one access-log line:
/// `127.0.0.1 - - [22/Nov/2026:04:17:01 +0000] "GET /a.txt HTTP/1.1" 200 6 rt=0.001 tls=userspace`.
pub fn assert_access_line(line: &str, method: &str, path: &str, version: &str, status: u16, bytes: u64) {
    let (prefix, rest) = line.split_once(" [").unwrap_or_else(|| panic!("access line {line:?}"));
    assert_eq!(prefix, "127.0.0.1 - -", "{line:?}");
    let (date, rest) = rest.split_once("] ").unwrap_or_else(|| panic!("access line {line:?}"));
    assert!(date.ends_with(" +0000") && date.len() == 26, "bad date {date:?} in {line:?}");
    let expected = format!("\"{method} {path} {version}\" {status} {bytes} rt=");
    assert!(rest.starts_with(&expected), "{line:?} does not continue with {expected:?}");
    let tail = &rest[expected.len()..];
    let (rt, mode) = tail.split_once(' ').unwrap_or_else(|| panic!("access line {line:?}"));
    let rt: f64 = rt.parse().unwrap_or_else(|_| panic!("rt in {line:?}"));
    assert!((0.0..60.0).contains(&rt), "{line:?}");
    assert!(mode == "tls=userspace" || mode == "tls=ktls", "{line:?}");
}

#[test]
fn connection_close_is_honoured() {
    let srv = Server::builder(BIN).file("a.txt", HELLO).file("b.txt", b"bb").start();
    let out = curl(&[
        "-v".to_string(),
        "--http1.1".into(),
        "-H".into(),
        "Connection: close".into(),
        "-o".into(),
        "/dev/null".into(),
        srv.url("/a.txt"),
        "-o".into(),
        "/dev/null".into(),
        srv.url("/b.txt"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("< Connection: close"), "{stderr}");
    assert!(!stderr.contains("Re-using existing connection"), "{stderr}");

    // Raw: the connection ends with close_notify right after the body.
    let mut c = TlsClient::connect(srv.addr());
    c.send(b"GET /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let r = c.read_response();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("connection"), Some("close"));
    let (rest, how) = c.read_until_close();
    assert!(rest.is_empty(), "bytes after the response: {rest:?}");
    assert_eq!(how, Closing::CloseNotify);

    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("connections"), 3);
}

#[test]
fn head_has_headers_and_no_body() {
    let data = pattern(5000, 4);
    let srv = Server::builder(BIN).file("h.bin", &data).file("a.txt", HELLO).start();
    let get = fetch(&srv.url("/h.bin"), &["--http1.1"]);
    let out = curl(&["--http1.1".to_string(), "-I".into(), srv.url("/h.bin")]);
    assert!(out.status.success());
    let (version, status, headers) = parse_head(&String::from_utf8_lossy(&out.stdout));
    assert_eq!((version.as_str(), status), ("HTTP/1.1", 200));
    let h = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    assert_eq!(h("content-length").as_deref(), Some("5000"));
    assert_eq!(h("etag").as_deref(), get.header("etag"));
    assert_eq!(h("last-modified").as_deref(), get.header("last-modified"));
    assert_eq!(h("content-type").as_deref(), Some("application/octet-stream"));

    // Raw: a HEAD followed by a GET on the same connection; if the HEAD had a body,
    // the GET's response would not parse.
    let mut c = TlsClient::connect(srv.addr());
    c.send(b"HEAD /h.bin HTTP/1.1\r\nHost: x\r\n\r\nGET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n");
    let head = c.read_head_response();
    assert_eq!(head.status, 200);
    assert_eq!(head.content_length(), Some(5000));
    let r = c.read_response();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, HELLO);
}

#[test]
fn missing_file_is_404() {
    let srv = hello_server(&[]);
    let r = fetch(&srv.url("/nope.txt"), &["--http1.1"]);
    assert_eq!(r.status, 404);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(r.body_str().contains("404 Not Found"));
    let r = fetch(&srv.url("/a.txt/below"), &[]);
    assert_eq!(r.status, 404, "a path through a file is not found");
    assert!(srv.wait_stderr("\"GET /nope.txt HTTP/1.1\": 404", Duration::from_secs(5)).is_some(), "{}", srv.stderr());
}

#[test]
fn directory_serves_index_html() {
    let srv = Server::builder(BIN).file("index.html", b"<h1>root</h1>").file("sub/index.html", b"<h1>sub</h1>").start();
    let r = fetch(&srv.url("/"), &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"<h1>root</h1>");
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let r = fetch(&srv.url("/sub/"), &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"<h1>sub</h1>");
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
}

#[test]
fn autoindex_lists_directory() {
    let srv = Server::builder(BIN)
        .file("sub/file.txt", b"x")
        .file("sub/<b>&.txt", b"y")
        .file("sub/.secret", b"z")
        .file("sub/inner/deep.txt", b"w")
        .arg("--autoindex")
        .start();
    let r = fetch(&srv.url("/sub/"), &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let html = r.body_str();
    assert!(html.contains("Index of /sub/"), "{html}");
    assert!(html.contains(">file.txt</a>"), "{html}");
    assert!(html.contains("href=\"inner/\""), "{html}");
    assert!(html.contains("&lt;b&gt;&amp;.txt"), "names must be HTML-escaped: {html}");
    assert!(!html.contains("<b>&"), "raw name leaked into the HTML: {html}");
    assert!(!html.contains(".secret"), "dot-files must not be listed: {html}");
    // A directory with an index.html still serves the index.
    srv.write("sub/index.html", b"indexed");
    let r = fetch(&srv.url("/sub/"), &[]);
    assert_eq!(r.body, b"indexed");
}

#[test]
fn directory_without_slash_redirects() {
    let srv = Server::builder(BIN).file("sub/index.html", b"sub").start();
    let r = fetch(&srv.url("/sub"), &[]);
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("/sub/"));
    let r = fetch(&srv.url("/sub?x=1"), &[]);
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("/sub/?x=1"), "the query goes along, as with nginx");
    let r = fetch(&srv.url("/sub"), &["-L"]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"sub");
}

#[test]
fn content_type_by_extension() {
    let cases: &[(&str, &[&str])] = &[
        ("page.html", &["text/html; charset=utf-8"]),
        ("style.css", &["text/css; charset=utf-8"]),
        ("app.js", &["text/javascript; charset=utf-8", "application/javascript; charset=utf-8"]),
        ("data.json", &["application/json; charset=utf-8"]),
        ("notes.txt", &["text/plain; charset=utf-8"]),
        ("img.png", &["image/png"]),
        ("photo.jpg", &["image/jpeg"]),
        ("pic.svg", &["image/svg+xml"]),
        ("doc.pdf", &["application/pdf"]),
        ("archive.tar.gz", &["application/gzip", "application/x-gzip"]),
        ("font.woff2", &["font/woff2"]),
        ("noext", &["application/octet-stream"]),
        ("weird.zzqq", &["application/octet-stream"]),
    ];
    let mut b = Server::builder(BIN);
    for (name, _) in cases {
        b = b.file(name, b"x");
    }
    let srv = b.start();
    for (name, expected) in cases {
        let r = fetch(&srv.url(&format!("/{name}")), &[]);
        assert_eq!(r.status, 200, "{name}");
        let ct = r.header("content-type").unwrap_or("");
        assert!(expected.contains(&ct), "{name}: Content-Type {ct:?}, expected one of {expected:?}");
    }
}

#[test]
fn access_log_records_requests() {
    let srv = hello_server(&["--ktls", "off"]);
    let _ = fetch(&srv.url("/a.txt"), &["--http1.1"]);
    let missing = fetch(&srv.url("/missing"), &["--http1.1"]);
    let _ = fetch(&srv.url("/a.txt"), &["--http1.0"]);
    let log = srv.wait_access_log(3, Duration::from_secs(10));
    assert_eq!(log.len(), 3, "{log:?}");
    assert_access_line(&log[0], "GET", "/a.txt", "HTTP/1.1", 200, 6);
    // An error page logs the body it sent, as nginx's $body_bytes_sent does.
    assert!(!missing.body.is_empty());
    assert_access_line(&log[1], "GET", "/missing", "HTTP/1.1", 404, missing.body.len() as u64);
    assert_access_line(&log[2], "GET", "/a.txt", "HTTP/1.0", 200, 6);
    assert!(log.iter().all(|l| l.ends_with(" tls=userspace")), "--ktls off must log userspace: {log:?}");
}

#[test]
fn access_log_off_writes_nothing() {
    let b = Server::builder(BIN).file("a.txt", HELLO).no_access_log().arg("--access-log").arg("off");
    let log_path = b.dir().join("access.log");
    let srv = b.start();
    assert_eq!(fetch(&srv.url("/a.txt"), &["--http1.1"]).status, 200);
    std::thread::sleep(Duration::from_millis(500));
    let st = srv.stop();
    st.assert_clean_exit();
    assert!(!log_path.exists());
}

#[test]
fn pipelined_requests_split_across_writes() {
    let srv = Server::builder(BIN).file("1.txt", b"one").file("2.txt", b"two").start();
    let mut c = TlsClient::connect(srv.addr());
    let all = format!("{}{}", get_request("/1.txt"), get_request("/2.txt"));
    // Split in the middle of the second request's head.
    let cut = get_request("/1.txt").len() + 7;
    c.send(&all.as_bytes()[..cut]);
    let r1 = c.read_response();
    assert_eq!(r1.body, b"one");
    std::thread::sleep(Duration::from_millis(100));
    c.send(&all.as_bytes()[cut..]);
    let r2 = c.read_response();
    assert_eq!(r2.body, b"two");
}

#[test]
fn ipv6_listen() {
    let srv = Server::builder(BIN).file("a.txt", HELLO).listen(&["[::1]:0"]).start();
    assert!(srv.addr().is_ipv6(), "{:?}", srv.addrs());
    let url = format!("https://[::1]:{}/a.txt", srv.port());
    let r = fetch(&url, &["-g"]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, HELLO);
    // IPv6-only: nothing on 127.0.0.1 at that port (unless something else happens to be there).
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("connections"), 1);
}

#[test]
fn ipv4_and_ipv6_together() {
    let srv = Server::builder(BIN).file("a.txt", HELLO).workers(Some(2)).listen(&["127.0.0.1:0", "[::1]:0"]).start();
    assert_eq!(srv.addrs().len(), 2, "{:?}", srv.addrs());
    for addr in srv.addrs().to_vec() {
        let r = fetch(&url_for(addr, "/a.txt"), &["-g"]);
        assert_eq!(r.status, 200, "{addr}");
        assert_eq!(r.body, HELLO, "{addr}");
    }
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("connections"), 2);
}

#[test]
fn several_workers_serve() {
    let srv = Server::builder(BIN).file("a.txt", HELLO).workers(Some(2)).start();
    for _ in 0..6 {
        let r = fetch(&srv.url("/a.txt"), &[]);
        assert_eq!(r.body, HELLO);
    }
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("connections"), 6);
    assert!(st.stderr.contains("with 2 workers"), "{}", st.stderr);
}

#[test]
fn access_log_defaults_to_stdout() {
    let srv = Server::builder(BIN).file("a.txt", HELLO).no_access_log().start();
    assert_eq!(fetch(&srv.url("/a.txt"), &["--http1.1"]).status, 200);
    let line = srv.wait_stdout("GET /a.txt", Duration::from_secs(10)).expect("access log line on stdout");
    assert_access_line(&line, "GET", "/a.txt", "HTTP/1.1", 200, 6);
    assert!(!srv.stderr().contains("\"GET /a.txt HTTP/1.1\" 200"), "access log leaked to stderr");
}

#[test]
fn access_log_dash_is_stdout() {
    let srv = Server::builder(BIN).file("a.txt", HELLO).no_access_log().args(["--access-log", "-"]).start();
    assert_eq!(fetch(&srv.url("/a.txt"), &["--http1.1"]).status, 200);
    let line = srv.wait_stdout("GET /a.txt", Duration::from_secs(10)).expect("access log line on stdout");
    assert_access_line(&line, "GET", "/a.txt", "HTTP/1.1", 200, 6);
}

/// Polls `path` until its body is `want` (or the status is `status`), for up to 3 s.
fn eventually(srv: &Server, path: &str, status: u16, want: Option<&[u8]>) -> Duration {
    let t = std::time::Instant::now();
    loop {
        let mut c = TlsClient::connect(srv.addr());
        let r = c.get(path);
        if r.status == status && want.is_none_or(|w| r.body == w) {
            return t.elapsed();
        }
        assert!(t.elapsed() < Duration::from_secs(3), "{path}: still {} {:?} after 3 s", r.status, r.body_str());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn in_place_rewrite_is_seen_at_once() {
    let srv = hello_server(&[]);
    let mut c = TlsClient::connect(srv.addr());
    assert_eq!(c.get("/a.txt").body, HELLO);
    srv.write("a.txt", b"rewritten in place, longer than before\n");
    let r = c.get("/a.txt");
    assert_eq!(r.body, b"rewritten in place, longer than before\n");
    assert_eq!(r.content_length(), Some(39));
}

/// A small file the worker keeps in memory, rewritten in place with bytes of the
/// same size: the next response on the same connection carries the new bytes.
#[test]
fn small_file_rewritten_in_place_with_its_size_is_seen_at_once() {
    use std::os::unix::fs::FileExt;
    let old: Vec<u8> = (0..4096).map(|i| b'a' + (i % 26) as u8).collect();
    let new: Vec<u8> = (0..4096).map(|i| b'A' + (i % 26) as u8).collect();
    let srv = Server::builder(BIN).file("s.txt", &old).start();
    let path = srv.root().join("s.txt");
    let past = std::time::SystemTime::now() - Duration::from_secs(10);
    let times = std::fs::FileTimes::new().set_modified(past).set_accessed(past);
    std::fs::File::options().write(true).open(&path).unwrap().set_times(times).unwrap();
    // Setting the times changed the ctime: only a file left alone for a second is kept.
    std::thread::sleep(Duration::from_millis(1100));
    let mut c = TlsClient::connect(srv.addr());
    for _ in 0..20 {
        assert!(c.get("/s.txt").body == old, "the file as written");
    }
    std::fs::File::options().write(true).open(&path).unwrap().write_all_at(&new, 0).unwrap();
    for i in 0..50 {
        let r = c.get("/s.txt");
        assert!(r.body == new, "response {i} after the rewrite carries the old bytes");
        assert_eq!(r.content_length(), Some(4096));
    }
}

#[test]
fn replaced_or_deleted_file_is_noticed() {
    let srv = hello_server(&[]);
    assert_eq!(fetch(&srv.url("/a.txt"), &[]).body, HELLO);
    // Replaced by rename (a new inode), as deploy tools do.
    let tmp = srv.root().join(".a.txt.new");
    std::fs::write(&tmp, b"new version\n").unwrap();
    std::fs::rename(&tmp, srv.root().join("a.txt")).unwrap();
    eventually(&srv, "/a.txt", 200, Some(b"new version\n"));
    // Deleted.
    std::fs::remove_file(srv.root().join("a.txt")).unwrap();
    eventually(&srv, "/a.txt", 404, None);
    // Replaced by a symlink leading out of ROOT.
    std::fs::write(srv.dir().join("outside.txt"), b"outside").unwrap();
    srv.write("b.txt", b"bee");
    assert_eq!(fetch(&srv.url("/b.txt"), &[]).body, b"bee");
    std::fs::remove_file(srv.root().join("b.txt")).unwrap();
    std::os::unix::fs::symlink(srv.dir().join("outside.txt"), srv.root().join("b.txt")).unwrap();
    eventually(&srv, "/b.txt", 403, None);
}
