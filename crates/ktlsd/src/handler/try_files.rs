//! Clean URLs: `try_files`, the candidates tried in order for a GET or HEAD before
//! the request's own path (`{path}` stands for it: `["{path}", "{path}.html",
//! "{path}/index.html"]` serves `/about` from `about.html`), as nginx's and
//! Caddy's `try_files`. The first candidate that names a regular file (or, ending
//! in `/`, a directory) is answered; when none does, the request's own path gets
//! the usual answer (its 404, redirect to add a slash, or the site's fallback).
//!
//! Every candidate goes through `files` like any request path: percent-decoding,
//! `..` and ROOT, the dot-file rule and `RESOLVE_BENEATH` all apply to it, and a
//! candidate `files` refuses is skipped, never served. A request path that is
//! itself refused (`..` above ROOT, a bad escape) tries no candidate.

use super::pattern::route_path;
use super::Site;
use crate::files::{self, Resolved};

/// The candidate path to answer `path` with, if one names something servable.
pub fn pick(path: &str, site: &Site<'_>) -> Option<String> {
    let candidates = site.at.try_files;
    if candidates.is_empty() || route_path(path).is_none() {
        return None;
    }
    candidates.iter().map(|c| c.replace("{path}", path)).find(|c| match files::resolve(site.root, c, site.files) {
        Ok(Resolved::File(_)) => true,
        Ok(Resolved::Directory(_)) => c.ends_with('/'),
        Err(_) => false,
    })
}
