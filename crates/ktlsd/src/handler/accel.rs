//! `X-Accel-Redirect`: an upstream that answers with this field (the application
//! authorised the request) has its answer replaced by a file beneath the rule's
//! `accel_root`, sent exactly as a static file is: the site's content types,
//! preconditions and 304, byte ranges, precompressed variants, and `sendfile` over
//! kTLS, the file opened with `openat2(RESOLVE_BENEATH)` by `crate::files`. A path
//! that could leave `accel_root` is refused before any open; a symbolic link that
//! leads out of it, by the open. Every refusal is answered 404, as a file that is
//! not there (the client learns nothing of the layout), and logged, a few lines a
//! second at most.
//!
//! Not here: reading the field from the upstream's answer (`proxy::control`).

use std::sync::Arc;

use super::{Body, Header, Request, Response, Site, Status};
use crate::files::{self, Refusal, Resolved, Root};

/// The `accel_root` of a rule: the directory `X-Accel-Redirect` paths are served
/// from, held open.
pub struct AccelRoot(pub Root);

impl std::fmt::Debug for AccelRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AccelRoot({})", self.0.path().display())
    }
}

impl PartialEq for AccelRoot {
    fn eq(&self, other: &AccelRoot) -> bool {
        self.0.path() == other.0.path()
    }
}

impl Eq for AccelRoot {}

/// Why an `X-Accel-Redirect` value is not served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccelRefusal {
    /// Not an absolute path, bad percent-encoding, a NUL or a backslash.
    Malformed,
    /// A `..` segment (as sent or percent-encoded): it could leave `accel_root`.
    Climbs,
}

impl AccelRefusal {
    pub fn reason(self) -> &'static str {
        match self {
            AccelRefusal::Malformed => "X-Accel-Redirect is not an absolute path",
            AccelRefusal::Climbs => "X-Accel-Redirect climbs out of accel_root with ..",
        }
    }
}

/// The path an `X-Accel-Redirect` value names beneath `accel_root`, still
/// percent-encoded as `crate::files` takes it (its query, if any, dropped): refused
/// when it could leave the root lexically. Symbolic links are the file system's to
/// refuse (`RESOLVE_BENEATH`).
pub fn accel_path(value: &str) -> Result<String, AccelRefusal> {
    let path = value.trim().split(['?', '#']).next().unwrap_or_default();
    if !path.starts_with('/') || path.contains(['\\', '\0']) {
        return Err(AccelRefusal::Malformed);
    }
    let decoded = percent_encoding::percent_decode_str(path).decode_utf8().map_err(|_| AccelRefusal::Malformed)?;
    if decoded.contains(['\\', '\0']) {
        return Err(AccelRefusal::Malformed);
    }
    if decoded.split('/').any(|s| s == "..") {
        return Err(AccelRefusal::Climbs);
    }
    Ok(path.to_string())
}

/// An upstream answer's `X-Accel-Redirect`, to be answered from the file it names.
#[derive(Debug)]
pub struct Accel {
    /// The client's request, for the file at `path` (its conditionals and range kept).
    pub req: Request,
    /// The path beneath `root`, or why there is none.
    pub path: Result<String, AccelRefusal>,
    /// The field's value as the upstream sent it, for the log.
    pub value: String,
    pub root: Arc<AccelRoot>,
    /// The upstream's fields that go with the file (they replace the file's own).
    pub fields: Vec<Header>,
}

/// The answer to `a` on `site` (whose content types, precompressed variants, header
/// rules, error pages and HSTS apply): the file beneath `accel_root` as the static
/// answer gives it, or 404 when there is none or the path is refused.
pub fn answer(a: Accel, site: &Site<'_>) -> Response {
    let files = files::Options { autoindex: false, ..site.files };
    let s = Site { root: &a.root.0, files, ..*site };
    let refused = match &a.path {
        Err(why) => Some(why.reason()),
        Ok(path) => match files::resolve(&a.root.0, path, files) {
            Ok(Resolved::File(_)) => None,
            Ok(Resolved::Directory(_)) | Err(Refusal::AddSlash(_)) => Some("X-Accel-Redirect names a directory"),
            Err(Refusal::NotFound) => Some("X-Accel-Redirect names no file"),
            Err(Refusal::Escape | Refusal::OutsideRoot) => Some("X-Accel-Redirect leads out of accel_root"),
            Err(Refusal::Hidden) => Some("X-Accel-Redirect names a dot-file"),
            Err(r) if r.status() == 503 => {
                return super::finish(&a.req, site, Response::refusal(Status(503), r.reason()));
            }
            Err(_) => Some("X-Accel-Redirect names a file that cannot be served"),
        },
    };
    if let Some(why) = refused {
        let value = &a.value;
        crate::log::refusal(404, why, || format!("proxy \"{} {}\": {why}: {value:?}", a.req.method, a.req.path));
        return super::finish(&a.req, site, Response::page(Status::NOT_FOUND));
    }
    let mut response = super::answer_unguarded(&a.req, &s);
    let mut fields = a.fields;
    // The static answer carries the site's own.
    fields.retain(|f| !matches!(f, Header::StrictTransportSecurity(_)));
    if matches!(response.body, Body::Parts { .. }) {
        // Each part says its type; the whole is multipart/byteranges.
        fields.retain(|f| !f.name().eq_ignore_ascii_case("content-type"));
    }
    if response.status.0 < 300 && !fields.is_empty() {
        for f in &fields {
            let many = f.name().eq_ignore_ascii_case("set-cookie");
            if !many {
                response.headers.retain(|h| !h.name().eq_ignore_ascii_case(f.name()));
            }
        }
        // Before Content-Range, which closes a 206 head.
        let at = response.headers.iter().position(|h| matches!(h, Header::ContentRange(_)));
        let at = at.unwrap_or(response.headers.len());
        response.headers.splice(at..at, fields);
    }
    response
}

#[cfg(test)]
#[path = "accel_tests.rs"]
mod tests;
