//! HTTP/2 upstreams end to end: gRPC (Debian's `python3-grpcio` as client and
//! server, `tests/proxy/grpc_echo.py`) through `h2c://` and `unix+h2c:` upstreams
//! over HTTP/2 (unary, server-streaming, client-streaming and ping-pong
//! bidirectional calls, an error status with its trailers, a deadline, a 5 MB
//! answer, 50 calls at once); trailers reaching an HTTP/3 client (the aioquic
//! client of `tests/h3/client.py`); gRPC from an HTTP/1.1 client refused with 505
//! while other HTTP/1.1 requests reach the HTTP/2 upstream; and a hostile HTTP/2
//! upstream (`tests/proxy/h2_hostile.py`, at frame level) that resets, sends
//! GOAWAY, bad HPACK, endless CONTINUATION or floods DATA past its flow-control
//! window: a 502 or a reset stream, the server serves on and its memory stays
//! bounded; and an `h2://` upstream over TLS (nghttpd).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// A Python child process that printed "ready"; killed when dropped.
struct Py(Child);

impl Py {
    fn start(script: &str, args: &[&str]) -> Py {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/proxy").join(script);
        let mut child = Command::new("/usr/bin/python3")
            .arg(path)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("/usr/bin/python3 runs");
        let mut line = String::new();
        let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
        assert_eq!(line.trim(), "ready", "{script} {args:?} did not start");
        Py(child)
    }
}

impl Drop for Py {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// ktlsd with a certificate for localhost (its path returned, for clients that
/// verify) and one `[[proxy]]` of every path to `upstream`.
fn server(upstream: &str, extra_args: &[&str]) -> (Server, std::path::PathBuf) {
    let b = Server::builder(BIN).workers(Some(1)).file("index.txt", "static file");
    let (cert, key, _) = cert_for(b.dir(), "localhost", &["localhost"]);
    let config = format!("[[proxy]]\npath = \"/**\"\nupstream = [{upstream:?}]\nread_timeout = \"10s\"\n");
    let srv = b
        .config(&config)
        .arg("--cert")
        .arg(&cert)
        .arg("--key")
        .arg(&key)
        .arg("--log-level")
        .arg("debug")
        .args(extra_args)
        .start();
    (srv, cert)
}

/// Runs the gRPC client against `srv`; its JSON.
fn grpc_client(srv: &Server, ca: &Path) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/proxy/grpc_echo.py");
    let out = run_with_timeout(
        Command::new("/usr/bin/python3").arg(script).arg("client").arg(srv.port().to_string()).arg(ca),
        None,
        Duration::from_secs(120),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "gRPC client failed: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("client output {text:?}: {e}"))
}

fn assert_calls(v: &Value, srv: &Server) {
    let ctx = || format!("{v}\n{}", srv.stderr());
    assert_eq!(v["unary"], "hello", "{}", ctx());
    assert_eq!(v["server_stream"], serde_json::json!(["0:abc", "1:abc", "2:abc"]), "{}", ctx());
    assert_eq!(v["client_stream"], "a+b+c", "{}", ctx());
    assert_eq!(v["bidi"], serde_json::json!(["echo:m0", "echo:m1", "echo:m2", "echo:m3", "echo:m4"]), "{}", ctx());
    // The status and its trailing metadata came back through the proxy.
    assert_eq!(v["fail"]["code"], "NOT_FOUND", "{}", ctx());
    assert_eq!(v["fail"]["details"], "no such thing", "{}", ctx());
    assert_eq!(v["fail"]["trailers"]["x-why"], "testing", "{}", ctx());
    assert_eq!(v["deadline"]["code"], "DEADLINE_EXCEEDED", "{}", ctx());
    assert!(v["deadline_secs"].as_f64().is_some_and(|s| s < 2.5), "{}", ctx());
    assert_eq!(v["big"], 5_000_000, "{}", ctx());
    assert_eq!(v["concurrent"], 50, "{}", ctx());
}

#[test]
fn grpc_calls_pass_through_h2c_and_unix_h2c_upstreams() {
    let dir = tempfile::tempdir().unwrap();
    let port = origin::free_port();
    let sock = format!("unix:{}", dir.path().join("grpc.sock").display());
    let _tcp = Py::start("grpc_echo.py", &["server", &format!("127.0.0.1:{port}")]);
    let _unix = Py::start("grpc_echo.py", &["server", &sock]);
    for upstream in [format!("h2c://127.0.0.1:{port}"), sock.replacen("unix:", "unix+h2c:", 1)] {
        let (srv, ca) = server(&upstream, &[]);
        let v = grpc_client(&srv, &ca);
        assert_calls(&v, &srv);
        let stopped = srv.stop();
        assert!(!stopped.stderr.contains("panicked"), "{}", stopped.stderr);
        // Every call the server answered is in the access log, as HTTP/2 (56: the one
        // cut by its deadline was reset by the client).
        let calls = stopped.access_log.iter().filter(|l| l.contains("/test.Echo/") && l.contains("HTTP/2.0")).count();
        assert!(calls >= 56, "{upstream}: {calls} calls logged:\n{}", stopped.access_log.join("\n"));
    }
}

#[test]
fn grpc_from_an_http11_client_is_refused_and_other_requests_reach_the_h2_upstream() {
    let port = origin::free_port();
    let _up = Py::start("h2_hostile.py", &[&port.to_string()]);
    let (srv, _) = server(&format!("h2c://127.0.0.1:{port}"), &[]);
    let grpc = ["--http1.1", "-H", "content-type: application/grpc", "--data-binary", "x"];
    let r = fetch(&srv.url("/test.Echo/Unary"), &grpc);
    assert_eq!(r.status, 505, "{}", r.body_str());
    assert!(r.body_str().contains("gRPC needs HTTP/2"), "{}", r.body_str());
    for proto in ["--http1.1", "--http2"] {
        let r = fetch(&srv.url("/plain"), &[proto]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "ok"), "{proto}");
        assert!(r.header("via").is_some_and(|v| v.contains("2 ktlsd")), "{proto}: {:?}", r.headers);
        // A body with trailers: the body whole on both; curl shows HTTP/2's trailers.
        let r = fetch(&srv.url("/trailers"), &[proto]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "hello"), "{proto}");
        let post = fetch(&srv.url("/plain"), &[proto, "--data-binary", "some body"]);
        assert_eq!(post.status, 200, "{proto}");
    }
    let r = fetch(&srv.url("/trailers"), &["--http2", "-v"]);
    assert!(r.stderr.contains("x-check: done"), "{}", r.stderr);
}

#[test]
fn trailers_reach_http3_clients() {
    let port = origin::free_port();
    let _up = Py::start("grpc_echo.py", &["server", &format!("127.0.0.1:{port}")]);
    let (srv, _) = server(&format!("h2c://127.0.0.1:{port}"), &["--http3"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h3/client.py");
    // One gRPC message: not compressed, 5 bytes.
    let framed = "\u{0}\u{0}\u{0}\u{0}\u{5}hello";
    let call = |method: &str| {
        serde_json::json!({"method": "POST", "path": format!("/test.Echo/{method}"), "body": framed,
            "headers": [["content-type", "application/grpc"], ["te", "trailers"]]})
    };
    let requests = serde_json::json!([call("Unary"), call("Fail")]);
    let out = run_with_timeout(
        Command::new("/usr/bin/python3")
            .arg(&script)
            .args([&srv.addr().ip().to_string(), &srv.port().to_string(), "--sni", "localhost"])
            .args(["requests", &requests.to_string()]),
        None,
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let field = |r: &Value, name: &str| -> Option<String> {
        r["headers"].as_array()?.iter().find(|h| h[0] == name).and_then(|h| h[1].as_str()).map(str::to_string)
    };
    let (ok, fail) = (&v["responses"][0], &v["responses"][1]);
    assert_eq!(ok["status"], 200, "{v}");
    assert_eq!(field(ok, "grpc-status").as_deref(), Some("0"), "{v}");
    // Trailers-only: the status in the head.
    assert_eq!(field(fail, "grpc-status").as_deref(), Some("5"), "{v}");
    assert_eq!(field(fail, "grpc-message").as_deref(), Some("no such thing"), "{v}");
}

/// Growth of ktlsd's resident memory allowed over the hostile runs: each endless
/// header block is refused at `MAX_HEADER_LIST` (64 KiB) and each flood at the
/// stream's and connection's flow-control windows (256 KiB, 1 MiB); a block or a
/// body held whole would be hundreds of MiB.
const HOSTILE_RSS_BOUND_KIB: u64 = 32 * 1024;

#[test]
fn hostile_h2_upstreams_get_a_502_or_a_reset_stream() {
    let port = origin::free_port();
    let _up = Py::start("h2_hostile.py", &[&port.to_string()]);
    let (srv, _) = server(&format!("h2c://127.0.0.1:{port}"), &[]);
    // Warm up (the connection pool, the allocator) before the memory is read.
    for proto in ["--http1.1", "--http2"] {
        assert_eq!(fetch(&srv.url("/plain"), &[proto]).status, 200);
    }
    let before = rss_kib(srv.pid());
    let mut peak = before;
    for proto in ["--http1.1", "--http2"] {
        // Before the head: a clean 502.
        for path in ["/rst-head", "/goaway-head", "/bad-hpack", "/continuation", "/continuation"] {
            let r = fetch(&srv.url(path), &[proto]);
            assert_eq!(r.status, 502, "{proto} {path}: {}", srv.stderr());
            peak = peak.max(rss_kib(srv.pid()));
        }
        // After the head: the client's response is cut, never ended as if whole; a
        // flood against a client reading slowly (past the windows) and one keeping up
        // (within them, then the upstream closes without END_STREAM).
        for (path, slow) in [("/rst", false), ("/goaway", false), ("/flood", true), ("/flood", false)] {
            let url = srv.url(path);
            let mut args = vec![proto, "-o", "/dev/null", "--max-time", "30", url.as_str()];
            // Slow, yet fast enough to read what the sockets hold before the cut (a
            // few MiB) well within the time limit.
            if slow {
                args.extend(["--limit-rate", "1M"]);
            }
            let out = curl(&args);
            assert!(
                !out.status.success(),
                "{proto} {path} (slow {slow}): a cut response must fail the client: {}",
                srv.stderr()
            );
            // 28: curl's own time limit; the response was never cut.
            assert_ne!(out.status.code(), Some(28), "{proto} {path} (slow {slow}): not cut: {}", srv.stderr());
            peak = peak.max(rss_kib(srv.pid()));
        }
        // A pooled connection the upstream closed without GOAWAY while a request was
        // on it (the flood's, then /linger's): the request goes again on a new one.
        for path in ["/linger", "/plain"] {
            let r = fetch(&srv.url(path), &[proto]);
            assert_eq!((r.status, r.body_str().as_str()), (200, "ok"), "{proto} {path}: serves on: {}", srv.stderr());
        }
    }
    let after = rss_kib(srv.pid());
    println!("hostile HTTP/2 upstreams: VmRSS {before} KiB before, {peak} KiB at most, {after} KiB after");
    assert!(
        peak.saturating_sub(before) < HOSTILE_RSS_BOUND_KIB,
        "VmRSS grew from {before} to {peak} KiB (bound {HOSTILE_RSS_BOUND_KIB} KiB)"
    );
    let stderr = srv.stderr();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("reset the stream") && stderr.contains("GOAWAY"), "{stderr}");
}

/// An `h2://` upstream (HTTP/2 over TLS, ALPN `h2`): nghttpd with a certificate
/// of the test's CA, verified against `upstream_ca`; a small answer, a 3 MB one
/// streamed, an 800 kB request body streamed up and echoed back (nghttpd's
/// `--echo-upload`), and trailers, over HTTP/1.1 and HTTP/2.
#[test]
fn an_h2_upstream_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = upstream_certificates(dir.path());
    let big = pattern(3_000_000, 7);
    let up = Nghttpd::h2(
        &[("small.txt", b"hello"), ("big.bin", &big)],
        &cert,
        &key,
        &["--echo-upload", "--trailer", "x-check: done"],
    );
    let config = format!(
        "[[proxy]]\npath = \"/**\"\nupstream = [\"h2://localhost:{}\"]\nupstream_ca = {:?}\nread_timeout = \"10s\"\n",
        up.port,
        ca.display().to_string()
    );
    let srv = Server::builder(BIN).workers(Some(1)).config(&config).arg("--log-level").arg("debug").start();
    let upload = dir.path().join("upload.bin");
    // Within the default max_body_bytes (1 MiB), past the stream's window (256 KiB).
    let sent = pattern(800_000, 11);
    std::fs::write(&upload, &sent).unwrap();
    let upload_arg = format!("@{}", upload.display());
    for proto in ["--http1.1", "--http2"] {
        let r = fetch(&srv.url("/small.txt"), &[proto]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "hello"), "{proto}: {}", srv.stderr());
        assert!(r.header("via").is_some_and(|v| v.contains("2 ktlsd")), "{proto}: {:?}", r.headers);
        let r = fetch(&srv.url("/big.bin"), &[proto]);
        assert_eq!(r.status, 200, "{proto}");
        assert_body("a 3 MB answer over h2://", &r.body, &big);
        let r = fetch(&srv.url("/echo"), &[proto, "--data-binary", &upload_arg]);
        assert_eq!(r.status, 200, "{proto}: {}", srv.stderr());
        assert_body("an 800 kB request body echoed over h2://", &r.body, &sent);
    }
    assert!(up.count("/big.bin") >= 2, "{}", up.log());
    let stopped = srv.stop();
    assert!(!stopped.stderr.contains("panicked"), "{}", stopped.stderr);
}

/// nghttpd's trailer after a Content-Length body (`--trailer`) reaches an HTTP/2
/// client (the /trailers case of h2_hostile.py is a body without Content-Length).
#[test]
fn trailers_after_a_content_length_body_reach_http2_clients() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = upstream_certificates(dir.path());
    let _up = Nghttpd::h2(&[("small.txt", b"hello")], &cert, &key, &["--trailer", "x-check: done"]);
    let config = format!(
        "[[proxy]]\npath = \"/**\"\nupstream = [\"h2://localhost:{}\"]\nupstream_ca = {:?}\n",
        _up.port,
        ca.display().to_string()
    );
    let srv = Server::builder(BIN).workers(Some(1)).config(&config).start();
    // nghttpd's trailer reaches an HTTP/2 client (nghttp prints the frames it reads).
    let out = run_with_timeout(
        Command::new("nghttp").stdin(Stdio::null()).args(["-v", &srv.url("/small.txt")]),
        None,
        Duration::from_secs(30),
    );
    let frames = String::from_utf8_lossy(&out.stdout);
    assert!(frames.contains("x-check: done"), "{frames}");
}
