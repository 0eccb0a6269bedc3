//! The admin listener with the real binary: `/metrics` scraped and parsed by
//! the reference Prometheus parser after a known mix of requests (exact
//! counter deltas), `/status` and `/advisor` JSON, `ktlsd status`, and where
//! the listener may and may not be reached.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

fn admin_server() -> (Server, PathBuf) {
    let b = Server::builder(BIN).file("a.txt", "hello").file("big.bin", vec![7u8; 20_000]).no_access_log();
    let sock = b.dir().join("admin.sock");
    let s = b.arg("--admin").arg(&sock).start();
    (s, sock)
}

fn delta(before: &HashMap<String, f64>, after: &HashMap<String, f64>, key: &str) -> f64 {
    let a = after.get(key).unwrap_or_else(|| panic!("no sample {key} in {after:?}"));
    a - before.get(key).copied().unwrap_or(0.0)
}

/// Requests are counted when their log entry is written, just after the last
/// byte is handed to the socket: wait until the figures settle.
fn scrape_when(sock: &std::path::Path, done: impl Fn(&HashMap<String, f64>) -> bool) -> HashMap<String, f64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = scrape(sock);
        if done(&m) || Instant::now() > deadline {
            return m;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn metrics_count_a_known_mix_exactly() {
    let (s, sock) = admin_server();
    let before = scrape(&sock);
    // 5 connections, 7 requests: 3 GETs on one kept-alive connection, a 20000-byte
    // body, a HEAD, a 404 and a 405.
    let a = s.url("/a.txt");
    let mut body_bytes = 0.0;
    for args in [
        vec!["-o", "/dev/null", "-o", "/dev/null", "-o", "/dev/null", a.as_str(), a.as_str(), a.as_str()],
        vec!["-o", "/dev/null", &s.url("/big.bin")],
        vec!["-I", a.as_str()],
        vec!["-o", "/dev/null", &s.url("/missing")],
        vec!["-o", "/dev/null", "-X", "POST", "-d", "x", a.as_str()],
    ] {
        // The mix is counted under protocol="http/1.1".
        let args: Vec<&str> = ["--http1.1", "-w", "%{size_download}\n"].into_iter().chain(args).collect();
        let out = curl(&args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        body_bytes +=
            String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.trim().parse::<f64>().ok()).sum::<f64>();
    }
    // 15 + 20000 bytes of files, and the bodies of the 404 and 405 pages.
    assert!(body_bytes > 20_015.0, "{body_bytes}");
    let rtt_count = "ktlsd_connection_rtt_seconds_count";
    // Six requests look a file up (the 405 does not): each is a hit or a miss of its
    // worker's open-file cache, published within a tick.
    let lookups = |m: &HashMap<String, f64>| {
        delta(&before, m, "ktlsd_open_file_cache_hits_total") + delta(&before, m, "ktlsd_open_file_cache_misses_total")
    };
    let after = scrape_when(&sock, |m| {
        delta(&before, m, rtt_count) >= 5.0
            && delta(&before, m, "ktlsd_response_seconds_count") >= 7.0
            && lookups(m) >= 6.0
    });
    assert_eq!(lookups(&after), 6.0);
    assert!(after["ktlsd_open_file_cache_hits_total"] >= 1.0, "the kept-alive GETs of /a.txt: {after:?}");
    assert!(after["ktlsd_open_fds"] > 0.0 && after["ktlsd_max_fds"] >= after["ktlsd_open_fds"]);
    let layer = r#"protocol="http/1.1",record_layer="userspace""#;
    for (key, want) in [
        ("ktlsd_accepted_connections_total".to_string(), 5.0),
        ("ktlsd_handshakes_total".to_string(), 5.0),
        (format!("ktlsd_connections_total{{{layer}}}"), 5.0),
        (r#"ktlsd_requests_total{code="2xx",method="GET"}"#.to_string(), 4.0),
        (r#"ktlsd_requests_total{code="2xx",method="HEAD"}"#.to_string(), 1.0),
        (r#"ktlsd_requests_total{code="4xx",method="GET"}"#.to_string(), 1.0),
        (r#"ktlsd_requests_total{code="4xx",method="other"}"#.to_string(), 1.0),
        (r#"ktlsd_requests_total{code="5xx",method="GET"}"#.to_string(), 0.0),
        (r#"ktlsd_sent_body_bytes_total{record_layer="userspace"}"#.to_string(), body_bytes),
        (r#"ktlsd_sent_body_bytes_total{record_layer="ktls"}"#.to_string(), 0.0),
        ("ktlsd_response_body_bytes_count".to_string(), 7.0),
        ("ktlsd_response_body_bytes_sum".to_string(), body_bytes),
        (r#"ktlsd_response_body_bytes_bucket{le="14600"}"#.to_string(), 6.0),
        ("ktlsd_ttfb_seconds_count".to_string(), 7.0),
        (rtt_count.to_string(), 5.0),
        ("ktlsd_connection_loss_ratio_count".to_string(), 5.0),
        (r#"ktlsd_handshake_failures_total{reason="timeout"}"#.to_string(), 0.0),
    ] {
        assert_eq!(delta(&before, &after, &key), want, "{key}");
    }
    assert_eq!(after[&format!("ktlsd_connections{{{layer}}}")], 0.0, "all closed");
    assert!(after["ktlsd_uptime_seconds"] > 0.0);
    // This host's kernel has no kTLS: no connection used it.
    assert_eq!(after[r#"ktlsd_connections_total{protocol="http/1.1",record_layer="ktls"}"#], 0.0);
    s.stop().assert_clean_exit();
}

#[test]
fn status_advisor_and_the_status_command() {
    let (s, sock) = admin_server();
    for _ in 0..3 {
        assert!(curl(&["-o", "/dev/null", &s.url("/a.txt")]).status.success());
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        let (code, body) = admin_get(&sock, "/status");
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        if v["requests"] == 3 || Instant::now() > deadline {
            break v;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status["requests"], 3, "{status}");
    assert_eq!(status["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(status["pid"], s.ready_pid());
    assert!(status["uptime_seconds"].as_f64().is_some_and(|u| u > 0.0), "{status}");
    assert_eq!(status["config"]["listen"][0], s.addr().to_string());
    assert_eq!(status["config"]["record_size"], "static:16384");
    assert_eq!(status["ktls"]["enabled"], s.ready_tls() == "ktls");
    assert!(status["ktls"]["summary"].as_str().is_some_and(|x| !x.is_empty()));
    assert_eq!(status["counters"]["connections"], 3);
    assert_eq!(status["body_bytes_sent"], 15);

    let (code, body) = admin_get(&sock, "/advisor");
    assert_eq!(code, 200);
    let adv: serde_json::Value = serde_json::from_str(&body).unwrap();
    for field in [
        "samples",
        "body_p50",
        "body_p95",
        "body_max",
        "over_initial_window",
        "connections",
        "lossy_connections",
        "loss_p50",
        "loss_p95",
        "rtt_p50_ms",
        "rtt_p95_ms",
        "current",
        "recommended",
        "reason",
        "config",
    ] {
        assert!(adv.get(field).is_some(), "/advisor has no {field}: {adv}");
    }
    assert_eq!((adv["samples"].as_u64(), adv["body_max"].as_u64()), (Some(3), Some(5)));
    assert_eq!(adv["current"], "static:16384");
    assert_eq!(adv["recommended"], "static:16384", "too few samples to change anything: {adv}");
    assert_eq!(admin_get(&sock, "/nothing").0, 404);

    let mut cmd = Command::new(BIN);
    cmd.args(["status", "--admin"]).arg(&sock);
    let out = Exited::from(run_with_timeout(&mut cmd, None, Duration::from_secs(30)));
    assert!(out.status.success(), "{out:?}");
    for want in ["version: ", "requests: 3", "record_size: static:16384", "  listen: "] {
        assert!(out.stdout.contains(want), "no {want:?} in\n{}", out.stdout);
    }
    s.stop().assert_clean_exit();
}

#[test]
fn status_command_names_an_unreachable_admin_address() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["status", "--admin"]).arg(dir.path().join("none.sock"));
    let out = Exited::from(run_with_timeout(&mut cmd, None, Duration::from_secs(30)));
    assert!(!out.status.success());
    assert!(out.stderr.contains("is ktlsd running with --admin"), "{}", out.stderr);
}

/// A free loopback port (bound then released: the server binds it right after).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn admin_is_loopback_only_unless_told_and_not_on_the_https_port() {
    let port = free_port();
    let public = format!("0.0.0.0:{port}");
    let exited = Server::builder(BIN).args(["--admin", &public]).run_to_exit();
    exited.assert_startup_error(&["admin address", "not a loopback address", "admin_public"]);

    let s = Server::builder(BIN).args(["--admin", &public, "--admin-public"]).no_access_log().start();
    // Reachable over TCP on its own port...
    let out = curl(&["-s", "-o", "/dev/null", "-w", "%{http_code}", &format!("http://127.0.0.1:{port}/metrics")]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    // ...and not through the HTTPS listener, in TLS or plain.
    let out = curl(&["-s", "-o", "/dev/null", "-w", "%{http_code}", &s.url("/metrics")]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "404");
    let out = curl(&["-s", "-o", "/dev/null", "-w", "%{http_code}", &format!("http://{}/metrics", s.addr())]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "400");
    s.stop().assert_clean_exit();
}

#[test]
fn json_and_combined_access_log_lines() {
    let s = Server::builder(BIN).file("a.txt", "hello").args(["--access-log-format", "json"]).start();
    // curl prefers HTTP/2: the JSON line comes from the h2 loop.
    let out = curl(&["-o", "/dev/null", "-e", "https://ref.test/x", "-A", "probe/1.0", &s.url("/a.txt")]);
    assert!(out.status.success());
    let lines = s.wait_access_log(1, Duration::from_secs(10));
    let v: serde_json::Value = serde_json::from_str(&lines[0]).unwrap_or_else(|e| panic!("{e}: {}", lines[0]));
    for (k, want) in [
        ("method", "GET"),
        ("target", "/a.txt"),
        ("protocol", "HTTP/2.0"),
        ("peer", "127.0.0.1"),
        ("record_layer", s.ready_tls()),
        ("referer", "https://ref.test/x"),
        ("user_agent", "probe/1.0"),
    ] {
        assert_eq!(v[k], want, "{k} in {v}");
    }
    assert_eq!((v["status"].as_u64(), v["bytes"].as_u64()), (Some(200), Some(5)), "{v}");
    assert!(v["tls_version"].as_str().is_some_and(|t| t.starts_with("TLSv1")), "{v}");
    assert!(v["cipher"].as_str().is_some_and(|c| c.starts_with("TLS")), "{v}");
    assert!(v["rt"].is_number() && v["ttfb"].is_number() && v["time"].is_string(), "{v}");
    s.stop().assert_clean_exit();

    let s = Server::builder(BIN).file("a.txt", "hello").args(["--access-log-format", "combined"]).start();
    assert!(curl(&["--http1.1", "-o", "/dev/null", "-e", "https://ref.test/x", "-A", "probe/1.0", &s.url("/a.txt")])
        .status
        .success());
    let lines = s.wait_access_log(1, Duration::from_secs(10));
    // nginx: $remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent"
    let l = &lines[0];
    assert!(l.starts_with("127.0.0.1 - - ["), "{l}");
    assert!(l.ends_with("] \"GET /a.txt HTTP/1.1\" 200 5 \"https://ref.test/x\" \"probe/1.0\""), "{l}");
    s.stop().assert_clean_exit();
}
