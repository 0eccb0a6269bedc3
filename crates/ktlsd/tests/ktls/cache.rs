//! The reverse proxy's cache on kTLS: a miss stores a multi-MiB entry from a
//! real upstream (the Python origin of the proxy tests), and the hit leaves by
//! `sendfile` from the entry file, encrypted by the kernel, over HTTP/1.1 and
//! HTTP/2. Proven three ways: tls_stat (every connection on kTLS), the access
//! log (`tls=ktls body=sendfile`), and `ktlsd_cache_hit_bytes_total{by="sendfile"}`
//! growing by the body's size; the bytes are checked by hash.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use testkit::{admin_get, assert_body, fetch};

use crate::harness::*;
use testkit::Origin;

/// The access log line: the request, status and body bytes first (as
/// [`logged`] reads them), then how the body left and where it was encrypted.
pub const LOG_FORMAT: &str = "\"$request\" $status $body_bytes_sent body=$body_path tls=$record_layer";

/// A kTLS server proxying `/api/**` to `origin` (with its cache in a directory of
/// its own when `cache`), one worker (the test kit's), logging [`LOG_FORMAT`], with
/// an admin socket.
pub struct Proxy {
    pub server: KtlsServer,
    pub sock: PathBuf,
    _dir: tempfile::TempDir,
}

impl Proxy {
    pub fn start(origin: &Origin, cache: bool) -> Proxy {
        Proxy::start_for(&origin.url(), cache)
    }

    /// [`Proxy::start`] in front of the upstream at `url`.
    pub fn start_for(url: &str, cache: bool) -> Proxy {
        let dir = tempfile::tempdir().expect("temp dir");
        let sock = dir.path().join("admin.sock");
        let cache_dir = dir.path().join("cache");
        let mut config = format!("[[proxy]]\npath = \"/api/**\"\nupstream = [{url:?}]\ncache = {cache}\n");
        if cache {
            config += &format!("\n[cache]\ndir = {:?}\nmax_size = \"256M\"\n", cache_dir.display().to_string());
        }
        let config_path = dir.path().join("ktlsd.toml");
        std::fs::write(&config_path, config).expect("write ktlsd.toml");
        let args = [
            "--config",
            &config_path.display().to_string(),
            "--admin",
            &sock.display().to_string(),
            "--access-log-format",
            "custom",
            "--access-log-custom",
            LOG_FORMAT,
        ]
        .map(str::to_string);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = KtlsServer::start(&[("index.txt", b"static".to_vec())], &args);
        Proxy { server, sock, _dir: dir }
    }

    /// `/metrics` as `name{labels}` to value, read as written (the emulated CPU of
    /// the VMs makes starting Python's parser for each scrape too slow).
    pub fn metrics(&self) -> HashMap<String, f64> {
        metrics_at(&self.sock)
    }

    /// `/metrics` once `key` has grown from `before` by at least `want` (a worker
    /// counts a response just after its last byte left), or after 10 s.
    pub fn metrics_once(&self, before: &HashMap<String, f64>, key: &str, want: f64) -> HashMap<String, f64> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let m = self.metrics();
            if sample(&m, key) - sample(before, key) >= want || Instant::now() > deadline {
                return m;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `/metrics` of the admin socket `sock` as `name{labels}` to value, read as written.
pub fn metrics_at(sock: &std::path::Path) -> HashMap<String, f64> {
    let (status, text) = admin_get(sock, "/metrics");
    assert_eq!(status, 200, "{text}");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

/// A metric's value, 0 when absent.
pub fn sample(m: &HashMap<String, f64>, key: &str) -> f64 {
    m.get(key).copied().unwrap_or(0.0)
}

/// The body the origin's `/api/set/NAME?n=N` sends on its first request for it.
fn first_answer(name_len: usize) -> Vec<u8> {
    let mut want = b"a 1 -".to_vec();
    want.resize(name_len, b'.');
    want
}

/// A miss stores a 4 MiB entry; the hit of it leaves by sendfile over kTLS.
fn hit_by_sendfile(test: &str, proto: &str) {
    const N: usize = 4 * MIB + 1000;
    let origin = Origin::start("a");
    let proxy = Proxy::start(&origin, true);
    let target = format!("/api/set/big?n={N}&h=Cache-Control%3Amax-age%3D600");
    let want = first_answer(N);

    let miss = fetch(&proxy.server.url(&target), &[proto]);
    assert_eq!(miss.status, 200, "{proto} miss");
    assert_eq!(miss.header("cache-status"), Some("ktlsd; fwd=miss"), "{proto} miss");
    assert_body(&format!("{proto} miss"), &miss.body, &want);

    let key = "ktlsd_cache_hit_bytes_total{by=\"sendfile\"}";
    let before = proxy.metrics();
    let hit = fetch(&proxy.server.url(&target), &[proto]);
    assert_eq!(hit.status, 200, "{proto} hit");
    assert_eq!(hit.header("cache-status"), Some("ktlsd; hit"), "{proto} hit");
    assert_body(&format!("{proto} hit"), &hit.body, &want);
    let m = proxy.metrics_once(&before, key, N as f64);
    let grew = sample(&m, key) - sample(&before, key);
    assert_eq!(grew, N as f64, "{proto}: cache-hit bytes by sendfile grew by {grew}, want the body's {N}");
    assert_eq!(sample(&m, "ktlsd_cache_hit_bytes_total{by=\"copy\"}"), 0.0, "{proto}: no hit byte by copy");
    assert_eq!(origin.count(&target), 1, "{proto}: one upstream request for a miss and a hit");

    let s = proxy.server.stop();
    let line = |word: &str| s.access_log.iter().filter(|l| l.contains(&target) && l.contains(word)).count();
    assert_eq!(line(&format!(" {N} body=sendfile tls=ktls")), 1, "{proto}: the hit's log line:\n{:#?}", s.access_log);
    assert_ktls(test, &s, &Expect::conns(2, 2));
}

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn cache_hit_by_sendfile_h1() {
    hit_by_sendfile("cache_hit_by_sendfile_h1", "--http1.1");
}

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn cache_hit_by_sendfile_h2() {
    hit_by_sendfile("cache_hit_by_sendfile_h2", "--http2");
}
