//! The answer as a description: status, typed header fields and a body the codec
//! writes (bytes in memory, or a range of an open file it sends by its own means).
//!
//! The codec adds what belongs to the connection (status line, Server, Date,
//! Connection); everything here is the same whichever protocol carries it.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::time::SystemTime;

use super::request::{Coding, EntityTag};
use crate::files::Found;

/// A response status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status(pub u16);

impl Status {
    pub const OK: Status = Status(200);
    pub const NO_CONTENT: Status = Status(204);
    pub const PARTIAL_CONTENT: Status = Status(206);
    pub const MOVED_PERMANENTLY: Status = Status(301);
    pub const NOT_MODIFIED: Status = Status(304);
    pub const BAD_REQUEST: Status = Status(400);
    pub const UNAUTHORIZED: Status = Status(401);
    pub const FORBIDDEN: Status = Status(403);
    pub const NOT_FOUND: Status = Status(404);
    pub const METHOD_NOT_ALLOWED: Status = Status(405);
    pub const REQUEST_TIMEOUT: Status = Status(408);
    pub const LENGTH_REQUIRED: Status = Status(411);
    pub const PRECONDITION_FAILED: Status = Status(412);
    pub const PAYLOAD_TOO_LARGE: Status = Status(413);
    pub const URI_TOO_LONG: Status = Status(414);
    pub const RANGE_NOT_SATISFIABLE: Status = Status(416);
    pub const EXPECTATION_FAILED: Status = Status(417);
    pub const MISDIRECTED_REQUEST: Status = Status(421);
    pub const TOO_MANY_REQUESTS: Status = Status(429);
    pub const HEADERS_TOO_LARGE: Status = Status(431);
    pub const NOT_IMPLEMENTED: Status = Status(501);
    pub const BAD_GATEWAY: Status = Status(502);
    pub const SERVICE_UNAVAILABLE: Status = Status(503);
    pub const GATEWAY_TIMEOUT: Status = Status(504);
    pub const VERSION_NOT_SUPPORTED: Status = Status(505);

    pub fn reason(self) -> &'static str {
        match self.0 {
            100 => "Continue",
            103 => "Early Hints",
            200 => "OK",
            204 => "No Content",
            206 => "Partial Content",
            301 => "Moved Permanently",
            302 => "Found",
            307 => "Temporary Redirect",
            308 => "Permanent Redirect",
            304 => "Not Modified",
            400 => "Bad Request",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "Not Found",
            405 => "Method Not Allowed",
            408 => "Request Timeout",
            411 => "Length Required",
            412 => "Precondition Failed",
            413 => "Content Too Large",
            414 => "URI Too Long",
            416 => "Range Not Satisfiable",
            417 => "Expectation Failed",
            421 => "Misdirected Request",
            429 => "Too Many Requests",
            431 => "Request Header Fields Too Large",
            500 => "Internal Server Error",
            501 => "Not Implemented",
            502 => "Bad Gateway",
            503 => "Service Unavailable",
            504 => "Gateway Timeout",
            505 => "HTTP Version Not Supported",
            _ => "",
        }
    }
}

/// Content-Range values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentRange {
    /// `bytes first-last/size` for a 206.
    Bytes { range: Range<u64>, size: u64 },
    /// `bytes */size` for a 416.
    Unsatisfied { size: u64 },
}

/// A header field's name: borrowed for the names most responses carry, so that those
/// cost no allocation; else owned.
pub type FieldName = Cow<'static, str>;

/// `name` as a [`FieldName`]: borrowed when it is one of the names most responses
/// carry, in the spellings met most (as most servers send them, and in lower case:
/// HTTP/2 upstreams, the cache's stored heads). Each arm compares the length before
/// the bytes, so a miss costs a few integer comparisons.
pub fn field_name(name: &str) -> FieldName {
    macro_rules! borrowed_if_one_of {
        ($($common:literal),* $(,)?) => {
            match name {
                $($common => Cow::Borrowed($common),)*
                _ => Cow::Owned(name.to_string()),
            }
        };
    }
    borrowed_if_one_of!(
        "Accept-Ranges",
        "Cache-Control",
        "Connection",
        "Content-Encoding",
        "Content-Language",
        "Content-Length",
        "Content-Location",
        "Content-Type",
        "Date",
        "ETag",
        "Expires",
        "Keep-Alive",
        "Last-Modified",
        "Server",
        "Transfer-Encoding",
        "Vary",
        "Via",
        "X-Content-Type-Options",
        "cache-control",
        "content-encoding",
        "content-language",
        "content-length",
        "content-location",
        "content-type",
        "date",
        "etag",
        "expires",
        "last-modified",
        "server",
        "vary",
        "via",
        "x-content-type-options",
    )
}

/// A response header field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Header {
    ContentType(Cow<'static, str>),
    ContentLength(u64),
    LastModified(SystemTime),
    ETag(EntityTag),
    /// `Accept-Ranges: bytes`.
    AcceptRanges,
    ContentRange(ContentRange),
    Location(String),
    /// `Allow: GET, HEAD, OPTIONS`, the methods answered (on 405 and on OPTIONS).
    Allow,
    StrictTransportSecurity(String),
    /// The coding of a precompressed or compressed variant.
    ContentEncoding(Coding),
    /// `Vary: Accept-Encoding`, on file answers of a site with precompressed variants
    /// and on those of files it compresses on the fly.
    VaryAcceptEncoding,
    /// A field from the site's configuration (header rules, CORS), its name and value
    /// checked at start-up.
    Field(FieldName, String),
}

impl Header {
    pub fn name(&self) -> &str {
        match self {
            Header::ContentType(_) => "Content-Type",
            Header::ContentLength(_) => "Content-Length",
            Header::LastModified(_) => "Last-Modified",
            Header::ETag(_) => "ETag",
            Header::AcceptRanges => "Accept-Ranges",
            Header::ContentRange(_) => "Content-Range",
            Header::Location(_) => "Location",
            Header::Allow => "Allow",
            Header::StrictTransportSecurity(_) => "Strict-Transport-Security",
            Header::ContentEncoding(_) => "Content-Encoding",
            Header::VaryAcceptEncoding => "Vary",
            Header::Field(name, _) => name,
        }
    }
}

impl Header {
    /// Appends the field value as sent (what `Display` writes), the fields of every
    /// file answer without `core::fmt`.
    pub fn write_value(&self, out: &mut String) {
        match self {
            Header::ContentType(t) => out.push_str(t),
            Header::ContentLength(n) => out.push_str(itoa::Buffer::new().format(*n)),
            Header::ETag(t) => {
                if t.weak {
                    out.push_str("W/");
                }
                out.push_str(&t.opaque);
            }
            Header::AcceptRanges => out.push_str("bytes"),
            Header::ContentRange(ContentRange::Bytes { range, size }) => {
                let mut b = itoa::Buffer::new();
                out.push_str("bytes ");
                out.push_str(b.format(range.start));
                out.push('-');
                out.push_str(b.format(range.end.saturating_sub(1)));
                out.push('/');
                out.push_str(b.format(*size));
            }
            other => {
                use fmt::Write as _;
                let _ = write!(out, "{other}");
            }
        }
    }
}

/// The field value as sent.
impl fmt::Display for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Header::ContentType(t) => f.write_str(t),
            Header::ContentLength(n) => write!(f, "{n}"),
            Header::LastModified(t) => f.write_str(&httpdate::fmt_http_date(*t)),
            Header::ETag(t) => write!(f, "{t}"),
            Header::AcceptRanges => f.write_str("bytes"),
            Header::ContentRange(ContentRange::Bytes { range, size }) => {
                write!(f, "bytes {}-{}/{size}", range.start, range.end.saturating_sub(1))
            }
            Header::ContentRange(ContentRange::Unsatisfied { size }) => write!(f, "bytes */{size}"),
            Header::Location(l) => f.write_str(l),
            Header::Allow => f.write_str("GET, HEAD, OPTIONS"),
            Header::StrictTransportSecurity(v) => f.write_str(v),
            Header::ContentEncoding(c) => f.write_str(c.token()),
            Header::VaryAcceptEncoding => f.write_str("Accept-Encoding"),
            Header::Field(_, value) => f.write_str(value),
        }
    }
}

/// What follows the head.
#[allow(clippy::large_enum_variant)] // one per request, on the stack for its life
pub enum Body {
    /// Nothing (304, and every answer to HEAD).
    Empty,
    /// A small body in memory (error pages, listings, challenge files).
    Bytes(Vec<u8>),
    /// Part of an open file, half-open, within its length.
    File { found: Found, range: Range<u64> },
    /// A body made of parts, each bytes in memory or a range of the one open file
    /// (a `multipart/byteranges` body: delimiters between file ranges).
    Parts { found: Found, parts: Vec<Part> },
}

impl Body {
    /// The bytes the body describes, read from its file where it has one.
    #[cfg(test)]
    pub fn read_all(&self) -> Vec<u8> {
        use std::os::unix::fs::FileExt;
        let read = |found: &Found, range: &Range<u64>| {
            let mut buf = vec![0; (range.end - range.start) as usize];
            found.file.read_exact_at(&mut buf, range.start).expect("read the body's file");
            buf
        };
        match self {
            Body::Empty => Vec::new(),
            Body::Bytes(b) => b.clone(),
            Body::File { found, range } => read(found, range),
            Body::Parts { found, parts } => parts
                .iter()
                .flat_map(|p| match p {
                    Part::Bytes(b) => b.clone(),
                    Part::File(r) => read(found, r),
                })
                .collect(),
        }
    }
}

pub use super::range::Part;

impl fmt::Debug for Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Body::Empty => f.write_str("Empty"),
            Body::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            Body::File { found, range } => write!(f, "File({:?}, {range:?})", found.rel),
            Body::Parts { found, parts } => write!(f, "Parts({:?}, {} parts)", found.rel, parts.len()),
        }
    }
}

/// One response.
#[derive(Debug)]
pub struct Response {
    pub status: Status,
    pub headers: Vec<Header>,
    pub body: Body,
    /// Why the request was refused, for the diagnostic log; `None` for answers that are
    /// no refusal (files, redirects, 304, 412, 416).
    pub refused: Option<Cow<'static, str>>,
}

impl Response {
    /// A complete small response with an HTML body naming the status.
    pub fn page(status: Status) -> Response {
        let body = format!(
            "<html><head><title>{code} {reason}</title></head><body><h1>{code} {reason}</h1></body></html>\n",
            code = status.0,
            reason = status.reason()
        );
        Response {
            status,
            headers: vec![Header::ContentType(Cow::Borrowed(HTML)), Header::ContentLength(body.len() as u64)],
            body: Body::Bytes(body.into_bytes()),
            refused: None,
        }
    }

    /// A page that refuses the request, saying why in the diagnostic log.
    pub fn refusal(status: Status, why: impl Into<Cow<'static, str>>) -> Response {
        Response { refused: Some(why.into()), ..Response::page(status) }
    }

    pub fn with(mut self, header: Header) -> Response {
        self.headers.push(header);
        self
    }

    /// The answer to a HEAD: the same head, Content-Length included, and no body.
    pub fn without_body(mut self) -> Response {
        self.body = Body::Empty;
        self
    }

    /// The first header of `name`.
    #[cfg(test)]
    pub fn header(&self, name: &str) -> Option<&Header> {
        self.headers.iter().find(|h| h.name().eq_ignore_ascii_case(name))
    }
}

pub const HTML: &str = "text/html; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_field_names_are_borrowed_as_spelled() {
        for (name, borrowed) in [
            ("Content-Type", true),
            ("content-type", true),
            ("ETag", true),
            ("etag", true),
            ("x-content-type-options", true),
            ("CONTENT-TYPE", false),
            ("X-App", false),
        ] {
            let got = field_name(name);
            assert_eq!(got, name, "the spelling is kept");
            assert_eq!(matches!(got, Cow::Borrowed(_)), borrowed, "{name}");
        }
    }

    #[test]
    fn header_values() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        for (h, want) in [
            (Header::ContentLength(12), "12"),
            (Header::LastModified(t), "Tue, 14 Nov 2023 22:13:20 GMT"),
            (Header::ETag(EntityTag::strong("\"a-1\"".into())), "\"a-1\""),
            (Header::ETag(EntityTag { weak: true, opaque: "\"a\"".into() }), "W/\"a\""),
            (Header::AcceptRanges, "bytes"),
            (Header::ContentRange(ContentRange::Bytes { range: 2..5, size: 10 }), "bytes 2-4/10"),
            (Header::ContentRange(ContentRange::Unsatisfied { size: 10 }), "bytes */10"),
            (Header::Allow, "GET, HEAD, OPTIONS"),
            (Header::Field("X-Frame-Options".into(), "DENY".into()), "DENY"),
            (Header::ContentType("text/plain".into()), "text/plain"),
            (Header::ContentRange(ContentRange::Bytes { range: 0..0, size: 0 }), "bytes 0-0/0"),
        ] {
            assert_eq!(h.to_string(), want, "{}", h.name());
            let mut written = String::from("x");
            h.write_value(&mut written);
            assert_eq!(written, format!("x{want}"), "{} as the head writes it", h.name());
        }
    }

    #[test]
    fn pages_name_their_status() {
        let r = Response::page(Status::NOT_FOUND);
        let Body::Bytes(body) = &r.body else { panic!("a page has a body") };
        let body = String::from_utf8_lossy(body);
        assert!(body.contains("<h1>404 Not Found</h1>"), "{body}");
        assert_eq!(r.header("content-length"), Some(&Header::ContentLength(body.len() as u64)));
        let r = r.without_body();
        assert!(matches!(r.body, Body::Empty));
        assert!(r.header("Content-Length").is_some());
        assert_eq!(Header::Field("X-Frame-Options".into(), String::new()).name(), "X-Frame-Options");
    }
}
