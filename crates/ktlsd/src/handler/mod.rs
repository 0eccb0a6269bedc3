//! The static-file answer, independent of the protocol: a typed [`Request`] in, a
//! [`Response`] description out. It resolves the path beneath the site's root,
//! lists or redirects directories, evaluates preconditions and a single byte
//! range, answers HEAD without a body, and puts HSTS on every response.
//!
//! It reads no socket and writes none: framing, limits, timeouts and the sending
//! of bodies belong to the codec (`http::h1`, later HTTP/2).

pub mod preconditions;
pub mod range;
pub mod request;
pub mod response;
pub mod sites;

pub use request::{Method, Request};
pub use response::{Body, Header, Response, Status};
pub use sites::{Pick, Sites};

use crate::files::{self, Refusal, Resolved, Root};
use preconditions::{Outcome, Validators};
use range::RangeOutcome;
use request::EntityTag;
use response::{ContentRange, HTML};

/// What one site serves and how.
#[derive(Clone, Copy)]
pub struct Site<'a> {
    /// The directory served, held open.
    pub root: &'a Root,
    pub files: files::Options,
    /// The Strict-Transport-Security value, sent on every response when set.
    pub hsts: Option<&'a str>,
}

/// Answers `req` from `site`.
pub fn handle(req: &Request, site: &Site<'_>) -> Response {
    let response = if req.method.is_served() {
        answer(req, site)
    } else {
        Response::refusal(Status::METHOD_NOT_ALLOWED, "method not allowed").with(Header::Allow)
    };
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

/// The answer to a GET (HEAD drops its body afterwards).
fn answer(req: &Request, site: &Site<'_>) -> Response {
    let found = match files::resolve(site.root, &req.path, site.files) {
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
        Err(refusal) => return Response::refusal(Status(refusal.status()), refusal.reason()),
    };

    let size = found.meta.len();
    let v = Validators { etag: EntityTag::strong(files::etag(&found.meta)), modified: files::modified(&found.meta) };
    match preconditions::evaluate(&req.headers, &v) {
        Outcome::Proceed => {}
        Outcome::NotModified => {
            return Response {
                status: Status::NOT_MODIFIED,
                headers: vec![Header::LastModified(v.modified), Header::ETag(v.etag)],
                body: Body::Empty,
                refused: None,
            };
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
        Header::ContentType(files::content_type(&found.rel).into()),
        Header::ContentLength(range.end - range.start),
        Header::LastModified(v.modified),
        Header::ETag(v.etag),
        Header::AcceptRanges,
    ];
    if status == Status::PARTIAL_CONTENT {
        headers.push(Header::ContentRange(ContentRange::Bytes { range: range.clone(), size }));
    }
    Response { status, headers, body: Body::File { found, range }, refused: None }
}

#[cfg(test)]
mod tests;
