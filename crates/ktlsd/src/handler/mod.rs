//! The static-file answer, independent of the protocol: a typed [`Request`] in, a
//! [`Response`] description out. It resolves the path beneath the site's root,
//! lists or redirects directories, evaluates preconditions and a single byte
//! range, answers HEAD without a body, and puts HSTS on every response.
//!
//! It reads no socket and writes none: framing, limits, timeouts and the sending
//! of bodies belong to the codec (`http::h1`, later HTTP/2).

pub mod content;
pub mod preconditions;
pub mod range;
pub mod request;
pub mod response;
pub mod sites;

pub use content::Content;
pub use request::{Method, Request};
pub use response::{Body, Header, Response, Status};
pub use sites::{Pick, Sites};

use crate::files::{self, Refusal, Resolved, Root};
use preconditions::{Outcome, Validators};
use range::RangeOutcome;
use request::{Coding, EntityTag};
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
}

/// Answers `req` from `site`.
pub fn handle(req: &Request, site: &Site<'_>) -> Response {
    let response = if req.method.is_served() {
        answer(req, site, &req.path, Fallback::Allowed)
    } else {
        Response::refusal(Status::METHOD_NOT_ALLOWED, "method not allowed").with(Header::Allow)
    };
    let response = with_error_page(response, site);
    let response = with_hsts(response, site);
    match req.method {
        Method::Head => response.without_body(),
        _ => response,
    }
}

/// `response` with Strict-Transport-Security when configured: every HTTPS response
/// carries it, errors included (RFC 6797 section 8.1 takes it from any). It goes
/// last, except that Content-Range closes a 206 head.
pub fn with_hsts(mut response: Response, site: &Site<'_>) -> Response {
    if let Some(v) = site.hsts {
        let at = match response.status {
            Status::PARTIAL_CONTENT => response.headers.iter().position(|h| matches!(h, Header::ContentRange(_))),
            _ => None,
        };
        let header = Header::StrictTransportSecurity(v.to_string());
        match at {
            Some(i) => response.headers.insert(i, header),
            None => response.headers.push(header),
        }
    }
    response
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
    let Some((_, path)) = site.content.error_pages.iter().find(|(s, _)| *s == response.status.0) else {
        return response;
    };
    let Ok(Resolved::File(page)) = files::resolve(site.root, path, site.files) else {
        // A missing page leaves the built-in one: an error page must not fail the answer.
        return response;
    };
    let len = page.meta.len();
    let content_type = site.content.content_type(&page.rel);
    for h in &mut response.headers {
        match h {
            Header::ContentType(t) => *t = content_type.clone().into(),
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
            return match files::listing_html(&listing, site.files) {
                Ok(html) => Response {
                    status: Status::OK,
                    headers: vec![Header::ContentType(HTML.into()), Header::ContentLength(html.len() as u64)],
                    body: Body::Bytes(html.into_bytes()),
                    refused: None,
                },
                Err(_) => Response::refusal(Status::FORBIDDEN, "directory cannot be listed"),
            };
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
            if let (Refusal::NotFound, Fallback::Allowed, Some(to)) = (&refusal, fallback, site.content.fallback.as_deref()) {
                return answer(req, site, to, Fallback::Used);
            }
            return Response::refusal(Status(refusal.status()), refusal.reason());
        }
    };

    // The original decides the Content-Type; the variant, if any, is what is sent.
    let content_type = site.content.content_type(&found.rel);
    let (found, coding) = choose_variant(req, site, found);
    let vary = site.content.varies_by_encoding();
    let size = found.meta.len();
    let etag = match coding {
        // Its own tag, so that a cache never serves one coding for another.
        Some(c) => files::etag_of_variant(&found.meta, c.token()),
        None => files::etag(&found.meta),
    };
    let v = Validators { etag: EntityTag::strong(etag), modified: files::modified(&found.meta) };
    match preconditions::evaluate(&req.headers, &v) {
        Outcome::Proceed => {}
        Outcome::NotModified => {
            let mut headers = vec![Header::LastModified(v.modified), Header::ETag(v.etag)];
            if vary {
                headers.push(Header::VaryAcceptEncoding);
            }
            return Response { status: Status::NOT_MODIFIED, headers, body: Body::Empty, refused: None };
        }
        Outcome::Failed => return Response::page(Status::PRECONDITION_FAILED),
    }

    let range = match req.headers.range {
        Some(spec) if preconditions::range_applies(&req.headers, &v) => spec.resolve(size),
        _ => RangeOutcome::Full,
    };
    let (status, range) = match range {
        RangeOutcome::Full => (Status::OK, 0..size),
        RangeOutcome::Partial(r) => (Status::PARTIAL_CONTENT, r),
        RangeOutcome::Unsatisfiable => {
            return Response::page(Status::RANGE_NOT_SATISFIABLE)
                .with(Header::ContentRange(ContentRange::Unsatisfied { size }));
        }
    };
    let mut headers = vec![
        Header::ContentType(content_type.into()),
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
    if status == Status::PARTIAL_CONTENT {
        headers.push(Header::ContentRange(ContentRange::Bytes { range: range.clone(), size }));
    }
    Response { status, headers, body: Body::File { found, range }, refused: None }
}

/// The precompressed variant of `found` the client accepts best, with its coding,
/// or `found` itself when there is none.
fn choose_variant(req: &Request, site: &Site<'_>, found: files::Found) -> (files::Found, Option<Coding>) {
    for coding in content::candidates(&site.content.precompressed, req.headers.accept_encoding.as_ref()) {
        if let Some(v) = files::variant(site.root, &found.rel, coding.suffix(), site.files) {
            return (v, Some(coding));
        }
    }
    (found, None)
}

#[cfg(test)]
mod tests;
