//! Response heads, and the small complete responses sent for errors and redirects.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use super::request::Version;
use super::Status;

thread_local! {
    /// The Date header value, formatted at most once a second per worker.
    static DATE: RefCell<(u64, String)> = const { RefCell::new((0, String::new())) };
}

fn http_date_now() -> String {
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != secs || d.1.is_empty() {
            *d = (secs, httpdate::fmt_http_date(now));
        }
        d.1.clone()
    })
}

/// Builds a response head line by line.
pub struct Head {
    buf: String,
}

impl Head {
    /// The status line always says HTTP/1.1, the version the server implements, for
    /// 1.0 requests too (RFC 9110 section 6.2; nginx answers the same); `finish`
    /// decides the connection's fate by the request's version.
    pub fn new(status: Status) -> Head {
        let mut buf = String::with_capacity(256);
        let _ = write!(buf, "HTTP/1.1 {} {}\r\nServer: ktlsd\r\nDate: {}\r\n", status.0, status.reason(), http_date_now());
        Head { buf }
    }

    pub fn header(mut self, name: &str, value: impl std::fmt::Display) -> Head {
        let _ = write!(self.buf, "{name}: {value}\r\n");
        self
    }

    /// Adds the header when there is a value (an optional, configured header).
    pub fn header_opt(self, name: &str, value: Option<&str>) -> Head {
        match value {
            Some(v) => self.header(name, v),
            None => self,
        }
    }

    /// Ends the head with the Connection header that matches `keep_alive`.
    pub fn finish(mut self, version: Version, keep_alive: bool) -> Vec<u8> {
        match (keep_alive, version) {
            (false, _) => self.buf.push_str("Connection: close\r\n"),
            (true, Version::Http10) => self.buf.push_str("Connection: keep-alive\r\n"),
            (true, Version::Http11) => {}
        }
        self.buf.push_str("\r\n");
        self.buf.into_bytes()
    }
}

/// A complete small response with an HTML body naming the status.
/// `extra` headers (e.g. Allow, Location, Content-Range) go before the body. The
/// answer to a HEAD (`head_only`) has the same head, Content-Length included, and no body.
pub fn simple(version: Version, status: Status, extra: &[(&str, String)], keep_alive: bool, head_only: bool) -> Vec<u8> {
    let body = format!(
        "<html><head><title>{code} {reason}</title></head><body><h1>{code} {reason}</h1></body></html>\n",
        code = status.0,
        reason = status.reason()
    );
    let mut head = Head::new(status)
        .header("Content-Type", "text/html; charset=utf-8")
        .header("Content-Length", body.len());
    for (name, value) in extra {
        head = head.header(name, value);
    }
    let mut out = head.finish(version, keep_alive);
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

/// The interim response that invites the body of an `Expect: 100-continue` request.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
