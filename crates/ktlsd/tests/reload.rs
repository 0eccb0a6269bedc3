//! A reload fails no request: SIGHUP with a changed certificate in the middle of
//! sequential requests by curl over HTTP/1.1 keep-alive and over HTTP/2, six rounds
//! each, every request answered; and, frame by frame with Python's `hpack` and
//! `hyperframe` (`tests/reload/h2_goaway.py`), the two GOAWAYs of RFC 9113 section
//! 6.8 on an HTTP/2 connection opened before the reload, whose request crossing the
//! first GOAWAY is served.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// Rounds per protocol, each across one reload.
const ROUNDS: usize = 6;
/// Requests per round, one after another.
const REQUESTS: usize = 150;
/// URLs per curl process, in turn: a process's connection is reused for its URLs
/// (keep-alive, or streams of one HTTP/2 connection) and its first request comes on a
/// new one, so a reload meets connections both between requests and just after their
/// handshake (where HTTP/2 lost requests to a GOAWAY naming stream 0).
const PER_CURL: [usize; 5] = [1, 1, 1, 2, 5];

/// The URL counts of a round's curl processes: [`PER_CURL`] in turn, `REQUESTS` in all.
fn batches() -> Vec<usize> {
    let mut out = Vec::new();
    let mut sent = 0;
    for &n in PER_CURL.iter().cycle() {
        if sent == REQUESTS {
            break;
        }
        out.push(n.min(REQUESTS - sent));
        sent += out[out.len() - 1];
    }
    out
}

/// Replaces `dst` by a copy of `src` in one rename, so a reload never reads half a file.
fn replace_file(src: &Path, dst: &Path) {
    let tmp = dst.with_extension("tmp");
    std::fs::copy(src, &tmp).expect("copy");
    std::fs::rename(&tmp, dst).expect("rename");
}

/// Runs `ROUNDS` rounds of `REQUESTS` sequential GETs with curl `flag`
/// (`--http1.1` or `--http2`), each round across one reload that swaps the
/// certificate; returns the failures of each round, as curl reported them.
fn rounds_across_reloads(flag: &str, version: &str) -> Vec<Vec<String>> {
    let b = Server::builder(BIN).bin_from_env();
    let (cert_a, key_a) = make_cert(b.dir(), "a", "rsa");
    let (cert_b, key_b) = make_cert(b.dir(), "b", "rsa");
    let (cert, key) = (b.dir().join("live.crt"), b.dir().join("live.key"));
    replace_file(&cert_a, &cert);
    replace_file(&key_a, &key);
    let body = pattern(3000, 7);
    let srv = b.workers(Some(2)).arg("--cert").arg(&cert).arg("--key").arg(&key).file("f.bin", &body).start();
    let url = srv.url("/f.bin");
    let mut all = Vec::new();
    for round in 0..ROUNDS {
        let done = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let client = std::thread::spawn({
            let (done, failures, url, flag, version) =
                (done.clone(), failures.clone(), url.clone(), flag.to_string(), version.to_string());
            let want = format!("200 {} {version}", body.len());
            move || {
                for n in batches() {
                    let mut args =
                        vec![flag.clone(), "-w".into(), "%{http_code} %{size_download} %{http_version}\n".into()];
                    for _ in 0..n {
                        args.extend(["-o".into(), "/dev/null".into(), url.clone()]);
                    }
                    let out = curl(&args);
                    let text = String::from_utf8_lossy(&out.stdout).into_owned();
                    let lines: Vec<&str> = text.lines().collect();
                    for i in 0..n {
                        match lines.get(i) {
                            Some(l) if *l == want => {}
                            got => failures
                                .lock()
                                .unwrap()
                                .push(format!("{got:?} (curl: {})", String::from_utf8_lossy(&out.stderr).trim())),
                        }
                    }
                    done.fetch_add(n, Ordering::Relaxed);
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        while done.load(Ordering::Relaxed) < REQUESTS / 2 {
            assert!(Instant::now() < deadline, "the client stalled");
            std::thread::sleep(Duration::from_millis(2));
        }
        let (c, k) = if round % 2 == 0 { (&cert_b, &key_b) } else { (&cert_a, &key_a) };
        replace_file(c, &cert);
        replace_file(k, &key);
        let line = reload(&srv, round + 1);
        assert!(line.contains("reloaded configuration"), "reload #{}: {line}", round + 1);
        client.join().unwrap();
        let failures = failures.lock().unwrap().clone();
        eprintln!("{flag} round {}: {} of {REQUESTS} requests failed", round + 1, failures.len());
        all.push(failures);
    }
    srv.stop().assert_clean_exit();
    all
}

fn assert_none_failed(flag: &str, rounds: &[Vec<String>]) {
    let failed: usize = rounds.iter().map(Vec::len).sum();
    let first: Vec<&String> = rounds.iter().flatten().take(5).collect();
    assert_eq!(failed, 0, "{flag}: {failed} of {} requests failed across reloads: {first:?}", ROUNDS * REQUESTS);
}

#[test]
fn http2_requests_across_reloads_all_succeed() {
    let rounds = rounds_across_reloads("--http2", "2");
    assert_none_failed("--http2", &rounds);
}

#[test]
fn http1_keep_alive_requests_across_reloads_all_succeed() {
    let rounds = rounds_across_reloads("--http1.1", "1.1");
    assert_none_failed("--http1.1", &rounds);
}

/// An HTTP/2 connection whose preface and SETTINGS were exchanged before SIGHUP:
/// the reload sends GOAWAY with 2^31-1 and NO_ERROR and a PING; a request sent
/// after that GOAWAY, before the PING's ACK, is answered whole; the final GOAWAY
/// names its stream; then the connection closes.
#[test]
fn http2_connection_from_before_a_reload_serves_a_request_crossing_the_first_goaway() {
    let body = pattern(20_000, 3);
    let srv = Server::builder(BIN).bin_from_env().file("f.bin", &body).start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reload/h2_goaway.py");
    let mut child = Command::new("/usr/bin/python3")
        .arg(&script)
        .args([&srv.addr().ip().to_string(), &srv.port().to_string(), "/f.bin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = lines.next().expect("a line").expect("utf-8");
    assert_eq!(ready, "ready", "the client did not finish its handshake");
    let line = reload(&srv, 1);
    assert!(line.contains("reloaded configuration"), "{line}");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    let report = lines.next().expect("a report").expect("utf-8");
    assert!(child.wait().unwrap().success(), "{report}");
    let r: Value = serde_json::from_str(&report).unwrap_or_else(|e| panic!("{report:?}: {e}"));
    assert_eq!(r["goaways"][0], serde_json::json!([0x7fff_ffffu32, 0]), "{report}");
    assert!(r["ping"].is_string(), "a PING goes with the first GOAWAY: {report}");
    assert_eq!(r["status"], 200, "{report}");
    assert_eq!(r["sha256"], sha256(&body), "{report}");
    assert_eq!(r["goaways"][1], serde_json::json!([1, 0]), "the final GOAWAY names stream 1: {report}");
    assert_eq!(r["closed"], true, "{report}");
    srv.stop().assert_clean_exit();
}
