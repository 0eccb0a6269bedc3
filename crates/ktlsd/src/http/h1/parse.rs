//! HTTP/1.x request heads: parsing with httparse, the head-size limit, framing
//! (version, keep-alive, Content-Length, Expect) and the handler's [`Request`].

use std::borrow::Cow;

use crate::handler::request::{join, HeaderFields, Method, Request};
use crate::handler::Status;
use crate::http::host;

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

/// One parsed request head: the handler's request and what HTTP/1.x framing needs.
#[derive(Debug)]
pub struct Head {
    pub request: Request,
    /// The request target as received (for the access log).
    pub target: String,
    pub version: Version,
    pub keep_alive: bool,
    pub content_length: u64,
    /// `Expect: 100-continue` on an HTTP/1.1 request.
    pub expect_continue: bool,
    /// `Transfer-Encoding: chunked` (alone, without Content-Length, on HTTP/1.1): a body
    /// only a proxied path reads; the others answer 411.
    pub chunked: bool,
    /// `Referer` and `User-Agent` as received, for the access log.
    pub referer: Option<String>,
    pub user_agent: Option<String>,
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

/// Whether the (possibly incomplete) request at the front of `buf` is a HEAD:
/// its error responses then carry no body either.
pub fn is_head(buf: &[u8]) -> bool {
    let start = buf.iter().position(|&b| b != b'\r' && b != b'\n').unwrap_or(buf.len());
    buf[start..].starts_with(b"HEAD ")
}

/// What the version token of a complete request line says.
#[derive(Debug, PartialEq, Eq)]
enum LineVersion {
    /// `HTTP/1.0`, `HTTP/1.1`, or no complete line yet: httparse reads it as it is.
    AsIs,
    /// No complete line yet, and its version token so far could still become one read
    /// as HTTP/1.x (`HTTP/0`, `HTTP/1.2`): httparse, which knows only `HTTP/1.0` and
    /// `HTTP/1.1`, would refuse it before the rest of the line arrives.
    Incomplete,
    /// Another spelling of HTTP/1.x (`HTTP/1.2`, `HTTP/1.10`, `HTTP/01.1`): read as
    /// `version`, 1.1 for every minor version above 0, as nginx does. The token spans
    /// `start..end` of the buffer.
    Rewrite { start: usize, end: usize, version: Version },
}

/// Checks the request line's version before httparse, which knows only 1.0 and 1.1.
/// `HTTP/<major>[.<minor>]` with a major other than 1 is 505; a token that is not of
/// that form is 400.
fn line_version(window: &[u8]) -> Result<LineVersion, BadRequest> {
    let start = window.iter().position(|&b| b != b'\r' && b != b'\n').unwrap_or(window.len());
    let Some(nl) = window[start..].iter().position(|&b| b == b'\n') else { return Ok(partial_line(&window[start..])) };
    let mut line = &window[start..start + nl];
    if let [rest @ .., b'\r'] = line {
        line = rest;
    }
    // Fewer than three parts: httparse answers it.
    if line.iter().filter(|&&b| b == b' ').count() < 2 {
        return Ok(LineVersion::AsIs);
    }
    let Some(sp) = line.iter().rposition(|&b| b == b' ') else { return Ok(LineVersion::AsIs) };
    let token = &line[sp + 1..];
    if token == b"HTTP/1.1" || token == b"HTTP/1.0" {
        return Ok(LineVersion::AsIs);
    }
    let digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
    let invalid = bad(Status::BAD_REQUEST, "malformed HTTP version");
    let rest = token.strip_prefix(b"HTTP/").ok_or(invalid.clone())?;
    let (major, minor) = match rest.iter().position(|&b| b == b'.') {
        Some(dot) => (&rest[..dot], Some(&rest[dot + 1..])),
        None => (rest, None),
    };
    if !digits(major) || minor.is_some_and(|m| !digits(m)) {
        return Err(invalid);
    }
    let is = |digits: &[u8], n: u8| digits.iter().skip_while(|&&d| d == b'0').eq([b'0' + n].iter());
    let is_zero = |digits: &[u8]| digits.iter().all(|&d| d == b'0');
    if !is(major, 1) {
        return Err(bad(Status::VERSION_NOT_SUPPORTED, "HTTP version not supported"));
    }
    let Some(minor) = minor else { return Err(invalid) };
    let at = start + sp + 1;
    let version = if is_zero(minor) { Version::Http10 } else { Version::Http11 };
    Ok(LineVersion::Rewrite { start: at, end: at + token.len(), version })
}

/// What [`line_version`] makes of a request line whose end has not arrived: wait for it
/// when the version token so far is the start of one it would accept.
fn partial_line(line: &[u8]) -> LineVersion {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().filter(|&&b| b == b' ').count() < 2 {
        return LineVersion::AsIs;
    }
    let token = line.rsplit(|&b| b == b' ').next().unwrap_or_default();
    let Some(rest) = token.strip_prefix(b"HTTP/") else { return LineVersion::AsIs };
    // `0*1` then `.` and digits: the forms read as HTTP/1.x.
    let rest = &rest[rest.iter().take_while(|&&b| b == b'0').count()..];
    let accepted = match rest {
        [] | [b'1'] => true,
        [b'1', b'.', minor @ ..] => minor.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if accepted && !b"HTTP/1.1".starts_with(token) && !b"HTTP/1.0".starts_with(token) {
        LineVersion::Incomplete
    } else {
        LineVersion::AsIs
    }
}

/// Parses one request head from the front of `buf`.
///
/// `Ok(None)`: incomplete, read more (unless `buf` already holds `max_head` bytes, which is
/// answered here with 414 or 431). `Ok(Some((request, used)))`: `used` bytes form the head.
pub fn parse(buf: &[u8], max_head: usize) -> Result<Option<(Head, usize)>, BadRequest> {
    let window = &buf[..buf.len().min(max_head)];
    match line_version(window)? {
        LineVersion::AsIs => parse_head(window, max_head),
        LineVersion::Incomplete if window.len() < max_head => Ok(None),
        LineVersion::Incomplete => Err(bad(Status::URI_TOO_LONG, "request line exceeds the limit")),
        LineVersion::Rewrite { start, end, version } => {
            // The same head with the version token in its plain spelling.
            let plain = version.as_str().as_bytes();
            let mut copy = Vec::with_capacity(window.len());
            copy.extend_from_slice(&window[..start]);
            copy.extend_from_slice(plain);
            copy.extend_from_slice(&window[end..]);
            // The token is never shorter than its plain spelling (`HTTP/1.x` has 8 bytes).
            let shrunk = (end - start).saturating_sub(plain.len());
            let r = parse_head(&copy, max_head.saturating_sub(shrunk))?;
            Ok(r.map(|(req, used)| (req, used + shrunk)))
        }
    }
}

fn parse_head(window: &[u8], max_head: usize) -> Result<Option<(Head, usize)>, BadRequest> {
    // Left uninitialised: httparse writes only the headers it finds.
    let mut headers = [std::mem::MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let used = match req.parse_with_uninit_headers(window, &mut headers) {
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
        Err(httparse::Error::Version) => return Err(bad(Status::VERSION_NOT_SUPPORTED, "HTTP version not supported")),
        Err(_) => return Err(bad(Status::BAD_REQUEST, "malformed request head")),
    };

    let method = Method::from_token(req.method.unwrap_or_default());
    let target = req.path.unwrap_or_default();
    let version = match req.version {
        Some(0) => Version::Http10,
        _ => Version::Http11,
    };
    let mut r = Head {
        request: Request::new(method, ""),
        target: target.to_string(),
        version,
        keep_alive: version == Version::Http11,
        content_length: 0,
        expect_continue: false,
        chunked: false,
        referer: None,
        user_agent: None,
    };
    let mut fields = HeaderFields::default();

    let path_and_query = origin_form(target)?;
    let without_fragment = path_and_query.split('#').next().unwrap_or("");
    let (path, query) = match without_fragment.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (without_fragment, None),
    };
    // `https://host?q` has an empty path, which stands for `/`.
    r.request.path =
        if path.is_empty() && path_and_query.len() < target.len() { "/".to_string() } else { path.to_string() };
    r.request.query = query.map(str::to_string);

    let mut hosts = 0;
    let mut content_length: Option<u64> = None;
    let mut content_length_text: Option<String> = None;
    let mut transfer_codings: Option<String> = None;
    // `Connection: upgrade` and `Upgrade: websocket`: together, a tunnel's request.
    let (mut connection_upgrade, mut websocket) = (false, false);
    for h in req.headers.iter() {
        let name = h.name;
        // Borrowed from the buffer unless it has bytes that are not UTF-8.
        let value = || match String::from_utf8_lossy(h.value) {
            Cow::Borrowed(v) => Cow::Borrowed(v.trim()),
            Cow::Owned(v) => Cow::Owned(v.trim().to_string()),
        };
        if name.eq_ignore_ascii_case("host") {
            hosts += 1;
            if hosts > 1 {
                return Err(bad(Status::BAD_REQUEST, "more than one Host header"));
            }
            let v = value();
            if v.is_empty() && version == Version::Http11 {
                return Err(bad(Status::BAD_REQUEST, "empty Host in an HTTP/1.1 request"));
            }
            if !v.is_empty() && !host::valid(v.as_bytes()) {
                return Err(bad(Status::BAD_REQUEST, "invalid Host"));
            }
            r.request.authority = (!v.is_empty()).then(|| v.into_owned());
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value().split(',') {
                let t = token.trim();
                if t.eq_ignore_ascii_case("close") {
                    r.keep_alive = false;
                } else if t.eq_ignore_ascii_case("keep-alive") && version == Version::Http10 {
                    r.keep_alive = true;
                } else if t.eq_ignore_ascii_case("upgrade") {
                    connection_upgrade = true;
                }
            }
        } else if name.eq_ignore_ascii_case("content-length") {
            let v = value();
            // 1*DIGIT only: u64's parser would also take a leading '+'.
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(Status::BAD_REQUEST, "invalid Content-Length"));
            }
            let n: u64 = v.parse().map_err(|_| bad(Status::BAD_REQUEST, "invalid Content-Length"))?;
            // Repeated, it must be the same text: `1` and `01` may be one number here
            // and two to a proxy in front that compares them as written.
            if content_length_text.as_deref().is_some_and(|t| t != v) {
                return Err(bad(Status::BAD_REQUEST, "conflicting Content-Length headers"));
            }
            content_length_text = Some(v.to_string());
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            join(&mut transfer_codings, &value());
        } else if name.eq_ignore_ascii_case("expect") {
            // An HTTP/1.0 client cannot read a 100 response: its expectations are ignored
            // (RFC 9110 section 10.1.1).
            if version == Version::Http11 {
                if value().eq_ignore_ascii_case("100-continue") {
                    r.expect_continue = true;
                } else {
                    return Err(bad(Status::EXPECTATION_FAILED, "unsupported expectation (only 100-continue)"));
                }
            }
        } else {
            if name.eq_ignore_ascii_case("upgrade") {
                // A list of protocols, each perhaps with a version (`websocket/13`).
                websocket |= value()
                    .split(',')
                    .any(|p| p.split('/').next().is_some_and(|name| name.trim().eq_ignore_ascii_case("websocket")));
            }
            if name.eq_ignore_ascii_case("referer") {
                r.referer = Some(value().into_owned());
            } else if name.eq_ignore_ascii_case("user-agent") {
                r.user_agent = Some(value().into_owned());
            }
            fields.add(name, &value());
        }
    }
    r.request.headers = fields.parse();
    if let Some(te) = transfer_codings {
        // One `chunked` alone on HTTP/1.1 without Content-Length is a body the codec
        // can decode (for a proxied path); anything else is refused, which keeps request
        // framing unambiguous (no smuggling through TE/CL disagreement). Codings we
        // do not know at all are 501 (RFC 9112 section 6.1), as nginx answers.
        let codings: Vec<&str> =
            te.split(',').map(|c| c.split(';').next().unwrap_or("").trim()).filter(|c| !c.is_empty()).collect();
        // A field without a coding is no framing at all: 400 (RFC 9112 section 6.1's
        // `transfer-coding` list has at least one element).
        if codings.is_empty() {
            return Err(bad(Status::BAD_REQUEST, "empty Transfer-Encoding"));
        }
        if !codings.iter().all(|c| c.eq_ignore_ascii_case("chunked")) {
            return Err(bad(Status::NOT_IMPLEMENTED, "unknown transfer coding"));
        }
        if codings.len() > 1 || content_length.is_some() || version == Version::Http10 {
            return Err(bad(Status::LENGTH_REQUIRED, "Transfer-Encoding request bodies are not accepted"));
        }
        r.chunked = true;
    }
    if version == Version::Http11 && hosts == 0 {
        return Err(bad(Status::BAD_REQUEST, "HTTP/1.1 request without Host"));
    }
    // `*` (asterisk-form, RFC 9112 section 3.2.4) asks OPTIONS about the server as a
    // whole; the handler answers it as HTTP/2's `:path *` is answered: 204 with Allow.
    if r.request.path.is_empty() || (target == "*" && r.request.method != Method::Options) {
        return Err(bad(Status::BAD_REQUEST, "request target is not a path"));
    }
    r.content_length = content_length.unwrap_or(0);
    // RFC 6455 section 4.1: a GET of HTTP/1.1; one with a body is taken as no upgrade.
    let bodiless = r.content_length == 0 && !r.chunked;
    if connection_upgrade && websocket && bodiless && version == Version::Http11 && r.request.method == Method::Get {
        r.request.upgrade = Some("websocket".to_string());
    }
    Ok(Some((r, used)))
}

/// The path and query of a request target. Absolute-form targets carry their own
/// authority, of which only the path matters here; the scheme is case-insensitive
/// and userinfo is refused (RFC 9110 section 4.2.4).
fn origin_form(target: &str) -> Result<&str, BadRequest> {
    let scheme_len = ["https://", "http://"]
        .iter()
        .find(|s| target.get(..s.len()).is_some_and(|p| p.eq_ignore_ascii_case(s)))
        .map(|s| s.len());
    let Some(n) = scheme_len else { return Ok(target) };
    let rest = &target[n..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.contains('@') {
        return Err(bad(Status::BAD_REQUEST, "userinfo in the request target"));
    }
    if !host::valid(authority.as_bytes()) {
        return Err(bad(Status::BAD_REQUEST, "invalid authority in the request target"));
    }
    Ok(&rest[end..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::request::{EntityTag, IfRange, TagCondition};

    #[test]
    fn parses_a_simple_get() {
        let (r, used) = parse(b"GET /a%20b?x=1 HTTP/1.1\r\nHost: x\r\n\r\nrest", 16384).unwrap().unwrap();
        assert_eq!(used, 36);
        assert_eq!(r.request.method, Method::Get);
        assert_eq!(r.request.path, "/a%20b");
        assert_eq!(r.request.query.as_deref(), Some("x=1"));
        assert_eq!(r.target, "/a%20b?x=1");
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

    fn status(head: &str) -> Result<Head, u16> {
        parse(head.as_bytes(), 16384).map(|r| r.expect("complete head").0).map_err(|e| e.status.0)
    }

    #[test]
    fn versions() {
        for (line, want) in [
            ("GET / HTTP/1.2", Ok(Version::Http11)),
            ("GET / HTTP/1.10", Ok(Version::Http11)),
            ("GET / HTTP/1.999", Ok(Version::Http11)),
            ("GET / HTTP/01.1", Ok(Version::Http11)),
            ("GET / HTTP/1.00", Ok(Version::Http10)),
            ("GET / HTTP/2.0", Err(505)),
            ("GET / HTTP/2", Err(505)),
            ("GET / HTTP/3", Err(505)),
            ("GET / HTTP/0.9", Err(505)),
            ("GET / HTTP/1", Err(400)),
            ("GET / HTTP/1.", Err(400)),
            ("GET / HTTP/x.1", Err(400)),
            ("GET / HTTZ/1.1", Err(400)),
            ("GET / http/1.1", Err(400)),
        ] {
            let got = status(&format!("{line}\r\nHost: x\r\n\r\n")).map(|r| r.version);
            assert_eq!(got, want, "{line}");
        }
        // The rewritten head's length is the original's.
        let head = b"GET /a HTTP/1.123\r\nHost: x\r\n\r\nGET";
        let (r, used) = parse(head, 16384).unwrap().unwrap();
        assert_eq!((used, r.keep_alive), (head.len() - 3, true));
        assert_eq!((r.target.as_str(), r.version), ("/a", Version::Http11));
        assert!(parse(b"GET / HTTP/1.2\r\nHost: x\r\n", 16384).unwrap().is_none());
    }

    /// A head that is accepted whole is incomplete, never refused, at every shorter
    /// prefix: a client's request line split across reads (`HTTP/0` then `1.1`) gets
    /// the answer it gets in one piece (found by the `h1_request` fuzz target).
    #[test]
    fn every_prefix_of_an_accepted_head_is_incomplete() {
        for head in [
            "GET / HTTP/01.1\r\nHost: x\r\n\r\n",
            "GET / HTTP/1.2\r\nHost: x\r\n\r\n",
            "GET / HTTP/001.10\r\nHost: x\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            "\r\nGET /x HTTP/1.0\n\n",
        ] {
            assert!(parse(head.as_bytes(), 16384).unwrap().is_some(), "{head:?}");
            for n in 0..head.len() {
                assert!(matches!(parse(&head.as_bytes()[..n], 16384), Ok(None)), "{:?}", &head[..n]);
            }
        }
        // What cannot become a version read as HTTP/1.x is still answered at once.
        assert_eq!(parse(b"GET / HTTP/2", 16384).unwrap_err().status, Status::VERSION_NOT_SUPPORTED);
        assert!(parse(b"GET / HTTP/1.x", 16384).is_err());
        assert_eq!(parse(b"GET / HTTP/1.2", 14).unwrap_err().status, Status::URI_TOO_LONG);
    }

    #[test]
    fn hosts() {
        for (host, ok) in [
            ("Host: localhost", true),
            ("Host: localhost:8443", true),
            ("Host: [::1]:8443", true),
            ("Host: [::1]", true),
            ("Host: 127.0.0.1", true),
            ("Host: xn--bcher-kva.example.", true),
            ("Host: a b", false),
            ("Host: a/b", false),
            ("Host: a\\b", false),
            ("Host: u@h", false),
            ("Host: h:8x", false),
            ("Host: [::1", false),
            ("Host: [::1]x", false),
            ("Host:", false),
            ("Host: a\r\nHost: a", false),
        ] {
            let got = status(&format!("GET / HTTP/1.1\r\n{host}\r\n\r\n")).map(drop);
            assert_eq!(got.is_ok(), ok, "{host:?}: {got:?}");
        }
        assert!(status("GET / HTTP/1.0\r\nHost:\r\n\r\n").is_ok());
        assert!(status("GET / HTTP/1.0\r\n\r\n").is_ok());
        // The checked value is kept, trimmed; an empty or absent one is `None`.
        for (head, want) in [
            ("GET / HTTP/1.1\r\nHost: a.example\r\n\r\n", Some("a.example")),
            ("GET / HTTP/1.1\r\nX: y\r\nhOsT:\t[::1]:80 \r\n\r\n", Some("[::1]:80")),
            ("GET / HTTP/1.0\r\nX-Host: x\r\n\r\n", None),
            ("GET / HTTP/1.0\r\nHost:\r\n\r\n", None),
        ] {
            assert_eq!(status(head).map(|r| r.request.authority), Ok(want.map(String::from)), "{head:?}");
        }
    }

    #[test]
    fn targets() {
        for (target, want) in [
            ("/a?x=1#f", Ok(("/a", Some("x=1")))),
            ("/a#f?x", Ok(("/a", None))),
            ("HTTPS://h/a?q", Ok(("/a", Some("q")))),
            ("Http://h:1/a", Ok(("/a", None))),
            ("https://h", Ok(("/", None))),
            ("https://h?q", Ok(("/", Some("q")))),
            ("https://u@h/a", Err(400)),
            ("https://u:p@h/a", Err(400)),
            ("https:///a", Err(400)),
            ("https://h/u@x", Ok(("/u@x", None))),
            ("ftp://h/a", Ok(("ftp://h/a", None))),
        ] {
            let got = status(&format!("GET {target} HTTP/1.1\r\nHost: h\r\n\r\n"));
            let got = got.as_ref().map(|r| (r.request.path.as_str(), r.request.query.as_deref())).map_err(|e| *e);
            assert_eq!(got, want, "{target}");
        }
    }

    #[test]
    fn transfer_codings_and_expectations() {
        for (headers, want) in [
            ("Transfer-Encoding: chunked", Ok(false)),
            ("Transfer-Encoding: Chunked", Ok(false)),
            ("Transfer-Encoding: chunked, chunked", Err(411)),
            ("Transfer-Encoding: chunked\r\nContent-Length: 3", Err(411)),
            ("Transfer-Encoding: gzip", Err(501)),
            ("Transfer-Encoding: gzip, chunked", Err(501)),
            ("Transfer-Encoding: chunked\r\nTransfer-Encoding: br", Err(501)),
            ("Transfer-Encoding:", Err(400)),
            ("Transfer-Encoding: ,", Err(400)),
            ("Expect: 100-continue", Ok(true)),
            ("Expect: 100-Continue", Ok(true)),
            ("Expect: 200-ok", Err(417)),
            ("Expect: 100-continue, x", Err(417)),
            ("X: y", Ok(false)),
        ] {
            let got = status(&format!("POST / HTTP/1.1\r\nHost: h\r\n{headers}\r\n\r\n")).map(|r| r.expect_continue);
            assert_eq!(got, want, "{headers:?}");
        }
        let chunked = |req: &str| status(req).map(|r| r.chunked);
        assert_eq!(chunked("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"), Ok(true));
        assert_eq!(chunked("POST / HTTP/1.1\r\nHost: h\r\n\r\n"), Ok(false));
        assert_eq!(chunked("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"), Err(411));
        // HTTP/1.0 expectations are ignored.
        assert_eq!(status("GET / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n").map(|r| r.expect_continue), Ok(false));
        assert_eq!(status("GET / HTTP/1.0\r\nExpect: x\r\n\r\n").map(|r| r.expect_continue), Ok(false));
    }

    #[test]
    fn repeated_list_fields_are_joined() {
        let r = status("GET / HTTP/1.1\r\nHost: h\r\nIf-None-Match: \"a\"\r\nIf-Match: \"c\"\r\nIf-None-Match: \"b\"\r\nIf-Range: \"d\"\r\nIf-Range: \"e\"\r\n\r\n").unwrap();
        let strong = |o: &str| EntityTag::strong(o.into());
        let h = &r.request.headers;
        assert_eq!(h.if_none_match, Some(TagCondition::Tags(vec![strong("\"a\""), strong("\"b\"")])));
        assert_eq!(h.if_match, Some(TagCondition::Tags(vec![strong("\"c\"")])));
        assert_eq!(h.if_range, Some(IfRange::Invalid));
    }

    #[test]
    fn head_requests_are_recognised_before_parsing() {
        assert!(is_head(b"HEAD / HTTP/1.1\r\n"));
        assert!(is_head(b"\r\nHEAD /aaaa"));
        assert!(!is_head(b"GET / HTTP/1.1\r\n"));
        assert!(!is_head(b"HEADX / HTTP/1.1\r\n"));
    }

    #[test]
    fn connection_tokens() {
        for (version, connection, want) in [
            ("1.1", None, true),
            ("1.1", Some("close"), false),
            ("1.1", Some("Keep-Alive, CLOSE"), false),
            ("1.1", Some("upgrade"), true),
            ("1.0", None, false),
            ("1.0", Some("keep-alive"), true),
            ("1.0", Some("Keep-Alive"), true),
            ("1.0", Some("keep-alive, close"), false),
        ] {
            let field = connection.map(|c| format!("Connection: {c}\r\n")).unwrap_or_default();
            let head = format!("GET / HTTP/{version}\r\nHost: h\r\n{field}\r\n");
            assert_eq!(status(&head).map(|r| r.keep_alive), Ok(want), "{head:?}");
        }
    }

    #[test]
    fn websocket_upgrades() {
        // (request line, fields): whether it asks for a WebSocket tunnel.
        for (line, fields, want) in [
            ("GET /ws HTTP/1.1", "Connection: Upgrade\r\nUpgrade: websocket\r\n", true),
            ("GET /ws HTTP/1.1", "Connection: keep-alive, upgrade\r\nUpgrade: WebSocket/13\r\n", true),
            ("GET /ws HTTP/1.1", "Upgrade: h2c, websocket\r\nConnection: Upgrade\r\n", true),
            ("GET /ws HTTP/1.1", "Upgrade: websocket\r\n", false),
            ("GET /ws HTTP/1.1", "Connection: Upgrade\r\n", false),
            ("GET /ws HTTP/1.1", "Connection: Upgrade\r\nUpgrade: h2c\r\n", false),
            ("GET /ws HTTP/1.1", "Connection: Upgrade\r\nUpgrade: websocketx\r\n", false),
            ("POST /ws HTTP/1.1", "Connection: Upgrade\r\nUpgrade: websocket\r\n", false),
            ("GET /ws HTTP/1.0", "Connection: Upgrade\r\nUpgrade: websocket\r\n", false),
            ("GET /ws HTTP/1.1", "Connection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: 3\r\n", false),
        ] {
            let head = format!("{line}\r\nHost: h\r\n{fields}\r\n");
            let got = status(&head).map(|r| r.request.upgrade);
            assert_eq!(got, Ok(want.then(|| "websocket".to_string())), "{head:?}");
        }
    }

    #[test]
    fn content_lengths() {
        for (field, want) in [
            ("", Ok(0)),
            ("Content-Length: 0\r\n", Ok(0)),
            ("Content-Length: 42\r\n", Ok(42)),
            ("Content-Length: 7\r\nContent-Length: 7\r\n", Ok(7)),
            ("Content-Length: 1\r\nContent-Length: 01\r\n", Err(400)),
            ("Content-Length: 18446744073709551615\r\n", Ok(u64::MAX)),
            ("Content-Length: 18446744073709551616\r\n", Err(400)),
            ("Content-Length: \r\n", Err(400)),
            ("Content-Length: 1 2\r\n", Err(400)),
            ("Content-Length: 0x10\r\n", Err(400)),
        ] {
            let head = format!("POST / HTTP/1.1\r\nHost: h\r\n{field}\r\n");
            assert_eq!(status(&head).map(|r| r.content_length), want, "{field:?}");
        }
    }

    #[test]
    fn methods_become_typed() {
        for (token, want) in [
            ("GET", Method::Get),
            ("HEAD", Method::Head),
            ("OPTIONS", Method::Options),
            ("get", Method::Other("get".into())),
            ("M-SEARCH", Method::Other("M-SEARCH".into())),
        ] {
            assert_eq!(status(&format!("{token} / HTTP/1.1\r\nHost: h\r\n\r\n")).map(|r| r.request.method), Ok(want));
        }
        assert_eq!(status("G(T / HTTP/1.1\r\nHost: h\r\n\r\n").map(drop), Err(400), "not a token");
    }
}
