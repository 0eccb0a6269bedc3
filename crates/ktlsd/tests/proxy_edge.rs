//! The reverse proxy at its edges, end to end with the real binary in front of the
//! Python origin (`crates/testkit/src/origin.py`, which logs every request it reads):
//! HTTP/2 streams waiting for an upstream do not hold back the connection's other
//! streams, and a reset frees them (a Python h2 client, `tests/proxy/h2_streams.py`);
//! `[[access]]` refuses a proxied path before anything reaches the origin;
//! hostile upstreams with `cache = true` get a clean 502/504 or a cut response, a
//! log line naming what went wrong, and nothing stored; bodies of unknown
//! length reach the client as they come; and a connect that fails for want of
//! descriptors here (under `prlimit --nofile`) is 503 and leaves the upstream's
//! health alone.

use std::path::Path;
use std::time::{Duration, Instant};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const PROTOCOLS: [&str; 2] = ["--http1.1", "--http2"];

/// ktlsd (one worker) forwarding `/api/**` to `origin` with `extra` in the rule,
/// and `more` after it (top-level tables).
fn server(origin: &Origin, extra: &str, more: &str) -> Server {
    let config = format!("[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\n{extra}\n\n{more}\n", origin.url());
    origin::ktlsd(BIN, &config, &[])
}

/// A `[cache]` table: entries under `dir`, at most `max_size` in all.
fn cache_table(dir: &Path, max_size: &str) -> String {
    format!("[cache]\ndir = {:?}\nmax_size = {max_size:?}\n", dir.display().to_string())
}

/// One finished stream of `h2_streams.py`: its id, status (or `reset`), seconds since the start, body bytes.
#[derive(Debug)]
struct Done {
    stream: u32,
    status: String,
    secs: f64,
    bytes: usize,
}

/// Runs `h2_streams.py` against `srv`: the slow path on stream 1, `n` quick ones,
/// then `args`; the streams in the order they finished.
fn h2_streams(srv: &Server, slow: &str, quick: &str, n: usize, args: &[&str]) -> Vec<Done> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/proxy/h2_streams.py");
    let out = std::process::Command::new("/usr/bin/python3")
        .arg(script)
        .args([srv.addr().ip().to_string(), srv.port().to_string(), slow.into(), quick.into(), n.to_string()])
        .args(args)
        .output()
        .expect("/usr/bin/python3 runs h2_streams.py (python3-h2)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "h2_streams.py failed:\n{text}\n{err}\n{}", srv.stderr());
    text.lines()
        .filter(|l| !l.starts_with("reset "))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let reset = f[1] == "reset";
            let secs = if reset { f[3] } else { f[2] };
            Done {
                stream: f[0].parse().unwrap(),
                status: if reset { format!("reset {}", f[2]) } else { f[1].into() },
                secs: secs.parse().unwrap(),
                bytes: f.get(3).filter(|_| !reset).map_or(0, |b| b.parse().unwrap()),
            }
        })
        .collect()
}

#[test]
fn a_stream_waiting_for_its_upstream_holds_back_no_other_stream() {
    let origin = Origin::start("a");
    let srv = server(&origin, "", "");
    for quick in ["/index.txt", "/api/name"] {
        let slow = format!("/api/hold?s=2&q={}", quick.len());
        let done = h2_streams(&srv, &slow, quick, 20, &[]);
        assert_eq!(done.len(), 21, "{done:?}");
        let (last, quick_ones) = done.split_last().unwrap();
        assert_eq!(
            (last.stream, last.status.as_str(), last.bytes),
            (1, "200", 4),
            "the slow stream ends last: {done:?}"
        );
        assert!(last.secs >= 1.9, "{done:?}");
        for d in quick_ones {
            assert_eq!(d.status, "200", "{quick}: {done:?}");
            // Well under the origin's 2 s, on a loaded machine too.
            assert!(d.secs < 1.0, "{quick} waited for the slow stream: {done:?}");
        }
        assert!(origin.requests().contains(&format!("! answered {slow}")), "{:?}", origin.requests());
    }
    assert_eq!(origin.count("/api/name"), 20);
}

#[test]
fn a_reset_stream_stops_its_exchange_and_the_connection_goes_on() {
    let origin = Origin::start("a");
    let srv = server(&origin, "", "");
    let slow = "/api/hold?s=3";
    let done = h2_streams(&srv, slow, "/index.txt", 5, &["--reset", "--after", "/api/name", "/index.txt"]);
    assert_eq!(done.len(), 7, "{done:?}");
    assert!(done.iter().all(|d| d.stream != 1), "stream 1 was reset by the client: {done:?}");
    let after: Vec<(&str, usize)> = done[5..].iter().map(|d| (d.status.as_str(), d.bytes)).collect();
    assert!(after.contains(&("200", 1)) && after.contains(&("200", 11)), "{done:?}");
    // The origin sees its client go away long before its 3 s are up.
    let start = Instant::now();
    let closed = format!("! closed {slow}");
    while !origin.requests().contains(&closed) && start.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(origin.requests().contains(&closed), "{:?}", origin.requests());
}

#[test]
fn an_upstream_failing_mid_body_resets_only_its_stream() {
    let origin = Origin::start("a");
    let srv = server(&origin, "read_timeout = \"1s\"", "");
    // The head and 5 bytes of 10, then the origin stalls past read_timeout.
    let done = h2_streams(&srv, "/api/slow-body", "/index.txt", 5, &["--after", "/api/name"]);
    assert_eq!(done.len(), 7, "{done:?}");
    let slow: Vec<&Done> = done.iter().filter(|d| d.stream == 1).collect();
    // RST_STREAM INTERNAL_ERROR (2), never an END_STREAM after 5 bytes.
    assert_eq!(slow.len(), 1, "{done:?}");
    assert_eq!(slow[0].status, "reset 2", "{done:?}");
    let others: Vec<(&str, usize)> =
        done.iter().filter(|d| d.stream != 1).map(|d| (d.status.as_str(), d.bytes)).collect();
    assert_eq!(others.iter().filter(|o| **o == ("200", 11)).count(), 5, "{done:?}");
    assert!(others.contains(&("200", 1)), "the connection goes on: {done:?}");
    assert!(srv.stderr().contains("response cut after 5 body bytes"), "{}", srv.stderr());
}

#[test]
fn access_rules_refuse_a_proxied_path_before_the_upstream() {
    let origin = Origin::start("a");
    let rules = "[[access]]\npath = \"/api/**\"\ndeny = [\"127.0.0.9\"]\n";
    let srv = server(&origin, "", rules);
    for proto in PROTOCOLS {
        let denied = ["--interface", "127.0.0.9"];
        let r = fetch(&srv.url("/api/name"), &[proto, denied[0], denied[1]]);
        assert_eq!(r.status, 403, "{proto}");
        let post = [proto, denied[0], denied[1], "--data-binary", "body"];
        assert_eq!(fetch(&srv.url("/api/echo"), &post).status, 403, "{proto}");
        assert_eq!(origin.requests(), Vec::<String>::new(), "{proto}: a denied request reached the origin");
    }
    for proto in PROTOCOLS {
        let r = fetch(&srv.url("/api/name"), &[proto]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "a"), "{proto}");
    }
    assert_eq!(origin.count("/api/name"), 2);
}

/// How a client sees a hostile upstream's answer.
#[derive(Debug, Clone, Copy)]
enum Seen {
    /// A clean error answer with this status.
    Status(u16),
    /// The head went out, then the response was cut (curl reports it incomplete;
    /// over HTTP/2 the stream's reset, INTERNAL_ERROR, may reach curl with the head).
    Cut,
    /// This status when the fault is in the bytes that came with the upstream's
    /// head (nothing was sent yet), else a cut.
    StatusOrCut(u16),
}

/// Every file under `dir`.
fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn hostile_upstreams_with_the_cache_on_store_nothing() {
    use Seen::*;
    let origin = Origin::start("a");
    let cache = tempfile::tempdir().unwrap();
    let tables = cache_table(cache.path(), "64M");
    let srv = server(&origin, "cache = true\nread_timeout = \"1s\"\nfail_timeout = \"1ms\"", &tables);
    // (path, what the log says, HTTP/1.1, HTTP/2): every body streams, stored or
    // not, so a fault after the head cuts the response on both protocols; a small
    // body being stored is awaited whole (within 200 ms) before its head, so a fault
    // in it is a clean 502.
    let cases = [
        ("/api/garbage", "invalid response", Status(502), Status(502)),
        ("/api/endless", "invalid response", Status(502), Status(502)),
        ("/api/huge-head", "invalid response", Status(502), Status(502)),
        ("/api/slow-head", "waiting for the response head: timed out", Status(504), Status(504)),
        // Content-Length longer than the body, then the upstream closes: early close mid-body.
        ("/api/short", "closed the connection before the end of the body", StatusOrCut(502), StatusOrCut(502)),
        // Content-Length longer than the body, and the upstream stalls past read_timeout.
        ("/api/slow-body", "reading the response body: timed out", Cut, Cut),
        // Content-Length shorter than the body.
        ("/api/long", "sent more than its Content-Length", StatusOrCut(502), StatusOrCut(502)),
        ("/api/cut-chunked", "closed the connection before the end of the body", Cut, Cut),
        ("/api/bad-chunk", "invalid chunked body", StatusOrCut(502), StatusOrCut(502)),
    ];
    for (path, why, h1, h2) in cases {
        for (proto, seen) in [("--http1.1", h1), ("--http2", h2)] {
            let target = format!("{path}?cc=1&p={proto}");
            for round in 1..=2 {
                let url = srv.url(&target);
                let out = curl(&["-sS", "-D", "-", "-o", "/dev/null", proto, &url]);
                let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
                let seen = match seen {
                    StatusOrCut(status) if out.status.success() => Status(status),
                    StatusOrCut(_) => Cut,
                    seen => seen,
                };
                match seen {
                    Status(status) => {
                        assert!(out.status.success(), "{target} round {round}: {}", srv.stderr());
                        let (_, got, fields) = parse_head(head.trim_end());
                        assert_eq!(got, status, "{target} round {round}: {}", srv.stderr());
                        let cs = fields.iter().find(|(n, _)| n == "cache-status").map(|(_, v)| v.as_str());
                        assert!(
                            cs.is_some_and(|v| v.starts_with("ktlsd; fwd=miss; detail=")),
                            "{target} round {round}: {cs:?}"
                        );
                    }
                    Cut | StatusOrCut(_) => {
                        assert!(!out.status.success(), "{target} round {round} looked complete: {head}");
                        let err = String::from_utf8_lossy(&out.stderr);
                        assert!(
                            head.contains("cache-status: ktlsd; fwd=miss") || err.contains("INTERNAL_ERROR"),
                            "{target} round {round}: {head}\n{err}"
                        );
                    }
                }
            }
            // Both rounds reached the origin: nothing was stored by the first.
            assert_eq!(origin.count(&target), 2, "{target}");
        }
        assert!(srv.stderr().contains(why), "{path}: no log line saying {why:?}:\n{}", srv.stderr());
    }
    // No entry and no temporary file left behind.
    assert_eq!(files(cache.path()), Vec::<std::path::PathBuf>::new());
    // The cache still stores what is whole.
    for proto in PROTOCOLS {
        let target = format!("/api/big?n=5000&cc=1&p={proto}");
        let first = fetch(&srv.url(&target), &[proto]);
        assert_eq!(first.header("cache-status"), Some("ktlsd; fwd=miss; stored"), "{proto}");
        let second = fetch(&srv.url(&target), &[proto]);
        assert_eq!((second.header("cache-status"), second.body.len()), (Some("ktlsd; hit"), 5000), "{proto}");
    }
}

/// A body of unknown length reaches the client as it comes, over HTTP/2 as over
/// HTTP/1.1: each line of a chunked event stream arrives before the upstream sends
/// the next, and the response ends where the upstream's body does. With
/// `cache = true`, a cacheable chunked body of 9 MB (more than an HTTP/2 stream
/// would hold whole) is streamed and stored: the next request is a hit with the
/// same bytes.
#[test]
fn bodies_of_unknown_length_stream_as_they_come() {
    use std::io::BufRead;
    let origin = Origin::start("a");
    let cache = tempfile::tempdir().unwrap();
    let tables = cache_table(cache.path(), "256M");
    let srv = server(&origin, "cache = true", &tables);
    for proto in PROTOCOLS {
        let url = srv.url(&format!("/api/events?n=3&gap=1.5&p={proto}"));
        let start = Instant::now();
        let mut child = std::process::Command::new("curl")
            .args(["-sS", "-k", "-N", "--max-time", "30", proto, &url])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("curl runs");
        let out = child.stdout.take().expect("curl's stdout");
        let lines: Vec<(String, Duration)> =
            std::io::BufReader::new(out).lines().map_while(Result::ok).map(|l| (l, start.elapsed())).collect();
        assert!(child.wait().expect("curl ends").success(), "{proto}: {lines:?}\n{}", srv.stderr());
        let names: Vec<&str> = lines.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(names, ["event 0", "event 1", "event 2"], "{proto}");
        // The upstream sends the first line at once and the last after 3 s.
        assert!(lines[0].1 < Duration::from_millis(1200), "{proto}: the first line took {:?}", lines[0].1);
        assert!(lines[2].1 >= Duration::from_millis(2900), "{proto}: {lines:?}");
    }
    let n = 9_000_003;
    let want: Vec<u8> = (0..n).map(|i| (i % 10000 % 251) as u8).collect();
    let target = format!("/api/chunked?n={n}&cc=1");
    let first = fetch(&srv.url(&target), &["--http2"]);
    // Larger than a piece: its head leaves before the body is stored, and cannot say so.
    assert_eq!(first.header("cache-status"), Some("ktlsd; fwd=miss"));
    assert_body("a chunked 9 MB body over HTTP/2", &first.body, &want);
    let second = fetch(&srv.url(&target), &["--http2"]);
    assert_eq!(second.header("cache-status"), Some("ktlsd; hit"));
    assert_body("the same body from the cache", &second.body, &want);
    assert_eq!(origin.count(&target), 1);
}

/// Growth of resident memory allowed while one HTTP/2 connection holds 128 proxied
/// 8 MiB bodies being stored: a stream keeps at most about two 64 KiB pieces, so
/// 128 of them about 16 MiB; a body held whole would be 1 GiB.
const HELD_STREAMS_RSS_BOUND_KIB: u64 = 96 * 1024;

/// Over HTTP/2, a proxied body being stored is streamed like any other: the heads of
/// 127 streams for distinct cacheable 8 MiB objects arrive though the client reads no
/// body, the server's memory stays bounded, and the head of a body whose upstream
/// stalls after its first bytes arrives at once (time to first byte is the upstream's,
/// not the whole body's).
#[test]
fn http2_streams_of_stored_bodies_hold_bounded_memory_and_answer_at_once() {
    let origin = Origin::start("a");
    let cache = tempfile::tempdir().unwrap();
    let tables = cache_table(cache.path(), "4G");
    let srv = server(&origin, "cache = true\nread_timeout = \"10s\"", &tables);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/proxy/h2_hold.py");
    // 127 and the slow one: the 128 streams a connection may have open at once.
    let mut paths: Vec<String> = (0..127).map(|i| format!("/api/big?n={}&cc=1&i={i}", 8 << 20)).collect();
    paths.push("/api/slow-body?cc=1".into());
    let before = rss_kib(srv.pid());
    let child = std::process::Command::new("/usr/bin/python3")
        .arg(script)
        .args([srv.addr().ip().to_string(), srv.port().to_string(), "6".into()])
        .args(&paths)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("/usr/bin/python3 runs h2_hold.py (python3-h2)");
    std::thread::sleep(Duration::from_secs(4));
    let during = rss_kib(srv.pid());
    let out = child.wait_with_output().expect("h2_hold.py ends");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "h2_hold.py failed: {text}\n{}", srv.stderr());
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let heads = v["heads"].as_array().expect("heads");
    let ok = heads.iter().filter(|h| h[1] == 200 && h[0].as_str().is_some_and(|p| p.starts_with("/api/big"))).count();
    assert_eq!(ok, 127, "every stream's head arrived without its body being read: {v}");
    let slow = heads.iter().find(|h| h[0] == "/api/slow-body?cc=1").unwrap_or_else(|| panic!("no slow head: {v}"));
    assert_eq!(slow[1], 200, "{v}");
    assert!(slow[2].as_f64().is_some_and(|s| s < 2.0), "the slow body's head waited for its body: {v}");
    let grown = during.saturating_sub(before);
    assert!(grown < HELD_STREAMS_RSS_BOUND_KIB, "RSS grew by {grown} KiB (from {before} KiB)");
}
