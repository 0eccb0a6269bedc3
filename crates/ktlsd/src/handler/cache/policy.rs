//! RFC 9111 for one entry: what a stored response may be used for, through the
//! `http-cache-semantics` crate (storability, freshness, Age, Vary matching,
//! Authorization), plus what that crate leaves out: the RFC 5861 extensions
//! `stale-while-revalidate` and `stale-if-error`, the fields a revalidation
//! sends, the merge of a 304's fields, and the cases this shared cache refuses
//! although the RFC would allow them (`Set-Cookie`, `Vary: *`, fields that are
//! not visible ASCII).
//!
//! It reads no file (see `entry`) and keeps no index (see `store`).

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use http_cache_semantics::{AfterResponse, BeforeRequest, CacheOptions, CachePolicy, RequestLike, ResponseLike};

use super::entry::{self, Head, Parsed};

/// The options of a shared cache (the crate's defaults: `private` is not stored,
/// `s-maxage` counts, heuristic freshness is 10% of the time since Last-Modified,
/// and only for the statuses RFC 9111 section 4.2.2 allows).
pub fn options() -> CacheOptions {
    CacheOptions { shared: true, ..CacheOptions::default() }
}

/// The stored field that carries a rule's `cache_valid` lifetime (seconds) for a
/// response whose origin gave no explicit freshness; never sent to a client.
pub const VALID_FIELD: &str = "ktlsd-cache-valid";

/// Whether `response` states its freshness itself (`max-age`, `s-maxage`, `Expires`).
pub fn explicit_freshness(response: &HeaderMap) -> bool {
    response.contains_key(http::header::EXPIRES)
        || response.get_all(http::header::CACHE_CONTROL).iter().filter_map(|v| v.to_str().ok()).any(|v| {
            v.split(',')
                .map(|d| d.trim().to_ascii_lowercase())
                .any(|d| d.starts_with("max-age") || d.starts_with("s-maxage"))
        })
}

/// The response's fields as the freshness rules read them: with [`VALID_FIELD`]'s
/// lifetime as `s-maxage` while the origin states none (`cache_valid`), else as they are.
pub fn with_valid(response: &HeaderMap) -> std::borrow::Cow<'_, HeaderMap> {
    let valid = response.get(VALID_FIELD).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    match valid {
        Some(secs) if !explicit_freshness(response) => {
            let mut view = response.clone();
            if let Ok(v) = HeaderValue::from_str(&format!("s-maxage={secs}")) {
                view.append(http::header::CACHE_CONTROL, v);
            }
            std::borrow::Cow::Owned(view)
        }
        _ => std::borrow::Cow::Borrowed(response),
    }
}

/// Fields that describe one connection, never stored (RFC 9110 section 7.6.1),
/// and those the codec writes itself for each answer.
const NOT_STORED: &[&str] =
    &["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"];
/// Fields a 304 may not change in the stored response (RFC 9111 section 3.2: the body is reused).
const KEPT_ON_REFRESH: &[&str] = &["content-length", "content-encoding", "transfer-encoding", "content-range"];

/// A request as the crate sees it: a GET (HEAD is answered from GET's entries)
/// with the request's fields less Host, whose primary key already matched.
pub struct View<'a>(pub &'a HeaderMap);

impl RequestLike for View<'_> {
    fn uri(&self) -> Uri {
        Uri::from_static("/")
    }
    fn is_same_uri(&self, _: &Uri) -> bool {
        // The primary key (host and target) matched before the crate is asked.
        true
    }
    fn method(&self) -> &Method {
        &Method::GET
    }
    fn headers(&self) -> &HeaderMap {
        self.0
    }
}

/// A stored response as the crate sees it.
pub struct Res<'a> {
    pub status: StatusCode,
    pub headers: &'a HeaderMap,
}

impl ResponseLike for Res<'_> {
    fn status(&self) -> StatusCode {
        self.status
    }
    fn headers(&self) -> &HeaderMap {
        self.headers
    }
}

/// What the cache knows of one stored entry.
#[derive(Debug)]
pub struct Meta {
    pub head: Head,
    pub policy: CachePolicy,
    pub body_offset: u64,
    pub body_len: u64,
    pub file_len: u64,
    /// The XXH3-64 of the body, as recorded in the file.
    pub body_sum: u64,
    /// The body was checked against `body_sum` (or written by this process):
    /// set by the first open after start that verifies it.
    pub verified: std::sync::atomic::AtomicBool,
    /// Fresh hits it answered since it was read or stored (the status page's hottest keys).
    pub hits: std::sync::atomic::AtomicU64,
    /// The entry left the index (evicted, purged, replaced, found corrupt): every
    /// worker holding its file closes it at its next lookup, so that the deleted
    /// file's disk space comes back although other workers hold it too.
    pub dropped: std::sync::atomic::AtomicBool,
    /// Where the entry's file is.
    pub path: PathBuf,
    /// The policy's figures, constant for an entry, kept so that a hit need not
    /// parse the stored fields again: when the response was received, its age then
    /// (its Age field), how long it stays fresh from then, and whether it has no Vary.
    response_time: SystemTime,
    age_at_response: Duration,
    fresh_for: Duration,
    plain: bool,
}

impl Meta {
    /// The entry read back from `path`; `None` when its head cannot form a policy
    /// (a field that is no longer valid): such a file is corrupt.
    pub fn new(parsed: Parsed, file_len: u64, path: PathBuf) -> Option<Meta> {
        let request = to_map(&parsed.head.request)?;
        let response = to_map(&parsed.head.fields)?;
        let response = with_valid(&response);
        let status = StatusCode::from_u16(parsed.head.status).ok()?;
        let response_time = entry::time(parsed.head.response_ms);
        let policy =
            CachePolicy::new_options(&View(&request), &Res { status, headers: &response }, response_time, options());
        Some(Meta {
            age_at_response: policy.age(response_time),
            fresh_for: policy.time_to_live(response_time),
            plain: parsed.head.request.is_empty() && stored_vary(&parsed.head.fields).is_empty(),
            response_time,
            head: parsed.head,
            policy,
            body_offset: parsed.body_offset,
            body_len: parsed.body_len,
            body_sum: parsed.body_sum,
            verified: std::sync::atomic::AtomicBool::new(false),
            hits: std::sync::atomic::AtomicU64::new(0),
            dropped: std::sync::atomic::AtomicBool::new(false),
            file_len,
            path,
        })
    }

    /// The entry's age at `now`: the crate's `age`, without reading the fields again.
    pub fn age(&self, now: SystemTime) -> Duration {
        self.age_at_response + now.duration_since(self.response_time).unwrap_or_default()
    }

    /// Whether the entry is stale at `now`: the crate's `is_stale` (its freshness
    /// lifetime at most its age), without reading the fields again.
    pub fn is_stale(&self, now: SystemTime) -> bool {
        self.fresh_for.is_zero() || now.duration_since(self.response_time).is_ok_and(|d| d >= self.fresh_for)
    }

    /// The response field `name` (lower-case), the first one.
    pub fn field(&self, name: &str) -> Option<&str> {
        field(&self.head.fields, name)
    }

    /// Fresh for `req` (fields less Host) at `now`, stale but matching (its Vary
    /// fields agree), or not for this request at all.
    pub fn freshness(&self, req: &HeaderMap, now: SystemTime) -> Freshness {
        // Without Vary and without the request's Cache-Control or Pragma, the crate's
        // answer is its staleness alone.
        if self.plain && !req.contains_key(http::header::CACHE_CONTROL) && !req.contains_key(http::header::PRAGMA) {
            return if self.is_stale(now) { Freshness::Stale } else { Freshness::Fresh };
        }
        match self.policy.before_request(&View(req), now) {
            BeforeRequest::Fresh(_) => Freshness::Fresh,
            BeforeRequest::Stale { matches: true, .. } => Freshness::Stale,
            BeforeRequest::Stale { matches: false, .. } => Freshness::Other,
        }
    }

    /// Whether `stale-while-revalidate` lets this stale entry be served while it is
    /// revalidated (RFC 5861 section 3): within its window, and neither the response
    /// (`must-revalidate`, `proxy-revalidate`, `no-cache`) nor the request
    /// (`no-cache`) asks for validation first.
    pub fn may_serve_while_revalidating(&self, req: &HeaderMap, now: SystemTime) -> bool {
        let Some(window) = self.directive("stale-while-revalidate") else { return false };
        !requires_validation(&self.head.fields) && !request_no_cache(req) && self.stale_within(window, now)
    }

    /// Whether `stale-if-error` (in the response, or in the request) lets this
    /// stale entry answer when the upstream failed (RFC 5861 section 4).
    pub fn may_serve_on_error(&self, req: &HeaderMap, now: SystemTime) -> bool {
        let asked = req
            .get_all(http::header::CACHE_CONTROL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|v| directive(v, "stale-if-error"));
        let Some(window) = self.directive("stale-if-error").or(asked) else { return false };
        !requires_validation(&self.head.fields) && self.stale_within(window, now)
    }

    /// Stale by less than `window` at `now` (a fresh entry is within any window).
    fn stale_within(&self, window: Duration, now: SystemTime) -> bool {
        !self.is_stale(now.checked_sub(window).unwrap_or(now))
    }

    /// A Cache-Control directive of the stored response with a number of seconds.
    fn directive(&self, name: &str) -> Option<Duration> {
        self.head.fields.iter().filter(|(n, _)| n == "cache-control").find_map(|(_, v)| directive(v, name))
    }

    /// The fields that make the upstream's answer to this request conditional on
    /// the stored response (If-None-Match with its ETag, If-Modified-Since with its
    /// Last-Modified): a 304 then lets [`super::Cache::refresh`] keep the body.
    pub fn revalidation(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (ours, theirs) in
            [("etag", http::header::IF_NONE_MATCH), ("last-modified", http::header::IF_MODIFIED_SINCE)]
        {
            if let Some(v) = self.field(ours).and_then(|v| HeaderValue::from_str(v).ok()) {
                h.insert(theirs, v);
            }
        }
        h
    }

    /// The head after a 304 `response` received at `now`: its fields replace the
    /// stored ones of the same name (except those describing the body), as RFC 9111
    /// section 4.3.4 says. `None` when the 304 does not select this response (the
    /// crate's `after_response`: its validators differ) and must not refresh it.
    pub fn refreshed(&self, response: &HeaderMap, now: SystemTime) -> Option<Head> {
        let request = to_map(&self.head.request)?;
        let not_modified = Res { status: StatusCode::NOT_MODIFIED, headers: response };
        if let AfterResponse::Modified(..) = self.policy.after_response(&View(&request), &not_modified, now) {
            return None;
        }
        let mut head = self.head.clone();
        let replaced: Vec<String> = response
            .keys()
            .map(|n| n.as_str().to_string())
            .filter(|n| !KEPT_ON_REFRESH.contains(&n.as_str()) && !NOT_STORED.contains(&n.as_str()))
            .collect();
        head.fields.retain(|(n, _)| !replaced.contains(n));
        for name in &replaced {
            for v in response.get_all(name.as_str()) {
                head.fields.push((name.clone(), v.to_str().ok()?.to_string()));
            }
        }
        head.response_ms = entry::millis(now);
        Some(head)
    }
}

/// How a stored entry stands for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    Fresh,
    Stale,
    /// Another variant (its Vary fields differ) or unusable for this request.
    Other,
}

/// Why a response is not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotStored {
    /// RFC 9111 section 3 forbids it (method, status, no-store, private, Authorization, no freshness).
    NotStorable,
    /// It sets a cookie: one client's cookie is never handed to another (nginx does the same).
    SetCookie,
    /// `Vary: *` never matches a later request.
    VaryAll,
    /// A field value that is not visible ASCII (not kept byte for byte).
    Field,
    /// Its Content-Length is above `max_object_size`.
    TooLarge,
    /// The cache directory could not be written (logged).
    Disk,
}

/// The head to store for a response to a request with fields `req` (less Host),
/// or why it is not stored.
pub fn admit(
    key: &str,
    req: &HeaderMap,
    status: StatusCode,
    response: &HeaderMap,
    now: SystemTime,
) -> Result<Head, NotStored> {
    let view = with_valid(response);
    let policy = CachePolicy::new_options(&View(req), &Res { status, headers: &view }, now, options());
    if !policy.is_storable() {
        return Err(NotStored::NotStorable);
    }
    if response.contains_key(http::header::SET_COOKIE) {
        return Err(NotStored::SetCookie);
    }
    let vary = vary_names(response);
    if vary.iter().any(|n| n == "*") {
        return Err(NotStored::VaryAll);
    }
    let connection: Vec<String> = response
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|n| n.trim().to_ascii_lowercase()))
        .collect();
    let mut fields = Vec::with_capacity(response.len());
    for (name, value) in response {
        let name = name.as_str();
        if NOT_STORED.contains(&name) || connection.iter().any(|c| c == name) {
            continue;
        }
        fields.push((name.to_string(), value.to_str().map_err(|_| NotStored::Field)?.to_string()));
    }
    let mut request = Vec::new();
    for name in &vary {
        for v in req.get_all(name.as_str()) {
            request.push((name.clone(), v.to_str().map_err(|_| NotStored::Field)?.to_string()));
        }
    }
    let ms = entry::millis(now);
    Ok(Head { key: key.to_string(), request, status: status.as_u16(), fields, stored_ms: ms, response_ms: ms })
}

/// The field names a response's Vary lists, lower-case.
pub fn vary_names(response: &HeaderMap) -> Vec<String> {
    split_vary(response.get_all(http::header::VARY).iter().filter_map(|v| v.to_str().ok()))
}

/// [`vary_names`] of stored fields.
pub fn stored_vary(fields: &[(String, String)]) -> Vec<String> {
    split_vary(fields.iter().filter(|(n, _)| n == "vary").map(|(_, v)| v.as_str()))
}

fn split_vary<'a>(values: impl Iterator<Item = &'a str>) -> Vec<String> {
    values.flat_map(|v| v.split(',')).map(|n| n.trim().to_ascii_lowercase()).filter(|n| !n.is_empty()).collect()
}

/// Which variant of its primary key a head is: a digest of the Vary fields it was
/// stored for (`0` without Vary), part of the file name.
pub fn secondary(head: &Head) -> String {
    if head.request.is_empty() && !head.fields.iter().any(|(n, _)| n == "vary") {
        return "0".into();
    }
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    for (n, v) in &head.request {
        ctx.update(n.as_bytes());
        ctx.update(b":");
        ctx.update(v.as_bytes());
        ctx.update(b"\n");
    }
    entry::hex(&ctx.finish().as_ref()[..8])
}

/// The first value of `name` in `fields`.
pub fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

fn to_map(fields: &[(String, String)]) -> Option<HeaderMap> {
    let mut map = HeaderMap::with_capacity(fields.len());
    for (n, v) in fields {
        map.append(HeaderName::from_bytes(n.as_bytes()).ok()?, HeaderValue::from_str(v).ok()?);
    }
    Some(map)
}

/// `name=SECONDS` in a Cache-Control value.
fn directive(value: &str, name: &str) -> Option<Duration> {
    value
        .split(',')
        .find_map(|d| {
            let (n, v) = d.split_once('=')?;
            (n.trim().eq_ignore_ascii_case(name)).then(|| v.trim().trim_matches('"').parse().ok()).flatten()
        })
        .map(Duration::from_secs)
}

/// Whether the stored response forbids serving it stale (RFC 9111 sections 5.2.2.2, 5.2.2.4, 5.2.2.8).
fn requires_validation(fields: &[(String, String)]) -> bool {
    fields.iter().filter(|(n, _)| n == "cache-control").any(|(_, v)| {
        v.split(',').any(|d| {
            let d = d.split('=').next().unwrap_or("").trim().to_ascii_lowercase();
            matches!(d.as_str(), "must-revalidate" | "proxy-revalidate" | "no-cache")
        })
    })
}

/// Whether the request asks for a validated answer (`no-cache`, or `Pragma: no-cache` without Cache-Control).
fn request_no_cache(req: &HeaderMap) -> bool {
    let cc: Vec<&str> = req.get_all(http::header::CACHE_CONTROL).iter().filter_map(|v| v.to_str().ok()).collect();
    if cc.is_empty() {
        return req.get_all(http::header::PRAGMA).iter().any(|v| v.to_str().is_ok_and(|v| v.contains("no-cache")));
    }
    cc.iter().flat_map(|v| v.split(',')).any(|d| d.trim().eq_ignore_ascii_case("no-cache"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures kept in `Meta` answer as the crate does, for every kind of freshness.
    #[test]
    fn kept_figures_agree_with_the_crate() {
        let t0 = entry::time(1_700_000_000_000);
        let date = httpdate::fmt_http_date(t0);
        let expires = httpdate::fmt_http_date(t0 + Duration::from_secs(90));
        let modified = httpdate::fmt_http_date(t0 - Duration::from_secs(1000));
        for fields in [
            vec![("cache-control", "max-age=60")],
            vec![("cache-control", "max-age=60"), ("age", "50")],
            vec![("cache-control", "max-age=60"), ("age", "600")],
            vec![("cache-control", "s-maxage=5, max-age=60")],
            vec![("cache-control", "no-cache, max-age=60")],
            vec![("date", date.as_str()), ("expires", expires.as_str())],
            vec![("date", date.as_str()), ("last-modified", modified.as_str())],
            vec![],
        ] {
            let head = Head {
                key: "GET  /".into(),
                request: Vec::new(),
                status: 200,
                fields: fields.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
                stored_ms: entry::millis(t0),
                response_ms: entry::millis(t0),
            };
            let meta = Meta::new(Parsed { head, body_offset: 0, body_len: 0, body_sum: 0 }, 0, PathBuf::new()).unwrap();
            for after in [0, 1, 4, 5, 6, 9, 10, 11, 59, 60, 61, 89, 90, 91, 100, 1000] {
                for now in [t0 + Duration::from_secs(after), t0 + Duration::from_millis(after * 1000 + 500)] {
                    assert_eq!(meta.is_stale(now), meta.policy.is_stale(now), "{fields:?} +{after}s");
                    assert_eq!(meta.age(now), meta.policy.age(now), "{fields:?} +{after}s");
                    let crate_says = match meta.policy.before_request(&View(&HeaderMap::new()), now) {
                        BeforeRequest::Fresh(_) => Freshness::Fresh,
                        BeforeRequest::Stale { matches: true, .. } => Freshness::Stale,
                        BeforeRequest::Stale { matches: false, .. } => Freshness::Other,
                    };
                    assert_eq!(meta.freshness(&HeaderMap::new(), now), crate_says, "{fields:?} +{after}s");
                }
            }
            assert_eq!(meta.is_stale(t0 - Duration::from_secs(5)), meta.policy.is_stale(t0 - Duration::from_secs(5)));
        }
    }
}
