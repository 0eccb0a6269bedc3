//! HTTP/2 through real clients: curl (`--http2`), nghttp, h2load, and the
//! frame-level conformance script `tests/h2/conformance.py` (Python `h2`
//! packages; Debian's `/usr/bin/python3`, which has them from `python3-h2`).
//! The codec's tables run in-process (`http::h2::tests`).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// Bodies around the frame and record edges (16384 - 9 bytes is one full DATA
/// frame in one full record), and large ones.
const SIZES: [usize; 7] = [0, 1, 16375, 16376, 16384, 16385, 1 << 20];

#[test]
fn bodies_intact_by_sha256() {
    let mut b = Server::builder(BIN);
    for (i, n) in SIZES.iter().enumerate() {
        b = b.file(&format!("f{n}"), pattern(*n, i as u64 + 1));
    }
    let srv = b.start();
    let big = srv.root().join("big");
    let want_big = write_big_file(&big, 100 << 20);
    for (i, n) in SIZES.iter().enumerate() {
        let r = fetch(&srv.url(&format!("/f{n}")), &["--http2"]);
        assert_eq!((r.version.as_str(), r.status), ("HTTP/2", 200), "{n} bytes");
        assert_eq!(r.header("content-length"), Some(n.to_string().as_str()));
        assert_eq!(sha256(&r.body), sha256(&pattern(*n, i as u64 + 1)), "{n} bytes");
    }
    let out = srv.dir().join("big.out");
    let o = curl(&["--http2".to_string(), "-o".into(), out.display().to_string(), srv.url("/big")]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(sha256_file(&out), want_big);
}

#[test]
fn ranges_head_304_404() {
    let body = pattern(50_000, 7);
    let srv = Server::builder(BIN).file("f", &body).start();
    let url = srv.url("/f");

    let r = fetch(&url, &["--http2", "-r", "100-16483"]);
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 100-16483/50000"));
    assert_eq!(r.body, &body[100..16484]);

    // nghttp shows the frames: HEAD gets HEADERS with END_STREAM and no DATA.
    let out =
        run_with_timeout(tool("nghttp").args(["-nv", "-H", ":method: HEAD", &url]), None, Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(":status: 200") && text.contains("content-length: 50000"), "{text}");
    assert!(text.contains("recv HEADERS frame <length=") && text.contains("flags=0x05"), "{text}");
    assert!(!text.contains("recv DATA frame"), "{text}");

    let etag = fetch(&url, &["--http2"]).header("etag").expect("an ETag").to_string();
    let r = fetch(&url, &["--http2", "-H", &format!("If-None-Match: {etag}")]);
    assert_eq!(r.status, 304);
    assert!(r.body.is_empty());

    let r = fetch(&srv.url("/nope"), &["--http2"]);
    assert_eq!((r.version.as_str(), r.status), ("HTTP/2", 404));
}

/// Several URLs at once share one connection (curl waits to multiplex).
#[test]
fn multiplexed_on_one_connection() {
    let files: Vec<(String, Vec<u8>)> =
        (0..6).map(|i| (format!("m{i}"), pattern(100_000 + i * 7919, i as u64))).collect();
    let mut b = Server::builder(BIN);
    for (name, data) in &files {
        b = b.file(name, data);
    }
    let srv = b.start();
    let dir = srv.dir().to_path_buf();
    let mut args: Vec<String> = vec!["--http2".into(), "--parallel".into(), "-w".into(), "%{num_connects}\\n".into()];
    for (name, _) in &files {
        args.extend(["-o".into(), dir.join(format!("{name}.out")).display().to_string(), srv.url(&format!("/{name}"))]);
    }
    let out = curl(&args);
    assert!(out.status.success(), "{out:?}");
    let connects: u32 = String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.trim().parse::<u32>().ok()).sum();
    assert_eq!(connects, 1, "all transfers on one connection: {:?}", String::from_utf8_lossy(&out.stdout));
    for (name, data) in &files {
        assert_eq!(sha256_file(&dir.join(format!("{name}.out"))), sha256(data), "{name}");
    }
    let log = srv.wait_access_log(files.len(), Duration::from_secs(5));
    assert_eq!(log.iter().filter(|l| l.contains(" HTTP/2.0\" 200 ")).count(), files.len(), "{log:?}");
}

#[test]
fn http2_off_falls_back_to_http11() {
    let srv = Server::builder(BIN).file("a.txt", b"hello\n").args(["--http2", "off"]).start();
    let r = fetch(&srv.url("/a.txt"), &["--http2"]);
    assert_eq!((r.version.as_str(), r.status), ("HTTP/1.1", 200));
    assert_eq!(r.body, b"hello\n");
}

#[test]
fn access_log_says_http2() {
    let srv = Server::builder(BIN).file("a.txt", b"hello\n").start();
    let r = fetch(&srv.url("/a.txt"), &["--http2"]);
    assert_eq!(r.status, 200);
    let log = srv.wait_access_log(1, Duration::from_secs(5));
    assert!(log[0].contains("\"GET /a.txt HTTP/2.0\" 200 6 ") && log[0].contains("tls=userspace"), "{log:?}");
}

fn tool(name: &str) -> Command {
    let mut c = Command::new(name);
    c.stdin(std::process::Stdio::null());
    c
}

#[test]
fn nghttp_verbose() {
    let body = pattern(40_000, 3);
    let srv = Server::builder(BIN).file("f", &body).start();
    let out = run_with_timeout(tool("nghttp").args(["-nv", &srv.url("/f")]), None, Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(":status: 200") && text.contains("recv DATA frame"), "{text}");
    // nghttp closes with GOAWAY; the whole body arrived as DATA.
    let data: usize = text
        .lines()
        .filter(|l| l.contains("recv DATA frame"))
        .filter_map(|l| l.split("length=").nth(1)?.split(',').next()?.parse::<usize>().ok())
        .sum();
    assert_eq!(data, body.len(), "{text}");
}

#[test]
fn h2load_completes_without_failures() {
    let srv = Server::builder(BIN).file("f", pattern(20_000, 9)).no_access_log().start();
    let out = run_with_timeout(
        tool("h2load").args(["-n", "2000", "-c", "4", "-m", "16", &srv.url("/f")]),
        None,
        Duration::from_secs(120),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("2000 succeeded, 0 failed, 0 errored, 0 timeout"), "{text}");
    assert!(text.contains("status codes: 2000 2xx"), "{text}");
}

/// Every case of the frame-level conformance script passes (RFC 9113 and 7541,
/// and the flood limits).
#[test]
fn conformance_script() {
    let srv = Server::builder(BIN).file("100k", pattern(100_000, 5)).no_access_log().start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h2/conformance.py");
    let out = run_with_timeout(
        tool("/usr/bin/python3").arg(&script).args([
            &srv.addr().ip().to_string(),
            &srv.port().to_string(),
            "--path",
            "/100k",
        ]),
        None,
        Duration::from_secs(300),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.lines().any(|l| l.ends_with("passed")) && !text.lines().any(|l| l.starts_with("FAIL")), "{text}");
}

/// A browser: headless Chromium loads a page with 50 subresources (images,
/// scripts, style sheets); the page counts what loaded and over which protocol
/// (Resource Timing's `nextHopProtocol`) and writes it into the DOM, which
/// `--dump-dom` prints. The access log shows every request as HTTP/2.0 from one
/// client port: one connection.
#[test]
fn chromium_loads_fifty_subresources_over_one_connection() {
    let srv = subresource_page(Server::builder(BIN), "h2").start();
    let profile = srv.dir().join("chromium-profile");
    let netlog = srv.dir().join("chromium-netlog.json");
    let out = run_with_timeout(
        headless_chromium(&profile).args([
            "--virtual-time-budget=20000",
            &format!("--log-net-log={}", netlog.display()),
            "--dump-dom",
            &srv.url("/index.html"),
        ]),
        None,
        Duration::from_secs(120),
    );
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(dom.contains("loaded=50 failed=0 scripts=15 h2=50"), "{dom}\n{}", String::from_utf8_lossy(&out.stderr));

    // The page and its 50 subresources, all HTTP/2.
    let stopped = srv.stop();
    let lines: Vec<&String> = stopped.access_log.iter().filter(|l| l.contains("\"GET /")).collect();
    assert_eq!(lines.len(), 51, "{:#?}", stopped.access_log);
    assert!(lines.iter().all(|l| l.contains(" HTTP/2.0\" 200 ")), "{:#?}", stopped.access_log);

    // On one connection: Chromium's net log has one HTTP/2 session, which sent all
    // 51 requests. (Chromium may open a spare TLS connection that carries no
    // request, so the server's accepted-connection count is not the measure.)
    let log: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&netlog).expect("chromium wrote its net log")).expect("net log JSON");
    let event_type = |name: &str| log["constants"]["logEventTypes"][name].as_u64().expect("known net log event");
    let send_headers = event_type("HTTP2_SESSION_SEND_HEADERS");
    let mut per_session: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for e in log["events"].as_array().expect("net log events") {
        if e["type"].as_u64() == Some(send_headers) {
            *per_session.entry(e["source"]["id"].as_u64().unwrap_or(0)).or_default() += 1;
        }
    }
    assert_eq!(
        per_session.values().copied().collect::<Vec<_>>(),
        vec![51],
        "requests per HTTP/2 session: {per_session:?}"
    );
    assert!(stopped.stat("connections") <= 2, "{}", stopped.stderr);
}

/// The HTTP/2 limit flags reach the connection: the server's SETTINGS carry the
/// stream limit and header table size given, and a fourth stream at once is
/// refused; a value out of range stops the start with a one-line error.
#[test]
fn limit_flags_are_applied_and_checked() {
    let srv = Server::builder(BIN)
        .file("f", pattern(300_000, 4))
        .args(["--h2-max-streams", "3", "--h2-hpack-table", "1024"])
        .start();
    let out = run_with_timeout(tool("nghttp").args(["-nv", &srv.url("/f")]), None, Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("[SETTINGS_MAX_CONCURRENT_STREAMS(0x03):3]"), "{text}");
    assert!(text.contains("[SETTINGS_HEADER_TABLE_SIZE(0x01):1024]"), "{text}");

    // Four requests at once from one client that ignores the setting: the
    // conformance script's raw client sends them before reading anything.
    let probe = r#"
import socket, ssl, sys, h2.connection, h2.config, h2.events
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(["h2"])
s = ctx.wrap_socket(socket.create_connection((sys.argv[1], int(sys.argv[2]))), server_hostname="localhost")
c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
c.initiate_connection(); s.sendall(c.data_to_send())
for i in range(4):
    c.send_headers(2 * i + 1, [(":method", "GET"), (":scheme", "https"), (":authority", "localhost"), (":path", "/f")], end_stream=True)
s.sendall(c.data_to_send())
refused = ended = 0
while ended + refused < 4:
    data = s.recv(65536)
    if not data: break
    for e in c.receive_data(data):
        if isinstance(e, h2.events.StreamReset): refused += 1
        if isinstance(e, h2.events.StreamEnded): ended += 1
        if isinstance(e, h2.events.DataReceived): c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
    s.sendall(c.data_to_send())
print(f"ended={ended} refused={refused}")
"#;
    let out = run_with_timeout(
        tool("/usr/bin/python3").args(["-c", probe, &srv.addr().ip().to_string(), &srv.port().to_string()]),
        None,
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ended=3 refused=1"), "{text}\n{}", String::from_utf8_lossy(&out.stderr));

    let exited = Server::builder(BIN).args(["--h2-max-streams", "0"]).run_to_exit();
    exited.assert_startup_error(&["h2_max_streams 0: expected 1 to 10000"]);
}

/// The raw-frame cases where HTTP/2 answers as HTTP/1.1 does (host checks, Date,
/// OPTIONS *, when a NO_ERROR reset goes out) all pass.
#[test]
fn parity_script() {
    let srv = Server::builder(BIN).file("f", pattern(1000, 3)).no_access_log().start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h2/parity.py");
    let (ip, port) = (srv.addr().ip().to_string(), srv.port().to_string());
    let out = run_with_timeout(
        tool("/usr/bin/python3").arg(&script).args([&ip, &port, "--path", "/f"]),
        None,
        Duration::from_secs(120),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.lines().any(|l| l.ends_with("passed")) && !text.lines().any(|l| l.starts_with("FAIL")), "{text}");
}
