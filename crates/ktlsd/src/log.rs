//! Logging: diagnostics through `tracing` on standard error, and the access log,
//! one line per request in common log format plus request time and TLS mode:
//!
//! `127.0.0.1 - - [22/Nov/2026:10:00:00 +0000] "GET /a.txt HTTP/1.1" 200 1234 rt=0.001 tls=ktls`
//!
//! Each worker buffers its own lines and writes them in whole-line batches (when the
//! buffer fills, on a short timer, and at exit), so logging costs no syscall per request.
//! Every entry also counts the request in the worker's metrics when it has them
//! (logging off or on), so the HTTP loops report each request in one place.

use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::stats::{Layer, Method, Metrics};

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
    /// How the bytes were protected (`ktls`, `userspace`).
    pub label: &'static str,
}

/// What a request asked, as received.
#[derive(Debug, Clone, Copy)]
pub struct RequestLine<'a> {
    pub method: &'a str,
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
            Some(r) => write!(f, "{} {} {}", r.method.escape_default(), r.target.escape_default(), r.version.escape_default()),
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
}

impl AccessLog {
    /// `out` is the destination (a dup of stdout or the log file), `None` when logging is off.
    pub fn new(out: Option<Arc<File>>) -> AccessLog {
        AccessLog { out: RefCell::new(out), buf: RefCell::new(Vec::with_capacity(FLUSH_AT)), metrics: None }
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

    pub fn write(&self, e: &AccessEntry<'_>) {
        let elapsed = e.started.elapsed();
        if let Some(m) = &self.metrics {
            let method = e.request.map_or(Method::Other, |r| Method::from_name(r.method));
            m.traffic.request(method, e.status, Layer::from_label(e.label), e.bytes, elapsed, e.ttfb);
        }
        if self.out.borrow().is_none() {
            return;
        }
        let rt = elapsed.as_secs_f64();
        let mut buf = self.buf.borrow_mut();
        let _ = writeln!(
            buf,
            "{} - - [{}] \"{}\" {} {} rt={:.3} tls={}",
            e.peer.ip(),
            clf_now(),
            Quoted(e.request),
            e.status,
            e.bytes,
            rt,
            e.label
        );
        let full = buf.len() >= FLUSH_AT;
        drop(buf);
        if full {
            self.flush();
        }
    }

    pub fn flush(&self) {
        let (Ok(out), Ok(mut buf)) = (self.out.try_borrow(), self.buf.try_borrow_mut()) else { return };
        let Some(out) = out.as_deref() else { return };
        if buf.is_empty() {
            return;
        }
        // `&File` writes: one write per batch on an O_APPEND file keeps the
        // workers' batches whole.
        if let Err(e) = (&*out).write_all(&buf) {
            tracing::warn!("access log write failed: {e}");
        }
        buf.clear();
    }
}

thread_local! {
    /// The common-log-format timestamp, formatted at most once a second per worker.
    static CLF_NOW: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// The current time in common log format, UTC: `22/Nov/2026:10:00:00 +0000`.
fn clf_now() -> String {
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
        c.1.clone()
    })
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
        let line = RequestLine { method: "GET", target: "/a\"b\x01", version: "HTTP/1.1" };
        log.write(&AccessEntry { peer, request: Some(line), status: 200, bytes: 7, started: Instant::now(), ttfb: Duration::ZERO, label: "ktls" });
        log.write(&AccessEntry { peer, request: None, status: 408, bytes: 0, started: Instant::now(), ttfb: Duration::ZERO, label: "userspace" });
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
    fn clf_time_is_utc_in_common_log_format() {
        let t = clf_now();
        let (date, zone) = t.split_once(' ').unwrap();
        assert_eq!(zone, "+0000");
        let parts: Vec<&str> = date.split(['/', ':']).collect();
        assert_eq!(parts.len(), 6, "{t}");
        assert!(["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"].contains(&parts[1]), "{t}");
        assert!(parts.iter().enumerate().all(|(i, p)| i == 1 || p.bytes().all(|b| b.is_ascii_digit())), "{t}");
    }
}
