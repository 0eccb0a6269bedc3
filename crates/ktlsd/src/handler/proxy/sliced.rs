//! Slices (`cache_slice`, nginx's `slice` module): on a `[[proxy]]` rule that has
//! it, every GET is answered from fixed-size, aligned slices of the object, each
//! fetched from the upstream with `Range: bytes=S-E` and stored as a cache entry of
//! its own (the object's key with the slice's size and index after it). A client's
//! range is answered from the slices it spans, fetching only the missing ones (each
//! slice's lookup coalesces with the other requests for it), and a whole-object
//! request is assembled from all of them. The client's conditionals are decided
//! on the first slice's validators (`304`, `412`, as a hit decides them), the
//! answer's `Age` is its oldest slice's, and a purge of the object removes its
//! slices ([`purge`]).
//!
//! Every slice is checked against the object it belongs to: its `Content-Range`
//! must be exactly the slice asked for, of the object's size, and its `ETag` and
//! `Last-Modified` those of the first slice the answer used. A stored slice that
//! differs is fetched again (and replaced); a fetched one that differs is never
//! stored: the answer is cut (its head is out) and the stored slices it used are
//! purged, so the next request assembles the new version only. An upstream that
//! ignores `Range` (a `200` with the whole body) has the client answered from that
//! body, and nothing is stored; a `206` with another `Content-Range` is refused
//! (502, or a cut answer once its head is out) and never stored.
//!
//! Memory: one piece ([`PIECE`]) per answer, whatever the object's or the slice's
//! size. An answer that one stored slice holds is that entry's file body (sent by
//! `sendfile`, as any hit); one that spans several slices is streamed piece by
//! piece, the stored slices read from their files (the page cache) on the worker.
//!
//! Not here: the lookups and files (`crate::handler::cache`), the exchange
//! (`super::Exchange`), the client's framing (the codecs).

use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use http::HeaderMap;

use super::parse::{Framing, Head};
use super::ranged::Window;
use super::replies::{answer, cut, refused, Added};
use super::{buffers, cached, client_fields, metrics, Exchange, Failure, FailureKind, Forwarding, Rule, PIECE};
use crate::handler::cache::{self, Cache, CacheStatus, FillGuard, Fwd, Key, Lookup};
use crate::handler::downstream::{Downstream, Outcome, StreamEnd, Streamed};
use crate::handler::preconditions::Outcome as Precondition;
use crate::handler::range::{RangeOutcome, RangeSet};
use crate::handler::request::Headers;
use crate::handler::response::{field_name, ContentRange, FieldName};
use crate::handler::{Body, Header, Method, Request, Response, Status};
use crate::vocab::BodyPath;

/// Request fields not sent with a slice's request: the client's own range and
/// conditionals (a slice is asked for whole and without conditions; the client's
/// range is cut out of the slices here).
const NOT_SENT: [&str; 6] =
    ["range", "if-range", "if-match", "if-none-match", "if-modified-since", "if-unmodified-since"];

/// Fields of a slice's answer that describe that slice or that answer, not the
/// object: not on the client's answer (which gets its own length, range, Date,
/// Server and Cache-Status).
const NOT_OBJECT: [&str; 8] = [
    "content-length",
    "content-range",
    "accept-ranges",
    "age",
    "date",
    "server",
    "cache-status",
    cache::policy::VALID_FIELD,
];

/// The slice size of a request `rule` answers from slices: a GET without a body
/// (nor a tunnel) on a rule with `cache_slice`, that `cache_bypass` does not send
/// upstream as it is. `fields`: the request's fields as the upstream would get them.
pub fn applies(rule: &Rule, req: &Request, fwd: &Forwarding, fields: &[(String, String)]) -> Option<u64> {
    let n = rule.control.cache_slice?;
    let sliced = req.method == Method::Get
        && fwd.body.is_none()
        && fwd.upgrade.is_none()
        && !rule.control.cache_bypass.applies(fields, req.query.as_deref());
    sliced.then_some(n)
}

/// What tells one version of an object from another: its size and validators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub size: u64,
    pub etag: Option<String>,
    pub modified: Option<String>,
}

impl Version {
    /// The version a slice's `fields` name, of an object of `size` bytes.
    fn of<N: AsRef<str>>(fields: &[(N, String)], size: u64) -> Version {
        let text = |name| field(fields, name).map(str::to_string);
        Version { size, etag: text("etag"), modified: text("last-modified") }
    }

    /// How it reads in a log line.
    fn shown(&self) -> String {
        let etag = self.etag.as_deref().unwrap_or("none");
        let modified = self.modified.as_deref().unwrap_or("none");
        format!("{} bytes, ETag {etag}, Last-Modified {modified}", self.size)
    }
}

/// The value of the field `name` (any case) in `fields`.
fn field<'a, N: AsRef<str>>(fields: &'a [(N, String)], name: &str) -> Option<&'a str> {
    fields.iter().find(|(n, _)| n.as_ref().eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

/// The slices (their indices, half-open) that the bytes `range` span, with slices
/// of `n` bytes; none for an empty range.
pub fn spans(range: &Range<u64>, n: u64) -> Range<u64> {
    if range.is_empty() || n == 0 {
        return 0..0;
    }
    range.start / n..(range.end - 1) / n + 1
}

/// The bytes of slice `index` of an object of `size` bytes, with slices of `n`
/// bytes (the last one may be shorter; empty past the end).
pub fn bounds(index: u64, n: u64, size: u64) -> Range<u64> {
    let start = index.saturating_mul(n).min(size);
    start..start.saturating_add(n).min(size)
}

/// The `Range` value that asks for slice `index` (its last byte may lie past the
/// object's end: the upstream answers what there is).
pub fn range_field(index: u64, n: u64) -> String {
    let start = index.saturating_mul(n);
    format!("bytes={start}-{}", start.saturating_add(n.saturating_sub(1)))
}

/// The slice asked for first: the one of the client's first byte when it names
/// one (`first-`, `first-last`); else slice 0, whose answer gives the size (a
/// suffix range, several ranges, none), as nginx's `slice` does.
pub fn first_slice(range: Option<&RangeSet>, n: u64) -> u64 {
    match (range.and_then(RangeSet::first_byte), n) {
        (Some(first), 1..) => first / n,
        _ => 0,
    }
}

/// A `Content-Range: bytes first-last/size` value: its bytes (half-open) and the
/// size; `None` for anything else (`bytes */size`, an unknown size `*`, garbage).
pub fn content_range(v: &str) -> Option<(Range<u64>, u64)> {
    let v = v.trim();
    let rest = v.get(..6).filter(|u| u.eq_ignore_ascii_case("bytes "))?;
    let rest = &v[rest.len()..];
    let (span, size) = rest.trim_start().split_once('/')?;
    let (first, last) = span.split_once('-')?;
    let number = |s: &str| s.bytes().all(|b| b.is_ascii_digit()).then(|| s.parse::<u64>().ok()).flatten();
    let (first, last, size) = (number(first)?, number(last)?, number(size)?);
    (first <= last && last < size).then_some((first..last + 1, size))
}

/// The size a 416's `Content-Range: bytes */size` gives.
pub fn unsatisfied_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let unit = v.get(..6).filter(|u| u.eq_ignore_ascii_case("bytes "))?;
    let size = v[unit.len()..].trim_start().strip_prefix("*/")?;
    size.bytes().all(|b| b.is_ascii_digit()).then(|| size.parse().ok()).flatten()
}

/// Removes every stored slice of the object `key` names, in slices of `n` bytes
/// (`POST /cache/purge` of a URL whose rule has `cache_slice`); how many entries
/// were removed. See [`purge_count`] for how they are found.
pub fn purge(cache: &Cache, key: &Key, n: u64) -> usize {
    let size = cache.stored_field(&key.slice(n, 0), "content-range").and_then(|v| content_range(&v)).map(|(_, s)| s);
    match purge_count(size, n, cache.figures().entries) {
        Some(count) => (0..count).map(|i| cache.purge(&key.slice(n, i))).sum(),
        None => cache.purge_prefix(&key.slices(n)),
    }
}

/// How the slices of an object are found for a purge: `Some(count)`, the slices
/// 0 to `count - 1` of an object of `size` bytes (as its stored slice 0 tells it)
/// in slices of `n` bytes, each purged by its key, when there are no more of them
/// than the `entries` the cache holds; else `None`, a walk of the cache's index
/// for the keys of the object's slices (slice 0 is not stored, or its size calls
/// for more keys than there are entries). Either way the work is bounded by the
/// number of entries.
pub fn purge_count(size: Option<u64>, n: u64, entries: u64) -> Option<u64> {
    let count = size.filter(|_| n > 0)?.div_ceil(n);
    (count <= entries).then_some(count)
}

/// Why an upstream's answer to a slice's request is not that slice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A `200`: the upstream ignored `Range` and sends the whole object.
    #[error("it ignored Range (200 with the whole body)")]
    Ignored,
    #[error("it answered {0}")]
    Status(u16),
    #[error("its 206 has no valid Content-Range ({0:?})")]
    NoRange(String),
    #[error("its Content-Range {got:?} is not the slice asked for ({want})")]
    WrongRange { got: String, want: String },
    #[error("its body's length is not its Content-Range's")]
    Length,
}

/// The object's size an upstream's answer to the request for slice `index` (slices
/// of `n` bytes) gives, once checked: a `206` whose `Content-Range` is exactly
/// that slice of an object of that size (`known`, when an earlier slice told it),
/// and whose body has that length.
pub fn check(
    status: u16,
    content_range: Option<&str>,
    framing: Framing,
    index: u64,
    n: u64,
    known: Option<u64>,
) -> Result<u64, Refusal> {
    match status {
        206 => {}
        200 => return Err(Refusal::Ignored),
        s => return Err(Refusal::Status(s)),
    }
    let text = content_range.unwrap_or_default();
    let (bytes, size) = content_range.and_then(content_range_of).ok_or_else(|| Refusal::NoRange(text.into()))?;
    let want = bounds(index, n, known.unwrap_or(size));
    if bytes != want || known.is_some_and(|k| k != size) || want.is_empty() {
        let want = match known {
            Some(k) => format!("bytes {}-{}/{k}", want.start, want.end.saturating_sub(1)),
            None => range_field(index, n),
        };
        return Err(Refusal::WrongRange { got: text.into(), want });
    }
    match framing {
        Framing::Length(len) if len == bytes.end - bytes.start => Ok(size),
        _ => Err(Refusal::Length),
    }
}

/// [`content_range`] for `Option::and_then`.
fn content_range_of(v: &str) -> Option<(Range<u64>, u64)> {
    content_range(v)
}

/// What the client gets of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `200` with these bytes (all of it).
    Whole(Range<u64>),
    /// `206` with these bytes.
    Part(Range<u64>),
    /// `416`.
    Unsatisfiable,
}

/// What a request with fields `req` gets of the object `v`: its one range (`206`),
/// the whole object (no range, several ranges, an `If-Range` that does not match:
/// `200`, as a hit answers), or `416` for a range past the end.
pub fn reply(req: &Headers, v: &Version) -> Reply {
    match cache::range_of(req, v.etag.as_deref(), v.modified.as_deref(), v.size) {
        RangeOutcome::Partial(r) => Reply::Part(r),
        RangeOutcome::Unsatisfiable => Reply::Unsatisfiable,
        RangeOutcome::Full | RangeOutcome::Multi(_) => Reply::Whole(0..v.size),
    }
}

/// What a slice's lookup or request brought.
#[allow(clippy::large_enum_variant)] // one per slice, moved once
enum Got<'r> {
    /// A stored slice of the object, of this version.
    Hit(cache::Hit, Version),
    /// A slice being fetched: its body is read from `up`, into `store` when it is
    /// stored (never when its version is not the one asked for).
    Fetch { up: Exchange<'r>, store: Option<cached::Store>, version: Version, head: Head },
    /// The upstream answered with the whole object (a `200`, Range ignored).
    Whole { up: Exchange<'r>, head: Head },
    /// The slice starts past the object's end (a `416` naming the size).
    Past { size: u64, head: Head },
    /// Another answer (a `404`, a `206` without a slice's `Content-Range`...).
    Other { up: Exchange<'r>, head: Head, why: Refusal },
}

/// Why an answer being streamed stopped.
enum Stop<E> {
    Client(E),
    Failed(Failure),
}

/// One object's slices, for one request.
struct Slicer<'r> {
    rule: &'r Rule,
    fwd: Forwarding,
    /// The request's fields as the upstream gets them, less [`NOT_SENT`].
    fields: Vec<(String, String)>,
    /// The request's fields (less Host) for the lookups.
    map: HeaderMap,
    cache: Arc<Cache>,
    /// The object's key.
    key: Key,
    /// The slice size.
    n: u64,
}

impl<'r> Slicer<'r> {
    /// Slice `index`: stored (of the version `known`, when given), or fetched. A
    /// stored slice of another version, or whose range is not the slice's, is
    /// fetched again and replaced.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped lookup or fill leaves nothing behind.
    async fn obtain(&self, index: u64, known: Option<&Version>) -> Result<Got<'r>, Failure> {
        let key = self.key.slice(self.n, index);
        let guard = match self.cache.lookup(&key, &self.map).await {
            Lookup::Hit(hit) => {
                let range = field(hit.fields(), "content-range");
                let size = check(206, range, Framing::Length(hit.body_len()), index, self.n, known.map(|v| v.size));
                let version = size.ok().map(|size| Version::of(hit.fields(), size));
                match (version, known) {
                    (Some(v), None) => return Ok(Got::Hit(hit, v)),
                    (Some(v), Some(k)) if v == *k => return Ok(Got::Hit(hit, v)),
                    (stored, Some(k)) => {
                        let stored = stored.map_or_else(|| "another range".to_string(), |v| v.shown());
                        tracing::info!(
                            "cache slice {index} of {}: stored as {stored}, the object is {}; fetched again",
                            self.fwd.target,
                            k.shown()
                        );
                        self.cache.bypass(&key, &self.map)
                    }
                    (None, None) => self.cache.bypass(&key, &self.map),
                }
            }
            Lookup::Miss(fill) => fill,
            Lookup::Stale(mut stale) => stale.fill.take().unwrap_or_else(|| self.cache.bypass(&key, &self.map)),
        };
        self.fetch(index, guard, known).await
    }

    /// Asks the upstream for slice `index`; its answer is stored by `guard` when it
    /// is that slice of the version `known` (any version when `None`).
    ///
    /// # Cancel safety
    /// Cancel-safe: the upstream connection is closed, the fill abandoned.
    async fn fetch(&self, index: u64, guard: FillGuard, known: Option<&Version>) -> Result<Got<'r>, Failure> {
        let mut fields = self.fields.clone();
        fields.push(("Range".into(), range_field(index, self.n)));
        let mut up = Exchange::begin(self.rule, self.fwd.clone(), fields).await?;
        let head = up.response().await?;
        let range = field(&head.fields, "content-range");
        match check(head.status, range, head.framing, index, self.n, known.map(|v| v.size)) {
            Ok(size) => {
                let version = Version::of(&head.fields, size);
                let store = match known {
                    Some(k) if *k != version => None,
                    _ => self.admit(guard, &head),
                };
                Ok(Got::Fetch { up, store, version, head })
            }
            Err(Refusal::Ignored) => Ok(Got::Whole { up, head }),
            Err(why @ Refusal::Status(416)) => match range.and_then(unsatisfied_size) {
                Some(size) => Ok(Got::Past { size, head }),
                None => Ok(Got::Other { up, head, why }),
            },
            Err(why) => Ok(Got::Other { up, head, why }),
        }
    }

    /// The entry writer of a slice's answer `head` (a 206), stored as the `200` of
    /// that slice with its `Content-Range` kept; `None` when it may not be stored.
    fn admit(&self, guard: FillGuard, head: &Head) -> Option<cached::Store> {
        let as_200 = Head { status: 200, fields: head.fields.clone(), ..*head };
        let parts = cached::stored_parts(&as_200, &self.rule.control.cache_valid);
        match guard.admit(&parts, SystemTime::now()) {
            Ok(w) => Some(cached::Store::new(w)),
            Err(why) => {
                tracing::debug!("cache slice of {} not stored: {why:?}", self.fwd.target);
                None
            }
        }
    }

    /// Purges the stored slices `used` of the object (a version that the
    /// upstream no longer has).
    fn purge(&self, used: &[u64]) {
        for &i in used {
            self.cache.purge(&self.key.slice(self.n, i));
        }
    }
}

/// Answers `req` from the slices of `n` bytes of the object `key` names (see the
/// module's doc), with `fields` as the upstream gets the request.
///
/// # Cancel safety
/// Dropped at any await (the client gone), it leaves nothing half-done: the slice
/// being fetched is abandoned (its temporary file removed, its waiters woken) and
/// its upstream connection closed; slices committed stay stored.
#[allow(clippy::too_many_arguments)] // the forward's parts, handed over once
pub async fn forward<D: Downstream>(
    rule: &Rule,
    fwd: Forwarding,
    mut fields: Vec<(String, String)>,
    cache: Arc<Cache>,
    key: Key,
    n: u64,
    req: &Request,
    d: &mut D,
    added: &Added,
) -> Outcome<D::Error> {
    fields.retain(|(name, _)| !NOT_SENT.iter().any(|x| name.eq_ignore_ascii_case(x)));
    let mut map = cached::header_map(&fields);
    map.remove(http::header::HOST);
    let s = Slicer { rule, fwd, fields, map, cache, key, n };
    let miss = cache::cache_status(&CacheStatus::fwd(Fwd::Miss));
    let first = first_slice(req.headers.range.as_ref(), n);
    let got = match s.obtain(first, None).await {
        Ok(got) => got,
        Err(f) => return refused(f, req, miss),
    };
    let (version, object): (Version, Vec<(FieldName, String)>) = match &got {
        Got::Hit(hit, v) => (v.clone(), hit.fields().iter().map(|(n, v)| (field_name(n), v.clone())).collect()),
        Got::Fetch { version, head, .. } => (version.clone(), head.fields.clone()),
        Got::Past { size, head } => (Version::of(&head.fields, *size), head.fields.clone()),
        Got::Whole { .. } | Got::Other { .. } => {
            cached::note(rule, req, &miss);
            return pass(got, &s, req, d, added, &miss).await;
        }
    };
    let etag = version.etag.as_deref();
    match cache::precondition(&req.headers, etag, version.modified.as_deref()) {
        Precondition::Proceed => {}
        decided => {
            let not_modified = decided == Precondition::NotModified;
            return conditional(not_modified, got, &s, req, &version, &object, &miss).await;
        }
    }
    let (status, range) = match reply(&req.headers, &version) {
        Reply::Part(r) => (206, r),
        Reply::Whole(r) => (200, r),
        Reply::Unsatisfiable => {
            cached::note(rule, req, &miss);
            let response = Response::page(Status::RANGE_NOT_SATISFIABLE)
                .with(Header::ContentRange(ContentRange::Unsatisfied { size: version.size }))
                .with(Header::Field("Cache-Status".into(), miss));
            return answer(response, false);
        }
    };
    let span = spans(&range, n);
    let first_hit = matches!(got, Got::Hit(..));
    // The oldest of the slices known before the head leaves: all of them on a
    // hit; those up to the first one to fetch on a miss.
    let (mut all_hit, mut age) = (true, None);
    for i in span.clone() {
        let slice_age = match i == first {
            true => age_of(&got),
            // A request that leads the fill of its first slice waits for no other.
            false => s.cache.fresh_age(&s.key.slice(n, i), &s.map, first_hit).await,
        };
        all_hit &= match i == first {
            true => first_hit,
            false => slice_age.is_some(),
        };
        age = age.max(slice_age);
        if !all_hit {
            break;
        }
    }
    let cache_status = cache::cache_status(&if all_hit { CacheStatus::hit() } else { CacheStatus::fwd(Fwd::Miss) });
    cached::note(rule, req, &cache_status);
    let mut headers = client_head(&object, status, &range, version.size, &cache_status);
    headers.extend(age.map(cache::age_field));
    let mut piece = buffers::take();
    let mut held = Some(got);
    if !span.contains(&first) {
        // Not part of the answer (a suffix range, an If-Range that did not match):
        // a slice being fetched is stored all the same.
        if let Some(Got::Fetch { mut up, store: Some(store), .. }) = held.take() {
            fill(&mut up, store, &mut piece, req).await;
        }
    }
    if range.is_empty() {
        // A zero-length object: nothing to assemble.
        buffers::give(piece);
        let response = Response { status: Status(status), headers, body: Body::Empty, refused: None };
        return answer(response, all_hit);
    }
    let mut first = first;
    if span.end - span.start == 1 {
        // One slice holds the answer: when it is stored, its entry file's bytes are
        // the body, sent as any hit's.
        let only = span.start;
        let got = match held.take() {
            Some(got) if only == first => got,
            _ => match s.obtain(only, Some(&version)).await {
                Ok(got) => got,
                Err(f) => return refused(f, req, miss),
            },
        };
        match got {
            Got::Hit(hit, _) => {
                let b = bounds(only, n, version.size);
                if let Some(body) = hit.body(range.start - b.start..range.end - b.start) {
                    buffers::give(piece);
                    let response = Response { status: Status(status), headers, body, refused: None };
                    return answer(response, true);
                }
            }
            got => (held, first) = (Some(got), only),
        }
    }
    added.apply(&mut headers);
    let len = range.end - range.start;
    let response = Response { status: Status(status), headers, body: Body::Empty, refused: None };
    let head_sent = d.send_head(response, Some(len), &[], false, None).await;
    let answered = Instant::now();
    let mut out = Out { left: len, sent: 0 };
    let end = match head_sent {
        Err(e) => StreamEnd::Client(e),
        Ok(()) => match assemble(&s, req, d, &mut out, &version, range, first, held, &mut piece).await {
            Ok(()) => StreamEnd::Complete,
            Err(Stop::Client(e)) => StreamEnd::Client(e),
            Err(Stop::Failed(f)) => cut(d, req, f, out.sent),
        },
    };
    buffers::give(piece);
    tracing::debug!("sliced \"{} {}\": {status} with {} body bytes", req.method, req.path, out.sent);
    Outcome::Streamed(Streamed { status, answered, sent: out.sent, path: BodyPath::Copy, end })
}

/// The age of slice `got` for the answer's `Age`: a stored slice's, or the
/// `Age` its upstream sent with a slice fetched now (a miss passes it on).
fn age_of(got: &Got<'_>) -> Option<u64> {
    match got {
        Got::Hit(hit, _) => Some(hit.age()),
        Got::Fetch { head, .. } => upstream_age(&head.fields),
        Got::Whole { .. } | Got::Past { .. } | Got::Other { .. } => None,
    }
}

/// The `Age` in an upstream's fields `fields`: a number of seconds (RFC 9111
/// section 5.1), else none.
pub fn upstream_age<N: AsRef<str>>(fields: &[(N, String)]) -> Option<u64> {
    let v = field(fields, "age")?.trim();
    v.bytes().all(|b| b.is_ascii_digit()).then(|| v.parse().ok()).flatten()
}

/// The answer when the client's conditionals, compared with the validators of
/// the first slice (`version`, whose stored or fetched answer is `got`), decided
/// it: `304` with the object's fields `object` that a 304 carries
/// (`not_modified`), else `412`. A slice being fetched is stored first (the
/// answer waits for it).
///
/// # Cancel safety
/// Cancel-safe: dropped, the slice's fill is abandoned.
async fn conditional<'r, E>(
    not_modified: bool,
    got: Got<'r>,
    s: &Slicer<'r>,
    req: &Request,
    version: &Version,
    object: &[(FieldName, String)],
    miss: &str,
) -> Outcome<E> {
    let hit = matches!(got, Got::Hit(..));
    let cache_status = if hit { cache::cache_status(&CacheStatus::hit()) } else { miss.to_string() };
    cached::note(s.rule, req, &cache_status);
    let age = age_of(&got);
    if let Got::Fetch { mut up, store: Some(store), .. } = got {
        let mut piece = buffers::take();
        fill(&mut up, store, &mut piece, req).await;
        buffers::give(piece);
    }
    let response = match not_modified {
        true => {
            let mut headers = client_head(object, 200, &(0..version.size), version.size, &cache_status);
            headers.extend(age.map(cache::age_field));
            cache::not_modified(headers)
        }
        false => cache::precondition_failed(cache_status),
    };
    answer(response, hit)
}

/// The body bytes of an answer still to send, and those sent.
struct Out {
    left: u64,
    sent: u64,
}

/// Sends `bytes` of the answer (the last of them ends it).
///
/// # Cancel safety
/// Not cancel-safe: part of the piece may have been sent.
async fn send<D: Downstream>(d: &mut D, out: &mut Out, bytes: &[u8]) -> Result<(), Stop<D::Error>> {
    if bytes.is_empty() {
        return Ok(());
    }
    let n = bytes.len() as u64;
    out.left = out.left.saturating_sub(n);
    out.sent += n;
    metrics::body_bytes(BodyPath::Copy.label(), n);
    d.send_body(bytes, out.left == 0).await.map_err(Stop::Client)
}

/// Streams the bytes `range` of the object `version` to the client, slice by
/// slice from the first the range spans; `held` is slice `first`'s, when it is
/// still to be used.
///
/// # Cancel safety
/// Not cancel-safe: the answer is part sent (see [`forward`]).
#[allow(clippy::too_many_arguments)] // one answer's state, handed over once
async fn assemble<D: Downstream>(
    s: &Slicer<'_>,
    req: &Request,
    d: &mut D,
    out: &mut Out,
    version: &Version,
    range: Range<u64>,
    first: u64,
    mut held: Option<Got<'_>>,
    piece: &mut Vec<u8>,
) -> Result<(), Stop<D::Error>> {
    let mut used = Vec::new();
    for i in spans(&range, s.n) {
        let got = match held.take_if(|_| i == first) {
            Some(got) => got,
            None => s.obtain(i, Some(version)).await.map_err(Stop::Failed)?,
        };
        let b = bounds(i, s.n, version.size);
        let clip = range.start.max(b.start) - b.start..range.end.min(b.end) - b.start;
        match got {
            Got::Hit(hit, _) => {
                used.push(i);
                let body =
                    hit.body(clip).ok_or_else(|| Stop::Failed(local_failure(s, i, "the stored slice is gone")))?;
                send_file(s, i, d, out, body, piece).await?;
            }
            Got::Fetch { mut up, store, version: v, .. } if v == *version => {
                pour(req, &mut up, store, &mut Window::new(clip), d, out, piece).await?;
            }
            Got::Fetch { up, version: v, .. } => {
                s.purge(&used);
                tracing::warn!(
                    "proxy \"{} {}\": slice {i} is {}, the object was {}: not mixed; the stored slices used are purged",
                    req.method,
                    req.path,
                    v.shown(),
                    version.shown()
                );
                let why = format!("slice {i} is of another version of the object ({})", v.shown());
                return Err(Stop::Failed(up.failure_now(FailureKind::Invalid, &why)));
            }
            Got::Whole { mut up, head } => {
                if Version::of(&head.fields, whole_size(&head).unwrap_or(u64::MAX)) != *version {
                    s.purge(&used);
                    let why = "the upstream ignored Range and sent another version of the object";
                    return Err(Stop::Failed(up.failure_now(FailureKind::Invalid, why)));
                }
                ignored(req, i);
                // The rest of the answer comes from this body; nothing is stored.
                let mut window = Window::new(range.start.max(b.start)..range.end);
                pour(req, &mut up, None, &mut window, d, out, piece).await?;
                return Ok(());
            }
            Got::Past { .. } => {
                return Err(Stop::Failed(local_failure(s, i, "the upstream says the slice is past the object's end")));
            }
            Got::Other { up, head, why } => {
                tracing::warn!("proxy \"{} {}\": slice {i} refused: {why}; not stored", req.method, req.path);
                let why = format!("invalid answer to slice {i} ({} {}): {why}", head.status, range_field(i, s.n));
                return Err(Stop::Failed(up.failure_now(FailureKind::Invalid, &why)));
            }
        }
    }
    Ok(())
}

/// Reads a body from `up`: each piece into `store` (a slice being stored) and
/// the client's part of it (`window`) to the client; once the client has its
/// part, the rest into the entry only (not read at all when nothing is stored).
/// The entry is committed once the body is whole. A body that ends before the
/// client's part is a failure.
///
/// # Cancel safety
/// Not cancel-safe: part of a piece may have been sent. Dropped, the entry is
/// abandoned.
async fn pour<D: Downstream>(
    req: &Request,
    up: &mut Exchange<'_>,
    mut store: Option<cached::Store>,
    window: &mut Window,
    d: &mut D,
    out: &mut Out,
    piece: &mut Vec<u8>,
) -> Result<(), Stop<D::Error>> {
    loop {
        let end = next_piece(up, piece).await.map_err(Stop::Failed)?;
        if let Some(s) = store.as_mut() {
            s.write(piece);
        }
        send(d, out, window.clip(piece)).await?;
        if end {
            if let Some(s) = store {
                s.commit().await;
            }
            if !window.done() {
                let why = "the body ended before the bytes of the answer";
                return Err(Stop::Failed(up.failure_now(FailureKind::Body, why)));
            }
            return Ok(());
        }
        if window.done() {
            if let Some(s) = store {
                // The client has its part: the slice's rest goes to its entry.
                fill(up, s, piece, req).await;
            }
            return Ok(());
        }
    }
}

/// Sends a stored slice's `body` (a file range) piece by piece, read from the
/// page cache on the worker.
///
/// # Cancel safety
/// Not cancel-safe: part of a piece may have been sent.
async fn send_file<D: Downstream>(
    s: &Slicer<'_>,
    index: u64,
    d: &mut D,
    out: &mut Out,
    body: Body,
    piece: &mut Vec<u8>,
) -> Result<(), Stop<D::Error>> {
    let Body::File { found, range } = body else { return Ok(()) };
    let mut at = range.start;
    while at < range.end {
        let want = (range.end - at).min(PIECE as u64) as usize;
        piece.clear();
        piece.resize(want, 0);
        let got = match found.file.read_at(piece, at) {
            Ok(0) => return Err(Stop::Failed(local_failure(s, index, "the stored slice is shorter than indexed"))),
            Ok(got) => got,
            Err(e) => {
                return Err(Stop::Failed(local_failure(s, index, &format!("the stored slice cannot be read: {e}"))))
            }
        };
        send(d, out, &piece[..got]).await?;
        at += got as u64;
    }
    Ok(())
}

/// A failure of the cache itself while an answer streams (its head is out).
fn local_failure(s: &Slicer<'_>, index: u64, why: &str) -> Failure {
    let upstream = format!("cache slice {index} of {}", s.fwd.target);
    Failure { status: Status::BAD_GATEWAY, kind: FailureKind::Body, upstream, detail: why.to_string() }
}

/// Logs an upstream that ignored a slice's Range.
fn ignored(req: &Request, index: u64) {
    tracing::warn!(
        "proxy \"{} {}\": the upstream ignored Range for slice {index} (200 with the whole body): \
         answered from that body, nothing stored",
        req.method,
        req.path
    );
}

/// A `200`'s length, when it has one.
fn whole_size(head: &Head) -> Option<u64> {
    match head.framing {
        Framing::Length(n) => Some(n),
        _ => None,
    }
}

/// The client's answer fields for `range` of an object of `size` bytes whose
/// slices carry `object`: the object's fields (not those of one slice or one
/// answer, see [`NOT_OBJECT`]), `Via` and `Cache-Status`, the answer's length,
/// and its `Content-Range` for a `206`.
fn client_head<N: AsRef<str>>(
    object: &[(N, String)],
    status: u16,
    range: &Range<u64>,
    size: u64,
    cache_status: &str,
) -> Vec<Header> {
    let fields = object
        .iter()
        .filter(|(n, _)| !NOT_OBJECT.iter().any(|x| n.as_ref().eq_ignore_ascii_case(x)))
        .map(|(n, v)| (field_name(n.as_ref()), v.clone()))
        .collect();
    let framing = Framing::Length(range.end - range.start);
    let mut head = Head { status, version: "1.1", fields, framing, reusable: true };
    let mut out = client_fields(&mut head, cache_status);
    out.push(Header::AcceptRanges);
    if status == 206 {
        out.push(Header::ContentRange(ContentRange::Bytes { range: range.clone(), size }));
    }
    out
}

/// The answer when slice `first`'s request got something else than a slice: a
/// `200` with the whole object (Range ignored: the client's range is cut out of
/// it, nothing stored) or another answer (passed on as it is, not stored).
///
/// # Cancel safety
/// Not cancel-safe: the answer may be part sent.
async fn pass<D: Downstream>(
    got: Got<'_>,
    s: &Slicer<'_>,
    req: &Request,
    d: &mut D,
    added: &Added,
    miss: &str,
) -> Outcome<D::Error> {
    let (mut up, mut head, size) = match got {
        Got::Whole { up, head } => match whole_size(&head) {
            Some(size) => {
                ignored(req, first_slice(req.headers.range.as_ref(), s.n));
                (up, head, Some(size))
            }
            None => (up, head, None),
        },
        Got::Other { up, head, why } if head.status == 206 => {
            // A part, but not the slice asked for: never stored nor passed on.
            let first = first_slice(req.headers.range.as_ref(), s.n);
            let why = format!("invalid answer to slice {first} ({}): {why}", range_field(first, s.n));
            return refused(up.failure_now(FailureKind::Invalid, &why), req, miss.to_string());
        }
        Got::Other { up, head, why } => {
            tracing::info!(
                "proxy \"{} {}\": the answer to a slice's request is not a slice ({why}): passed on, not stored",
                req.method,
                req.path
            );
            (up, head, None)
        }
        Got::Hit(..) | Got::Fetch { .. } | Got::Past { .. } => return answer(Response::page(Status(500)), false),
    };
    let mut piece = buffers::take();
    let (status, mut headers, mut window) = match size {
        Some(size) => {
            let version = Version::of(&head.fields, size);
            let (status, range) = match reply(&req.headers, &version) {
                Reply::Part(r) => (206, r),
                Reply::Whole(r) => (200, r),
                Reply::Unsatisfiable => {
                    buffers::give(piece);
                    let response = Response::page(Status::RANGE_NOT_SATISFIABLE)
                        .with(Header::ContentRange(ContentRange::Unsatisfied { size }))
                        .with(Header::Field("Cache-Status".into(), miss.to_string()));
                    return answer(response, false);
                }
            };
            (status, client_head(&head.fields, status, &range, size, miss), Window::new(range))
        }
        None => (head.status, client_fields(&mut head, miss), Window::new(0..u64::MAX)),
    };
    let len = match head.framing {
        Framing::Length(_) if size.is_some() => Some(window.len()),
        Framing::Length(n) => Some(n),
        Framing::None => {
            buffers::give(piece);
            let response = Response { status: Status(status), headers, body: Body::Empty, refused: None };
            return answer(response, false);
        }
        Framing::Chunked | Framing::Close => None,
    };
    added.apply(&mut headers);
    let response = Response { status: Status(status), headers, body: Body::Empty, refused: None };
    let empty = len == Some(0);
    let head_sent = d.send_head(response, len, &[], empty, None).await;
    let answered = Instant::now();
    let mut out = Out { left: len.unwrap_or(u64::MAX), sent: 0 };
    let end = match head_sent {
        Err(e) => StreamEnd::Client(e),
        Ok(()) if empty => StreamEnd::Complete,
        Ok(()) => {
            let r = match size {
                Some(_) => pour(req, &mut up, None, &mut window, d, &mut out, &mut piece).await,
                None => relay(&mut up, d, &mut out, &mut piece).await,
            };
            match r {
                Ok(()) => StreamEnd::Complete,
                Err(Stop::Client(e)) => StreamEnd::Client(e),
                Err(Stop::Failed(f)) => cut(d, req, f, out.sent),
            }
        }
    };
    buffers::give(piece);
    Outcome::Streamed(Streamed { status, answered, sent: out.sent, path: BodyPath::Copy, end })
}

/// Reads the rest of a slice's body into its entry and commits it. A failure
/// abandons the entry (logged): the client's answer does not wait for it.
///
/// # Cancel safety
/// Cancel-safe: dropped, the entry is abandoned and the connection closed.
async fn fill(up: &mut Exchange<'_>, mut store: cached::Store, piece: &mut Vec<u8>, req: &Request) {
    loop {
        match next_piece(up, piece).await {
            Ok(end) => {
                store.write(piece);
                if end {
                    store.commit().await;
                    return;
                }
            }
            Err(f) => return tracing::warn!("proxy \"{} {}\": slice not stored: {f}", req.method, req.path),
        }
    }
}

/// Reads `up`'s next body piece into `piece` (emptied first); whether it was the last.
///
/// # Cancel safety
/// Cancel-safe as [`Exchange::read_body`] is: bytes read stay in the exchange or in `piece`.
async fn next_piece(up: &mut Exchange<'_>, piece: &mut Vec<u8>) -> Result<bool, Failure> {
    piece.clear();
    let more = up.read_body(piece).await?;
    Ok(!more || up.body_complete())
}

/// Passes a body of unknown length on as it comes, to its end.
///
/// # Cancel safety
/// Not cancel-safe: part of a piece may have been sent.
async fn relay<D: Downstream>(
    up: &mut Exchange<'_>,
    d: &mut D,
    out: &mut Out,
    piece: &mut Vec<u8>,
) -> Result<(), Stop<D::Error>> {
    loop {
        let end = next_piece(up, piece).await.map_err(Stop::Failed)?;
        metrics::body_bytes(BodyPath::Copy.label(), piece.len() as u64);
        out.sent += piece.len() as u64;
        if !piece.is_empty() || end {
            d.send_body(piece, end).await.map_err(Stop::Client)?;
        }
        if end {
            return Ok(());
        }
    }
}

#[cfg(test)]
#[path = "sliced_tests.rs"]
mod tests;
