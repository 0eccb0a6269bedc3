//! A site's content-delivery options: which precompressed variants it serves and
//! how the one sent is chosen from Accept-Encoding; error pages, the fallback, MIME
//! overrides, header rules and CORS, and the on-the-fly compression policy.
//!
//! It only describes and chooses; opening files is `files`' business and the
//! answer is assembled in [`super::handle`]; compressing on the fly is the
//! `compress` module's.

use std::borrow::Cow;
use std::path::Path;

use super::request::Coding;
use super::rules::{Cors, HeaderRule};

/// Per-site delivery options; [`Content::NONE`] is the behaviour without any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Content {
    /// Precompressed codings looked for beside a file, in the server's order of
    /// preference (it breaks ties between equal client qualities). Empty: none.
    pub precompressed: Vec<Coding>,
    /// The path served for a request whose path names nothing (a single-page app's
    /// `/index.html`); never for a path that exists but is refused.
    pub fallback: Option<String>,
    /// Content-Type overrides by file extension (lower-case, without the dot), validated.
    pub mime_types: Vec<(String, String)>,
    /// `[[headers]]` rules, in order, for file and listing answers (matched on the
    /// file's path) and proxied answers (on the request's).
    pub headers: Vec<HeaderRule>,
    /// Which origins may read answers from scripts; `None`: no CORS fields.
    pub cors: Option<Cors>,
    /// The host every other name of the site is redirected to (301), lower-case.
    pub canonical: Option<String>,
    /// The failure table of the site's `[[auth]]` rules; `None`: no basic auth.
    pub auth: Option<std::sync::Arc<super::auth::Auth>>,
    /// Every rule and value that applies by path (redirects, IP rules, basic auth,
    /// `[[proxy]]`, `[[location]]` blocks, and the site's own rate limit,
    /// compression, error pages and `try_files`), matched once per request.
    pub locations: super::location::Locations,
}

impl Content {
    /// No options: files are served as they are.
    #[cfg(test)]
    pub const NONE: Content = Content {
        precompressed: Vec::new(),
        fallback: None,
        mime_types: Vec::new(),
        headers: Vec::new(),
        cors: None,
        canonical: None,
        auth: None,
        locations: super::location::Locations::EMPTY,
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
