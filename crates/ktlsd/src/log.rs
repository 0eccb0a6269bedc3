//! Logging: diagnostics through `tracing` on standard error, and the access log,
//! one line per request in one of three [`LogFormat`]s; the default is common log
//! format plus request time and TLS mode:
//!
//! `127.0.0.1 - - [22/Nov/2026:10:00:00 +0000] "GET /a.txt HTTP/1.1" 200 1234 rt=0.001 tls=ktls`
//!
//! Each worker buffers its own lines and writes them in whole-line batches (when the
//! buffer fills, on a short timer, and at exit), so logging costs no syscall per request.
//! Every entry also counts the request in the worker's metrics when it has them
//! (logging off or on), so the HTTP loops report each request in one place.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::stats::Metrics;
use crate::vocab::{BodyPath, Method, RecordLayer};

pub mod vars;

pub use vars::{Notes, Template};

/// The access log's line format (`access_log_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Common log format plus `rt=` and `tls=` (the example above).
    #[default]
    Ktlsd,
    /// nginx's `combined`: common log format plus quoted Referer and User-Agent.
    Combined,
    /// One JSON object per line with every field.
    Json,
    /// The line template of `access_log_custom`, with nginx-style variables.
    Custom,
}

/// The negotiated TLS version and cipher suite (IANA names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsInfo {
    pub version: &'static str,
    pub cipher: &'static str,
}

/// One request, as logged.
pub struct AccessEntry<'a> {
    pub peer: SocketAddr,
    /// `None` when no request head could be read (logged as `-`).
    pub request: Option<RequestLine<'a>>,
    pub status: u16,
    /// Body bytes sent.
    pub bytes: u64,
    pub started: Instant,
    /// From `started` to the moment the response began to be sent.
    pub ttfb: Duration,
    /// Where the bytes were protected (logged as `ktls`, `userspace`).
    pub layer: RecordLayer,
    /// How the body left (logged as `sendfile`, `copy`, `splice`); `None` without one.
    pub body: Option<BodyPath>,
    pub referer: Option<&'a str>,
    pub user_agent: Option<&'a str>,
    pub tls: Option<TlsInfo>,
    /// The subject of the client's verified certificate (mTLS), as RFC 4514 writes it.
    pub client_subject: Option<&'a str>,
    /// The Host (HTTP/1.1) or :authority (HTTP/2) as received.
    pub host: Option<&'a str>,
    /// The site that answered: its first configured name, `default` or `unknown`.
    pub site: &'a str,
    /// What the handler noted of the request (request id, user, upstreams); `None`
    /// when no request was read.
    pub notes: Option<&'a Notes>,
}

/// The HTTP version an entry's request came over: QUIC carries HTTP/3 only; the
/// request line says HTTP/2 (`HTTP/2.0`); anything else is HTTP/1.x.
fn protocol_of(e: &AccessEntry<'_>) -> crate::vocab::HttpVersion {
    use crate::vocab::HttpVersion;
    match (e.layer, e.request.map(|r| r.version)) {
        (RecordLayer::Quic, _) => HttpVersion::Http3,
        (_, Some(v)) if v.starts_with("HTTP/2") => HttpVersion::Http2,
        (_, Some(v)) if v.starts_with("HTTP/3") => HttpVersion::Http3,
        _ => HttpVersion::Http1,
    }
}

/// What a request asked, as received.
#[derive(Debug, Clone, Copy)]
pub struct RequestLine<'a> {
    pub method: &'a Method,
    pub target: &'a str,
    /// `HTTP/1.1`, `HTTP/1.0`.
    pub version: &'a str,
}

/// The quoted request field of a log line: `GET /a HTTP/1.1` with anything
/// unprintable escaped, or `-`.
struct Quoted<'a>(Option<RequestLine<'a>>);

impl std::fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            None => f.write_str("-"),
            Some(r) => write!(f, "{} {} {}", Escaped(r.method.as_str()), Escaped(r.target), Escaped(r.version)),
        }
    }
}

/// A field with anything unprintable, `'`, `"` and `\\` escaped (Rust's
/// `escape_default`). Most fields need none: those are written whole rather
/// than char by char.
struct Escaped<'a>(&'a str);

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plain = |b: u8| (0x20..0x7f).contains(&b) && !matches!(b, b'"' | b'\\' | b'\'');
        if self.0.bytes().all(plain) {
            f.write_str(self.0)
        } else {
            write!(f, "{}", self.0.escape_default())
        }
    }
}

/// Lets through at most `limit` events per one-second window and counts the rest,
/// to be reported in one line when the window is over.
pub struct RateLimit {
    limit: u32,
    window: Cell<Instant>,
    passed: Cell<u32>,
    suppressed: Cell<u64>,
}

impl RateLimit {
    pub const WINDOW: Duration = Duration::from_secs(1);

    pub fn new(limit: u32) -> RateLimit {
        RateLimit { limit, window: Cell::new(Instant::now()), passed: Cell::new(0), suppressed: Cell::new(0) }
    }

    /// Whether an event at `now` may be logged. Returns, too, how many events the
    /// window that just ended suppressed (to be reported first).
    pub fn check(&self, now: Instant) -> (bool, u64) {
        let ended = self.roll(now);
        if self.passed.get() < self.limit {
            self.passed.set(self.passed.get() + 1);
            (true, ended)
        } else {
            self.suppressed.set(self.suppressed.get() + 1);
            (false, ended)
        }
    }

    /// Starts a new window when the current one is over; returns how many events
    /// the ended window suppressed.
    pub fn roll(&self, now: Instant) -> u64 {
        if now.saturating_duration_since(self.window.get()) < Self::WINDOW {
            return 0;
        }
        self.window.set(now);
        self.passed.set(0);
        self.suppressed.replace(0)
    }
}

/// At most one line per period for one kind of diagnostic, shared by every
/// thread: a fault that repeats (a full disk, a corrupt file met on every hit)
/// must not flood the log. The events in between are counted, and the next line
/// says how many there were.
pub struct Throttle {
    every_ms: u64,
    /// When the next line may be written, in milliseconds since [`Throttle`]'s clock started.
    next_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl Throttle {
    pub const fn new(every: Duration) -> Throttle {
        Throttle { every_ms: every.as_millis() as u64, next_ms: AtomicU64::new(0), suppressed: AtomicU64::new(0) }
    }

    /// `Some(n)` when a line may be written now, `n` being how many events were
    /// suppressed since the last one; `None` when this one is suppressed (and counted).
    pub fn check(&self) -> Option<u64> {
        static START: OnceLock<Instant> = OnceLock::new();
        let now = START.get_or_init(Instant::now).elapsed().as_millis() as u64;
        let next = self.next_ms.load(Relaxed);
        if now >= next && self.next_ms.compare_exchange(next, now + self.every_ms, Relaxed, Relaxed).is_ok() {
            return Some(self.suppressed.swap(0, Relaxed));
        }
        self.suppressed.fetch_add(1, Relaxed);
        None
    }
}

/// `" (and N more like it since the last)"` after a throttled line, or nothing.
pub fn more(suppressed: u64) -> String {
    match suppressed {
        0 => String::new(),
        n => format!(" ({n} more like it since the last such line)"),
    }
}

/// Most lines a thread writes per second for one kind of refused request
/// (the status and reason); the rest are counted and reported in one line.
pub const REFUSAL_LINES: u32 = 5;

/// Kinds of refusal a thread keeps a count for; past this, the table starts afresh.
const REFUSAL_KINDS: usize = 64;

thread_local! {
    static REFUSALS: RefCell<std::collections::HashMap<(u16, String), RateLimit>> = RefCell::default();
}

/// Logs one refused request at info, at most [`REFUSAL_LINES`] a second per
/// thread for each status and reason (a client sending bad requests in a loop
/// must not flood the log); at debug level every one. The access log and the
/// counters have them all. `line` is called only when the line is written.
pub fn refusal(status: u16, why: &str, line: impl FnOnce() -> String) {
    if tracing::enabled!(tracing::Level::DEBUG) {
        tracing::debug!("{}", line());
        return;
    }
    let now = Instant::now();
    let (write, suppressed) = REFUSALS.with(|r| {
        let mut r = r.borrow_mut();
        if r.len() >= REFUSAL_KINDS && !r.contains_key(&(status, why.to_string())) {
            report_suppressed(&mut r, now + RateLimit::WINDOW);
            r.clear();
        }
        let limit = r.entry((status, why.to_string())).or_insert_with(|| RateLimit::new(REFUSAL_LINES));
        limit.check(now)
    });
    if suppressed > 0 {
        tracing::info!("suppressed {suppressed} similar refusal line(s) ({status} {why}) in the last second");
    }
    if write {
        tracing::info!("{}", line());
    }
}

/// Reports the refusals suppressed in windows that have ended by now; called on
/// a timer so that the count of a flood that stopped is not lost.
pub fn report_suppressed_refusals() {
    REFUSALS.with(|r| report_suppressed(&mut r.borrow_mut(), Instant::now()));
}

fn report_suppressed(table: &mut std::collections::HashMap<(u16, String), RateLimit>, now: Instant) {
    for ((status, why), limit) in table.iter() {
        let n = limit.roll(now);
        if n > 0 {
            tracing::info!("suppressed {n} similar refusal line(s) ({status} {why}) in the last second");
        }
    }
}

const FLUSH_AT: usize = 32 * 1024;

/// A worker's access log.
pub struct AccessLog {
    /// Shared by all workers: each writes whole-line batches to the same
    /// append-mode file.
    out: RefCell<Option<Arc<File>>>,
    buf: RefCell<Vec<u8>>,
    /// Where each entry is counted; `None` in tests of the log alone.
    metrics: Option<Arc<Metrics>>,
    format: Cell<LogFormat>,
    /// The template of the `custom` format.
    custom: RefCell<Option<Arc<Template>>>,
    /// The plain-HTTP (port 80) listener's log: no TLS (`tls=none`), counted apart.
    plain: bool,
    /// Sites with an access log of their own: their lines go there instead.
    sites: RefCell<Vec<SiteOut>>,
}

/// A site's own access log as a worker writes it.
struct SiteOut {
    label: String,
    out: Arc<File>,
    buf: Vec<u8>,
}

/// A site's own access log: the site's label (see `handler::Sites::label`) and its open file.
#[derive(Clone)]
pub struct SiteLog {
    pub label: String,
    pub path: std::path::PathBuf,
    pub file: Arc<File>,
}

impl AccessLog {
    /// `out` is the destination (a dup of stdout or the log file), `None` when logging is off.
    pub fn new(out: Option<Arc<File>>) -> AccessLog {
        AccessLog {
            out: RefCell::new(out),
            buf: RefCell::new(Vec::with_capacity(FLUSH_AT)),
            metrics: None,
            format: Cell::default(),
            custom: RefCell::new(None),
            plain: false,
            sites: RefCell::new(Vec::new()),
        }
    }

    /// The log of the plain-HTTP listener: its lines say `tls=none` (JSON:
    /// `"record_layer": "none"`) and its requests are counted as plain-HTTP ones.
    pub fn plain_http(mut self) -> AccessLog {
        self.plain = true;
        self
    }

    /// Writes later lines in `format` (start-up and reload).
    pub fn set_format(&self, format: LogFormat) {
        self.format.set(format);
    }

    /// The template later lines follow when the format is `custom`.
    pub fn set_custom(&self, template: Option<Arc<Template>>) {
        *self.custom.borrow_mut() = template;
    }

    /// The worker's metrics the entries are counted in, if any.
    pub fn metrics(&self) -> Option<&Metrics> {
        self.metrics.as_deref()
    }

    /// Counts every entry in `metrics` too (the worker's own).
    pub fn counting(mut self, metrics: Arc<Metrics>) -> AccessLog {
        self.metrics = Some(metrics);
        self
    }

    /// Writes out the buffered lines to the current destination, then sends
    /// later lines to `out` (a reopened or reconfigured log).
    pub fn switch(&self, out: Option<Arc<File>>) {
        let same = match (&*self.out.borrow(), &out) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        if !same {
            self.flush();
            *self.out.borrow_mut() = out;
        }
    }

    /// Writes out what the sites' own logs hold, then sends later lines of each
    /// site in `logs` to its file (start-up, reload, reopening).
    pub fn switch_sites(&self, logs: &[SiteLog]) {
        let same = {
            let now = self.sites.borrow();
            now.len() == logs.len()
                && now.iter().zip(logs).all(|(a, b)| a.label == b.label && Arc::ptr_eq(&a.out, &b.file))
        };
        if same {
            return;
        }
        self.flush_sites();
        *self.sites.borrow_mut() =
            logs.iter().map(|l| SiteOut { label: l.label.clone(), out: l.file.clone(), buf: Vec::new() }).collect();
    }

    pub fn write(&self, e: &AccessEntry<'_>) {
        let mut sites = self.sites.borrow_mut();
        if let Some(site) = sites.iter_mut().find(|s| s.label == e.site) {
            self.write_to(&mut site.buf, e);
            if site.buf.len() >= FLUSH_AT {
                write_batch(&site.out, &mut site.buf);
            }
            return;
        }
        drop(sites);
        if self.out.borrow().is_none() {
            self.count(e);
            return;
        }
        let mut buf = self.buf.borrow_mut();
        self.write_to(&mut buf, e);
        let full = buf.len() >= FLUSH_AT;
        drop(buf);
        if full {
            self.flush();
        }
    }

    /// Counts `e` in the metrics.
    fn count(&self, e: &AccessEntry<'_>) {
        let elapsed = e.started.elapsed();
        match &self.metrics {
            Some(m) if self.plain => m.traffic.plain_request(e.status),
            Some(m) => {
                m.traffic.request(e.request.map(|r| r.method), e.status, e.layer, e.bytes, elapsed, e.ttfb);
                m.traffic.carried(protocol_of(e), e.body, e.bytes);
                m.sites.count(e.site, e.status, e.bytes);
            }
            None => {}
        }
    }

    /// Counts `e` and appends its line to `buf`.
    fn write_to(&self, buf: &mut Vec<u8>, e: &AccessEntry<'_>) {
        self.count(e);
        let elapsed = e.started.elapsed();
        let layer = if self.plain { "none" } else { e.layer.label() };
        let _ = match self.format.get() {
            LogFormat::Ktlsd => {
                common_fields(buf, e);
                buf.extend_from_slice(b" rt=");
                Seconds(elapsed).write_to(buf);
                buf.extend_from_slice(b" tls=");
                buf.extend_from_slice(layer.as_bytes());
                buf.push(b'\n');
                Ok(())
            }
            LogFormat::Combined => {
                common_fields(buf, e);
                writeln!(buf, " \"{}\" \"{}\"", Escaped(e.referer.unwrap_or("-")), Escaped(e.user_agent.unwrap_or("-")))
            }
            LogFormat::Json => writeln!(buf, "{}", json_line(e, elapsed.as_secs_f64(), layer)),
            LogFormat::Custom => {
                match &*self.custom.borrow() {
                    Some(t) => t.write(buf, e, elapsed.as_secs_f64(), layer),
                    None => writeln!(buf, "{}", json_line(e, elapsed.as_secs_f64(), layer)).unwrap_or_default(),
                }
                Ok(())
            }
        };
    }

    pub fn flush(&self) {
        self.flush_sites();
        let (Ok(out), Ok(mut buf)) = (self.out.try_borrow(), self.buf.try_borrow_mut()) else { return };
        let Some(out) = out.as_deref() else { return };
        write_batch(out, &mut buf);
    }

    fn flush_sites(&self) {
        let Ok(mut sites) = self.sites.try_borrow_mut() else { return };
        for s in sites.iter_mut() {
            write_batch(&s.out, &mut s.buf);
        }
    }
}

/// Access log lines dropped whole because the destination refused them (a full
/// disk, an I/O error), since start.
static DROPPED_LINES: AtomicU64 = AtomicU64::new(0);

/// Writes out a batch of whole lines and empties it. `&File` writes on an
/// O_APPEND file; the workers' batches are serialised, so that a batch the file
/// system takes only in part (a full disk) can be cut back to its last whole line:
/// a line is written whole or dropped whole (and counted, the failure logged at
/// most once a second), never left half-written to merge with the next one.
fn write_batch(out: &File, buf: &mut Vec<u8>) {
    static SERIAL: Mutex<()> = Mutex::new(());
    static FAILED: Throttle = Throttle::new(Duration::from_secs(1));
    if buf.is_empty() {
        return;
    }
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Where this batch starts, when the destination is a regular file that can be cut back.
    let start = out.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
    let (written, failure) = write_whole(out, buf);
    if let Some(e) = failure {
        let whole = buf[..written].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if whole < written {
            if let Some(start) = start {
                let _ = out.set_len(start + whole as u64);
            }
        }
        drop(serial);
        let dropped = buf[whole..].iter().filter(|&&b| b == b'\n').count() as u64;
        let total = DROPPED_LINES.fetch_add(dropped, Relaxed) + dropped;
        if let Some(n) = FAILED.check() {
            tracing::warn!(
                "access log write failed: {e}; {dropped} line(s) dropped whole, {total} since start{}",
                more(n)
            );
        }
    }
    buf.clear();
}

/// Writes `buf` to `out` with as many `write` calls as it takes: the bytes
/// written, and the error that stopped it short.
fn write_whole(mut out: &File, buf: &[u8]) -> (usize, Option<std::io::Error>) {
    let mut done = 0;
    while done < buf.len() {
        match out.write(&buf[done..]) {
            Ok(0) => return (done, Some(std::io::ErrorKind::WriteZero.into())),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return (done, Some(e)),
        }
    }
    (done, None)
}

/// The common log format's fields, `peer - - [time] "request" status bytes`, the
/// numbers written without `core::fmt` (they are in every line).
fn common_fields(buf: &mut Vec<u8>, e: &AccessEntry<'_>) {
    let _ = write!(buf, "{} - - [", e.peer.ip());
    with_clf_now(|t| buf.extend_from_slice(t.as_bytes()));
    let _ = write!(buf, "] \"{}\" ", Quoted(e.request));
    let mut n = itoa::Buffer::new();
    buf.extend_from_slice(n.format(e.status).as_bytes());
    buf.push(b' ');
    buf.extend_from_slice(n.format(e.bytes).as_bytes());
}

/// One entry as a JSON object (absent fields are `null`).
fn json_line(e: &AccessEntry<'_>, rt: f64, layer: &str) -> String {
    let r = e.request;
    let v = serde_json::json!({
        "time": clf_now(),
        "peer": e.peer.ip().to_string(),
        "method": r.map(|r| r.method.as_str()),
        "target": r.map(|r| r.target),
        "protocol": r.map(|r| r.version),
        "status": e.status,
        "bytes": e.bytes,
        "rt": (rt * 1e6).round() / 1e6,
        "ttfb": (e.ttfb.as_secs_f64() * 1e6).round() / 1e6,
        "tls_version": e.tls.map(|t| t.version),
        "cipher": e.tls.map(|t| t.cipher),
        "record_layer": layer,
        "body": e.body.map(BodyPath::label),
        "referer": e.referer,
        "user_agent": e.user_agent,
        "client_subject": e.client_subject,
        "host": e.host,
        "site": e.site,
    });
    let mut v = v;
    if let (Some(notes), Some(map)) = (e.notes, v.as_object_mut()) {
        // The fields of nginx's upstream and request variables, by the same names.
        let n = notes.0.borrow();
        let list = |f: &dyn Fn(&vars::Attempt) -> serde_json::Value| match n.upstream.is_empty() {
            true => serde_json::Value::Null,
            false => n.upstream.iter().map(f).collect(),
        };
        let secs = |d: Option<Duration>| d.map(|d| (d.as_secs_f64() * 1e6).round() / 1e6);
        let upstream = [
            ("upstream_addr", list(&|a| a.addr.clone().into())),
            ("upstream_status", list(&|a| a.status.into())),
            ("upstream_connect_time", list(&|a| secs(a.connect).into())),
            ("upstream_header_time", list(&|a| secs(a.header).into())),
            ("upstream_response_time", list(&|a| secs(a.response).into())),
            ("upstream_cache_status", n.cache_status.into()),
            ("remote_user", n.remote_user.clone().into()),
        ];
        drop(n);
        map.insert("request_id".into(), notes.request_id().into());
        for (k, value) in upstream {
            map.insert(k.into(), value);
        }
    }
    v.to_string()
}

thread_local! {
    /// The common-log-format timestamp, formatted at most once a second per worker.
    static CLF_NOW: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// The current time in common log format, UTC: `22/Nov/2026:10:00:00 +0000`.
fn clf_now() -> String {
    with_clf_now(str::to_string)
}

fn with_clf_now<R>(use_it: impl FnOnce(&str) -> R) -> R {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    CLF_NOW.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != secs {
            // "Sun, 22 Nov 2026 10:00:00 GMT" rearranged.
            let http = httpdate::fmt_http_date(UNIX_EPOCH + std::time::Duration::from_secs(secs));
            let parts: Vec<&str> = http.split(' ').collect();
            let clf = match parts.as_slice() {
                [_, day, mon, year, time, _] => format!("{day}/{mon}/{year}:{time} +0000"),
                _ => http.clone(),
            };
            *c = (secs, clf);
        }
        use_it(&c.1)
    })
}

/// A duration in seconds with three decimals (`0.012`), from integer
/// microseconds rather than float formatting.
struct Seconds(Duration);

impl Seconds {
    /// Appends the seconds, without `core::fmt` (one per log line).
    fn write_to(&self, out: &mut Vec<u8>) {
        let ms = (self.0.as_micros() + 500) / 1000;
        out.extend_from_slice(itoa::Buffer::new().format(ms / 1000).as_bytes());
        let frac = (ms % 1000) as u16;
        out.extend_from_slice(&[
            b'.',
            b'0' + (frac / 100) as u8,
            b'0' + (frac / 10 % 10) as u8,
            b'0' + (frac % 10) as u8,
        ]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        let path = std::env::temp_dir().join(format!("ktlsd-log-test-{}", std::process::id()));
        let file = Arc::new(File::create(&path).expect("temp file"));
        let log = AccessLog::new(Some(file));
        let peer: SocketAddr = "192.0.2.1:1234".parse().unwrap();
        let line = RequestLine { method: &Method::Get, target: "/a\"b\x01", version: "HTTP/1.1" };
        log.write(&AccessEntry {
            peer,
            request: Some(line),
            status: 200,
            bytes: 7,
            started: Instant::now(),
            ttfb: Duration::ZERO,
            layer: RecordLayer::Kernel,
            body: Some(BodyPath::Sendfile),
            referer: None,
            user_agent: None,
            tls: None,
            client_subject: None,
            host: None,
            site: "default",
            notes: None,
        });
        log.write(&AccessEntry {
            peer,
            request: None,
            status: 408,
            bytes: 0,
            started: Instant::now(),
            ttfb: Duration::ZERO,
            layer: RecordLayer::Userspace,
            body: None,
            referer: None,
            user_agent: None,
            tls: None,
            client_subject: None,
            host: None,
            site: "default",
            notes: None,
        });
        log.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with("192.0.2.1 - - ["), "{}", lines[0]);
        assert!(lines[0].contains("] \"GET /a\\\"b\\u{1} HTTP/1.1\" 200 7 rt="), "{}", lines[0]);
        assert!(lines[0].ends_with(" tls=ktls"), "{}", lines[0]);
        assert!(lines[1].contains("] \"-\" 408 0 rt="), "{}", lines[1]);
        assert!(lines[1].ends_with(" tls=userspace"), "{}", lines[1]);
    }

    #[test]
    fn formats() {
        let path = std::env::temp_dir().join(format!("ktlsd-log-formats-{}", std::process::id()));
        let log = AccessLog::new(Some(Arc::new(File::create(&path).expect("temp file"))));
        let peer: SocketAddr = "192.0.2.1:1234".parse().unwrap();
        let line = RequestLine { method: &Method::Get, target: "/a", version: "HTTP/1.1" };
        let tls = Some(TlsInfo { version: "TLSv1_3", cipher: "TLS13_AES_128_GCM_SHA256" });
        let notes = Notes::default();
        notes.with(|n| {
            n.request_id = Some("req-7".into());
            n.cache_status = Some("HIT");
            n.upstream = vec![vars::Attempt {
                addr: "127.0.0.1:9000".into(),
                status: Some(200),
                connect: Some(Duration::from_micros(1500)),
                header: Some(Duration::from_millis(3)),
                response: None,
            }];
        });
        let entry = |referer, user_agent| AccessEntry {
            peer,
            request: Some(line),
            status: 200,
            bytes: 7,
            started: Instant::now(),
            ttfb: Duration::from_micros(250),
            layer: RecordLayer::Kernel,
            body: Some(BodyPath::Splice),
            referer,
            user_agent,
            tls,
            client_subject: Some("CN=alice,O=Example"),
            host: Some("a.test"),
            site: "a.test",
            notes: Some(&notes),
        };
        log.set_format(LogFormat::Combined);
        log.write(&entry(Some("https://e.test/\"x"), Some("curl/8.0")));
        log.write(&entry(None, None));
        log.set_format(LogFormat::Json);
        log.write(&entry(None, Some("curl/8.0")));
        log.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("192.0.2.1 - - ["), "{}", lines[0]);
        assert!(
            lines[0].ends_with("] \"GET /a HTTP/1.1\" 200 7 \"https://e.test/\\\"x\" \"curl/8.0\""),
            "{}",
            lines[0]
        );
        assert!(lines[1].ends_with("] \"GET /a HTTP/1.1\" 200 7 \"-\" \"-\""), "{}", lines[1]);
        let v: serde_json::Value = serde_json::from_str(lines[2]).unwrap();
        for (k, want) in [
            ("peer", "192.0.2.1"),
            ("method", "GET"),
            ("target", "/a"),
            ("protocol", "HTTP/1.1"),
            ("record_layer", "ktls"),
            ("body", "splice"),
            ("tls_version", "TLSv1_3"),
            ("cipher", "TLS13_AES_128_GCM_SHA256"),
            ("user_agent", "curl/8.0"),
            ("client_subject", "CN=alice,O=Example"),
            ("host", "a.test"),
            ("site", "a.test"),
        ] {
            assert_eq!(v[k], want, "{k} in {v}");
        }
        assert_eq!(
            (v["status"].as_u64(), v["bytes"].as_u64(), v["ttfb"].as_f64()),
            (Some(200), Some(7), Some(0.00025))
        );
        assert!(v["rt"].is_f64() && v["time"].is_string() && v["referer"].is_null(), "{v}");
        assert_eq!(
            (&v["request_id"], &v["upstream_addr"][0], &v["upstream_status"][0], &v["upstream_cache_status"]),
            (
                &serde_json::json!("req-7"),
                &serde_json::json!("127.0.0.1:9000"),
                &serde_json::json!(200),
                &serde_json::json!("HIT")
            )
        );
        assert_eq!(
            (v["upstream_connect_time"][0].as_f64(), v["upstream_header_time"][0].as_f64()),
            (Some(0.0015), Some(0.003))
        );
        assert!(v["upstream_response_time"][0].is_null() && v["remote_user"].is_null(), "{v}");
    }

    #[test]
    fn escaped_fields_match_escape_default() {
        for s in [
            "/a.txt?x=1&y=%20",
            "",
            "say \"hi\"",
            "back\\slash",
            "it's",
            "tab\there",
            "nl\n",
            "\u{7f}",
            "caf\u{e9}",
            "~ !#$",
        ] {
            assert_eq!(Escaped(s).to_string(), s.escape_default().to_string(), "{s:?}");
        }
    }

    #[test]
    fn rate_limit_table() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let rl = RateLimit { limit: 3, window: Cell::new(t0), passed: Cell::new(0), suppressed: Cell::new(0) };
        // (time in ms, logged, suppressed count reported)
        let steps = [
            (0, true, 0),
            (10, true, 0),
            (20, true, 0),
            (30, false, 0),
            (999, false, 0),
            (1000, true, 2),
            (1001, true, 0),
            (3000, true, 0),
        ];
        for (ms, log, reported) in steps {
            assert_eq!(rl.check(at(ms)), (log, reported), "at {ms} ms");
        }
        for _ in 0..5 {
            rl.check(at(3100));
        }
        assert_eq!(rl.roll(at(3500)), 0, "window still open");
        assert_eq!(rl.roll(at(4000)), 3, "3 of 5 over the limit of 3 (one already passed at 3000)");
    }

    #[test]
    fn seconds_have_three_decimals() {
        for (us, want) in [
            (0, "0.000"),
            (499, "0.000"),
            (500, "0.001"),
            (12_345, "0.012"),
            (1_999_600, "2.000"),
            (61_250_000, "61.250"),
        ] {
            let mut written = Vec::new();
            Seconds(Duration::from_micros(us)).write_to(&mut written);
            assert_eq!(written, want.as_bytes(), "{us} us, as a log line holds it");
        }
    }

    #[test]
    fn clf_time_is_utc_in_common_log_format() {
        let t = clf_now();
        let (date, zone) = t.split_once(' ').unwrap();
        assert_eq!(zone, "+0000");
        let parts: Vec<&str> = date.split(['/', ':']).collect();
        assert_eq!(parts.len(), 6, "{t}");
        assert!(
            ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"].contains(&parts[1]),
            "{t}"
        );
        assert!(parts.iter().enumerate().all(|(i, p)| i == 1 || p.bytes().all(|b| b.is_ascii_digit())), "{t}");
    }
}
