//! The admin listener: plain HTTP/1.1 on a loopback address or a Unix socket,
//! serving `/metrics` (Prometheus text), `/status` and `/advisor` (JSON), and
//! `POST /cache/purge` (the response cache), one request per connection. It runs on a thread of its own and only reads the
//! workers' counters (summed per request), so it never touches the data path.
//! Also the client side of `ktlsd status`. Not a general HTTP server: no
//! keep-alive, no TLS, no request body.

use std::io::{Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::Current;
use crate::config::{AccessLogTarget, AdminAddr, KtlsMode};
use crate::handler::cache::{self, Cache};
use crate::handler::sites::NamedSite;
use crate::names;
use crate::stats::{advisor, prometheus, Metrics, Stats};

/// Longest an admin request head may take to arrive.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The admin Unix socket's mode.
const SOCKET_MODE: u32 = 0o666;
/// Largest admin request head.
const MAX_HEAD: usize = 8 * 1024;

/// A bound admin socket, not yet serving.
pub enum Bound {
    Tcp(std::net::TcpListener),
    /// The path is removed when the listener stops.
    Unix(std::os::unix::net::UnixListener, PathBuf),
}

/// Binds the admin address. Done with the other listeners, before privileges
/// are dropped. A stale Unix socket left by an earlier run is replaced; any other
/// file at that path is an error.
pub fn bind(addr: &AdminAddr) -> anyhow::Result<Bound> {
    match addr {
        AdminAddr::Tcp(a) => {
            let l = std::net::TcpListener::bind(a).with_context(|| format!("cannot listen on admin address {a}"))?;
            l.set_nonblocking(true)?;
            Ok(Bound::Tcp(l))
        }
        AdminAddr::Unix(p) => {
            if let Ok(m) = std::fs::symlink_metadata(p) {
                if !m.file_type().is_socket() {
                    return Err(anyhow!(
                        "admin socket path {} exists and is not a socket; remove it or choose another path",
                        p.display()
                    ));
                }
                std::fs::remove_file(p)
                    .with_context(|| format!("cannot replace the stale admin socket {}", p.display()))?;
            }
            let l = std::os::unix::net::UnixListener::bind(p)
                .with_context(|| format!("cannot listen on admin socket {}", p.display()))?;
            // Connecting takes write permission on the socket: any local user may, as
            // any local user may reach a loopback admin address (its endpoints only
            // read). The directory's permissions say who gets that far.
            std::fs::set_permissions(
                p,
                <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(SOCKET_MODE),
            )
            .with_context(|| format!("cannot set the mode of admin socket {}", p.display()))?;
            l.set_nonblocking(true)?;
            Ok(Bound::Unix(l, p.clone()))
        }
    }
}

/// What the admin endpoints read.
pub struct State {
    pub workers: Vec<Arc<Metrics>>,
    pub started: Instant,
    pub current: watch::Receiver<Current>,
    /// The HTTPS and plain-HTTP addresses as bound (port 0 resolved).
    pub https: Vec<std::net::SocketAddr>,
    pub http: Vec<std::net::SocketAddr>,
}

/// Serves `bound` on a thread of its own until `stop` turns true.
pub fn spawn(bound: Bound, state: State, stop: watch::Receiver<bool>) -> anyhow::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("ktlsd-admin".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return tracing::error!("admin listener cannot start its event loop: {e}"),
            };
            rt.block_on(run(bound, Arc::new(state), stop));
        })
        .context("cannot start the admin thread")
}

async fn run(bound: Bound, state: Arc<State>, stop: watch::Receiver<bool>) {
    match bound {
        Bound::Tcp(l) => match tokio::net::TcpListener::from_std(l) {
            Ok(l) => serve(|| async { l.accept().await.map(|(s, _)| s) }, state, stop).await,
            Err(e) => tracing::error!("admin listener unusable: {e}"),
        },
        Bound::Unix(l, path) => {
            match tokio::net::UnixListener::from_std(l) {
                Ok(l) => serve(|| async { l.accept().await.map(|(s, _)| s) }, state, stop).await,
                Err(e) => tracing::error!("admin listener unusable: {e}"),
            }
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Answers each connection `accept` yields, in a task of its own, until `stop`;
/// a failed accept is logged and retried after a pause rather than in a spin.
async fn serve<S, F, A>(mut accept: F, state: Arc<State>, mut stop: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: FnMut() -> A,
    A: std::future::Future<Output = std::io::Result<S>>,
{
    loop {
        tokio::select! {
            r = accept() => match r {
                Ok(s) => { tokio::spawn(answer(s, state.clone())); }
                Err(e) => { tracing::warn!("admin accept failed: {e}"); tokio::time::sleep(Duration::from_millis(100)).await; }
            },
            _ = stop.wait_for(|s| *s) => break,
        }
    }
}

async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, state: Arc<State>) {
    let mut head = Vec::with_capacity(512);
    let read = tokio::time::timeout(REQUEST_TIMEOUT, async {
        let mut chunk = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => head.extend_from_slice(&chunk[..n]),
            }
        }
        true
    })
    .await;
    if read != Ok(true) {
        return;
    }
    let line = head.split(|&b| b == b'\r' || b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let (status, ctype, body) = respond(method, target, &state);
    let body = if method == "HEAD" { String::new() } else { body };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n{body}",
        if method == "HEAD" { 0 } else { body.len() }
    );
    let _ = tokio::time::timeout(REQUEST_TIMEOUT, s.write_all(reply.as_bytes())).await;
    let _ = s.shutdown().await;
}

/// Status line, content type and body for one admin request.
fn respond(method: &str, target: &str, state: &State) -> (&'static str, &'static str, String) {
    const JSON: &str = "application/json";
    if target.split('?').next() == Some("/cache/purge") {
        let current = state.current.borrow().clone();
        return purge(method, target, current.shared.cache.as_deref(), &current.shared.sites);
    }
    if method != "GET" && method != "HEAD" {
        return ("405 Method Not Allowed", TEXT, "only GET and HEAD\n".into());
    }
    let path = target.split('?').next().unwrap_or_default();
    let total = Metrics::sum(state.workers.iter().map(|m| &**m));
    let current = state.current.borrow().clone();
    match path {
        "/metrics" => {
            let mut out = String::with_capacity(8192);
            let stat = kernel_tls::TlsStat::read().ok();
            prometheus::render(&mut out, &total, state.started.elapsed(), stat.as_ref());
            prometheus::fd_budget(&mut out, open_fds(), Some(super::FdBudget::read().limit));
            if let Some(cache) = &current.shared.cache {
                prometheus::cache(&mut out, &cache.figures());
            }
            crate::handler::proxy::metrics::render(&mut out);
            let certificates = current.shared.certificates.expiry();
            crate::stats::sites::render(&mut out, &total.sites, &crate::stats::sites::RELOADS, &certificates);
            ("200 OK", "text/plain; version=0.0.4; charset=utf-8", out)
        }
        "/status" => ("200 OK", JSON, json(&status(&total, state, &current))),
        "/advisor" => {
            let policy = current.shared.config.record_policy.to_string();
            ("200 OK", JSON, json(&advisor::advise(&total.traffic, &policy, current.shared.http3.is_some())))
        }
        _ => ("404 Not Found", TEXT, "not found: try /metrics, /status or /advisor\n".into()),
    }
}

/// Plain-text answers of the admin endpoints.
const TEXT: &str = "text/plain; charset=utf-8";

/// `POST /cache/purge?url=TARGET[&host=NAME]`: removes every stored variant of
/// TARGET (path and query as clients send it, percent-encoded once more in the
/// query) of the default site, or of the `[[site]]` that answers NAME. 200 when
/// something was removed, 404 when nothing was stored (or there is no `[cache]`),
/// 400 without an absolute `url`, 405 for another method.
fn purge(
    method: &str,
    target: &str,
    cache: Option<&Cache>,
    sites: &[NamedSite],
) -> (&'static str, &'static str, String) {
    if method != "POST" {
        return ("405 Method Not Allowed", TEXT, "purge with POST /cache/purge?url=/path[&host=name]\n".into());
    }
    let (mut url, mut host) = (None, None);
    for pair in target.split_once('?').map_or("", |(_, q)| q).split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_encoding::percent_decode_str(&v.replace('+', " ")).decode_utf8_lossy().into_owned();
        match k {
            "url" => url = Some(v),
            "host" => host = Some(v),
            _ => {}
        }
    }
    let Some(url) = url.filter(|u| u.starts_with('/')) else {
        return ("400 Bad Request", TEXT, "give the path to purge: POST /cache/purge?url=/path[&host=name]\n".into());
    };
    let Some(cache) = cache else {
        return ("404 Not Found", TEXT, "no [cache] is configured: nothing to purge\n".into());
    };
    // The key's host is the `[[site]]`'s; any other name is the default site's (empty), as requests are keyed.
    let host = host.map(|h| names::host_of(&h)).filter(|h| names::find(sites, |s| &s.names, h).is_some());
    let key = cache::Key::new(host.as_deref().unwrap_or(""), &url);
    match cache.purge(&key) {
        0 => ("404 Not Found", TEXT, format!("nothing stored for {url}\n")),
        n => ("200 OK", TEXT, format!("purged {url}: {n} stored variant(s) removed\n")),
    }
}

/// Descriptors this process has open (entries of `/proc/self/fd`, less the one
/// reading it).
fn open_fds() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count().saturating_sub(1) as u64)
}

fn json<T: Serialize>(v: &T) -> String {
    // Plain numbers, strings and maps: serialising cannot fail.
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

/// The `/status` document.
#[derive(Serialize)]
struct Status {
    version: &'static str,
    pid: u32,
    uptime_seconds: f64,
    config: ConfigSummary,
    ktls: KtlsSummary,
    /// The counters, by name, summed over workers.
    counters: std::collections::BTreeMap<&'static str, u64>,
    connections_open: u64,
    requests: u64,
    body_bytes_sent: u64,
    /// Each ACME site's state, failures and last error.
    acme: std::collections::BTreeMap<String, crate::stats::sites::AcmeStatus>,
}

#[derive(Serialize)]
struct ConfigSummary {
    root: String,
    listen: Vec<String>,
    http_listen: Vec<String>,
    workers: usize,
    ktls: String,
    record_size: String,
    tls_versions: Vec<String>,
    access_log: String,
}

#[derive(Serialize)]
struct KtlsSummary {
    /// New connections may use the kernel's record layer.
    enabled: bool,
    /// What the kernel offers (or why it is not used).
    summary: String,
}

fn status(total: &Metrics, state: &State, current: &Current) -> Status {
    let c = &current.shared.config;
    let t = &total.traffic;
    let ktls = match &current.shared.ktls {
        Some(k) => KtlsSummary { enabled: true, summary: k.summary() },
        None if c.ktls == KtlsMode::Off => KtlsSummary { enabled: false, summary: "off (--ktls off)".into() },
        None => KtlsSummary { enabled: false, summary: "unavailable in this kernel (see `ktlsd doctor`)".into() },
    };
    Status {
        version: env!("CARGO_PKG_VERSION"),
        pid: std::process::id(),
        uptime_seconds: state.started.elapsed().as_secs_f64(),
        config: ConfigSummary {
            root: c.root.display().to_string(),
            listen: state.https.iter().map(|a| a.to_string()).collect(),
            http_listen: state.http.iter().map(|a| a.to_string()).collect(),
            workers: c.workers,
            ktls: format!("{:?}", c.ktls).to_lowercase(),
            record_size: c.record_policy.to_string(),
            tls_versions: c.tls_versions.iter().map(|v| format!("{v:?}")).collect(),
            access_log: match &c.access_log {
                AccessLogTarget::Off => "off".into(),
                AccessLogTarget::Stdout => "-".into(),
                AccessLogTarget::File(p) => p.display().to_string(),
            },
        },
        ktls,
        counters: total.stats.fields().into_iter().collect(),
        connections_open: t.open.iter().flatten().map(Stats::get).sum(),
        requests: t.requests.iter().flatten().map(Stats::get).sum(),
        body_bytes_sent: t.body_bytes.iter().map(Stats::get).sum(),
        acme: crate::stats::sites::acme_snapshot(),
    }
}

/// `ktlsd status`: fetches `/status` from the admin address `addr` and prints it readably.
pub fn print_status(addr: &str) -> anyhow::Result<()> {
    let addr = AdminAddr::parse(addr)?;
    let request = b"GET /status HTTP/1.1\r\nHost: ktlsd\r\nConnection: close\r\n\r\n";
    let mut reply = Vec::new();
    let hint = "is ktlsd running with --admin at that address?";
    match &addr {
        AdminAddr::Tcp(a) => {
            let mut s = std::net::TcpStream::connect_timeout(a, REQUEST_TIMEOUT)
                .with_context(|| format!("cannot connect to the admin listener at {a} ({hint})"))?;
            s.set_read_timeout(Some(REQUEST_TIMEOUT))?;
            s.write_all(request)?;
            s.read_to_end(&mut reply).with_context(|| format!("reading from {a}"))?;
        }
        AdminAddr::Unix(p) => {
            let mut s = std::os::unix::net::UnixStream::connect(p)
                .with_context(|| format!("cannot connect to the admin socket {} ({hint})", p.display()))?;
            s.set_read_timeout(Some(REQUEST_TIMEOUT))?;
            s.write_all(request)?;
            s.read_to_end(&mut reply).with_context(|| format!("reading from {}", p.display()))?;
        }
    }
    let text = String::from_utf8_lossy(&reply);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| anyhow!("{addr} sent no complete HTTP response"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(anyhow!("{addr} answered {}", head.lines().next().unwrap_or_default()));
    }
    let v: serde_json::Value =
        serde_json::from_str(body).with_context(|| format!("{addr} sent a /status that is not JSON"))?;
    print!("{}", readable(&v));
    Ok(())
}

/// `/status` as indented `key: value` lines.
fn readable(v: &serde_json::Value) -> String {
    fn walk(out: &mut String, v: &serde_json::Value, indent: usize) {
        if let serde_json::Value::Object(map) = v {
            for (k, v) in map {
                match v {
                    serde_json::Value::Object(_) => {
                        out.push_str(&format!("{:indent$}{k}:\n", ""));
                        walk(out, v, indent + 2);
                    }
                    serde_json::Value::Array(a) => {
                        let items: Vec<String> =
                            a.iter().map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_string)).collect();
                        out.push_str(&format!("{:indent$}{k}: {}\n", "", items.join(", ")));
                    }
                    serde_json::Value::String(s) => out.push_str(&format!("{:indent$}{k}: {s}\n", "")),
                    other => out.push_str(&format!("{:indent$}{k}: {other}\n", "")),
                }
            }
        }
    }
    let mut out = String::new();
    walk(&mut out, v, 0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stores `body` for `key` through the cache's own API, as the proxy does.
    fn plant(cache: &std::sync::Arc<Cache>, key: &cache::Key, vary: &[(&'static str, &'static str)], body: &[u8]) {
        let mut req = http::HeaderMap::new();
        for (n, v) in vary {
            req.insert(*n, http::HeaderValue::from_static(v));
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let cache::Lookup::Miss(fill) = rt.block_on(cache.lookup(key, &req)) else { panic!("a new key is a miss") };
        let mut parts = http::Response::builder().status(200).body(()).unwrap().into_parts().0;
        parts.headers.insert("cache-control", http::HeaderValue::from_static("max-age=600"));
        parts.headers.insert("vary", http::HeaderValue::from_static("accept-encoding"));
        let mut w = fill.admit(&parts, std::time::SystemTime::now()).unwrap();
        w.write(body).unwrap();
        w.commit().unwrap();
    }

    #[test]
    fn purge_removes_every_variant_of_a_key() {
        let dir = tempfile::tempdir().unwrap();
        let config = cache::Settings {
            dir: dir.path().join("cache"),
            max_size: 64 << 20,
            max_object_size: 1 << 20,
            ..Default::default()
        };
        let cache = Cache::open(&config).unwrap();
        let site = NamedSite {
            names: names::Names::parse(&["a.example".to_string()]).unwrap(),
            root: crate::files::Root::new(dir.path()).unwrap(),
            files: crate::files::Options { dotfiles: false, autoindex: false, cache_entries: 0 },
            hsts: None,
            content: crate::handler::Content::default(),
            client_auth: false,
        };
        let sites = [site];
        plant(&cache, &cache::Key::new("", "/p?x=1"), &[("accept-encoding", "gzip")], b"gz");
        plant(&cache, &cache::Key::new("", "/p?x=1"), &[("accept-encoding", "br")], b"br");
        plant(&cache, &cache::Key::new("a.example", "/p?x=1"), &[], b"site");
        assert_eq!(cache.figures().entries, 3);
        for (method, target, status, body) in [
            ("GET", "/cache/purge?url=/p", "405 Method Not Allowed", "POST"),
            ("POST", "/cache/purge", "400 Bad Request", "url=/path"),
            ("POST", "/cache/purge?url=p", "400 Bad Request", "url=/path"),
            ("POST", "/cache/purge?url=/p", "404 Not Found", "nothing stored for /p"),
            ("POST", "/cache/purge?url=%2Fp%3Fx%3D1", "200 OK", "2 stored variant(s) removed"),
            ("POST", "/cache/purge?url=%2Fp%3Fx%3D1", "404 Not Found", "nothing stored"),
            ("POST", "/cache/purge?url=%2Fp%3Fx%3D1&host=other.example", "404 Not Found", "nothing stored"),
            ("POST", "/cache/purge?host=A.example.:443&url=%2Fp%3Fx%3D1", "200 OK", "1 stored variant(s) removed"),
        ] {
            let (got, _, text) = purge(method, target, Some(&cache), &sites);
            assert_eq!(got, status, "{method} {target}: {text}");
            assert!(text.contains(body), "{method} {target}: {text}");
        }
        assert_eq!(cache.figures().entries, 0);
        let (got, _, text) = purge("POST", "/cache/purge?url=/p", None, &sites);
        assert_eq!((got, text.contains("no [cache]")), ("404 Not Found", true));
    }

    #[test]
    fn readable_status() {
        let v = serde_json::json!({"version": "1.0", "config": {"listen": ["a", "b"], "workers": 2}, "uptime_seconds": 1.5});
        assert_eq!(readable(&v), "config:\n  listen: a, b\n  workers: 2\nuptime_seconds: 1.5\nversion: 1.0\n");
    }
}
