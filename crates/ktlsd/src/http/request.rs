//! Request heads: parsing with httparse, limits, and the few headers a static
//! server acts on.

use crate::http::Status;

/// HTTP version of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
}

impl Version {
    pub fn as_str(self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        }
    }
}

/// What the request asks for, and the headers that shape the answer.
#[derive(Debug, Default)]
pub struct Request {
    pub method: String,
    /// Path part of the target, still percent-encoded, without query or fragment.
    pub path: String,
    /// The request line as received (for the access log).
    pub line: String,
    pub version: Option<Version>,
    pub keep_alive: bool,
    pub content_length: u64,
    pub range: Option<String>,
    pub if_none_match: Option<String>,
    pub if_modified_since: Option<String>,
    pub if_match: Option<String>,
    pub if_unmodified_since: Option<String>,
    pub if_range: Option<String>,
    pub user_agent: Option<String>,
    pub referer: Option<String>,
}

/// A request that cannot be answered normally, with the status to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest {
    pub status: Status,
    pub reason: &'static str,
}

fn bad(status: Status, reason: &'static str) -> BadRequest {
    BadRequest { status, reason }
}

const MAX_HEADERS: usize = 100;

/// Parses one request head from the front of `buf`.
///
/// `Ok(None)`: incomplete, read more (unless `buf` already holds `max_head` bytes, which is
/// answered here with 414 or 431). `Ok(Some((request, used)))`: `used` bytes form the head.
pub fn parse(buf: &[u8], max_head: usize) -> Result<Option<(Request, usize)>, BadRequest> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let window = &buf[..buf.len().min(max_head)];
    let used = match req.parse(window) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            if window.len() < max_head {
                return Ok(None);
            }
            let line_done = window.windows(2).any(|w| w == b"\r\n") || window.contains(&b'\n');
            return Err(if line_done {
                bad(Status::HEADERS_TOO_LARGE, "request headers exceed the limit")
            } else {
                bad(Status::URI_TOO_LONG, "request line exceeds the limit")
            });
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Err(bad(Status::HEADERS_TOO_LARGE, "more than 100 request headers"))
        }
        Err(httparse::Error::Version) => {
            return Err(bad(Status::VERSION_NOT_SUPPORTED, "HTTP version not supported"))
        }
        Err(_) => return Err(bad(Status::BAD_REQUEST, "malformed request head")),
    };

    let method = req.method.unwrap_or_default().to_string();
    let target = req.path.unwrap_or_default();
    let version = match req.version {
        Some(0) => Version::Http10,
        _ => Version::Http11,
    };
    let mut r = Request {
        line: format!("{method} {target} {}", version.as_str()),
        method,
        version: Some(version),
        keep_alive: version == Version::Http11,
        ..Request::default()
    };

    // Absolute-form targets carry their own authority; only the path matters here.
    let path_and_query = if let Some(rest) = target.strip_prefix("https://").or_else(|| target.strip_prefix("http://")) {
        rest.find('/').map_or("/", |i| &rest[i..])
    } else {
        target
    };
    r.path = path_and_query.split(['?', '#']).next().unwrap_or("").to_string();

    let mut host_seen = false;
    let mut content_length: Option<u64> = None;
    for h in req.headers.iter() {
        let name = h.name;
        let value = || String::from_utf8_lossy(h.value).trim().to_string();
        if name.eq_ignore_ascii_case("host") {
            if host_seen {
                return Err(bad(Status::BAD_REQUEST, "more than one Host header"));
            }
            host_seen = true;
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value().split(',') {
                let t = token.trim();
                if t.eq_ignore_ascii_case("close") {
                    r.keep_alive = false;
                } else if t.eq_ignore_ascii_case("keep-alive") && version == Version::Http10 {
                    r.keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case("content-length") {
            let v = value();
            // 1*DIGIT only: u64's parser would also take a leading '+'.
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(Status::BAD_REQUEST, "invalid Content-Length"));
            }
            let n: u64 = v.parse().map_err(|_| bad(Status::BAD_REQUEST, "invalid Content-Length"))?;
            if content_length.is_some_and(|c| c != n) {
                return Err(bad(Status::BAD_REQUEST, "conflicting Content-Length headers"));
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // A body whose length we would have to decode; refusing it keeps request
            // framing unambiguous (no smuggling through TE/CL disagreement).
            return Err(bad(Status::LENGTH_REQUIRED, "Transfer-Encoding request bodies are not accepted"));
        } else if name.eq_ignore_ascii_case("range") {
            r.range = Some(value());
        } else if name.eq_ignore_ascii_case("if-none-match") {
            r.if_none_match = Some(value());
        } else if name.eq_ignore_ascii_case("if-modified-since") {
            r.if_modified_since = Some(value());
        } else if name.eq_ignore_ascii_case("if-match") {
            r.if_match = Some(value());
        } else if name.eq_ignore_ascii_case("if-unmodified-since") {
            r.if_unmodified_since = Some(value());
        } else if name.eq_ignore_ascii_case("if-range") {
            r.if_range = Some(value());
        } else if name.eq_ignore_ascii_case("user-agent") {
            r.user_agent = Some(value());
        } else if name.eq_ignore_ascii_case("referer") {
            r.referer = Some(value());
        }
    }
    if version == Version::Http11 && !host_seen {
        return Err(bad(Status::BAD_REQUEST, "HTTP/1.1 request without Host"));
    }
    if r.path.is_empty() || target == "*" {
        return Err(bad(Status::BAD_REQUEST, "request target is not a path"));
    }
    r.content_length = content_length.unwrap_or(0);
    Ok(Some((r, used)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_simple_get() {
        let (r, used) = parse(b"GET /a%20b?x=1 HTTP/1.1\r\nHost: x\r\n\r\nrest", 16384).unwrap().unwrap();
        assert_eq!(used, 36);
        assert_eq!(r.method, "GET");
        assert_eq!(r.path, "/a%20b");
        assert!(r.keep_alive);
    }

    #[test]
    fn http10_keep_alive_is_opt_in() {
        let (r, _) = parse(b"GET / HTTP/1.0\r\n\r\n", 16384).unwrap().unwrap();
        assert!(!r.keep_alive);
        let (r, _) = parse(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", 16384).unwrap().unwrap();
        assert!(r.keep_alive);
    }

    #[test]
    fn limits_and_errors() {
        let long_line = format!("GET /{} HTTP/1.1\r\n", "a".repeat(2000));
        assert_eq!(parse(long_line.as_bytes(), 1024).unwrap_err().status, Status::URI_TOO_LONG);
        let big_headers = format!("GET / HTTP/1.1\r\nHost: x\r\nX: {}\r\n", "a".repeat(2000));
        assert_eq!(parse(big_headers.as_bytes(), 1024).unwrap_err().status, Status::HEADERS_TOO_LARGE);
        assert_eq!(parse(b"GET / HTTP/1.1\r\n\r\n", 1024).unwrap_err().status, Status::BAD_REQUEST);
        assert_eq!(parse(b"\x16\x03\x01garbage\r\n\r\n", 1024).unwrap_err().status, Status::BAD_REQUEST);
        assert!(parse(b"GET / HTTP/1.1\r\nHost: x\r\n", 1024).unwrap().is_none());
        let cl = b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        assert_eq!(parse(cl, 1024).unwrap_err().status, Status::BAD_REQUEST);
    }
}
