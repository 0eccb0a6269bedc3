//! The admin listener over kTLS: `/metrics` counts kTLS connections and relays
//! tls_stat; the record-size advisor on three traffic mixes.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use testkit::{admin_get, fetch, pattern, run_with_timeout, scrape};

use crate::harness::*;

/// A server with `files` and an admin socket (in a directory kept with it).
fn ktls_with_admin(files: &[(&str, Vec<u8>)], args: &[&str]) -> (KtlsServer, tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let sock = dir.path().join("admin.sock");
    let sock_arg = sock.display().to_string();
    let mut all = vec!["--admin", sock_arg.as_str()];
    all.extend_from_slice(args);
    (KtlsServer::start(files, &all), dir, sock)
}

fn sample(m: &HashMap<String, f64>, key: &str) -> f64 {
    *m.get(key).unwrap_or_else(|| panic!("no sample {key} in /metrics"))
}

/// `/metrics` counts kTLS connections and their bytes under record_layer="ktls"
/// (none under userspace), and relays the kernel's own tls_stat, which rose by
/// one TX and one RX per connection.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn metrics_count_ktls_connections_and_relay_tls_stat() {
    let test = "metrics_count_ktls_connections_and_relay_tls_stat";
    let files = standard_files();
    let (server, _dir, sock) = ktls_with_admin(&files, &[]);
    let before = scrape(&sock);
    let names = ["one", "r16385", "big"];
    for name in names {
        let r = fetch(&server.url(&format!("/{name}")), &["--http1.1"]);
        assert_eq!(r.status, 200, "/{name}");
    }
    let want_bytes: usize = names.iter().map(|n| file(&files, n).len()).sum();
    let layer = |l: &str| format!("ktlsd_connections_total{{protocol=\"http/1.1\",record_layer=\"{l}\"}}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        let m = scrape(&sock);
        if sample(&m, &layer("ktls")) - before.get(&layer("ktls")).copied().unwrap_or(0.0) >= 3.0
            || Instant::now() > deadline
        {
            break m;
        }
        thread::sleep(Duration::from_millis(100));
    };
    let d = |k: &str| sample(&after, k) - before.get(k).copied().unwrap_or(0.0);
    assert_eq!(d(&layer("ktls")), 3.0, "{test}");
    assert_eq!(d(&layer("userspace")), 0.0, "{test}");
    assert_eq!(d("ktlsd_sent_body_bytes_total{record_layer=\"ktls\"}"), want_bytes as f64, "{test}");
    assert_eq!(d("ktlsd_sent_body_bytes_total{record_layer=\"userspace\"}"), 0.0, "{test}");
    assert_eq!(d("ktlsd_ktls_install_failures_total"), 0.0, "{test}");
    for c in ["TlsTxSw", "TlsRxSw"] {
        let key = format!("ktlsd_kernel_tls_stat{{counter=\"{c}\"}}");
        assert!(d(&key) >= 3.0, "{test}: {key} rose by {}", d(&key));
    }
    let stopped = server.stop();
    assert_ktls(test, &stopped, &Expect::conns(3, 3));
}

/// Runs `ktlsd` over kTLS with `files`, fetches `urls` on `connections` kept-alive
/// curl connections (through netem's `link` on lo if given, set up once the
/// server has started), and returns `/advisor`'s recommendation and reason.
fn advice_after(
    files: &[(&str, Vec<u8>)],
    urls: &[&str],
    connections: usize,
    link: Option<&[&str]>,
) -> (String, String) {
    let (server, _dir, sock) = ktls_with_admin(files, &["--record-size", "dynamic"]);
    let netem = link.map(Netem::on);
    for _ in 0..connections {
        let mut args: Vec<String> = vec!["-sk".into(), "--http1.1".into(), "--max-time".into(), "120".into()];
        for u in urls {
            args.extend(["-o".into(), "/dev/null".into(), server.url(u)]);
        }
        let out = run_with_timeout(Command::new("curl").args(&args), None, Duration::from_secs(150));
        assert!(out.status.success(), "curl: {}", String::from_utf8_lossy(&out.stderr));
    }
    let want = (urls.len() * connections) as u64;
    let deadline = Instant::now() + Duration::from_secs(20);
    let advice = loop {
        let (status, body) = admin_get(&sock, "/advisor");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("advisor JSON");
        if v["samples"].as_u64() >= Some(want) && v["connections"].as_u64() >= Some(connections as u64)
            || Instant::now() > deadline
        {
            break v;
        }
        thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(advice["samples"].as_u64(), Some(want), "{advice}");
    assert!(advice["current"].as_str().is_some_and(|c| c.starts_with("dynamic")), "{advice}");
    drop(netem);
    server.stop();
    (
        advice["recommended"].as_str().unwrap_or_default().to_string(),
        advice["reason"].as_str().unwrap_or_default().to_string(),
    )
}

/// `tc qdisc` on lo for the life of the guard.
struct Netem;

impl Netem {
    fn on(spec: &[&str]) -> Netem {
        // None may be there yet: the deletion's complaint is expected.
        let _ = Command::new("tc").args(["qdisc", "del", "dev", "lo", "root"]).stderr(Stdio::null()).status();
        let mut args = vec!["qdisc", "add", "dev", "lo", "root", "netem"];
        args.extend_from_slice(spec);
        let st = Command::new("tc").args(&args).status().expect("tc");
        assert!(st.success(), "tc {args:?} failed: netem (sch_netem) is needed");
        Netem
    }
}

impl Drop for Netem {
    fn drop(&mut self) {
        let _ = Command::new("tc").args(["qdisc", "del", "dev", "lo", "root"]).status();
    }
}

/// The advisor on three real traffic mixes over kTLS: all small bodies
/// (static:4k), mostly small with a few large on a near link (static:16k), and
/// large bodies over a link with 20 ms RTT and 1% loss made by netem (adaptive).
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn advisor_recommends_from_three_traffic_mixes() {
    let files = vec![("small", pattern(1_000, 1)), ("mid", pattern(10_000, 2)), ("large", pattern(100_000, 3))];
    let small: Vec<&str> = vec!["/small"; 60];
    let (rec, why) = advice_after(&files, &small, 2, None);
    assert_eq!(rec, "static:4k", "all small: {why}");

    // 2 of 60 (3%) exceed the initial window: fewer than the 5% that matter.
    let mut mixed: Vec<&str> = vec!["/mid"; 58];
    mixed.extend(["/large", "/large"]);
    let (rec, why) = advice_after(&files, &mixed, 2, None);
    assert_eq!(rec, "static:16k", "mixed: {why}");

    let large: Vec<&str> = vec!["/large"; 40];
    let (rec, why) = advice_after(&files, &large, 3, Some(&["delay", "10ms", "loss", "1%"]));
    assert_eq!(rec, "adaptive", "large over a lossy link: {why}");
    assert!(why.contains("exceed the initial window"), "{why}");
}

/// The status page's document over kTLS: after downloads on fresh connections,
/// `/status.json` counts as many kTLS connections as the kernel's `TlsTxSw` rose
/// (and as `TlsRxSw`), its kTLS share is 1 (no user-space connection), and its
/// sendfile body bytes rose by the files' bytes, which left by sendfile.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn status_json_ktls_share_and_sendfile_bytes_match_tls_stat() {
    let test = "status_json_ktls_share_and_sendfile_bytes_match_tls_stat";
    let files = standard_files();
    let (server, _dir, sock) = ktls_with_admin(&files, &[]);
    let doc = || -> serde_json::Value {
        let (status, body) = admin_get(&sock, "/status.json");
        assert_eq!(status, 200, "{test}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{test}: /status.json is not JSON ({e}): {body}"))
    };
    let num = |v: &serde_json::Value, path: &[&str]| -> f64 {
        path.iter().fold(v, |v, k| &v[k]).as_f64().unwrap_or_else(|| panic!("{test}: no number at {path:?} in {v}"))
    };
    let (before, stat_before) = (doc(), read_tls_stat());
    let names = ["big", "odd"];
    for name in names {
        let r = fetch(&server.url(&format!("/{name}")), &["--http1.1"]);
        assert_eq!(r.status, 200, "{test}: /{name}");
    }
    let want_bytes: usize = names.iter().map(|n| file(&files, n).len()).sum();
    let connections = ["now", "tls", "connections", "ktls"];
    let sendfile = ["now", "body_bytes", "sendfile"];
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        let d = doc();
        let done = num(&d, &sendfile) - num(&before, &sendfile) >= want_bytes as f64;
        if done || Instant::now() > deadline {
            break d;
        }
        thread::sleep(Duration::from_millis(100));
    };
    let stat_after = read_tls_stat();
    let stat = |c: &str| stat_after.get(c).unwrap_or(0) as f64 - stat_before.get(c).unwrap_or(0) as f64;
    let ktls = num(&after, &connections) - num(&before, &connections);
    assert_eq!(ktls, names.len() as f64, "{test}: kTLS connections in /status.json");
    assert_eq!(ktls, stat("TlsTxSw"), "{test}: /status.json's kTLS connections against tls_stat's TlsTxSw");
    assert_eq!(ktls, stat("TlsRxSw"), "{test}: against TlsRxSw");
    assert_eq!(num(&after, &["now", "tls", "connections", "userspace"]), 0.0, "{test}");
    assert_eq!(num(&after, &["now", "tls", "ktls_share"]), 1.0, "{test}: the kTLS share");
    assert_eq!(after["now"]["tls"]["ktls_enabled"], true, "{test}");
    assert_eq!(num(&after, &sendfile) - num(&before, &sendfile), want_bytes as f64, "{test}: sendfile bytes");
    assert_eq!(num(&after, &["now", "body_bytes", "copy"]), 0.0, "{test}: nothing copied");
    let stopped = server.stop();
    assert_ktls(test, &stopped, &Expect::conns(2, 2));
}
