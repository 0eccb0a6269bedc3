//! The admin listener: plain HTTP/1.1 on a loopback address or a Unix socket,
//! serving `/metrics` (Prometheus text), `/status` and `/advisor` (JSON), one
//! request per connection. It runs on a thread of its own and only reads the
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
    const TEXT: &str = "text/plain; charset=utf-8";
    const JSON: &str = "application/json";
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
            let certificates = current.shared.certificates.expiry();
            crate::stats::sites::render(&mut out, &total.sites, &crate::stats::sites::RELOADS, &certificates);
            ("200 OK", "text/plain; version=0.0.4; charset=utf-8", out)
        }
        "/status" => ("200 OK", JSON, json(&status(&total, state, &current))),
        "/advisor" => {
            let policy = current.shared.config.record_policy.to_string();
            ("200 OK", JSON, json(&advisor::advise(&total.traffic, &policy)))
        }
        _ => ("404 Not Found", TEXT, "not found: try /metrics, /status or /advisor\n".into()),
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

    #[test]
    fn readable_status() {
        let v = serde_json::json!({"version": "1.0", "config": {"listen": ["a", "b"], "workers": 2}, "uptime_seconds": 1.5});
        assert_eq!(readable(&v), "config:\n  listen: a, b\n  workers: 2\nuptime_seconds: 1.5\nversion: 1.0\n");
    }
}
