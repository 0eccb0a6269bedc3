//! The one path-pattern dialect of every rule that applies by path (`[[proxy]]`,
//! `[[redirect]]`, `[[access]]`, `[[auth]]`, `[[headers]]`, `[[location]]`):
//! [`PathPattern`], compiled once at configuration load; and what they are matched
//! against: the request path percent-decoded and normalised exactly as `files` reads
//! it ([`route_path`]), so that `/%61dmin/` or `/x/../admin/` cannot step around an
//! `/admin/*` rule. It holds no state and does no I/O; the rules are compiled into
//! each site's tree in [`super::location`].

/// A path pattern. The dialect, the same for every rule:
/// - without a glob character, an exact path: `/about` matches `/about` only;
/// - `*` matches any run of characters, `/` included (`/old/*` covers
///   `/old/a/b.html`), as Caddy's path matcher; `**` is the same as `*`; `?` is any
///   one character, `[abc]` one of a class, `{a,b}` either;
/// - a pattern ending in `/*` (or `/**`) also matches its directory without the
///   slash: `/private/*` covers `/private`, so that no rewrite of that path (an index,
///   a clean URL) reaches the directory unguarded;
/// - a pattern that does not start with `/` matches at any depth: `*.css` is
///   `*/*.css`, `app.?s` matches `/x/app.js`.
///
/// Matching is linear in the path's length whatever the pattern (`globset`).
#[derive(Debug, Clone)]
pub struct PathPattern {
    pattern: String,
    matcher: Option<globset::GlobMatcher>,
    /// The directory a `/dir/*` pattern also covers (`/dir`), when it is literal.
    dir: Option<String>,
    /// `/dir/` of a pattern that is only `/dir/*` or `/dir/**` with `dir` literal: the
    /// common proxied or guarded tree, matched by its prefix instead of the glob
    /// (the same answer; a test holds them equal).
    prefix: Option<String>,
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
    /// Compiles `pattern`, a rule's `path`: printable characters without spaces, no
    /// `.` or `..` segment (requests are matched normalised); an absolute path or glob,
    /// or a glob matched at any depth. The error says what to write.
    pub fn new(pattern: &str) -> Result<PathPattern, String> {
        if pattern.is_empty() || !pattern.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!("path {pattern:?}: expected a path or glob such as /old/* (no spaces)"));
        }
        if pattern.split('/').any(|s| s == ".." || s == ".") {
            return Err(format!(
                "path {pattern:?}: write it without . or .. segments (requests are matched normalised)"
            ));
        }
        let dir = (pattern.strip_suffix("/**").or_else(|| pattern.strip_suffix("/*")))
            .filter(|d| d.starts_with('/') && !d.is_empty() && !d.contains(GLOB_CHARS))
            .map(str::to_string);
        let anchored = match pattern.starts_with('/') {
            true => pattern.to_string(),
            false => format!("*/{pattern}"),
        };
        if !anchored.contains(GLOB_CHARS) {
            return Ok(PathPattern { pattern: pattern.to_string(), matcher: None, dir, prefix: None });
        }
        let prefix = dir.as_ref().map(|d| format!("{d}/"));
        let glob = globset::GlobBuilder::new(&anchored)
            .literal_separator(false)
            .backslash_escape(false)
            .build()
            .map_err(|e| format!("path {pattern:?} is not a glob: {e}"))?;
        Ok(PathPattern { pattern: pattern.to_string(), matcher: Some(glob.compile_matcher()), dir, prefix })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether the normalised request path `path` is matched.
    pub fn matches(&self, path: &str) -> bool {
        match (&self.matcher, &self.prefix) {
            (None, _) => self.pattern == path,
            (Some(_), Some(prefix)) => path.starts_with(prefix.as_str()) || self.dir.as_deref() == Some(path),
            (Some(m), None) => m.is_match(path) || self.dir.as_deref() == Some(path),
        }
    }

    /// What the one `*` of the pattern matched in `path`, when the pattern is
    /// `prefix*suffix` with no other glob character and `path` is matched (empty for
    /// the directory a `/dir/*` pattern also covers).
    pub fn capture<'p>(&self, path: &'p str) -> Option<&'p str> {
        let (prefix, suffix) = self.pattern.split_once('*')?;
        if !self.matches(path) {
            return None;
        }
        if self.dir.as_deref() == Some(path) {
            return Some("");
        }
        if path.len() < prefix.len() + suffix.len() {
            return None;
        }
        path.get(prefix.len()..path.len() - suffix.len())
    }

    /// The segments every path this pattern matches begins with: the whole path of an
    /// exact pattern, the directories before the first glob character of a glob
    /// (none for one matched at any depth). The location tree files the pattern there.
    pub fn literal_segments(&self) -> impl Iterator<Item = &str> {
        let literal = match (&self.matcher, self.pattern.starts_with('/')) {
            (None, _) => self.pattern.as_str(),
            (Some(_), false) => "",
            (Some(_), true) => {
                let before = &self.pattern[..self.pattern.find(GLOB_CHARS).unwrap_or(self.pattern.len())];
                &before[..before.rfind('/').unwrap_or(0)]
            }
        };
        literal.split('/').filter(|s| !s.is_empty())
    }

    /// How specific the pattern is, for the choice between `[[location]]` blocks: an
    /// exact path most, then the longer literal beginning (`/api/v2/*` over `/api/*`
    /// over `*.json`).
    pub fn specificity(&self) -> usize {
        match (&self.matcher, self.pattern.starts_with('/')) {
            (None, _) => usize::MAX,
            (Some(_), false) => 0,
            (Some(_), true) => self.pattern.find(GLOB_CHARS).unwrap_or(self.pattern.len()),
        }
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
    // Most paths have nothing to decode or resolve: they are their own normal form.
    let plain =
        !raw.contains(['%', '\0']) && !raw.contains("//") && raw.split('/').all(|seg| seg != "." && seg != "..");
    if plain {
        return Some(raw.to_string());
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
            ("/a/.", Some("/a")),
            ("/a/..", Some("/")),
            ("/.a/..b", Some("/.a/..b")),
            ("/a/b/c.html", Some("/a/b/c.html")),
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
            ("/old/*", "/old", true, Some("")),
            ("/old/*", "/older", false, None),
            ("/old/**", "/old/a/b", true, None),
            ("/old/**", "/old", true, None),
            ("/old/*.html", "/old/a/b.html", true, Some("a/b")),
            ("/old/*.html", "/old/a/b.htm", false, None),
            ("/old/*.html", "/old", false, None),
            ("/api/*", "/api/x/y", true, Some("x/y")),
            ("*.php", "/x/y.php", true, None),
            ("*.php", "/y.php", true, None),
            ("*.php", "/y.php/x", false, None),
            ("app.?s", "/x/app.js", true, None),
            ("app.?s", "/x/app.s", false, None),
            ("assets/*.css", "/x/assets/a.css", true, None),
            ("/a?c", "/abc", true, None),
            ("/{a,b}/x", "/b/x", true, None),
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
        assert!(PathPattern::new("").is_err());
        // Matching stays linear: a pattern of many stars against a long path from a
        // client answers at once (backtracking would take exponential time).
        let stars = PathPattern::new("/*a*a*a*a*a*a*a*a*a*a*b").unwrap();
        let long = format!("/{}", "a".repeat(4000));
        let t = std::time::Instant::now();
        assert!(!stars.matches(&long));
        assert!(t.elapsed() < std::time::Duration::from_secs(1), "{:?}", t.elapsed());
    }

    #[test]
    fn prefix_patterns_match_as_their_glob_does() {
        let paths = ["/", "/a", "/a/", "/a/b", "/a/b/", "/ab", "/ab/c", "/a/b/c.html", "/b/a/", "/a//", "/a/.x"];
        for pattern in ["/a/*", "/a/**", "/a/b/*", "/a/b/**"] {
            let fast = PathPattern::new(pattern).unwrap();
            assert!(fast.prefix.is_some(), "{pattern}");
            let glob = PathPattern { prefix: None, ..fast.clone() };
            for path in paths {
                assert_eq!(fast.matches(path), glob.matches(path), "{pattern} {path}");
            }
        }
        assert!(PathPattern::new("/a/*.css").unwrap().prefix.is_none());
        assert!(PathPattern::new("/a*/*").unwrap().prefix.is_none());
    }

    #[test]
    fn literal_segments_and_specificity() {
        for (pattern, segments, specificity) in [
            ("/a/b", &["a", "b"][..], usize::MAX),
            ("/a/b/", &["a", "b"][..], usize::MAX),
            ("/a/*", &["a"][..], 3),
            ("/a/b*", &["a"][..], 4),
            ("/a*", &[][..], 2),
            ("/{a,b}/x", &[][..], 1),
            ("*.css", &[][..], 0),
            ("assets/*", &[][..], 0),
        ] {
            let p = PathPattern::new(pattern).unwrap();
            assert_eq!(p.literal_segments().collect::<Vec<_>>(), segments, "{pattern}");
            assert_eq!(p.specificity(), specificity, "{pattern}");
        }
    }
}
