//! The response cache in front of a `[[proxy]]` rule with `cache = true`: the
//! lookup before an exchange ([`plan`]), and what the upstream's answer does to
//! the stored entry ([`Pending::on_head`], [`Pending::on_failure`], [`Store`]).
//!
//! A fresh hit is answered from the entry file (a `Body::File` from the body's
//! offset, so the codec sends it by `sendfile` as a static file); a stale entry is
//! revalidated with the stored validators (a 304 refreshes it), served at once while
//! a background exchange refreshes it (`stale-while-revalidate`), or served when
//! the upstream fails (`stale-if-error`); a miss is teed into an [`EntryWriter`]
//! while it streams to the client and committed only once its body is complete.
//! Only GET requests without a body are looked up; others go upstream with
//! `fwd=method` (or `fwd=uri-miss` when the rule does not cache).
//!
//! Not here: the exchange itself (`super::Exchange`) and the client's framing,
//! which the codecs own. Disk work that can block long (`fdatasync` on commit, the
//! body copy of a refresh) runs on the blocking pool; the writes of body pieces
//! go to the page cache and are left on the loop, as the codec's own reads of files are.

use std::sync::Arc;
use std::time::SystemTime;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::{headers::Forwarding, parse, Exchange, Failure, Rule, CACHE_STATUS_MISS};
use crate::handler::cache::{self, Cache, CacheStatus, EntryWriter, FillGuard, Fwd, Key, Lookup, NotStored};
use crate::handler::{Method, Request, Response, Sites};

/// The answer to `req` from a stored entry, with `status` as its Cache-Status and
/// the `Via` a miss has (the upstream's stored `Via`, then this hop).
fn from_entry(hit: cache::Hit, req: &Request, status: &CacheStatus) -> Response {
    let mut response = hit.into_response(req, status);
    let via: Vec<String> =
        response.headers.iter().filter(|h| h.name().eq_ignore_ascii_case("via")).map(ToString::to_string).collect();
    response.headers.retain(|h| !h.name().eq_ignore_ascii_case("via"));
    response.headers.push(crate::handler::Header::Field("Via".into(), super::headers::hit_via(via)));
    response
}

/// What to do with a proxied request once the cache was asked.
#[allow(clippy::large_enum_variant)] // one per request, moved once
pub enum Plan {
    /// Answered from the cache: no exchange.
    Answer(Response),
    /// Go upstream, then hand the answer to the [`Pending`].
    Forward(Pending),
}

/// A request gone upstream, with what the cache needs of its answer.
pub struct Pending {
    /// `None`: the rule does not cache (or the request is not looked up).
    cache: Option<Arc<Cache>>,
    fill: Option<FillGuard>,
    /// The stale entry being revalidated.
    stale: Option<cache::Stale>,
    /// The request's fields (less Host), for the freshness rules.
    fields: HeaderMap,
    /// The Cache-Status when the cache is not asked.
    bypass: String,
    /// The rule's `cache_valid` lifetimes.
    valid: super::control::Valid,
    /// A cold range fill: the request went upstream without its Range.
    cold: Option<ColdFill>,
}

/// A `Range` request filled whole (see `super::ranged`).
struct ColdFill {
    key: Key,
    /// The fields as the client's request had them (Range included), to send it
    /// again when the object is too large to be filled.
    sent: Vec<(String, String)>,
}

/// What the upstream's head leads to.
pub enum Next {
    /// Answer from the (refreshed, or stale) entry; the exchange is dropped.
    Answer(Response),
    /// Pass the upstream's answer on with this Cache-Status, teeing its body into
    /// the `Store` when there is one (whose own Cache-Status, `stored`, may be said
    /// only of a body committed before the head is sent).
    Pass(String, Option<Store>),
}

/// Notes the cache's verdict on `req` for the access log (`$upstream_cache_status`,
/// in nginx's words), for a rule that caches: `cache_status` is the RFC 9211 value.
pub fn note(rule: &Rule, req: &Request, cache_status: &str) {
    if rule.cache {
        let nginx = crate::log::vars::nginx_cache_status(cache_status);
        req.notes.with(|n| n.cache_status = Some(nginx));
    }
}

/// [`note`] for an answer the cache gave itself (a hit, a stale entry).
pub fn note_answer(rule: &Rule, req: &Request, response: &Response) {
    if let Some(h) = response.headers.iter().find(|h| h.name().eq_ignore_ascii_case("cache-status")) {
        note(rule, req, &h.to_string());
    }
}

/// The key of `target` (path and query, as sent) for a request to `authority`:
/// a `[[site]]`'s host, or empty for the default site (as the admin purge keys it).
pub fn key(sites: &Sites<'_>, authority: Option<&str>, target: &str) -> Key {
    let host =
        authority.map(crate::names::host_of).filter(|h| crate::names::find(sites.named, |s| &s.names, h).is_some());
    Key::new(host.as_deref().unwrap_or(""), target)
}

/// The cache that `rule` stores a request for `target` (as forwarded) to `authority`
/// in, with its key, when it caches: what [`plan`] needs of the sites, for a
/// task that outlives them.
pub fn cache_of(sites: &Sites<'_>, rule: &Rule, authority: Option<&str>, target: &str) -> Option<(Arc<Cache>, Key)> {
    let c = sites.cache.filter(|_| rule.cache)?;
    Some((c.clone(), key(sites, authority, target)))
}

/// Asks the cache about `req` (its `target` as sent, its `fields`, and whether a
/// body follows), with the cache and key from [`cache_of`]; the revalidation fields
/// are added to `fields` when a stale entry is to be validated. `fwd` and `rule`
/// start a background refresh under `stale-while-revalidate`.
///
/// # Cancel safety
/// Cancel-safe: a dropped lookup leaves nothing behind.
pub async fn plan(
    cache: Option<(Arc<Cache>, Key)>,
    rule: &Rule,
    req: &Request,
    has_body: bool,
    fwd: &Forwarding,
    fields: &mut Vec<(String, String)>,
) -> Plan {
    let uncached = |bypass| {
        let valid = Vec::new();
        let (fields, cold) = (HeaderMap::new(), None);
        Plan::Forward(Pending { cache: None, fill: None, stale: None, fields, bypass, valid, cold })
    };
    let Some((c, key)) = cache else { return uncached(CACHE_STATUS_MISS.to_string()) };
    match req.method {
        // HEAD and requests with a body (a GET with one is unusual) pass by the cache.
        Method::Get if !has_body => {}
        Method::Get | Method::Head => return uncached(cache::cache_status(&CacheStatus::fwd(Fwd::Bypass))),
        _ => return uncached(cache::cache_status(&CacheStatus::fwd(Fwd::Method))),
    }
    let mut map = header_map(fields);
    // Not part of the match (the key holds the site): without it the lookup need not copy the map.
    map.remove(http::header::HOST);
    let valid = rule.control.cache_valid.clone();
    let mut pending = Pending {
        cache: Some(c.clone()),
        fill: None,
        stale: None,
        fields: map,
        bypass: String::new(),
        valid,
        cold: None,
    };
    if rule.control.cache_bypass.applies(fields, req.query.as_deref()) {
        // To the upstream without a lookup; the answer may still be stored.
        pending.fill = Some(c.bypass(&key, &pending.fields));
        return Plan::Forward(pending);
    }
    // A Range request that misses fills the whole object (unless it is known to be
    // too large or not storable): the fields as sent are kept to send it again.
    let sent = (req.headers.range.is_some() && !c.ranges_direct(&key)).then(|| fields.clone());
    let plan = match c.lookup(&key, &pending.fields).await {
        Lookup::Hit(hit) => {
            let status = hit.cache_status();
            Plan::Answer(from_entry(hit, req, &status))
        }
        Lookup::Miss(fill) => {
            pending.fill = Some(fill);
            Plan::Forward(pending)
        }
        Lookup::Stale(mut stale) if stale.serve_while_revalidating => {
            if let Some(fill) = stale.fill.take() {
                let validators = stale.revalidate.clone();
                refresh_in_background(
                    c.clone(),
                    rule.clone(),
                    fwd.clone(),
                    fields.clone(),
                    validators,
                    stale.hit.entry(),
                    fill,
                );
            }
            let status = CacheStatus { detail: Some("stale-while-revalidate"), ..CacheStatus::hit() };
            Plan::Answer(from_entry(stale.hit, req, &status))
        }
        Lookup::Stale(mut stale) => {
            with_validators(fields, &stale.revalidate);
            pending.fill = stale.fill.take();
            pending.stale = Some(stale);
            Plan::Forward(pending)
        }
    };
    match plan {
        Plan::Forward(mut p) if p.fill.is_some() => {
            if let Some(sent) = sent.filter(|_| super::ranged::without_range(fields)) {
                p.cold = Some(ColdFill { key, sent });
            }
            Plan::Forward(p)
        }
        other => other,
    }
}

impl Pending {
    /// Whether the request missed and goes upstream to fill the entry (not a
    /// revalidation, nor a cold range fill): what a cache peer may be asked for.
    pub fn is_plain_miss(&self) -> bool {
        self.fill.is_some() && self.stale.is_none() && self.cold.is_none()
    }

    /// Gives up storing the answer here: its owner among the cache peers keeps it.
    pub fn leave_to_peer(&mut self) {
        (self.cache, self.fill, self.stale) = (None, None, None);
        self.bypass = cache::cache_status(&CacheStatus { detail: Some("peer"), ..CacheStatus::fwd(Fwd::Miss) });
    }

    /// What a cold range fill does with the upstream's `head` (see
    /// `super::ranged::Cold`); `None` when the request was not filled this way.
    pub fn cold(&self, head: &parse::Head, req: &Request) -> Option<super::ranged::Cold> {
        let (c, _) = (self.cache.as_ref()?, self.cold.as_ref()?);
        Some(super::ranged::Cold::of(head, &req.headers, c.max_object_size()))
    }

    /// Whether the request goes upstream without its Range, to fill the whole object.
    pub fn is_cold(&self) -> bool {
        self.cold.is_some()
    }

    /// Gives up a cold range fill whose object is too large to be stored: the key's
    /// ranges go upstream as sent from now on ([`Cache::ranges_direct`]), nothing is
    /// stored, and the request's fields as sent (Range included) are returned, to
    /// send it again.
    pub fn again(&mut self) -> Option<Vec<(String, String)>> {
        let cold = self.cold.take()?;
        if let Some(c) = self.cache.take() {
            c.note_ranges_direct(&cold.key);
        }
        (self.fill, self.stale) = (None, None);
        self.bypass = cache::cache_status(&CacheStatus::fwd(Fwd::Miss));
        Some(cold.sent)
    }

    /// What the upstream's `head` leads to: a 304 refreshes a stale entry and the
    /// refreshed entry answers `req`; an upstream error lets a stale entry answer
    /// under `stale-if-error`; else the answer passes on, stored when it may be.
    ///
    /// # Cancel safety
    /// Cancel-safe: a refresh under way finishes on the blocking pool.
    pub async fn on_head(mut self, head: &parse::Head, req: &Request) -> Next {
        let Some(c) = self.cache.clone() else { return Next::Pass(self.bypass, None) };
        let response = stored_parts(head, &self.valid);
        if let Some(stale) = self.stale.take() {
            let fwd = stale.fwd;
            if head.status == 304 {
                let entry = stale.hit.entry();
                let (cache, fields) = (c.clone(), response.headers.clone());
                let refreshed = tokio::task::spawn_blocking(move || cache.refresh(&entry, &fields)).await;
                let status = CacheStatus { fwd: Some(fwd), fwd_status: Some(304), ..CacheStatus::default() };
                // Not rewritten (replaced or purged meanwhile): the 304 still validates what was looked up.
                let hit = refreshed.ok().flatten().unwrap_or(stale.hit);
                return Next::Answer(from_entry(hit, req, &status));
            }
            if matches!(head.status, 500 | 502 | 503 | 504) && stale.on_error(&c, &self.fields) {
                let detail = Some("stale-if-error");
                let status =
                    CacheStatus { fwd: Some(fwd), fwd_status: Some(head.status), detail, ..CacheStatus::default() };
                return Next::Answer(from_entry(stale.hit, req, &status));
            }
        }
        let Some(fill) = self.fill.take() else {
            return Next::Pass(cache::cache_status(&CacheStatus::fwd(Fwd::Stale)), None);
        };
        let stored = fill.cache_status(true);
        let not_stored = fill.cache_status(false);
        match fill.admit(&response, SystemTime::now()) {
            Ok(writer) => {
                let store = Store { writer: Some(writer), stored: cache::cache_status(&stored) };
                Next::Pass(cache::cache_status(&not_stored), Some(store))
            }
            Err(why @ NotStored::Disk) => {
                tracing::warn!("proxied \"{}\" not stored: {why:?}", req.path);
                Next::Pass(cache::cache_status(&not_stored), None)
            }
            Err(why) => {
                tracing::debug!("proxied \"{}\" not stored: {why:?}", req.path);
                if let Some(cold) = self.cold.as_ref().filter(|_| head.status == 200) {
                    // Its next ranges go upstream as sent, not whole again.
                    c.note_ranges_direct(&cold.key);
                }
                Next::Pass(cache::cache_status(&not_stored), None)
            }
        }
    }

    /// The stale entry's answer to `req` when the upstream failed (`f`) and
    /// `stale-if-error` allows it; `None`: answer the failure.
    pub fn on_failure(self, f: &Failure, req: &Request) -> Option<Response> {
        let (c, stale) = (self.cache?, self.stale?);
        if !stale.on_error(&c, &self.fields) {
            return None;
        }
        tracing::warn!("proxy \"{} {}\": {f}; answered from the stale entry (stale-if-error)", req.method, req.path);
        let status = CacheStatus { fwd: Some(stale.fwd), detail: Some("stale-if-error"), ..CacheStatus::default() };
        Some(from_entry(stale.hit, req, &status))
    }

    /// The Cache-Status of a failed exchange's 502 or 504.
    pub fn failed_status(&self) -> String {
        match (&self.cache, &self.stale) {
            (Some(_), Some(s)) => cache::cache_status(&CacheStatus::fwd(s.fwd)),
            (Some(_), None) => cache::cache_status(&CacheStatus::fwd(Fwd::Miss)),
            (None, _) => self.bypass.clone(),
        }
    }
}

/// A response body being stored as it streams to the client.
pub struct Store {
    writer: Option<EntryWriter>,
    /// The Cache-Status of an answer whose entry was committed before its head.
    stored: String,
}

impl Store {
    /// A store of the body `writer` writes, whose answers' heads leave before it is
    /// committed (a slice's: `super::sliced`).
    pub(super) fn new(writer: EntryWriter) -> Store {
        Store { writer: Some(writer), stored: String::new() }
    }

    /// Appends a piece of the body; after a failure (logged) nothing more is stored.
    pub fn write(&mut self, piece: &[u8]) {
        if let Some(w) = self.writer.as_mut() {
            if let Err(e) = w.write(piece) {
                tracing::debug!("a proxied response is not stored: {e}");
                self.writer = None;
            }
        }
    }

    /// Publishes the entry once the whole body was written (off the loop: it
    /// flushes the file's data).
    ///
    /// # Cancel safety
    /// Cancel-safe: the commit finishes on the blocking pool.
    pub async fn commit(self) -> bool {
        let Some(w) = self.writer else { return false };
        match tokio::task::spawn_blocking(move || w.commit()).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::debug!("a proxied response is not stored: {e}");
                false
            }
            Err(e) => {
                tracing::warn!("storing a proxied response failed: {e}");
                false
            }
        }
    }

    /// The Cache-Status of an answer whose entry [`Store::commit`] published before
    /// the answer's head was sent.
    pub fn stored_status(&self) -> &str {
        &self.stored
    }
}

/// The upstream's status and fields as `http` parts.
fn parts_of(head: &parse::Head) -> http::response::Parts {
    let (mut parts, ()) = http::Response::new(()).into_parts();
    parts.status = http::StatusCode::from_u16(head.status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    parts.headers = header_map(&head.fields);
    parts
}

/// [`parts_of`] `head` as the cache stores it: with the lifetime `valid`
/// (`cache_valid`) gives its status, which counts while the origin states none (a
/// 304's fields refresh a stored entry: it gets none, the entry keeps its own).
pub(super) fn stored_parts(head: &parse::Head, valid: &super::control::Valid) -> http::response::Parts {
    let mut response = parts_of(head);
    let lifetime = super::control::valid_for(valid, head.status).filter(|_| head.status != 304);
    if let Some(v) = lifetime.and_then(|l| HeaderValue::from_str(itoa::Buffer::new().format(l.as_secs().max(1))).ok()) {
        response.headers.insert(cache::policy::VALID_FIELD, v);
    }
    response
}

/// `fields` as a header map; a field `http` cannot hold is left out.
pub(super) fn header_map<N: AsRef<str>>(fields: &[(N, String)]) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(fields.len());
    for (n, v) in fields {
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(n.as_ref().as_bytes()), HeaderValue::from_str(v)) {
            map.append(n, v);
        }
    }
    map
}

/// `fields` with the client's own validators replaced by the stored entry's.
fn with_validators(fields: &mut Vec<(String, String)>, validators: &HeaderMap) {
    fields.retain(|(n, _)| !n.eq_ignore_ascii_case("if-none-match") && !n.eq_ignore_ascii_case("if-modified-since"));
    for (n, v) in validators {
        if let Ok(v) = v.to_str() {
            fields.push((n.as_str().to_string(), v.to_string()));
        }
    }
}

/// Revalidates a stale entry served under `stale-while-revalidate`, on a task of
/// the worker's own (the workers run their connections in a `LocalSet`): a 304
/// refreshes the entry, a storable answer replaces it. Dropping the task (the
/// worker stopping) abandons the fill.
fn refresh_in_background(
    c: Arc<Cache>,
    rule: Rule,
    fwd: Forwarding,
    mut fields: Vec<(String, String)>,
    validators: HeaderMap,
    entry: cache::Entry,
    fill: FillGuard,
) {
    with_validators(&mut fields, &validators);
    // Its upstream is not the logged request's.
    let fwd = Forwarding { notes: Default::default(), ..fwd };
    tokio::task::spawn_local(async move {
        let target = fwd.target.clone();
        let outcome = async {
            let mut up = Exchange::begin(&rule, fwd, fields).await?;
            let head = up.response().await?;
            if head.status == 304 {
                let map = parts_of(&head).headers;
                let refreshed = tokio::task::spawn_blocking(move || c.refresh(&entry, &map).is_some()).await;
                return Ok(refreshed.unwrap_or(false));
            }
            let response = stored_parts(&head, &rule.control.cache_valid);
            let Ok(writer) = fill.admit(&response, SystemTime::now()) else { return Ok(false) };
            let mut store = Store { writer: Some(writer), stored: String::new() };
            let mut piece = Vec::with_capacity(super::PIECE);
            while {
                piece.clear();
                up.read_body(&mut piece).await?
            } {
                store.write(&piece);
            }
            store.write(&piece);
            Ok::<bool, Failure>(store.commit().await)
        };
        match outcome.await {
            Ok(done) => tracing::debug!("background revalidation of {target}: refreshed={done}"),
            Err(f) => tracing::info!("background revalidation of {target}: {f}"),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_answers_carry_the_lifetime_of_their_status() {
        let valid =
            vec![(Some(200), std::time::Duration::from_secs(600)), (None, std::time::Duration::from_millis(10))];
        for (status, want) in [(200, Some("600")), (404, Some("1")), (304, None)] {
            let head = parse::Head {
                status,
                version: "1.1",
                fields: Vec::new(),
                framing: parse::Framing::None,
                reusable: true,
            };
            let parts = stored_parts(&head, &valid);
            let got = parts.headers.get(cache::policy::VALID_FIELD).and_then(|v| v.to_str().ok());
            assert_eq!(got, want, "{status}");
            assert!(stored_parts(&head, &Vec::new()).headers.is_empty(), "{status}: no cache_valid, no lifetime");
        }
    }

    #[test]
    fn validators_replace_the_clients() {
        let mut fields = vec![("If-None-Match".to_string(), "\"old\"".to_string()), ("Accept".into(), "*/*".into())];
        let mut v = HeaderMap::new();
        v.insert(http::header::IF_NONE_MATCH, HeaderValue::from_static("\"stored\""));
        with_validators(&mut fields, &v);
        assert_eq!(fields, [("Accept".to_string(), "*/*".to_string()), ("if-none-match".into(), "\"stored\"".into())]);
    }

    #[test]
    fn header_maps_keep_repeated_fields_and_drop_bad_ones() {
        let fields = [("A".to_string(), "1".to_string()), ("a".into(), "2".into()), ("bad name".into(), "x".into())];
        let map = header_map(&fields);
        assert_eq!(map.get_all("a").iter().count(), 2);
        assert_eq!(map.len(), 2);
    }
}
