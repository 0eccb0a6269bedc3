//! Path patterns of `[[redirect]]` and `[[access]]` rules ([`PathPattern`], compiled
//! once at configuration load), and what the request phases match them against: the
//! request path percent-decoded and normalised exactly as `files` reads it
//! ([`route_path`]), so that `/%61dmin/` or `/x/../admin/` cannot step around an
//! `/admin/*` rule. It holds no state and does no I/O; the rules themselves are in
//! [`super::routing`].

/// A path pattern of a `[[redirect]]` or `[[access]]` rule: an exact path, or a
/// glob in which `*` matches any run of characters, `/` included (`/old/*` covers
/// `/old/a/b.html`), as Caddy's path matcher does. Compiled once.
#[derive(Debug, Clone)]
pub struct PathPattern {
    pattern: String,
    matcher: Option<globset::GlobMatcher>,
}

impl PartialEq for PathPattern {
    fn eq(&self, other: &PathPattern) -> bool {
        self.pattern == other.pattern
    }
}

impl Eq for PathPattern {}

/// The characters that make a path a glob.
pub const GLOB_CHARS: &[char] = &['*', '?', '[', ']', '{', '}'];

impl PathPattern {
    /// Compiles `pattern`, which must be an absolute path (checked by the caller).
    pub fn new(pattern: &str) -> Result<PathPattern, String> {
        if !pattern.contains(GLOB_CHARS) {
            return Ok(PathPattern { pattern: pattern.to_string(), matcher: None });
        }
        let glob = globset::GlobBuilder::new(pattern)
            .literal_separator(false)
            .backslash_escape(false)
            .build()
            .map_err(|e| format!("path {pattern:?} is not a glob: {e}"))?;
        Ok(PathPattern { pattern: pattern.to_string(), matcher: Some(glob.compile_matcher()) })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether the normalised request path `path` is matched.
    pub fn matches(&self, path: &str) -> bool {
        match &self.matcher {
            None => self.pattern == path,
            Some(m) => m.is_match(path),
        }
    }

    /// What the one `*` of the pattern matched in `path`, when the pattern is
    /// `prefix*suffix` with no other glob character and `path` is matched.
    pub fn capture<'p>(&self, path: &'p str) -> Option<&'p str> {
        let (prefix, suffix) = self.pattern.split_once('*')?;
        if !self.matches(path) || path.len() < prefix.len() + suffix.len() {
            return None;
        }
        path.get(prefix.len()..path.len() - suffix.len())
    }
}

/// The request path (still percent-encoded) decoded and normalised for matching:
/// `.` and empty segments dropped, `..` applied, a trailing `/` kept. `None` for a
/// path `files` refuses anyway (bad escape, NUL, `..` above ROOT, not absolute):
/// no rule matches it, and the static answer refuses it.
pub fn route_path(raw: &str) -> Option<String> {
    if !raw.starts_with('/') {
        return None;
    }
    let decoded = percent_encoding::percent_decode_str(raw).collect::<Vec<u8>>();
    if decoded.contains(&0) || has_bad_escape(raw) {
        return None;
    }
    let decoded = String::from_utf8_lossy(&decoded);
    let mut segments: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop()?;
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if decoded.ends_with('/') || segments.is_empty() {
        out.push('/');
    }
    Some(out)
}

/// A `%` not followed by two hex digits (`files` refuses such a path with 400).
fn has_bad_escape(raw: &str) -> bool {
    let b = raw.as_bytes();
    b.iter().enumerate().any(|(i, &c)| {
        c == b'%'
            && !(b.get(i + 1).is_some_and(u8::is_ascii_hexdigit) && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_paths() {
        for (raw, want) in [
            ("/", Some("/")),
            ("/a/b", Some("/a/b")),
            ("/a/b/", Some("/a/b/")),
            ("//a///b", Some("/a/b")),
            ("/a/./b", Some("/a/b")),
            ("/x/../admin/", Some("/admin/")),
            ("/%61dmin/x", Some("/admin/x")),
            ("/%2e%2e/x", None),
            ("/x/%2e%2e/admin", Some("/admin")),
            ("/a%2Fb", Some("/a/b")),
            ("/..", None),
            ("/a%00", None),
            ("/a%zz", None),
            ("/a%2", None),
            ("a", None),
            ("/%ff", Some("/\u{fffd}")),
        ] {
            assert_eq!(route_path(raw).as_deref(), want, "{raw}");
        }
    }

    #[test]
    fn patterns() {
        for (pattern, path, matches, capture) in [
            ("/old", "/old", true, None),
            ("/old", "/old/", false, None),
            ("/old/*", "/old/a/b.html", true, Some("a/b.html")),
            ("/old/*", "/old/", true, Some("")),
            ("/old/*", "/old", false, None),
            ("/old/*.html", "/old/a/b.html", true, Some("a/b")),
            ("/old/*.html", "/old/a/b.htm", false, None),
            ("*.php", "/x/y.php", true, None),
            ("/a?c", "/abc", true, None),
            ("/a[", "/a[", false, None),
        ] {
            let Ok(p) = PathPattern::new(pattern) else {
                assert!(!matches, "{pattern} does not compile");
                continue;
            };
            assert_eq!(p.matches(path), matches, "{pattern} {path}");
            if capture.is_some() {
                assert_eq!(p.capture(path), capture, "{pattern} {path}");
            }
        }
    }
}
