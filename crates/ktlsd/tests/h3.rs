//! HTTP/3 through real QUIC clients: `tests/h3/client.py` (Python `aioquic`, at
//! frame level) sends requests and malformed frames, ngtcp2's `gtlsclient` and
//! headless Chromium fetch files; curl checks that HTTP/1.1 and HTTP/2 answers
//! advertise HTTP/3 with `Alt-Svc` only when it is on. The QUIC admission rules and
//! the HTTP/3 options run in-process (`quic::tests`, `config::h3::tests`,
//! `http::h3::tests`).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::*;

#[path = "h3/client.rs"]
mod aioquic;
use aioquic::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

fn h3_server(b: ServerBuilder) -> Server {
    b.arg("--http3").start()
}

#[test]
fn get_head_404_range_and_304_as_on_tcp_logged_as_http3() {
    let body = pattern(50_000, 3);
    let b = Server::builder(BIN).file("f", &body);
    let sock = b.dir().join("admin.sock");
    let srv = h3_server(b.arg("--admin").arg(&sock));
    let r = requests(
        &srv,
        "localhost",
        &serde_json::json!([
            {"path": "/f"},
            {"path": "/f", "method": "HEAD"},
            {"path": "/nope"},
            {"path": "/f", "headers": [["range", "bytes=100-199"]]},
            {"path": "/f", "method": "DELETE"},
        ]),
    );
    let rs = &r["responses"];
    assert_eq!(rs[0]["status"], 200, "{r}");
    assert_eq!(rs[0]["sha256"], sha256(&body));
    assert_eq!(header(&rs[0], "content-length"), Some("50000"));
    assert_eq!(header(&rs[0], "server"), Some("ktlsd"));
    assert!(header(&rs[0], "alt-svc").is_none(), "HTTP/3 answers need no Alt-Svc: {r}");
    assert_eq!((rs[1]["status"].as_u64(), rs[1]["len"].as_u64()), (Some(200), Some(0)), "HEAD: {r}");
    assert_eq!(header(&rs[1], "content-length"), Some("50000"));
    assert_eq!(rs[2]["status"], 404);
    assert_eq!(rs[3]["status"], 206);
    assert_eq!(header(&rs[3], "content-range"), Some("bytes 100-199/50000"));
    assert_eq!(rs[3]["sha256"], sha256(&body[100..200]));
    assert_eq!(rs[4]["status"], 405);

    let etag = header(&rs[0], "etag").expect("an ETag").to_string();
    let r = requests(&srv, "localhost", &serde_json::json!([{"path": "/f", "headers": [["if-none-match", etag]]}]));
    assert_eq!((r["responses"][0]["status"].as_u64(), r["responses"][0]["len"].as_u64()), (Some(304), Some(0)));

    let log = srv.wait_access_log(6, Duration::from_secs(10));
    for (line, want) in log.iter().zip(["\"GET /f HTTP/3.0\" 200 50000", "\"HEAD /f HTTP/3.0\" 200 0"]) {
        assert!(line.contains(want) && line.ends_with("tls=quic"), "{line}");
    }
    assert!(log.iter().any(|l| l.contains("\"GET /f HTTP/3.0\" 304 0")), "{log:?}");

    let m = scrape(&sock);
    let key = r#"ktlsd_connections_total{protocol="h3",record_layer="quic"}"#;
    assert_eq!(m.get(key).copied(), Some(2.0), "two QUIC connections: {m:?}");
    assert!(!m.contains_key(r#"ktlsd_connections_total{protocol="h3",record_layer="ktls"}"#));
    // The advisor knows HTTP/3 is on, and recommends nothing about it.
    let (code, body) = admin_get(&sock, "/advisor");
    let adv: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("/advisor {code} {body:?}: {e}"));
    assert_eq!((adv["http3_recommended"].as_bool(), adv["http3_reason"].as_str()), (Some(false), Some("HTTP/3 is on")));
}

#[test]
fn many_concurrent_streams_and_a_large_file_arrive_intact() {
    let mut b = Server::builder(BIN).no_access_log();
    for i in 0..100 {
        b = b.file(&format!("s{i}"), pattern(10 * 1024, i));
    }
    let srv = b.arg("--h3-max-streams").arg("16").arg("--http3").start();
    let want_big = write_big_file(&srv.root().join("big"), 30 << 20);
    let many: Vec<Value> = (0..100).map(|i| serde_json::json!({"path": format!("/s{i}")})).collect();
    let mut all = many.clone();
    all.push(serde_json::json!({"path": "/big"}));
    // 101 requests at once on a connection allowed 16 streams at a time: the client
    // waits for stream credit, and every body arrives whole.
    let r = requests(&srv, "localhost", &Value::Array(all));
    let rs = r["responses"].as_array().unwrap();
    for (i, resp) in rs[..100].iter().enumerate() {
        assert_eq!(resp["status"], 200, "stream {i}: {resp}");
        assert_eq!(resp["sha256"], sha256(&pattern(10 * 1024, i as u64)), "stream {i}");
    }
    assert_eq!(rs[100]["len"], 30 << 20);
    assert_eq!(rs[100]["sha256"], want_big);
}

#[test]
fn malformed_frames_and_qpack_garbage_get_the_rfc_errors_and_the_server_serves_on() {
    let srv = h3_server(Server::builder(BIN).file("f", "still here").no_access_log());
    // (abuse, QUIC application error code the connection is closed with)
    for (kind, code) in [("data-first", 0x105u64), ("qpack-garbage", 0x200)] {
        let r = client(&srv, "localhost", &["abuse", kind]);
        assert_eq!(r["closed"].as_u64(), Some(code), "{kind}: {r}");
    }
    // A field section over max_header_bytes: 431 on that stream, the connection goes on.
    let r = client(&srv, "localhost", &["abuse", "huge-headers"]);
    assert_eq!(r["status"], 431, "{r}");
    assert!(r["closed"].is_null(), "{r}");
    let r = requests(&srv, "localhost", &serde_json::json!([{"path": "/f"}]));
    assert_eq!(r["responses"][0]["text"], "still here", "{r}");
    assert!(!srv.stderr().contains("panicked"), "{}", srv.stderr());
}

#[test]
fn alt_svc_on_http1_and_http2_only_when_http3_is_on_and_reload_keeps_serving() {
    let on = h3_server(Server::builder(BIN).file("f", "x"));
    let want = format!("h3=\":{}\"; ma=86400", on.port());
    for v in ["--http1.1", "--http2"] {
        let r = fetch(&on.url("/f"), &[v]);
        assert_eq!(r.header("alt-svc"), Some(want.as_str()), "{v}");
    }
    let off = Server::builder(BIN).file("f", "x").start();
    for v in ["--http1.1", "--http2"] {
        assert_eq!(fetch(&off.url("/f"), &[v]).header("alt-svc"), None, "{v}");
    }
    // The UDP sockets outlive a reload; new connections take the new configuration.
    on.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !on.stderr().contains("reloaded configuration") {
        assert!(Instant::now() < deadline, "no reload: {}", on.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = requests(&on, "localhost", &serde_json::json!([{"path": "/f"}]));
    assert_eq!(r["responses"][0]["text"], "x", "{r}");
}

#[test]
fn quic_retry_always_validates_the_address_first() {
    let srv = h3_server(Server::builder(BIN).file("f", "ok").arg("--quic-retry").arg("always"));
    let r = requests(&srv, "localhost", &serde_json::json!([{"path": "/f"}]));
    assert_eq!((r["retried"].as_bool(), r["responses"][0]["text"].as_str()), (Some(true), Some("ok")), "{r}");
    let plain = h3_server(Server::builder(BIN).file("f", "ok").arg("--quic-retry").arg("never"));
    let r = requests(&plain, "localhost", &serde_json::json!([{"path": "/f"}]));
    assert_eq!(r["retried"].as_bool(), Some(false), "{r}");
}

#[test]
fn sni_and_authority_choose_the_site_over_http3() {
    let b = Server::builder(BIN).file("f.txt", "default");
    let mut config = String::new();
    let mut fps = Vec::new();
    for label in ["a", "b"] {
        let name = format!("{label}.example");
        let root = b.dir().join(label);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("f.txt"), label).unwrap();
        let (c, k, fp) = cert_for(b.dir(), label, &[&name]);
        fps.push(fp);
        config += &format!("[[site]]\nnames = [{name:?}]\nroot = {:?}\ncert = {:?}\nkey = {:?}\n", root, c, k);
    }
    let srv = h3_server(b.config(&config));
    for (label, fp) in ["a", "b"].iter().zip(&fps) {
        let name = format!("{label}.example");
        let r = requests(&srv, &name, &serde_json::json!([{"path": "/f.txt"}]));
        assert_eq!(r["cert"].as_str(), Some(fp.as_str()), "{name}: {r}");
        assert_eq!(r["responses"][0]["text"].as_str(), Some(*label), "{name}: {r}");
    }
    // :authority picks the site per request, as Host does over TCP.
    let r = requests(&srv, "a.example", &serde_json::json!([{"path": "/f.txt", "authority": "b.example"}]));
    assert_eq!(r["responses"][0]["text"], "b", "{r}");
}

#[test]
fn shutdown_closes_open_connections_with_h3_no_error() {
    use std::io::BufRead;
    let srv = h3_server(Server::builder(BIN).file("index.html", "hi"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h3/client.py");
    let mut child = std::process::Command::new("/usr/bin/python3")
        .arg(&script)
        .args([&srv.addr().ip().to_string(), &srv.port().to_string(), "wait-close", "20"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains("200"), "{first}");
    let t0 = Instant::now();
    srv.signal(libc::SIGTERM);
    let last = lines.next().unwrap().unwrap();
    let _ = child.wait();
    let v: Value = serde_json::from_str(&last).unwrap();
    assert_eq!(v["closed"].as_u64(), Some(0x100), "{last}");
    assert!(t0.elapsed() < Duration::from_secs(5), "closed after {:?}", t0.elapsed());
}

/// Stopping closes an HTTP/3 connection in RFC 9114 section 5.2's two steps: a first
/// GOAWAY with the largest id (2^62-4); a request the client sends after it (one that
/// crossed it) is still answered; the final GOAWAY names the request after the last
/// one taken (stream 4 taken: 8); then the connection closes with H3_NO_ERROR.
#[test]
fn stop_sends_two_goaways_and_answers_a_request_crossing_the_first() {
    use std::io::BufRead;
    let srv = h3_server(Server::builder(BIN).bin_from_env().file("f.txt", "hello"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h3/client.py");
    let mut child = std::process::Command::new("/usr/bin/python3")
        .arg(&script)
        .args([&srv.addr().ip().to_string(), &srv.port().to_string(), "cross-goaway", "/f.txt"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains("200"), "{first}");
    srv.signal(libc::SIGTERM);
    let last = lines.next().unwrap().unwrap();
    let _ = child.wait();
    let v: Value = serde_json::from_str(&last).unwrap();
    assert_eq!(v["goaways"], serde_json::json!([(1u64 << 62) - 4, 8]), "{last}");
    assert_eq!(v["second"]["status"], 200, "the request crossing the first GOAWAY is answered: {last}");
    assert_eq!(v["second"]["text"], "hello", "{last}");
    assert_eq!(v["closed"].as_u64(), Some(0x100), "{last}");
}

/// A browser: headless Chromium, told to use QUIC for the server's origin and to
/// trust its certificate by public key, loads a page of 50 images, scripts and style
/// sheets; the page writes into the DOM how many loaded and how many came over `h3`
/// (Resource Timing's `nextHopProtocol`), and the access log has every request as HTTP/3.0.
#[test]
fn chromium_loads_a_page_of_fifty_resources_over_http3() {
    let chromium = chromium();
    let b = subresource_page(Server::builder(BIN), "h3");
    let (cert, key, _) = cert_for(b.dir(), "localhost", &["localhost"]);
    let srv = h3_server(b.arg("--cert").arg(&cert).arg("--key").arg(&key));
    // The certificate's SubjectPublicKeyInfo, SHA-256, base64: what Chromium is told to accept.
    let spki = run_with_timeout(
        std::process::Command::new("sh").arg("-c").arg(format!(
            "openssl x509 -pubkey -noout -in {} | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | openssl base64 -A",
            cert.display()
        )),
        None,
        Duration::from_secs(20),
    );
    let spki = String::from_utf8_lossy(&spki.stdout).trim().to_string();
    assert_eq!(spki.len(), 44, "SPKI hash {spki:?}");
    let origin = format!("localhost:{}", srv.port());
    let profile = srv.dir().join("chromium-profile");
    let out = run_with_timeout(
        std::process::Command::new(chromium).args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--enable-quic",
            &format!("--origin-to-force-quic-on={origin}"),
            &format!("--ignore-certificate-errors-spki-list={spki}"),
            // The server listens on 127.0.0.1 only; Chromium would try ::1 first and not fall back for QUIC.
            "--host-resolver-rules=MAP localhost 127.0.0.1",
            &format!("--user-data-dir={}", profile.display()),
            "--virtual-time-budget=20000",
            "--dump-dom",
            &format!("https://{origin}/index.html"),
        ]),
        None,
        Duration::from_secs(120),
    );
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains("loaded=50 failed=0 scripts=15 h3=50 page=h3"),
        "{dom}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stopped = srv.stop();
    let lines: Vec<&String> = stopped.access_log.iter().filter(|l| l.contains("\"GET /")).collect();
    assert!(lines.len() >= 51, "{:#?}", stopped.access_log);
    assert!(
        lines.iter().all(|l| l.contains(" HTTP/3.0\" 200 ") && l.ends_with("tls=quic")),
        "{:#?}",
        stopped.access_log
    );
}

#[test]
fn a_flood_of_cancelled_requests_ends_the_connection_with_excessive_load() {
    let srv = h3_server(Server::builder(BIN).file("f", "fine").no_access_log().args(["--h2-max-resets", "50"]));
    write_big_file(&srv.root().join("big"), 16 << 20);
    let r = client(&srv, "localhost", &["abuse", "cancel-flood:400:/big"]);
    assert_eq!(r["closed"].as_u64(), Some(0x107), "H3_EXCESSIVE_LOAD: {r}");
    let r = requests(&srv, "localhost", &serde_json::json!([{"path": "/f"}]));
    assert_eq!(r["responses"][0]["text"], "fine", "{r}");
}

/// A third client, ngtcp2's `gtlsclient` (GnuTLS): 20 requests on one connection
/// and a file downloaded whole.
#[test]
fn gtlsclient_downloads_intact() {
    let srv = h3_server(Server::builder(BIN).file("f", pattern(300_000, 9)));
    let out_dir = srv.dir().join("dl");
    std::fs::create_dir_all(&out_dir).unwrap();
    let port = srv.port().to_string();
    let out = run_with_timeout(
        std::process::Command::new("gtlsclient").args([
            "-q",
            "--no-quic-dump",
            "--no-http-dump",
            "--exit-on-all-streams-close",
            "-n",
            "20",
            &format!("--download={}", out_dir.display()),
            "127.0.0.1",
            &port,
            &format!("https://localhost:{port}/f"),
        ]),
        None,
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "gtlsclient (ngtcp2-client): {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(sha256_file(&out_dir.join("f")), sha256(&pattern(300_000, 9)));
    let log = srv.wait_access_log(20, Duration::from_secs(10));
    assert_eq!(log.iter().filter(|l| l.contains("\"GET /f HTTP/3.0\" 200 300000")).count(), 20, "{log:#?}");
}

#[test]
fn http3_without_tls13_or_its_initial_suite_stops_start_up_with_one_line() {
    for (args, needle) in [
        (&["--tls-versions", "1.2"][..], "QUIC needs TLS 1.3"),
        (&["--cipher-suites", "TLS_AES_256_GCM_SHA384"][..], "TLS_AES_128_GCM_SHA256 in cipher_suites"),
    ] {
        let e = Server::builder(BIN).arg("--http3").args(args).run_to_exit();
        e.assert_startup_error(&["http3", needle]);
    }
}

/// Growth of resident memory allowed over the hostile run: without the handshake
/// cap before Retry, the 10,000 Initials held about 200 MiB of connection state.
const HOSTILE_RSS_BOUND_KIB: u64 = 64 * 1024;

/// Raw UDP no QUIC client sends (`tests/h3/hostile.py`: random bytes, truncated
/// Initials, 10,000 Initials with fake connection IDs from one socket, 65507-byte
/// datagrams, stateless-reset-shaped packets, unknown versions) while an aioquic
/// client keeps fetching: every request succeeds, memory stays bounded, each
/// unknown version of a full-sized datagram draws one Version Negotiation offering
/// QUIC v1 only, and nothing panics.
#[test]
fn hostile_datagrams_leave_real_clients_served_and_memory_bounded() {
    let body = pattern(20_000, 5);
    let srv = h3_server(Server::builder(BIN).file("f", &body).no_access_log());
    let ten = Value::Array(vec![serde_json::json!({"path": "/f"}); 10]);
    let check = |r: &Value| {
        for resp in r["responses"].as_array().expect("responses") {
            assert_eq!((resp["status"].as_u64(), resp["sha256"].as_str()), (Some(200), Some(sha256(&body).as_str())));
        }
    };
    check(&requests(&srv, "localhost", &ten));
    let before = rss_kib(srv.pid());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h3/hostile.py");
    let (host, port) = (srv.addr().ip().to_string(), srv.port().to_string());
    let hostile = std::thread::spawn(move || {
        run_with_timeout(
            std::process::Command::new("/usr/bin/python3").arg(&script).args([&host, &port]),
            None,
            Duration::from_secs(300),
        )
    });
    let mut rounds = 0;
    while !hostile.is_finished() || rounds < 3 {
        check(&requests(&srv, "localhost", &ten));
        rounds += 1;
    }
    let out = hostile.join().expect("hostile.py thread");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "hostile.py: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("hostile.py output {text:?}: {e}"));
    assert_eq!(r["sent"]["initial-flood"], 10_000, "{r}");
    assert_eq!(r["version_negotiation"], 4, "one per unknown version in a full-sized datagram: {r}");
    let offered = r["vn_versions"].as_array().expect("versions offered");
    assert!(offered.contains(&Value::from("0x1")) && !offered.iter().any(|v| v == "0xff00001d"), "{r}");
    check(&requests(&srv, "localhost", &ten));
    let after = rss_kib(srv.pid());
    assert!(after < before + HOSTILE_RSS_BOUND_KIB, "RSS {before} KiB before, {after} KiB after {rounds} rounds");
    eprintln!("hostile UDP: RSS {before} KiB before, {after} KiB after; {rounds} rounds of 10 requests during it");
    let stopped = srv.stop();
    stopped.assert_clean_exit();
    assert!(!stopped.stderr.contains("panicked"), "{}", stopped.stderr);
}

/// Under the real `systemd-socket-activate --datagram`, the UDP socket it passes
/// carries HTTP/3 (the server binds no UDP socket of its own on that address, which
/// would fail as the passed one holds it) while TCP binds `listen` itself.
#[test]
fn a_udp_socket_passed_by_socket_activation_carries_http3() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    // systemd-socket-activate starts the server on the first datagram to the socket.
    let started = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poke = {
        let (started, addr) = (started.clone(), addr.clone());
        std::thread::spawn(move || {
            let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            for _ in 0..300 {
                if started.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let _ = udp.send_to(b"wake up", &addr);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let srv = Server::builder(BIN)
        .file("f", "over a passed socket\n")
        .workers(Some(2))
        .listen(&[&addr])
        .arg("--http3")
        .wrapper(["systemd-socket-activate", "--datagram", "-l", &addr])
        .start();
    started.store(true, std::sync::atomic::Ordering::SeqCst);
    poke.join().unwrap();
    assert!(srv.stderr().contains("socket activation: HTTP/3 on the 1 UDP socket(s) passed"), "{}", srv.stderr());
    assert_eq!(srv.port(), port, "TCP binds listen itself");
    for _ in 0..3 {
        let r = requests(&srv, "localhost", &Value::Array(vec![serde_json::json!({"path": "/f"}); 5]));
        for resp in r["responses"].as_array().unwrap() {
            assert_eq!(resp["text"], "over a passed socket\n", "{r}");
        }
    }
    assert_eq!(fetch(&srv.url("/f"), &[]).status, 200, "TCP serves beside it");
    srv.stop().assert_clean_exit();
}

/// A `[[proxy]]` rule takes HTTP/3 requests as it takes HTTP/1.1 and HTTP/2 ones:
/// a GET reaches the upstream (with `Via: 3 ktlsd`) and comes back with a
/// Cache-Status; a POST body reaches it whole; a cacheable answer is stored and the
/// next request is a hit with the same bytes (counted as a hit's bytes by copy);
/// an upstream that closes without answering gets a 502; one that closes mid-body
/// gets the stream reset, never a short body passed off as whole; a request body
/// over `max_body_bytes` gets a 413; files beside the rule are still served.
#[test]
fn proxied_paths_over_http3() {
    let origin = origin::Origin::start("a");
    let cache = tempfile::tempdir().unwrap();
    let config = format!(
        "[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\ncache = true\n\n[cache]\ndir = {:?}\nmax_size = \"64M\"\n",
        origin.url(),
        cache.path().display().to_string()
    );
    let admin = tempfile::tempdir().unwrap();
    let sock = admin.path().join("admin.sock");
    let args = ["--http3", "--admin", sock.to_str().unwrap(), "--max-body-bytes", "150000"];
    let srv = origin::ktlsd(BIN, &config, &args);
    let body = "b".repeat(100_000);
    let big = "/api/big?n=300000&cc=1";
    let r = requests(
        &srv,
        "localhost",
        &serde_json::json!([
            {"path": "/api/name"},
            {"path": "/api/echo", "method": "POST", "body": body},
            {"path": big},
            {"path": "/api/close-early"},
            {"path": "/api/short"},
            {"path": "/index.txt"},
            // Over --max-body-bytes: announced, refused before the upstream; not
            // announced, cut off on the way up.
            {"path": "/api/echo?announced", "method": "POST", "body_len": 200_000,
             "headers": [["content-length", "200000"]]},
            {"path": "/api/echo?unannounced", "method": "POST", "body_len": 200_000},
        ]),
    );
    let rs = &r["responses"];
    assert_eq!((rs[0]["status"].as_u64(), rs[0]["text"].as_str()), (Some(200), Some("a")), "{r}");
    // Via names the protocol each message was received with: the upstream's here.
    assert_eq!(header(&rs[0], "via"), Some("1.1 ktlsd"), "{r}");
    assert!(header(&rs[0], "cache-status").is_some_and(|c| c.starts_with("ktlsd; fwd=")), "{r}");
    let echo: Value = serde_json::from_str(rs[1]["text"].as_str().unwrap_or("")).expect("the echo's JSON");
    assert_eq!(echo["method"], "POST", "{echo}");
    assert_eq!(echo["body_len"], 100_000, "{echo}");
    assert_eq!(echo["body_sha256"], sha256(body.as_bytes()), "{echo}");
    assert!(echo["fields"].as_array().is_some_and(|f| f.contains(&serde_json::json!(["Via", "3 ktlsd"]))), "{echo}");
    assert_eq!((rs[2]["status"].as_u64(), rs[2]["len"].as_u64()), (Some(200), Some(300_000)), "{r}");
    assert_eq!(header(&rs[2], "cache-status"), Some("ktlsd; fwd=miss"), "{r}");
    assert_eq!(rs[3]["status"].as_u64(), Some(502), "{r}");
    // A body of 100 announced bytes being stored is awaited before its head: the
    // upstream closing after 10 gets a clean 502.
    assert_eq!(
        (rs[4]["status"].as_u64(), header(&rs[4], "cache-status")),
        (Some(502), Some("ktlsd; fwd=miss; detail=body")),
        "{r}"
    );
    assert_eq!(rs[5]["text"], "static file", "{r}");
    assert_eq!((rs[6]["status"].as_u64(), rs[7]["status"].as_u64()), (Some(413), Some(413)), "{r}");
    assert_eq!(origin.count("/api/echo?announced"), 0, "a body announced too large reached the upstream");

    let again = requests(&srv, "localhost", &serde_json::json!([{"path": big}]));
    let hit = &again["responses"][0];
    assert_eq!(header(hit, "cache-status"), Some("ktlsd; hit"), "{again}");
    assert_eq!(hit["sha256"], rs[2]["sha256"], "{again}");
    assert_eq!(origin.count(big), 1);
    let hit_bytes = scrape(&sock).get("ktlsd_cache_hit_bytes_total{by=\"copy\"}").copied();
    assert_eq!(hit_bytes, Some(300_000.0), "the hit's body bytes, by copy");
    let log = srv.stderr();
    assert!(
        log.contains("\"GET /api/short\": 502 upstream")
            && log.contains("closed the connection before the end of the body"),
        "{log}"
    );
}
