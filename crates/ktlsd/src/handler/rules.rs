//! Response header rules and the CORS shorthand: which extra fields a site puts on
//! its answers, chosen by the path of the file answered, and how a CORS preflight
//! is answered.
//!
//! Rules are validated once, at start-up ([`HeaderRule::new`], [`Cors::parse`]);
//! applying them is a pure function of the rule, the path and the clock. It does
//! not decide what is served: resolution and status stay in [`super::handle`].

use std::time::{Duration, SystemTime};

use super::pattern::PathPattern;
use super::response::Header;

/// Which paths a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    /// A path pattern of the one dialect ([`PathPattern`]: `/assets/*`, `*.js`).
    Pattern(PathPattern),
    /// Lower-case file extensions without the dot.
    Extensions(Vec<String>),
}

impl PathMatch {
    /// Whether the path `path` (beneath ROOT, starting with `/`) is matched.
    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathMatch::Pattern(p) => p.matches(path),
            PathMatch::Extensions(exts) => {
                let name = path.rsplit('/').next().unwrap_or(path);
                match name.rsplit_once('.') {
                    Some((stem, ext)) if !stem.is_empty() => exts.iter().any(|e| e.eq_ignore_ascii_case(ext)),
                    _ => false,
                }
            }
        }
    }
}

/// One `[[headers]]` block, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderRule {
    pub paths: PathMatch,
    /// Fields that replace any of the same name.
    pub set: Vec<(String, String)>,
    /// Fields appended beside any of the same name.
    pub add: Vec<(String, String)>,
    /// `Expires` this long after the answer, with `Cache-Control: max-age` unless
    /// the rule sets Cache-Control itself.
    pub expires: Option<Duration>,
}

/// Fields a rule may not touch: hop-by-hop and framing fields belong to the codec,
/// Date and Server too, and the validators and coding describe the body sent.
const RESERVED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
    "content-range",
    "content-encoding",
    "date",
    "server",
    "etag",
    "last-modified",
];

impl HeaderRule {
    /// Checks every field name and value; the error says which and why.
    pub fn new(
        paths: PathMatch,
        set: Vec<(String, String)>,
        add: Vec<(String, String)>,
        expires: Option<Duration>,
    ) -> Result<HeaderRule, String> {
        for (name, value) in set.iter().chain(&add) {
            check_field(name, value)?;
        }
        if set.is_empty() && add.is_empty() && expires.is_none() {
            return Err("the rule sets nothing: give set, add or expires".into());
        }
        Ok(HeaderRule { paths, set, add, expires })
    }
}

/// A field a rule may send: a token name that is not reserved, a value of visible
/// ASCII, spaces and tabs (no CR, LF or NUL, so nothing can be smuggled into the head).
pub fn check_field(name: &str, value: &str) -> Result<(), String> {
    let token = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !token {
        return Err(format!("header name {name:?} is not an HTTP token"));
    }
    if RESERVED.iter().any(|r| r.eq_ignore_ascii_case(name)) {
        return Err(format!("header {name} is set by the server itself and cannot be configured"));
    }
    if !value.bytes().all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic()) {
        return Err(format!("header {name}: value {value:?} may hold only visible ASCII, spaces and tabs"));
    }
    Ok(())
}

/// `30d`, `12h`, `15m`, `45s`, `2w`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let mult = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 604_800,
        _ => return Err(format!("{s:?} is not a duration such as 30d, 12h, 15m or 45s")),
    };
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a duration such as 30d, 12h, 15m or 45s"))?;
    n.checked_mul(mult)
        .filter(|secs| *secs <= 10 * 365 * 86_400)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{s:?} is longer than ten years"))
}

/// The fields the matching rules give the file at `path`, in order: later rules'
/// `set` replace earlier ones' of the same name.
pub fn fields_for(rules: &[HeaderRule], path: &str, now: SystemTime) -> Fields {
    let mut out = Fields::default();
    for rule in rules.iter().filter(|r| r.paths.matches(path)) {
        if let Some(d) = rule.expires {
            out.set("Expires", httpdate::fmt_http_date(now + d));
            let sets_cache_control = rule.set.iter().any(|(n, _)| n.eq_ignore_ascii_case("cache-control"));
            if !sets_cache_control {
                out.set("Cache-Control", format!("max-age={}", d.as_secs()));
            }
        }
        for (n, v) in &rule.set {
            out.set(n, v.clone());
        }
        for (n, v) in &rule.add {
            out.add.push((n.clone(), v.clone()));
        }
    }
    out
}

/// The result of [`fields_for`]: fields replacing the answer's own, then fields added.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fields {
    pub set: Vec<(String, String)>,
    pub add: Vec<(String, String)>,
}

impl Fields {
    /// Puts the fields on `headers`: `set` replacing those of the same name, `add` beside them.
    pub fn apply(&self, headers: &mut Vec<Header>) {
        for (name, value) in &self.set {
            headers.retain(|h| !h.name().eq_ignore_ascii_case(name));
            headers.push(Header::Field(name.clone().into(), value.clone()));
        }
        for (name, value) in &self.add {
            headers.push(Header::Field(name.clone().into(), value.clone()));
        }
    }

    fn set(&mut self, name: &str, value: String) {
        self.set.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.add.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.set.push((name.to_string(), value));
    }
}

/// Which origins may read the site's answers from a script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cors {
    /// `*`: any origin (no credentials).
    Any,
    /// These origins exactly (`https://a.example`), answered by echoing the one
    /// that asks, with `Vary: Origin`.
    Origins(Vec<String>),
}

/// How long a browser may cache a preflight answer, in seconds.
pub const PREFLIGHT_MAX_AGE: u32 = 86_400;

impl Cors {
    /// `["*"]` or a list of origins (`scheme://host[:port]`, no path).
    pub fn parse(list: &[String]) -> Result<Cors, String> {
        if list.len() == 1 && list[0].trim() == "*" {
            return Ok(Cors::Any);
        }
        if list.is_empty() {
            return Err("cors: give \"*\" or a list of origins such as [\"https://a.example\"]".into());
        }
        let mut origins = Vec::new();
        for o in list {
            let o = o.trim();
            let rest = o.strip_prefix("https://").or_else(|| o.strip_prefix("http://"));
            let ok = rest.is_some_and(|h| {
                !h.is_empty() && h.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
            });
            if !ok {
                return Err(format!("cors: {o:?} is not an origin such as https://a.example (\"*\" only alone)"));
            }
            origins.push(o.to_ascii_lowercase());
        }
        Ok(Cors::Origins(origins))
    }

    /// The Access-Control-Allow-Origin value for a request from `origin`, if allowed.
    pub fn allow_origin(&self, origin: Option<&str>) -> Option<String> {
        match self {
            Cors::Any => Some("*".into()),
            Cors::Origins(list) => {
                let o = origin?;
                list.iter().any(|a| a.eq_ignore_ascii_case(o)).then(|| o.to_string())
            }
        }
    }

    /// Whether answers differ by Origin (a list is answered per origin).
    pub fn varies(&self) -> bool {
        matches!(self, Cors::Origins(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_matches() {
        let p = |pat: &str| PathMatch::Pattern(PathPattern::new(pat).unwrap());
        for (pat, path, want) in [
            ("*.js", "/app.js", true),
            ("*.js", "/assets/deep/app.js", true),
            ("*.js", "/app.json", false),
            ("/assets/*", "/assets/a.css", true),
            ("/assets/*", "/assets/x/a.css", true),
            ("/assets/**", "/assets/x/a.css", true),
            ("assets/**/*.css", "/assets/a.css", true),
            ("assets/**/*.css", "/assets/x/y/a.css", true),
            ("assets/**/*.css", "/other/a.css", false),
            ("/index.html", "/index.html", true),
            ("/index.html", "/x/index.html", false),
            ("app.?s", "/app.js", true),
            ("app.?s", "/app.s", false),
        ] {
            assert_eq!(p(pat).matches(path), want, "{pat} {path}");
        }
        let e = PathMatch::Extensions(vec!["css".into(), "js".into()]);
        for (path, want) in
            [("/a.css", true), ("/a.CSS", true), ("/x/a.js", true), ("/.js", false), ("/js", false), ("/a.json", false)]
        {
            assert_eq!(e.matches(path), want, "{path}");
        }
    }

    #[test]
    fn fields_are_checked() {
        for (name, value, ok) in [
            ("Cache-Control", "public, max-age=31536000, immutable", true),
            ("X-Frame-Options", "DENY", true),
            ("Bad Name", "x", false),
            ("X-A", "a\r\nSet-Cookie: b", false),
            ("X-A", "a\nb", false),
            ("X-A", "a\0", false),
            ("Content-Length", "1", false),
            ("transfer-encoding", "chunked", false),
            ("Connection", "close", false),
            (":status", "200", false),
            ("", "x", false),
        ] {
            assert_eq!(check_field(name, value).is_ok(), ok, "{name}: {value:?}");
        }
        let none = HeaderRule::new(PathMatch::Pattern(PathPattern::new("*").unwrap()), vec![], vec![], None);
        assert!(none.is_err());
    }

    #[test]
    fn durations() {
        for (s, secs) in [
            ("30d", Some(2_592_000)),
            ("12h", Some(43_200)),
            ("90", Some(90)),
            ("2w", Some(1_209_600)),
            ("1y", None),
            ("d", None),
            ("-1s", None),
            ("99999w", None),
        ] {
            assert_eq!(parse_duration(s).ok().map(|d| d.as_secs()), secs, "{s}");
        }
    }

    #[test]
    fn rules_apply_in_order() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let hashed = HeaderRule::new(
            PathMatch::Pattern(PathPattern::new("/assets/**").unwrap()),
            vec![("Cache-Control".into(), "public, max-age=31536000, immutable".into())],
            vec![],
            None,
        )
        .unwrap();
        let css = HeaderRule::new(
            PathMatch::Extensions(vec!["css".into()]),
            vec![],
            vec![("X-Kind".into(), "style".into())],
            Some(Duration::from_secs(86_400)),
        )
        .unwrap();
        let rules = [css, hashed];
        let f = fields_for(&rules, "/assets/a.css", now);
        assert_eq!(
            f.set,
            [
                ("Expires".to_string(), "Wed, 15 Nov 2023 22:13:20 GMT".to_string()),
                ("Cache-Control".into(), "public, max-age=31536000, immutable".into()),
            ]
        );
        assert_eq!(f.add, [("X-Kind".to_string(), "style".to_string())]);
        let f = fields_for(&rules, "/a.css", now);
        assert_eq!(f.set[1], ("Cache-Control".to_string(), "max-age=86400".to_string()));
        assert_eq!(fields_for(&rules, "/a.js", now), Fields::default());
    }

    #[test]
    fn cors_origins() {
        assert_eq!(Cors::parse(&["*".into()]), Ok(Cors::Any));
        let c = Cors::parse(&["https://a.example".into(), "http://b.example:8080".into()]).unwrap();
        assert_eq!(c.allow_origin(Some("https://a.example")).as_deref(), Some("https://a.example"));
        assert_eq!(c.allow_origin(Some("https://evil.example")), None);
        assert_eq!(c.allow_origin(None), None);
        assert_eq!(Cors::Any.allow_origin(None).as_deref(), Some("*"));
        for bad in [&["*".to_string(), "https://a".into()][..], &[], &["a.example".into()], &["https://a/b".into()]] {
            assert!(Cors::parse(bad).is_err(), "{bad:?}");
        }
    }
}
