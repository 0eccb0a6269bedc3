//! HTTP/2 through real clients: curl (`--http2`), nghttp, h2load, and the
//! frame-level conformance script `tests/h2/conformance.py` (Python `h2`
//! packages; Debian's `/usr/bin/python3`, which has them from `python3-h2`).
//! The codec's tables run in-process (`http::h2::tests`).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

/// Bodies around the frame and record edges (16384 - 9 bytes is one full DATA
/// frame in one full record), and large ones.
const SIZES: [usize; 7] = [0, 1, 16375, 16376, 16384, 16385, 1 << 20];

#[test]
fn bodies_intact_by_sha256() {
    let mut b = Server::builder();
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
    let srv = Server::builder().file("f", &body).start();
    let url = srv.url("/f");

    let r = fetch(&url, &["--http2", "-r", "100-16483"]);
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 100-16483/50000"));
    assert_eq!(r.body, &body[100..16484]);

    // nghttp shows the frames: HEAD gets HEADERS with END_STREAM and no DATA.
    let out = run_with_timeout(tool("nghttp").args(["-nv", "-H", ":method: HEAD", &url]), None, Duration::from_secs(30));
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
    let files: Vec<(String, Vec<u8>)> = (0..6).map(|i| (format!("m{i}"), pattern(100_000 + i * 7919, i as u64))).collect();
    let mut b = Server::builder();
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
    let srv = Server::builder().file("a.txt", b"hello\n").args(["--http2", "off"]).start();
    let r = fetch(&srv.url("/a.txt"), &["--http2"]);
    assert_eq!((r.version.as_str(), r.status), ("HTTP/1.1", 200));
    assert_eq!(r.body, b"hello\n");
}

#[test]
fn access_log_says_http2() {
    let srv = Server::builder().file("a.txt", b"hello\n").start();
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
    let srv = Server::builder().file("f", &body).start();
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
    let srv = Server::builder().file("f", pattern(20_000, 9)).no_access_log().start();
    let out = run_with_timeout(tool("h2load").args(["-n", "2000", "-c", "4", "-m", "16", &srv.url("/f")]), None, Duration::from_secs(120));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("2000 succeeded, 0 failed, 0 errored, 0 timeout"), "{text}");
    assert!(text.contains("status codes: 2000 2xx"), "{text}");
}

/// Every case of the frame-level conformance script passes (RFC 9113 and 7541,
/// and the flood limits).
#[test]
fn conformance_script() {
    let srv = Server::builder().file("100k", pattern(100_000, 5)).no_access_log().start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h2/conformance.py");
    let out = run_with_timeout(
        tool("/usr/bin/python3").arg(&script).args([&srv.addr().ip().to_string(), &srv.port().to_string(), "--path", "/100k"]),
        None,
        Duration::from_secs(300),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.lines().any(|l| l.ends_with("passed")) && !text.lines().any(|l| l.starts_with("FAIL")), "{text}");
}
