//! A hit as a [`Response`] whose body is the entry file from its body's offset,
//! so the codecs send it as they send a static file (sendfile over kTLS, the
//! same record-size policies, HTTP/2 DATA by sendfile); the request's
//! conditionals and single range answered from the stored full response with the
//! handler's own `preconditions` and `range`; and the RFC 9211 `Cache-Status`
//! value, built in one place.

use std::borrow::Cow;

use super::Hit;
use crate::files::Found;
use crate::handler::preconditions::{self, Outcome, Validators};
use crate::handler::range::RangeOutcome;
use crate::handler::request::{EntityTag, Headers};
use crate::handler::response::{field_name, ContentRange};
use crate::handler::{Body, Header, Method, Request, Response, Status};

/// Why a request went to the upstream (RFC 9211 section 2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fwd {
    /// The cache was not consulted (a method or a path the cache skips).
    Bypass,
    /// The method is not cacheable.
    Method,
    /// No entry for the key.
    Miss,
    /// An entry of another variant only (Vary).
    VaryMiss,
    /// The request asked for a fresh answer (no-cache).
    Request,
    /// The entry was stale.
    Stale,
}

impl Fwd {
    fn token(self) -> &'static str {
        match self {
            Fwd::Bypass => "bypass",
            Fwd::Method => "method",
            Fwd::Miss => "miss",
            Fwd::VaryMiss => "vary-miss",
            Fwd::Request => "request",
            Fwd::Stale => "stale",
        }
    }
}

/// What one response's `Cache-Status` says.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CacheStatus {
    /// Answered from the cache without going upstream.
    pub hit: bool,
    pub fwd: Option<Fwd>,
    /// The status the upstream answered with, when it differs from the one sent (a 304 that refreshed an entry).
    pub fwd_status: Option<u16>,
    /// The upstream's answer was stored.
    pub stored: bool,
    /// The request waited for another request's fill of the same key.
    pub collapsed: bool,
    /// More about the answer, e.g. `stale-while-revalidate`, `stale-if-error`.
    pub detail: Option<&'static str>,
}

impl CacheStatus {
    /// `ktlsd; hit`.
    pub fn hit() -> CacheStatus {
        CacheStatus { hit: true, ..CacheStatus::default() }
    }

    /// `ktlsd; fwd=...`.
    pub fn fwd(fwd: Fwd) -> CacheStatus {
        CacheStatus { fwd: Some(fwd), ..CacheStatus::default() }
    }
}

/// The `Cache-Status` value (RFC 9211): `ktlsd; hit`, `ktlsd; fwd=miss; stored`,
/// `ktlsd; fwd=stale; fwd-status=304`, `ktlsd; hit; detail=stale-while-revalidate`...
pub fn cache_status(s: &CacheStatus) -> String {
    let mut out = String::from("ktlsd");
    if s.hit {
        out.push_str("; hit");
    }
    if let Some(f) = s.fwd {
        out.push_str("; fwd=");
        out.push_str(f.token());
    }
    if let Some(code) = s.fwd_status {
        out.push_str("; fwd-status=");
        out.push_str(itoa::Buffer::new().format(code));
    }
    if s.stored {
        out.push_str("; stored");
    }
    if s.collapsed {
        out.push_str("; collapsed");
    }
    if let Some(d) = s.detail {
        out.push_str("; detail=");
        out.push_str(d);
    }
    out
}

/// Stored fields not sent with a hit: the codec writes its own Date and Server,
/// Content-Length and Accept-Ranges follow the range sent, Age is computed.
const REPLACED: &[&str] =
    &["date", "server", "content-length", "accept-ranges", "age", "cache-status", super::policy::VALID_FIELD];
/// The stored fields a 304 carries (RFC 9110 section 15.4.5).
const ON_304: &[&str] = &["cache-control", "content-location", "etag", "expires", "vary", "last-modified"];

impl Hit {
    /// The answer to `req` (GET or HEAD) from this entry, with `status` as its
    /// Cache-Status. A stored 200 answers conditionals (304, 412) and one byte range
    /// (206, 416) as a static file does; other stored statuses are sent whole.
    pub fn into_response(self, req: &Request, status: &CacheStatus) -> Response {
        let meta = self.meta.clone();
        let size = meta.body_len;
        // Room for the fields added below: the list is not grown again on each hit.
        let mut headers: Vec<Header> = Vec::with_capacity(meta.head.fields.len() + 6);
        headers.extend(
            meta.head
                .fields
                .iter()
                .filter(|(n, _)| !REPLACED.contains(&n.as_str()))
                .map(|(n, v)| Header::Field(field_name(n), v.clone())),
        );
        headers.push(age_field(self.age));
        headers.push(Header::Field(Cow::Borrowed("cache-status"), cache_status(status)));
        let head = req.method == Method::Head;
        if meta.head.status != 200 {
            // A 204 has no body and so no Content-Length (RFC 9110 section 8.6).
            if meta.head.status != 204 {
                headers.push(Header::ContentLength(size));
            }
            return self.with_body(Status(meta.head.status), headers, 0..size, head);
        }
        let (conditions, v) = conditions(&req.headers, meta.field("etag"), meta.field("last-modified"));
        match preconditions::evaluate(&conditions, &v) {
            Outcome::Proceed => {}
            Outcome::NotModified => return not_modified(headers),
            Outcome::Failed => return precondition_failed(cache_status(status)),
        }
        let range = resolve(&conditions, &v, size);
        headers.push(Header::AcceptRanges);
        match range {
            // Several ranges of a stored body: the whole body instead (RFC 9110 section 14.2
            // lets a server ignore Range); multipart answers are for files.
            RangeOutcome::Full | RangeOutcome::Multi(_) => {
                headers.push(Header::ContentLength(size));
                self.with_body(Status::OK, headers, 0..size, head)
            }
            RangeOutcome::Partial(r) => {
                headers.push(Header::ContentLength(r.end - r.start));
                headers.push(Header::ContentRange(ContentRange::Bytes { range: r.clone(), size }));
                self.with_body(Status::PARTIAL_CONTENT, headers, r, head)
            }
            RangeOutcome::Unsatisfiable => Response::page(Status::RANGE_NOT_SATISFIABLE)
                .with(Header::ContentRange(ContentRange::Unsatisfied { size }))
                .with(Header::Field(Cow::Borrowed("cache-status"), cache_status(status))),
        }
    }

    /// Seconds the response has been stored or upstream: its `Age`.
    pub fn age(&self) -> u64 {
        self.age
    }

    /// The stored fields (names in lower case), in the order received.
    pub fn fields(&self) -> &[(String, String)] {
        &self.meta.head.fields
    }

    /// The stored body's length.
    pub fn body_len(&self) -> u64 {
        self.meta.body_len
    }

    /// The bytes `range` of the stored body (within it) as a file body, sent as a
    /// hit's is; `None` when the entry is gone (purged or evicted since the lookup,
    /// and not held open by this worker).
    pub fn body(self, range: std::ops::Range<u64>) -> Option<Body> {
        let offset = self.meta.body_offset;
        let o = super::open::opened(&self.meta, self.file)?;
        let found = Found { file: o.file, meta: o.fstat, rel: o.rel, mime: "", content: o.content };
        Some(Body::File { found, range: offset + range.start..offset + range.end })
    }

    /// The response with `range` of the stored body (relative to the body) as a
    /// range of the entry file, or no body for HEAD.
    fn with_body(self, status: Status, headers: Vec<Header>, range: std::ops::Range<u64>, head: bool) -> Response {
        let offset = self.meta.body_offset;
        let Some(o) = super::open::opened(&self.meta, self.file) else {
            // Purged or evicted since the lookup, and not held open by this worker.
            return Response::page(Status(503));
        };
        let found = Found { file: o.file, meta: o.fstat, rel: o.rel, mime: "", content: o.content };
        let body = match head {
            true => Body::Empty,
            false => Body::File { found, range: offset + range.start..offset + range.end },
        };
        Response { status, headers, body, refused: None }
    }
}

/// The `Age` field of an answer from the cache, `age` seconds old.
pub fn age_field(age: u64) -> Header {
    Header::Field(Cow::Borrowed("age"), age.to_string())
}

/// The `304` of a `200` that would have carried `headers`: the fields a 304
/// carries (RFC 9110 section 15.4.5), `Age` and `Cache-Status`, no body. Field
/// names are compared in any case.
pub fn not_modified(mut headers: Vec<Header>) -> Response {
    headers.retain(|h| {
        let name = h.name();
        ON_304.iter().chain(&["age", "cache-status"]).any(|n| name.eq_ignore_ascii_case(n))
    });
    Response { status: Status::NOT_MODIFIED, headers, body: Body::Empty, refused: None }
}

/// The `412` of a failed `If-Match` or `If-Unmodified-Since`, with `cache_status`.
pub fn precondition_failed(cache_status: String) -> Response {
    Response::page(Status::PRECONDITION_FAILED).with(Header::Field(Cow::Borrowed("cache-status"), cache_status))
}

/// What the conditionals of a request with fields `req` decide for a `200` with
/// these ETag and Last-Modified values (RFC 9110 section 13.2.2's order), as a
/// hit decides it.
pub fn precondition(req: &Headers, etag: Option<&str>, modified: Option<&str>) -> Outcome {
    let (conditions, v) = conditions(req, etag, modified);
    preconditions::evaluate(&conditions, &v)
}

/// The request's conditions `req` as they apply to a stored (or arriving) 200 with
/// these ETag and Last-Modified values, and the response's validators.
fn conditions(req: &Headers, etag: Option<&str>, modified: Option<&str>) -> (Headers, Validators) {
    let etag = etag.and_then(parse_etag);
    let modified = modified.and_then(|v| httpdate::parse_http_date(v).ok());
    let mut conditions = req.clone();
    if modified.is_none() {
        // Without Last-Modified the date conditions have nothing to compare (RFC 9110 section 13.1.3, 13.1.4).
        conditions.if_modified_since = None;
        conditions.if_unmodified_since = None;
    }
    let v = Validators {
        // No stored ETag: a tag no request can name, so only `*` matches.
        etag: etag.unwrap_or(EntityTag { weak: false, opaque: String::new() }),
        modified: modified.unwrap_or(std::time::UNIX_EPOCH),
    };
    (conditions, v)
}

/// What the Range of `conditions` selects of `size` bytes, under its If-Range.
fn resolve(conditions: &Headers, v: &Validators, size: u64) -> RangeOutcome {
    match &conditions.range {
        Some(spec) if preconditions::range_applies(conditions, v) => spec.resolve(size),
        _ => RangeOutcome::Full,
    }
}

/// What the Range of a request with fields `req` selects of a 200 of `size` bytes
/// with these ETag and Last-Modified values (its If-Range compared with them), as
/// a hit would answer it: the cold range fill's window.
pub fn range_of(req: &Headers, etag: Option<&str>, modified: Option<&str>, size: u64) -> RangeOutcome {
    let (conditions, v) = conditions(req, etag, modified);
    resolve(&conditions, &v, size)
}

/// An ETag field value: `"x"` or `W/"x"`.
fn parse_etag(v: &str) -> Option<EntityTag> {
    let v = v.trim();
    let (weak, opaque) = match v.strip_prefix("W/") {
        Some(o) => (true, o),
        None => (false, v),
    };
    (opaque.len() >= 2 && opaque.starts_with('"') && opaque.ends_with('"'))
        .then(|| EntityTag { weak, opaque: opaque.to_string() })
}
