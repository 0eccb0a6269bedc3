//! The answer to a request, independent of the protocol: a typed [`Request`] in, a
//! [`Response`] description out. [`handle`] runs the request phases in a fixed
//! order, each in its own module, the first that answers ending the request:
//! canonical host ([`canonical`]), redirects ([`redirect`]), IP rules
//! ([`access`]), the per-client rate limit ([`limit`]), basic auth ([`auth`]) (together
//! [`guard`]), then the static answer (with [`try_files`]) or the reverse proxy
//! ([`proxy`], with its [`cache`]). Which rules and per-path values apply to a
//! request is its site's location tree's to say ([`location`]), once per request. [`pipeline`] is the one way every codec takes
//! through them: the site chosen once, the phases in order, a forward run over the
//! codec's per-request handle. The static answer resolves the path beneath the site's root,
//! lists or redirects directories, evaluates preconditions and byte ranges
//! (one, or several as `multipart/byteranges`), answers HEAD without a body and OPTIONS (CORS preflights included) with
//! 204, puts the site's header rules and CORS fields on its answers, and HSTS on
//! every response. A file is sent as a precompressed variant or compressed on the
//! fly ([`compress`]) when the client accepts it.
//!
//! It frames nothing: framing, limits, timeouts and the sending of bodies belong to
//! the codecs (`http::h1`, `h2`, `h3`); the proxy's own sockets are its only I/O.

pub mod accel;
pub mod access;
pub mod auth;
pub mod cache;
pub mod canonical;
pub mod client;
pub mod compress;
pub mod content;
pub mod downstream;
pub mod failure;
pub mod htpasswd;
pub mod limit;
pub mod location;
pub mod pattern;
pub mod pipeline;
pub mod preconditions;
pub mod proxy;
pub mod range;
pub mod redirect;
pub mod request;
pub mod response;
pub mod rules;
pub mod sites;
pub mod try_files;

pub use compress::prepare;
pub use content::Content;
pub use request::{Method, Request};
pub use response::{Body, Header, Part, Response, Status};
pub use sites::{Pick, Sites};

use crate::files::{self, Refusal, Resolved, Root};
use preconditions::{Outcome, Validators};
use range::RangeOutcome;
use request::{Coding, EntityTag, ListingFormat};
use response::{ContentRange, HTML};

/// What one site serves and how.
#[derive(Clone, Copy)]
pub struct Site<'a> {
    /// The directory served, held open.
    pub root: &'a Root,
    pub files: files::Options,
    /// The Strict-Transport-Security value, sent on every response when set.
    pub hsts: Option<&'a str>,
    /// Precompressed variants, error pages and the like.
    pub content: &'a Content,
    /// The values that may differ by path (rate limit, compression, error pages,
    /// `try_files`, body limit): the site's own, until the pipeline has matched the
    /// request's path ([`Site::at`]).
    pub at: location::PerPath<'a>,
}

impl<'a> Site<'a> {
    /// The site, with its own values for every path.
    pub fn new(root: &'a Root, files: files::Options, hsts: Option<&'a str>, content: &'a Content) -> Site<'a> {
        Site { root, files, hsts, content, at: content.locations.site_wide() }
    }

    /// The same site serving `content` (its own values for every path).
    #[cfg(test)]
    pub fn with_content(self, content: &'a Content) -> Site<'a> {
        Site::new(self.root, self.files, self.hsts, content)
    }

    /// The site with `route`'s values for the path it was matched on.
    pub fn at(self, route: &location::Route<'a>) -> Site<'a> {
        Site { at: route.at, ..self }
    }
}

/// Answers `req` from `site`: the first phase that answers, with the site's error
/// page, CORS and HSTS fields, or the static answer (what [`pipeline`] does for a
/// path no `[[proxy]]` rule takes, for the in-process tests).
#[cfg(test)]
pub fn handle(req: &Request, site: &Site<'_>) -> Response {
    let path = pattern::route_path(&req.path);
    let route = site.content.locations.find(path.as_deref());
    let site = &site.at(&route);
    let response = guarded(req, site, &route, path.as_deref()).unwrap_or_else(|| static_answer(req, site));
    finish(req, site, response)
}

/// The static answer to a request the guarding phases let through ([`guard`]),
/// finished as [`handle`] finishes its answers.
pub fn answer_unguarded(req: &Request, site: &Site<'_>) -> Response {
    finish(req, site, static_answer(req, site))
}

/// `status`'s answer for a request the server could not complete (a failed
/// upstream): the site's error page for it when configured, HSTS, no body for HEAD.
pub fn error_answer(status: Status, site: &Site<'_>, head_request: bool) -> Response {
    let response = with_hsts(with_error_page(Response::page(status), site), site);
    if head_request {
        response.without_body()
    } else {
        response
    }
}

/// The phases before the answer itself (canonical host, redirects, IP rules, rate
/// limit, basic auth), finished as [`handle`] finishes its answers: the answer that
/// ends the request, or `None` when it may go on. The [`pipeline`] runs it once per
/// request, before the static answer or the reverse proxy (the rate limit counts
/// each call), with the `route` its normalised `path` matched.
pub fn guard(req: &Request, site: &Site<'_>, route: &location::Route<'_>, path: Option<&str>) -> Option<Response> {
    guarded(req, site, route, path).map(|response| finish(req, site, response))
}

/// `response` with the site's error page, CORS and HSTS fields, and no body for HEAD.
fn finish(req: &Request, site: &Site<'_>, response: Response) -> Response {
    let mut response = with_error_page(response, site);
    if let (true, Some(cors)) = (req.method.is_served(), &site.content.cors) {
        if let Some(origin) = cors.allow_origin(req.headers.origin.as_deref()) {
            append(&mut response, Header::Field("Access-Control-Allow-Origin".into(), origin));
        }
        if cors.varies() {
            append(&mut response, Header::Field("Vary".into(), "Origin".into()));
        }
    }
    let response = with_hsts(response, site);
    match req.method {
        Method::Head => response.without_body(),
        _ => response,
    }
}

/// The guarding phases, in order, with the rules `route` holds for the normalised
/// `path`; each returns an answer to end the request with, or `None` to hand it to
/// the next.
fn guarded(req: &Request, site: &Site<'_>, route: &location::Route<'_>, path: Option<&str>) -> Option<Response> {
    let auth = || Some((site.content.auth.as_deref()?, route.auth?));
    canonical::phase(req, site.content.canonical.as_deref())
        .or_else(|| redirect::phase(req, path, route.redirect))
        .or_else(|| access::phase(req, route.access))
        .or_else(|| limit::phase(req.client, site.at.limiter))
        .or_else(|| auth().and_then(|(table, rule)| table.check(rule, req, std::time::Instant::now())))
}

/// The static answer: a file (after `try_files`), a listing, OPTIONS, or 405.
fn static_answer(req: &Request, site: &Site<'_>) -> Response {
    match req.method {
        Method::Get | Method::Head => match try_files::pick(&req.path, site) {
            Some(path) => answer(req, site, &path, Fallback::Allowed),
            None => answer(req, site, &req.path, Fallback::Allowed),
        },
        Method::Options => options(req, site),
        _ => Response::refusal(Status::METHOD_NOT_ALLOWED, "method not allowed").with(Header::Allow),
    }
}

/// The answer a codec gives instead of asking [`handle`] (a request it cannot
/// parse, too large, or for no site): `status`'s error page with the site's HSTS,
/// and no body when the request was HEAD.
pub fn refusal(status: Status, site: &Site<'_>, head_request: bool) -> Response {
    let response = with_hsts(Response::page(status), site);
    if head_request {
        response.without_body()
    } else {
        response
    }
}

/// `response` with Strict-Transport-Security when configured: every HTTPS response
/// carries it, errors included (RFC 6797 section 8.1 takes it from any). It goes
/// last, except that Content-Range closes a 206 head.
pub fn with_hsts(mut response: Response, site: &Site<'_>) -> Response {
    if let Some(v) = site.hsts {
        append(&mut response, Header::StrictTransportSecurity(v.to_string()));
    }
    response
}

/// Adds `header` last, except that Content-Range stays the last field of a 206.
fn append(response: &mut Response, header: Header) {
    let at = match response.status {
        Status::PARTIAL_CONTENT => response.headers.iter().position(|h| matches!(h, Header::ContentRange(_))),
        _ => None,
    };
    match at {
        Some(i) => response.headers.insert(i, header),
        None => response.headers.push(header),
    }
}

/// The answer to OPTIONS: 204 with Allow; for a CORS preflight (Origin and
/// Access-Control-Request-Method) from an allowed origin asking for a served
/// method, the Access-Control-Allow-* fields too. A refused preflight gets none of
/// them, so the browser does not send the request. The path is not resolved: the
/// answer is the same for every path (`*` included).
fn options(req: &Request, site: &Site<'_>) -> Response {
    let mut headers = vec![Header::Allow];
    if let (Some(cors), Some(method)) = (&site.content.cors, req.headers.cors_method.as_deref()) {
        let served = matches!(method.trim(), "GET" | "HEAD");
        if let (true, Some(origin)) = (served, cors.allow_origin(req.headers.origin.as_deref())) {
            let field = |name: &'static str, value: String| Header::Field(name.into(), value);
            headers.push(field("Access-Control-Allow-Origin", origin));
            headers.push(field("Access-Control-Allow-Methods", "GET, HEAD, OPTIONS".into()));
            // The fields asked for are allowed as asked: a static server reads none it must guard.
            if let Some(asked) = req.headers.cors_headers.as_deref().filter(|v| is_token_list(v)) {
                headers.push(field("Access-Control-Allow-Headers", asked.trim().to_string()));
            }
            headers.push(field("Access-Control-Max-Age", rules::PREFLIGHT_MAX_AGE.to_string()));
        }
        if cors.varies() {
            headers.push(Header::Field("Vary".into(), "Origin".into()));
        }
    }
    Response { status: Status::NO_CONTENT, headers, body: Body::Empty, refused: None }
}

/// A comma-separated list of field names, as Access-Control-Request-Headers holds.
fn is_token_list(v: &str) -> bool {
    !v.trim().is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~, ".contains(&b))
}

/// The fields the site's header rules give `path` (the clock is read only for a
/// site with rules).
pub fn rule_fields(site: &Site<'_>, path: &str) -> rules::Fields {
    match site.content.headers.is_empty() {
        true => rules::Fields::default(),
        false => rules::fields_for(&site.content.headers, path, std::time::SystemTime::now()),
    }
}

/// Applies the site's header rules for the file (or listing) at `path` beneath ROOT.
fn with_rules(headers: &mut Vec<Header>, site: &Site<'_>, path: &str) {
    rule_fields(site, path).apply(headers);
}

/// [`with_rules`] for the file at `rel` beneath ROOT; its rule path (`/rel`) is
/// made only when the site has rules.
fn with_file_rules(headers: &mut Vec<Header>, site: &Site<'_>, rel: &std::path::Path) {
    if !site.content.headers.is_empty() {
        with_rules(headers, site, &format!("/{}", rel.to_string_lossy()));
    }
}

/// Whether a path that names nothing may be answered from the site's fallback.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fallback {
    Allowed,
    /// Already answering from the fallback: its absence is a plain 404.
    Used,
}

/// `response`, when its status has a configured error page that exists, with that
/// page as its body (status, reason and other fields kept); else as it is.
fn with_error_page(mut response: Response, site: &Site<'_>) -> Response {
    let Some((_, path)) = site.at.error_pages.iter().find(|(s, _)| *s == response.status.0) else {
        return response;
    };
    let Ok(Resolved::File(page)) = files::resolve(site.root, path, site.files) else {
        // A missing page leaves the built-in one: an error page must not fail the answer.
        return response;
    };
    let len = page.meta.len();
    let content_type = site.content.content_type(&page.rel, page.mime);
    for h in &mut response.headers {
        match h {
            Header::ContentType(t) => *t = content_type.clone(),
            Header::ContentLength(n) => *n = len,
            _ => {}
        }
    }
    response.body = Body::File { found: page, range: 0..len };
    response
}

/// The answer to a GET for `path` (HEAD drops its body afterwards).
fn answer(req: &Request, site: &Site<'_>, path: &str, fallback: Fallback) -> Response {
    let found = match files::resolve(site.root, path, site.files) {
        Ok(Resolved::File(f)) => f,
        Ok(Resolved::Directory(listing)) => {
            let Ok(entries) = files::listing::entries(&listing, site.files) else {
                return Response::refusal(Status::FORBIDDEN, "directory cannot be listed");
            };
            let (content_type, body) = match req.headers.listing {
                ListingFormat::Html => (HTML, files::listing::html(&listing.url_path, &entries)),
                ListingFormat::Json => ("application/json", files::listing::json(&entries)),
            };
            let mut headers = vec![
                Header::ContentType(content_type.into()),
                Header::ContentLength(body.len() as u64),
                Header::Field("Vary".into(), "Accept".into()),
            ];
            with_rules(&mut headers, site, &files::listing::decoded_title(&listing.url_path));
            return Response { status: Status::OK, headers, body: Body::Bytes(body.into_bytes()), refused: None };
        }
        Err(Refusal::AddSlash(mut location)) => {
            // The query goes along, as nginx keeps it (`$args`).
            if let Some(q) = &req.query {
                location.push('?');
                location.push_str(q);
            }
            return Response::page(Status::MOVED_PERMANENTLY).with(Header::Location(location));
        }
        Err(refusal) => {
            // Only a path that names nothing: a refused one (dot-file, escape, 403) never.
            if let (Refusal::NotFound, Fallback::Allowed, Some(to)) =
                (&refusal, fallback, site.content.fallback.as_deref())
            {
                return answer(req, site, to, Fallback::Used);
            }
            return Response::refusal(Status(refusal.status()), refusal.reason());
        }
    };

    // The original decides the Content-Type and the rules; the variant, if any, is what is sent.
    let content_type = site.content.content_type(&found.rel, found.mime);
    let rel = found.rel.clone();
    let chosen = match precompressed(req, site, &found.rel) {
        Some((v, c)) => {
            // Its own tag, so that a cache never serves one coding for another.
            let etag = EntityTag::strong(files::etag_of_variant(&v.meta, c.token()));
            let modified = files::modified(&v.meta);
            compress::Chosen { found: v, coding: Some(c), etag, modified, varies: true }
        }
        None => compress::choose(req, site, &content_type, found),
    };
    let vary = chosen.varies || site.content.varies_by_encoding();
    let compress::Chosen { found, coding, etag, modified, .. } = chosen;
    let size = found.meta.len();
    let v = Validators { etag, modified };
    match preconditions::evaluate(&req.headers, &v) {
        Outcome::Proceed => {}
        Outcome::NotModified => {
            let mut headers = vec![Header::LastModified(v.modified), Header::ETag(v.etag)];
            if vary {
                headers.push(Header::VaryAcceptEncoding);
            }
            // A 304 carries the Cache-Control and Expires a 200 would (RFC 9110 section 15.4.5).
            with_file_rules(&mut headers, site, &rel);
            return Response { status: Status::NOT_MODIFIED, headers, body: Body::Empty, refused: None };
        }
        Outcome::Failed => return Response::page(Status::PRECONDITION_FAILED),
    }

    let range = match &req.headers.range {
        Some(spec) if preconditions::range_applies(&req.headers, &v) => spec.resolve(size),
        _ => RangeOutcome::Full,
    };
    let mut several = None;
    let (status, range) = match range {
        RangeOutcome::Full => (Status::OK, 0..size),
        RangeOutcome::Partial(r) => (Status::PARTIAL_CONTENT, r),
        RangeOutcome::Multi(ranges) => {
            several = Some(ranges);
            (Status::PARTIAL_CONTENT, 0..size)
        }
        RangeOutcome::Unsatisfiable => {
            return Response::page(Status::RANGE_NOT_SATISFIABLE)
                .with(Header::ContentRange(ContentRange::Unsatisfied { size }));
        }
    };
    let mut headers = vec![
        Header::ContentType(content_type),
        Header::ContentLength(range.end - range.start),
        Header::LastModified(v.modified),
        Header::ETag(v.etag),
        Header::AcceptRanges,
    ];
    if let Some(c) = coding {
        headers.push(Header::ContentEncoding(c));
    }
    if vary {
        headers.push(Header::VaryAcceptEncoding);
    }
    with_file_rules(&mut headers, site, &rel);
    if let Some(ranges) = several {
        // Each part says its type; the whole is multipart (RFC 9110 section 14.6).
        let boundary = range::boundary();
        let is_type = |h: &Header| h.name().eq_ignore_ascii_case("Content-Type");
        let part_type = headers.iter().find(|h| is_type(h)).map(Header::to_string).unwrap_or_default();
        let (parts, len) = range::multipart(&ranges, size, &part_type, &boundary);
        headers.retain(|h| !is_type(h) && !matches!(h, Header::ContentLength(_)));
        headers.insert(0, Header::ContentType(format!("multipart/byteranges; boundary={boundary}").into()));
        headers.insert(1, Header::ContentLength(len));
        return Response { status, headers, body: Body::Parts { found, parts }, refused: None };
    }
    if status == Status::PARTIAL_CONTENT {
        headers.push(Header::ContentRange(ContentRange::Bytes { range: range.clone(), size }));
    }
    Response { status, headers, body: Body::File { found, range }, refused: None }
}

/// The precompressed variant of the file at `rel` the client accepts best, with
/// its coding; `None` when there is none.
fn precompressed(req: &Request, site: &Site<'_>, rel: &std::path::Path) -> Option<(files::Found, Coding)> {
    compress::candidates(&site.content.precompressed, req.headers.accept_encoding.as_ref())
        .into_iter()
        .find_map(|coding| Some((files::variant(site.root, rel, coding.suffix(), site.files)?, coding)))
}

/// Whether a precompressed variant of `rel` would be sent to `req` (it wins over
/// compressing on the fly).
fn has_precompressed(req: &Request, site: &Site<'_>, rel: &std::path::Path) -> bool {
    precompressed(req, site, rel).is_some()
}

#[cfg(test)]
#[allow(unsafe_code)] // its fixtures plant FIFOs with mkfifo
mod tests;

#[cfg(test)]
mod route_tests;

#[cfg(test)]
mod pipeline_tests;
