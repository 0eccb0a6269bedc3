//! The request as the handler sees it, whatever protocol carried it: method, path,
//! query, authority, and the few header fields that shape a static answer, parsed
//! once into types (as nginx's `headers_in`).
//!
//! Framing (version, keep-alive, Content-Length, Expect) is the codec's business
//! and does not appear here.

use std::fmt;
use std::time::SystemTime;

use super::range::RangeSet;
pub use crate::vocab::Method;

/// One request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: Method,
    /// Path part of the target, still percent-encoded, without query or fragment.
    pub path: String,
    /// Query part of the target (after `?`, without the fragment), still encoded.
    pub query: Option<String>,
    /// The host (and port) the request names, checked by the codec; `None` when absent.
    pub authority: Option<String>,
    pub headers: Headers,
    /// The client's address: the connection's peer (its TCP address, or the one a
    /// load balancer's PROXY protocol header named), set by the codec; behind a
    /// trusted proxy (`trusted_proxies`), the address its forwarding fields name, set
    /// by the pipeline ([`super::client`]). `None` when there is none.
    pub client: Option<std::net::IpAddr>,
    /// The trusted proxy the request came through, when `client` was taken from its
    /// forwarding fields: the address an upstream's `X-Forwarded-For` gets appended.
    pub via: Option<std::net::IpAddr>,
    /// The protocol the client asks to switch to, for a tunnel through a `[[proxy]]`
    /// rule: HTTP/1.1's `Upgrade: websocket` (with `Connection: upgrade`, on a GET
    /// without a body), or HTTP/2's extended CONNECT `:protocol` (RFC 8441), in
    /// lowercase. `None` for every other request.
    pub upgrade: Option<String>,
    /// What the handler notes of the request for its log line (request id, user,
    /// upstreams), shared by the request's clones.
    pub notes: crate::log::Notes,
}

impl Request {
    /// A request for `path` with no query, authority, conditional headers or client address.
    pub fn new(method: Method, path: &str) -> Request {
        Request {
            method,
            path: path.to_string(),
            query: None,
            authority: None,
            headers: Headers::default(),
            client: None,
            via: None,
            upgrade: None,
            notes: crate::log::Notes::default(),
        }
    }
}

/// An entity tag (RFC 9110 section 8.8.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityTag {
    pub weak: bool,
    /// The opaque tag with its quotes, as sent: `"a-1"`.
    pub opaque: String,
}

impl EntityTag {
    pub fn strong(opaque: String) -> EntityTag {
        EntityTag { weak: false, opaque }
    }

    /// Strong comparison: both strong and equal.
    pub fn strong_eq(&self, other: &EntityTag) -> bool {
        !self.weak && !other.weak && self.opaque == other.opaque
    }

    /// Weak comparison: equal opaque tags, weakness ignored.
    pub fn weak_eq(&self, other: &EntityTag) -> bool {
        self.opaque == other.opaque
    }
}

impl fmt::Display for EntityTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.weak {
            f.write_str("W/")?;
        }
        f.write_str(&self.opaque)
    }
}

/// The value of If-Match or If-None-Match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagCondition {
    /// `*`: any current representation.
    Any,
    /// A list of entity tags; members that are no entity tag are dropped (they match nothing).
    Tags(Vec<EntityTag>),
}

impl TagCondition {
    fn parse(value: &str) -> TagCondition {
        if value.trim() == "*" {
            return TagCondition::Any;
        }
        TagCondition::Tags(list_members(value).filter_map(Member::into_tag).collect())
    }

    /// Whether `tag` is matched, comparing strongly (If-Match) or weakly (If-None-Match).
    pub fn matches(&self, tag: &EntityTag, comparison: Comparison) -> bool {
        match self {
            TagCondition::Any => true,
            TagCondition::Tags(tags) => tags.iter().any(|t| match comparison {
                Comparison::Strong => t.strong_eq(tag),
                Comparison::Weak => t.weak_eq(tag),
            }),
        }
    }
}

/// How entity tags are compared (RFC 9110 section 8.8.3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    Strong,
    Weak,
}

/// The value of If-Range: exactly one validator (RFC 9110 section 13.1.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfRange {
    /// One strong entity tag.
    Tag(EntityTag),
    /// One HTTP date.
    Date(SystemTime),
    /// Anything else (a weak tag, a list, junk): never matches, so the whole file is sent.
    Invalid,
}

impl IfRange {
    pub(crate) fn parse(value: &str) -> IfRange {
        let s = value.trim();
        if s.starts_with('"') || s.starts_with("W/") {
            let mut members = list_members(s);
            match (members.next(), members.next()) {
                (Some(Member::Tag(t)), None) if !t.weak => IfRange::Tag(t),
                _ => IfRange::Invalid,
            }
        } else {
            http_date(s).map_or(IfRange::Invalid, IfRange::Date)
        }
    }
}

/// The header fields a static answer depends on, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    pub if_match: Option<TagCondition>,
    pub if_none_match: Option<TagCondition>,
    /// `None` when absent or not an HTTP date (then it is ignored, RFC 9110 section 13.1.4).
    pub if_unmodified_since: Option<SystemTime>,
    /// `None` when absent or not an HTTP date (RFC 9110 section 13.1.3).
    pub if_modified_since: Option<SystemTime>,
    /// `None` when absent or not one byte range this server honours (then the whole
    /// file is sent): several ranges, other units, malformed.
    pub range: Option<RangeSet>,
    pub if_range: Option<IfRange>,
    /// `None` when absent: any coding is acceptable, identity preferred (RFC 9110 section 12.5.3).
    pub accept_encoding: Option<AcceptEncoding>,
    /// The Origin of a cross-origin request, as sent.
    pub origin: Option<String>,
    /// Access-Control-Request-Method: present only in a CORS preflight.
    pub cors_method: Option<String>,
    /// Access-Control-Request-Headers of a preflight, as sent (joined).
    pub cors_headers: Option<String>,
    /// The form of a directory listing Accept asks for.
    pub listing: ListingFormat,
    /// Authorization, as sent (the last line when repeated).
    pub authorization: Option<String>,
    /// X-Forwarded-For, as sent (lines joined): read only from a trusted proxy.
    pub forwarded_for: Option<String>,
    /// Forwarded (RFC 7239), as sent (lines joined): read only from a trusted proxy.
    pub forwarded: Option<String>,
    /// X-Request-Id, as sent (the last line): kept only from a trusted proxy.
    pub request_id: Option<String>,
}

/// Which form of a directory listing the client wants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ListingFormat {
    #[default]
    Html,
    /// `Accept: application/json`, with a weight above text/html's.
    Json,
}

impl ListingFormat {
    /// JSON when Accept names application/json with a weight above zero and above
    /// text/html's (a browser's `text/html,...,*/*;q=0.8` stays HTML).
    fn from_accept(value: &str) -> ListingFormat {
        let mut json = 0;
        let mut html = 0;
        for member in value.split(',') {
            let mut params = member.split(';');
            let range = params.next().unwrap_or("").trim().to_ascii_lowercase();
            let mut q = Some(1000);
            for p in params {
                if let Some((k, v)) = p.split_once('=') {
                    if k.trim().eq_ignore_ascii_case("q") {
                        q = parse_qvalue(v.trim());
                    }
                }
            }
            let q = q.unwrap_or(0);
            match range.as_str() {
                "application/json" => json = json.max(q),
                "text/html" => html = html.max(q),
                _ => {}
            }
        }
        if json > 0 && json > html {
            ListingFormat::Json
        } else {
            ListingFormat::Html
        }
    }
}

/// A content coding this server can send from a precompressed file beside the original.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Br,
    Zstd,
    Gzip,
}

impl Coding {
    pub const ALL: [Coding; 3] = [Coding::Br, Coding::Zstd, Coding::Gzip];

    /// The Content-Encoding token.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Br => "br",
            Coding::Zstd => "zstd",
            Coding::Gzip => "gzip",
        }
    }

    /// The suffix of the precompressed file (`style.css.br`).
    pub fn suffix(self) -> &'static str {
        match self {
            Coding::Br => ".br",
            Coding::Zstd => ".zst",
            Coding::Gzip => ".gz",
        }
    }

    /// The coding named by a config value (`br`, `zstd`, `gzip`).
    pub fn from_token(token: &str) -> Option<Coding> {
        Coding::ALL.into_iter().find(|c| c.token().eq_ignore_ascii_case(token))
    }
}

/// A quality value in thousandths (`q=0.5` is 500); 0 refuses.
pub type Quality = u16;

/// Accept-Encoding, parsed once: each coding with its quality, `*` and `identity` included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptEncoding {
    /// Lower-case coding names (`x-gzip` read as `gzip`) with their qualities, as listed.
    entries: Vec<(String, Quality)>,
}

impl AcceptEncoding {
    pub fn parse(value: &str) -> AcceptEncoding {
        let mut entries = Vec::new();
        for member in value.split(',') {
            let mut params = member.split(';');
            let name = params.next().unwrap_or("").trim().to_ascii_lowercase();
            if name.is_empty() {
                continue;
            }
            let mut q = Some(1000);
            for p in params {
                if let Some((k, v)) = p.split_once('=') {
                    if k.trim().eq_ignore_ascii_case("q") {
                        q = parse_qvalue(v.trim());
                    }
                }
            }
            // A malformed weight makes the member mean nothing rather than "accepted".
            let Some(q) = q else { continue };
            let name = if name == "x-gzip" { "gzip".to_string() } else { name };
            entries.push((name, q));
        }
        AcceptEncoding { entries }
    }

    /// The quality the client gives `coding` (`identity` too): its own entry, else `*`'s,
    /// else 0 for a coding and, for identity, 1 unless refused (RFC 9110 section 12.5.3).
    pub fn quality(&self, coding: &str) -> Quality {
        match (self.listed(coding), self.listed("*")) {
            (Some(own), _) => own,
            (None, Some(any)) => any,
            (None, None) if coding == "identity" => 1000,
            (None, None) => 0,
        }
    }
}

impl AcceptEncoding {
    /// The quality of `coding` when the client names it, `None` otherwise.
    pub fn listed(&self, coding: &str) -> Option<Quality> {
        self.entries.iter().find(|(n, _)| n == coding).map(|(_, q)| *q)
    }
}

/// `0`, `0.5`, `1.000` (RFC 9110 section 12.4.2) in thousandths; `None` when malformed.
fn parse_qvalue(v: &str) -> Option<Quality> {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac_value = format!("{frac:0<3}").parse::<u16>().ok()?;
    match int {
        "0" => Some(frac_value),
        "1" if frac_value == 0 => Some(1000),
        _ => None,
    }
}

/// Collects the field lines a codec receives, then parses them into [`Headers`].
/// Repeated list fields are joined (RFC 9110 section 5.3); of the others the last wins.
#[derive(Debug, Default)]
pub struct HeaderFields {
    if_match: Option<String>,
    if_none_match: Option<String>,
    if_unmodified_since: Option<String>,
    if_modified_since: Option<String>,
    range: Option<String>,
    if_range: Option<String>,
    accept_encoding: Option<String>,
    origin: Option<String>,
    cors_method: Option<String>,
    cors_headers: Option<String>,
    accept: Option<String>,
    authorization: Option<String>,
    forwarded_for: Option<String>,
    forwarded: Option<String>,
    request_id: Option<String>,
}

impl HeaderFields {
    /// Takes one field line (`name` in any case, `value` trimmed); ignores fields
    /// the handler does not use.
    pub fn add(&mut self, name: &str, value: &str) {
        let is = |n: &str| name.eq_ignore_ascii_case(n);
        if is("if-match") {
            join(&mut self.if_match, value);
        } else if is("if-none-match") {
            join(&mut self.if_none_match, value);
        } else if is("if-unmodified-since") {
            self.if_unmodified_since = Some(value.to_string());
        } else if is("if-modified-since") {
            self.if_modified_since = Some(value.to_string());
        } else if is("range") {
            self.range = Some(value.to_string());
        } else if is("if-range") {
            // Several lines make a list, which is no single validator: the condition fails.
            join(&mut self.if_range, value);
        } else if is("accept-encoding") {
            join(&mut self.accept_encoding, value);
        } else if is("origin") {
            self.origin = Some(value.to_string());
        } else if is("access-control-request-method") {
            self.cors_method = Some(value.to_string());
        } else if is("access-control-request-headers") {
            join(&mut self.cors_headers, value);
        } else if is("accept") {
            join(&mut self.accept, value);
        } else if is("authorization") {
            self.authorization = Some(value.to_string());
        } else if is("x-forwarded-for") {
            join(&mut self.forwarded_for, value);
        } else if is("forwarded") {
            join(&mut self.forwarded, value);
        } else if is("x-request-id") {
            self.request_id = Some(value.to_string());
        }
    }

    pub fn parse(self) -> Headers {
        Headers {
            if_match: self.if_match.as_deref().map(TagCondition::parse),
            if_none_match: self.if_none_match.as_deref().map(TagCondition::parse),
            if_unmodified_since: self.if_unmodified_since.as_deref().and_then(http_date),
            if_modified_since: self.if_modified_since.as_deref().and_then(http_date),
            range: self.range.as_deref().and_then(RangeSet::parse),
            if_range: self.if_range.as_deref().map(IfRange::parse),
            accept_encoding: self.accept_encoding.as_deref().map(AcceptEncoding::parse),
            origin: self.origin,
            cors_method: self.cors_method,
            cors_headers: self.cors_headers,
            listing: self.accept.as_deref().map_or(ListingFormat::Html, ListingFormat::from_accept),
            authorization: self.authorization,
            forwarded_for: self.forwarded_for,
            forwarded: self.forwarded,
            request_id: self.request_id,
        }
    }
}

/// Appends one field line's value to a list field (`a, b`).
pub(crate) fn join(field: &mut Option<String>, value: &str) {
    match field {
        Some(list) => {
            list.push_str(", ");
            list.push_str(value);
        }
        None => *field = Some(value.to_string()),
    }
}

fn http_date(s: &str) -> Option<SystemTime> {
    httpdate::parse_http_date(s.trim()).ok()
}

/// A member of an entity-tag list.
#[derive(Debug, PartialEq, Eq)]
enum Member {
    Tag(EntityTag),
    /// Not an entity tag; it still counts as a member.
    Junk,
}

impl Member {
    fn into_tag(self) -> Option<EntityTag> {
        match self {
            Member::Tag(t) => Some(t),
            Member::Junk => None,
        }
    }
}

/// The members of an entity-tag list (`"a", W/"b"`), split at commas outside quotes
/// (an entity tag may contain a comma).
fn list_members(list: &str) -> impl Iterator<Item = Member> + '_ {
    let mut rest = list;
    std::iter::from_fn(move || loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            return None;
        }
        let opaque_start = if rest.starts_with("W/") { 2 } else { 0 };
        let end = if rest[opaque_start..].starts_with('"') {
            // Up to and including the closing quote, if there is one.
            rest[opaque_start + 1..].find('"').map_or(rest.len(), |i| opaque_start + 1 + i + 1)
        } else {
            rest.find(',').unwrap_or(rest.len())
        };
        let (item, tail) = rest.split_at(end);
        rest = tail;
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let (weak, opaque) = match item.strip_prefix("W/") {
            Some(o) => (true, o),
            None => (false, item),
        };
        let quoted = opaque.len() >= 2 && opaque.starts_with('"') && opaque.ends_with('"');
        return Some(if quoted { Member::Tag(EntityTag { weak, opaque: opaque.to_string() }) } else { Member::Junk });
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(weak: bool, o: &str) -> Member {
        Member::Tag(EntityTag { weak, opaque: o.to_string() })
    }

    #[test]
    fn lists_keep_commas_inside_quotes() {
        let got: Vec<Member> = list_members("\"a,b\", W/\"c\" ,,\"d\" x, \"e").collect();
        assert_eq!(got, [tag(false, "\"a,b\""), tag(true, "\"c\""), tag(false, "\"d\""), Member::Junk, Member::Junk]);
    }

    #[test]
    fn methods() {
        for m in ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "get", "BREW"] {
            let method = Method::from_token(m);
            assert_eq!(method.as_str(), m);
            assert_eq!(method.is_served(), m == "GET" || m == "HEAD", "{m}");
        }
        assert_eq!(Method::from_token("get"), Method::Other("get".into()));
    }

    #[test]
    fn if_range_values() {
        let date = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let strong = |o: &str| IfRange::Tag(EntityTag::strong(o.into()));
        for (value, want) in [
            ("\"a-1\"", strong("\"a-1\"")),
            (" \"a-1\" ", strong("\"a-1\"")),
            ("W/\"a-1\"", IfRange::Invalid),
            ("\"a-1\", \"b\"", IfRange::Invalid),
            ("\"a-1\" x", IfRange::Invalid),
            ("\"a-1", IfRange::Invalid),
            ("Tue, 14 Nov 2023 22:13:20 GMT", IfRange::Date(date)),
            ("garbage", IfRange::Invalid),
        ] {
            assert_eq!(IfRange::parse(value), want, "{value:?}");
        }
    }

    #[test]
    fn fields_are_joined_or_replaced() {
        let mut f = HeaderFields::default();
        for (n, v) in [
            ("If-None-Match", "\"a\""),
            ("if-match", "\"c\""),
            ("IF-NONE-MATCH", "\"b\""),
            ("If-Range", "\"d\""),
            ("If-Range", "\"e\""),
            ("If-Modified-Since", "Tue, 14 Nov 2023 22:13:20 GMT"),
            ("If-Modified-Since", "junk"),
            ("Range", "bytes=0-1"),
            ("Range", "bytes=2-3"),
            ("X-Other", "y"),
        ] {
            f.add(n, v);
        }
        let h = f.parse();
        let strong = |o: &str| EntityTag::strong(o.into());
        assert_eq!(h.if_none_match, Some(TagCondition::Tags(vec![strong("\"a\""), strong("\"b\"")])));
        assert_eq!(h.if_match, Some(TagCondition::Tags(vec![strong("\"c\"")])));
        assert_eq!(h.if_range, Some(IfRange::Invalid));
        assert_eq!(h.if_modified_since, None, "the last line wins, and it is no date");
        assert_eq!(h.range, RangeSet::parse("bytes=2-3"));
        assert!(h.range.is_some());
        assert_eq!(HeaderFields::default().parse(), Headers::default());
    }

    #[test]
    fn tag_conditions() {
        let ours = EntityTag::strong("\"a-1\"".into());
        for (value, strong, weak) in [
            ("*", true, true),
            ("\"a-1\"", true, true),
            ("\"x\", \"a-1\"", true, true),
            ("W/\"a-1\"", false, true),
            ("\"x\", W/\"a-1\"", false, true),
            ("\"x\"", false, false),
            ("", false, false),
            ("*, \"x\"", false, false),
            ("a-1", false, false),
        ] {
            let c = TagCondition::parse(value);
            assert_eq!(c.matches(&ours, Comparison::Strong), strong, "{value:?} strong");
            assert_eq!(c.matches(&ours, Comparison::Weak), weak, "{value:?} weak");
        }
    }

    #[test]
    fn accept_encoding_qualities() {
        for (value, coding, want) in [
            ("gzip, br", "br", 1000),
            ("gzip;q=0.5, br;q=0.25", "br", 250),
            ("gzip;q=0.5", "br", 0),
            ("GZIP;Q=0.8", "gzip", 800),
            ("x-gzip", "gzip", 1000),
            ("br;q=0", "br", 0),
            ("*;q=0.3", "zstd", 300),
            ("*;q=0.3, zstd;q=0", "zstd", 0),
            ("br;q=1.0", "br", 1000),
            ("br;q=1.5", "br", 0),
            ("br;q=0.1234", "br", 0),
            ("br;q=abc", "br", 0),
            ("", "identity", 1000),
            ("gzip", "identity", 1000),
            ("identity;q=0", "identity", 0),
            ("*;q=0", "identity", 0),
            ("*;q=0, identity", "identity", 1000),
        ] {
            assert_eq!(AcceptEncoding::parse(value).quality(coding), want, "{value:?} {coding}");
        }
        let mut f = HeaderFields::default();
        f.add("Accept-Encoding", "gzip");
        f.add("accept-encoding", "br;q=0.5");
        assert_eq!(f.parse().accept_encoding.map(|a| a.quality("br")), Some(500), "lines are joined");
        for (accept, want) in [
            ("application/json", ListingFormat::Json),
            ("application/json, text/html;q=0.5", ListingFormat::Json),
            ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", ListingFormat::Html),
            ("text/html, application/json", ListingFormat::Html),
            ("application/json;q=0", ListingFormat::Html),
            ("*/*", ListingFormat::Html),
        ] {
            let mut f = HeaderFields::default();
            f.add("Accept", accept);
            assert_eq!(f.parse().listing, want, "{accept}");
        }
    }

    #[test]
    fn entity_tag_comparison() {
        // RFC 9110 section 8.8.3.2's table.
        let t = |weak: bool, o: &str| EntityTag { weak, opaque: o.to_string() };
        for (a, b, strong, weak) in [
            (t(true, "\"1\""), t(true, "\"1\""), false, true),
            (t(true, "\"1\""), t(true, "\"2\""), false, false),
            (t(true, "\"1\""), t(false, "\"1\""), false, true),
            (t(false, "\"1\""), t(false, "\"1\""), true, true),
        ] {
            assert_eq!((a.strong_eq(&b), a.weak_eq(&b)), (strong, weak), "{a} {b}");
        }
        assert_eq!(t(true, "\"x\"").to_string(), "W/\"x\"");
    }
}
