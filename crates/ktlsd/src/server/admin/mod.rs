//! The admin listener: plain HTTP/1.1 on a loopback address or a Unix socket,
//! serving the status page (`/`, [`page`]) and its document (`/status.json`,
//! [`document`]), `/metrics` (Prometheus text), `/status` and `/advisor` (JSON),
//! `POST /cache/purge` (the response cache), the load balancer's `/healthz` with
//! `POST /drain` and `/undrain` ([`drain`]) and the admin actions
//! (`POST /upstreams/drain`, `/upstreams/enable`: [`actions`]), one request per
//! connection. It runs on a thread of its own, samples the status page's history
//! there once a second, and only reads the workers' counters (summed per request
//! and per sample), so it never touches the data path. Also the client side of
//! `ktlsd status`. Not a general HTTP server: no keep-alive, no TLS, no request
//! body; a request head over 8 KiB is refused (414 or 431).

mod actions;
mod document;
pub mod drain;
mod page;

use std::io::{Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::Current;
use crate::config::{AccessLogTarget, AdminAddr, KtlsMode};
use crate::handler::cache::{self, Cache};
use crate::handler::proxy::sliced;
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
    /// The status page's history, sampled once a second by the admin thread.
    pub history: Mutex<document::History>,
    /// Whether `/healthz` tells the load balancer to take this member out.
    pub drain: drain::Drain,
}

/// Serves `bound` on a thread of its own until `stop` turns true.
pub fn spawn(bound: Bound, state: State, stop: watch::Receiver<bool>) -> anyhow::Result<JoinHandle<()>> {
    crate::sys::event_loop_thread("ktlsd-admin", move || run(bound, Arc::new(state), stop))
        .map(|(thread, _)| thread)
        .context("cannot start the admin thread")
}

async fn run(bound: Bound, state: Arc<State>, stop: watch::Receiver<bool>) {
    tokio::spawn(sample(state.clone()));
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

/// Samples the history once a second, for as long as the admin thread runs.
async fn sample(state: Arc<State>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last = Instant::now();
    loop {
        tick.tick().await;
        let total = Metrics::sum(state.workers.iter().map(|m| &**m));
        let current = state.current.borrow().clone();
        let now = Instant::now();
        state.history.lock().unwrap_or_else(PoisonError::into_inner).sample(&total, &current, now - last);
        last = now;
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
    let (reply, head_only) = match Request::parse(&head) {
        Ok(req) => (route(&req, &state).await, req.method == "HEAD"),
        Err(reply) => (reply, false),
    };
    let mut out = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n",
        reply.status,
        reply.ctype,
        if head_only { 0 } else { reply.body.len() }
    );
    for (name, value) in &reply.headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    if !head_only {
        bytes.extend_from_slice(reply.body.as_bytes());
    }
    let _ = tokio::time::timeout(REQUEST_TIMEOUT, s.write_all(&bytes)).await;
    let _ = s.shutdown().await;
    // A lingering close: what the client still sends (the rest of a head too large
    // to read) is read and dropped for a moment, so that closing with it unread does
    // not reset the connection before the client has read the answer.
    let _ = tokio::time::timeout(LINGER, async {
        let (mut chunk, mut left) = ([0u8; 4096], LINGER_BYTES);
        while left > 0 {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// Longest a closing admin connection is read from, and how much of it.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 256 * 1024;

/// One admin request's head, parsed.
pub struct Request<'a> {
    pub method: &'a str,
    /// The request target: an absolute path and an optional query.
    pub target: &'a str,
    /// Header fields, names in lower case.
    fields: Vec<(String, &'a str)>,
}

impl<'a> Request<'a> {
    /// Parses a head read by [`answer`] (complete, or cut at [`MAX_HEAD`]); a head
    /// that is not a plain HTTP/1.x request gets its refusal.
    fn parse(head: &'a [u8]) -> Result<Request<'a>, Reply> {
        let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
            return Err(match head.contains(&b'\n') {
                false => Reply::text("414 URI Too Long", format!("the request line is over {MAX_HEAD} bytes\n")),
                true => Reply::text(
                    "431 Request Header Fields Too Large",
                    format!("the request head is over {MAX_HEAD} bytes\n"),
                ),
            });
        };
        let bad = |why: &str| Reply::text("400 Bad Request", format!("{why}\n"));
        let text = std::str::from_utf8(&head[..end]).map_err(|_| bad("the request head is not UTF-8"))?;
        let mut lines = text.split("\r\n");
        let line = lines.next().unwrap_or_default();
        let mut parts = line.split(' ');
        let (Some(method), Some(target), Some(version), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("expected METHOD TARGET HTTP/1.1"));
        };
        if !version.starts_with("HTTP/1.") || method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(bad("expected METHOD TARGET HTTP/1.1"));
        }
        if !target.starts_with('/') || !target.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad("the target must be an absolute path of visible ASCII characters"));
        }
        let mut fields = Vec::new();
        for l in lines {
            let Some((name, value)) = l.split_once(':') else { return Err(bad("a header line without a colon")) };
            fields.push((name.trim().to_ascii_lowercase(), value.trim()));
        }
        Ok(Request { method, target, fields })
    }

    /// The path of the target.
    pub fn path(&self) -> &'a str {
        self.target.split('?').next().unwrap_or_default()
    }

    /// The query of the target, if any.
    pub fn query(&self) -> Option<&'a str> {
        self.target.split_once('?').map(|(_, q)| q)
    }

    /// The first field named `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&'a str> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
}

/// An admin answer: status line, content type, body and any more fields.
pub struct Reply {
    status: &'static str,
    ctype: &'static str,
    body: std::borrow::Cow<'static, str>,
    headers: Vec<(&'static str, String)>,
}

impl Reply {
    fn new(status: &'static str, ctype: &'static str, body: impl Into<std::borrow::Cow<'static, str>>) -> Reply {
        Reply { status, ctype, body: body.into(), headers: Vec::new() }
    }

    /// A plain-text answer.
    fn text(status: &'static str, body: impl Into<std::borrow::Cow<'static, str>>) -> Reply {
        Reply::new(status, TEXT, body)
    }

    fn header(mut self, name: &'static str, value: String) -> Reply {
        self.headers.push((name, value));
        self
    }
}

/// The answer to one admin request.
async fn route(req: &Request<'_>, state: &State) -> Reply {
    let path = req.path();
    if let Some(action) = actions::Action::of(path) {
        return actions::act(req, state, action).await;
    }
    if let Some(endpoint) = drain::Endpoint::of(path) {
        return drain::answer(req, &state.drain, endpoint);
    }
    if path == "/cache/purge" {
        let current = state.current.borrow().clone();
        let (status, ctype, body) = purge(
            req.method,
            req.target,
            current.shared.cache.as_deref(),
            &current.shared.sites,
            &current.shared.config.content,
        );
        return Reply::new(status, ctype, body);
    }
    if req.method != "GET" && req.method != "HEAD" {
        return Reply::text("405 Method Not Allowed", "only GET and HEAD\n").header("Allow", "GET, HEAD".into());
    }
    if let Some(asset) = page::asset(path) {
        return page::reply(asset);
    }
    if path == "/status.json" {
        let since = match since(req.query()) {
            Ok(s) => s,
            Err(why) => return Reply::text("400 Bad Request", why),
        };
        let current = state.current.borrow().clone();
        let mut history = state.history.lock().unwrap_or_else(PoisonError::into_inner);
        let doc = document::document(state, &current, &mut history, since);
        drop(history);
        return Reply::new("200 OK", JSON, serde_json::to_string(&doc).unwrap_or_default());
    }
    let (status, ctype, body) = respond(path, state);
    Reply::new(status, ctype, body)
}

/// `/status.json`'s query: nothing, or `since=UNIX_SECONDS` (history samples after it).
fn since(query: Option<&str>) -> Result<u64, &'static str> {
    match query.filter(|q| !q.is_empty()) {
        None => Ok(0),
        Some(q) => q
            .strip_prefix("since=")
            .filter(|v| v.len() <= 20)
            .and_then(|v| v.parse().ok())
            .ok_or("/status.json takes no query but since=UNIX_SECONDS\n"),
    }
}

const JSON: &str = "application/json";

/// Status line, content type and body of the read-only endpoints.
fn respond(path: &str, state: &State) -> (&'static str, &'static str, String) {
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
            crate::handler::proxy::peers::render(&mut out);
            let certificates = current.shared.certificates.expiry();
            crate::stats::sites::render(&mut out, &total.sites, &crate::stats::sites::RELOADS, &certificates);
            ("200 OK", "text/plain; version=0.0.4; charset=utf-8", out)
        }
        "/status" => ("200 OK", JSON, json(&status(&total, state, &current))),
        "/advisor" => {
            let policy = current.shared.config.record_policy.to_string();
            ("200 OK", JSON, json(&advisor::advise(&total.traffic, &policy, current.shared.http3.is_some())))
        }
        _ => ("404 Not Found", TEXT, "not found: try /, /status.json, /metrics, /status or /advisor\n".into()),
    }
}

/// Plain-text answers of the admin endpoints.
const TEXT: &str = "text/plain; charset=utf-8";

/// `POST /cache/purge?url=TARGET[&host=NAME]`: removes every stored variant of
/// TARGET (path and query as clients send it, percent-encoded once more in the
/// query) of the default site (whose content is `default`), or of the `[[site]]`
/// that answers NAME; and, when the `[[proxy]]` rule that takes TARGET's path
/// has `cache_slice`, every stored slice of it. 200 when something was removed,
/// 404 when nothing was stored (or there is no `[cache]`), 400 without an
/// absolute `url`, 405 for another method.
fn purge(
    method: &str,
    target: &str,
    cache: Option<&Cache>,
    sites: &[NamedSite],
    default: &crate::handler::Content,
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
    let site = host.map(|h| names::host_of(&h)).and_then(|h| Some((names::find(sites, |s| &s.names, &h)?, h)));
    let key = cache::Key::new(site.as_ref().map_or("", |(_, h)| h.as_str()), &url);
    let content = site.map_or(default, |(s, _)| &s.content);
    let variants = cache.purge(&key);
    let slices = slice_size(content, &url).map(|n| sliced::purge(cache, &key, n));
    match (variants, slices) {
        (0, None | Some(0)) => ("404 Not Found", TEXT, format!("nothing stored for {url}\n")),
        (n, None) => ("200 OK", TEXT, format!("purged {url}: {n} stored variant(s) removed\n")),
        (n, Some(s)) => ("200 OK", TEXT, format!("purged {url}: {n} stored variant(s) and {s} slice(s) removed\n")),
    }
}

/// The `cache_slice` of the `[[proxy]]` rule of `content` that takes the path of
/// `url` (path and query), when it caches in slices.
fn slice_size(content: &crate::handler::Content, url: &str) -> Option<u64> {
    let path = crate::handler::pattern::route_path(url.split_once('?').map_or(url, |(p, _)| p));
    let rule = content.locations.find(path.as_deref()).proxy?;
    rule.control.cache_slice.filter(|_| rule.cache)
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

/// `ktlsd status`: fetches `/status` from the admin address `addr` and prints it
/// readably; with `json`, fetches `/status.json` and prints it as indented JSON.
pub fn print_status(addr: &str, json: bool) -> anyhow::Result<()> {
    let path = if json { "/status.json" } else { "/status" };
    let (addr, body) = request(addr, "GET", path)?;
    let v: serde_json::Value =
        serde_json::from_str(&body).with_context(|| format!("{addr} sent a {path} that is not JSON"))?;
    match json {
        true => println!("{}", serde_json::to_string_pretty(&v)?),
        false => print!("{}", readable(&v)),
    }
    Ok(())
}

/// `ktlsd drain`: `POST /drain` (or `/undrain` with `undo`) to the admin address
/// `addr`, and prints what the member is now doing.
pub fn drain(addr: &str, undo: bool) -> anyhow::Result<()> {
    let path = if undo { "/undrain" } else { "/drain" };
    let (_, body) = request(addr, "POST", path)?;
    print!("{body}");
    Ok(())
}

/// Sends one bodiless request to the admin address `addr` and gives back the
/// address parsed and the body of its 200 answer; any other answer is an error.
fn request(addr: &str, method: &str, path: &str) -> anyhow::Result<(AdminAddr, String)> {
    let addr = AdminAddr::parse(addr)?;
    let request = format!("{method} {path} HTTP/1.1\r\nHost: ktlsd\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    let request = request.as_bytes();
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
        return Err(anyhow!("{addr} answered {}: {}", head.lines().next().unwrap_or_default(), body.trim_end()));
    }
    let body = body.to_string();
    Ok((addr, body))
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
            let (got, _, text) = purge(method, target, Some(&cache), &sites, &Default::default());
            assert_eq!(got, status, "{method} {target}: {text}");
            assert!(text.contains(body), "{method} {target}: {text}");
        }
        assert_eq!(cache.figures().entries, 0);
        let (got, _, text) = purge("POST", "/cache/purge?url=/p", None, &sites, &Default::default());
        assert_eq!((got, text.contains("no [cache]")), ("404 Not Found", true));
    }

    #[test]
    fn readable_status() {
        let v = serde_json::json!({"version": "1.0", "config": {"listen": ["a", "b"], "workers": 2}, "uptime_seconds": 1.5});
        assert_eq!(readable(&v), "config:\n  listen: a, b\n  workers: 2\nuptime_seconds: 1.5\nversion: 1.0\n");
    }
}
