//! A site's content-delivery options: which precompressed variants it serves and
//! how the one sent is chosen from Accept-Encoding; error pages, the fallback, MIME
//! overrides, header rules and CORS, and the on-the-fly compression policy.
//!
//! It only describes and chooses; opening files is `files`' business and the
//! answer is assembled in [`super::handle`]; compressing on the fly is the
//! `compress` module's.

use std::borrow::Cow;
use std::path::Path;

use super::request::{AcceptEncoding, Coding};
use super::rules::{Cors, HeaderRule};

/// Per-site delivery options; [`Content::NONE`] is the behaviour without any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Content {
    /// Precompressed codings looked for beside a file, in the server's order of
    /// preference (it breaks ties between equal client qualities). Empty: none.
    pub precompressed: Vec<Coding>,
    /// Pages served for error statuses, with that status: (status, path beneath ROOT).
    pub error_pages: Vec<(u16, String)>,
    /// The path served for a request whose path names nothing (a single-page app's
    /// `/index.html`); never for a path that exists but is refused.
    pub fallback: Option<String>,
    /// Content-Type overrides by file extension (lower-case, without the dot), validated.
    pub mime_types: Vec<(String, String)>,
    /// `[[headers]]` rules, in order, for file and listing answers.
    pub headers: Vec<HeaderRule>,
    /// Which origins may read answers from scripts; `None`: no CORS fields.
    pub cors: Option<Cors>,
    /// Canonical host, redirects, IP rules, rate limit and `try_files`.
    pub routing: super::routing::Routing,
    /// On-the-fly compression; `None`: off.
    pub compress: Option<Policy>,
    /// `[[auth]]` rules and their failure table; `None`: no basic auth.
    pub auth: Option<std::sync::Arc<super::auth::Auth>>,
    /// `[[proxy]]` rules, in order: the first whose glob matches the path forwards the request.
    pub proxy: Vec<std::sync::Arc<super::proxy::Rule>>,
}

impl Content {
    /// No options: files are served as they are.
    #[cfg(test)]
    pub const NONE: Content = Content {
        precompressed: Vec::new(),
        error_pages: Vec::new(),
        fallback: None,
        mime_types: Vec::new(),
        headers: Vec::new(),
        cors: None,
        routing: super::routing::Routing::NONE,
        compress: None,
        auth: None,
        proxy: Vec::new(),
    };

    /// [`Content::NONE`] for as long as needed.
    #[cfg(test)]
    pub fn none() -> &'static Content {
        static NONE: Content = Content::NONE;
        &NONE
    }

    /// The Content-Type of the file at `rel`: the site's override for its extension,
    /// else `builtin`, the built-in table's ([`crate::files::content_type`] of `rel`,
    /// which [`crate::files::Found::mime`] holds).
    pub fn content_type(&self, rel: &Path, builtin: &'static str) -> Cow<'static, str> {
        if self.mime_types.is_empty() {
            return Cow::Borrowed(builtin);
        }
        let ext = rel.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        match ext.and_then(|e| self.mime_types.iter().find(|(x, _)| *x == e)) {
            Some((_, t)) => Cow::Owned(t.clone()),
            None => Cow::Borrowed(builtin),
        }
    }

    /// Whether answers for files vary with Accept-Encoding.
    pub fn varies_by_encoding(&self) -> bool {
        !self.precompressed.is_empty()
    }
}

/// A site's on-the-fly compression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The codings offered, in the server's order of preference (it breaks ties
    /// between equal client qualities); never empty.
    pub codings: Vec<Coding>,
    /// Smaller files go out as they are: the coding's own framing and the
    /// Content-Encoding field would eat what little is saved.
    pub min_size: u64,
    /// Larger files go out as they are, so that one request cannot hold a
    /// compressor for long.
    pub max_size: u64,
}

/// The codings to try, best first: those the client accepts (quality above 0),
/// by its quality, then by the server's order. When the client names identity, a
/// coding it ranks lower is not sent; without Accept-Encoding no coding is sent
/// (a client that says nothing may not decode).
pub fn candidates(configured: &[Coding], accept: Option<&AcceptEncoding>) -> Vec<Coding> {
    let Some(accept) = accept else { return Vec::new() };
    let identity = accept.listed("identity").unwrap_or(0);
    let mut ranked: Vec<(u16, usize, Coding)> = configured
        .iter()
        .enumerate()
        .map(|(i, c)| (accept.quality(c.token()), i, *c))
        .filter(|(q, _, _)| *q > 0 && *q >= identity)
        .collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    ranked.into_iter().map(|(_, _, c)| c).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use Coding::*;

    #[test]
    fn mime_overrides_by_extension() {
        let c = Content { mime_types: vec![("md".into(), "text/markdown; charset=utf-8".into())], ..Content::NONE };
        for (name, want) in [
            ("a.md", "text/markdown; charset=utf-8"),
            ("A.MD", "text/markdown; charset=utf-8"),
            ("a.txt", "text/plain; charset=utf-8"),
            ("md", "application/octet-stream"),
            ("Makefile", "application/octet-stream"),
        ] {
            let rel = Path::new(name);
            assert_eq!(c.content_type(rel, crate::files::content_type(rel)), want, "{name}");
        }
    }

    #[test]
    fn candidates_follow_qualities_then_server_order() {
        let all = [Br, Zstd, Gzip];
        for (configured, accept, want) in [
            (&all[..], Some("gzip, deflate, br, zstd"), vec![Br, Zstd, Gzip]),
            (&all[..], Some("gzip, deflate"), vec![Gzip]),
            (&all[..], Some("gzip;q=1, br;q=0.5"), vec![Gzip, Br]),
            (&all[..], Some("br;q=0, *"), vec![Zstd, Gzip]),
            (&all[..], Some("*;q=0.2"), vec![Br, Zstd, Gzip]),
            (&all[..], Some("identity"), vec![]),
            (&all[..], Some(""), vec![]),
            (&all[..], None, vec![]),
            // Identity preferred over every coding: send the file as it is.
            (&all[..], Some("identity;q=1, gzip;q=0.5"), vec![]),
            (&all[..], Some("identity;q=0.5, gzip;q=0.5"), vec![Gzip]),
            (&all[..], Some("gzip;q=0.5"), vec![Gzip]),
            (&[Gzip, Br][..], Some("br, gzip"), vec![Gzip, Br]),
            (&[][..], Some("br, gzip"), vec![]),
        ] {
            let accept = accept.map(AcceptEncoding::parse);
            assert_eq!(candidates(configured, accept.as_ref()), want, "{configured:?} {accept:?}");
        }
    }
}
