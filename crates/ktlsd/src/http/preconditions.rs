//! Conditional requests (RFC 9110 section 13) and byte ranges (section 14).

use std::time::SystemTime;

/// What the preconditions decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Send the representation (possibly a range).
    Proceed,
    /// 304 Not Modified.
    NotModified,
    /// 412 Precondition Failed.
    Failed,
}

/// The validators of the file being served.
pub struct Validators<'a> {
    pub etag: &'a str,
    pub modified: SystemTime,
}

/// The members of an entity-tag list (`"a", W/"b"`), split at commas outside quotes
/// (an entity tag may contain a comma).
fn etag_list(list: &str) -> impl Iterator<Item = &str> {
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
        if !item.is_empty() {
            return Some(item);
        }
    })
}

fn etag_list_matches(list: &str, etag: &str, weak: bool) -> bool {
    let list = list.trim();
    if list == "*" {
        return true;
    }
    let opaque = |t: &str| t.strip_prefix("W/").unwrap_or(t).to_string();
    etag_list(list).any(|t| if weak { opaque(t) == opaque(etag) } else { !t.starts_with("W/") && t == etag })
}

fn parse_date(s: &str) -> Option<SystemTime> {
    httpdate::parse_http_date(s.trim()).ok()
}

/// Evaluates If-Match, If-Unmodified-Since, If-None-Match and If-Modified-Since, in
/// the RFC's order.
pub fn evaluate(req: &super::request::Request, v: &Validators<'_>) -> Outcome {
    if let Some(im) = &req.if_match {
        if !etag_list_matches(im, v.etag, false) {
            return Outcome::Failed;
        }
    } else if let Some(t) = req.if_unmodified_since.as_deref().and_then(parse_date) {
        if v.modified > t {
            return Outcome::Failed;
        }
    }
    if let Some(inm) = &req.if_none_match {
        if etag_list_matches(inm, v.etag, true) {
            return Outcome::NotModified;
        }
    } else if let Some(t) = req.if_modified_since.as_deref().and_then(parse_date) {
        if v.modified <= t {
            return Outcome::NotModified;
        }
    }
    Outcome::Proceed
}

/// Whether an If-Range validator still matches (else the Range is ignored). If-Range
/// holds exactly one validator (RFC 9110 section 13.1.5): one strong entity tag, compared
/// strongly, or one HTTP date equal to Last-Modified. Anything else, a list included,
/// does not match, so the whole file is sent.
pub fn if_range_matches(if_range: &str, v: &Validators<'_>) -> bool {
    let s = if_range.trim();
    if s.starts_with('"') || s.starts_with("W/") {
        let mut tags = etag_list(s);
        let single = tags.next().filter(|_| tags.next().is_none());
        single.is_some_and(|t| t.len() >= 2 && t.ends_with('"') && !t.starts_with("W/") && t == v.etag)
    } else {
        parse_date(s) == Some(v.modified)
    }
}

/// The result of a Range header against a representation of `size` bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum RangeOutcome {
    /// No usable single range: send the whole file (absent, malformed, or several ranges).
    Full,
    /// One satisfiable range, inclusive bounds.
    Partial { start: u64, end: u64 },
    /// 416 Range Not Satisfiable.
    Unsatisfiable,
}

/// Interprets a Range header value for a file of `size` bytes.
pub fn range(value: &str, size: u64) -> RangeOutcome {
    // The range unit is case-insensitive (RFC 9110 section 14.1).
    let value = value.trim();
    let spec = match value.get(..6) {
        Some(unit) if unit.eq_ignore_ascii_case("bytes=") => &value[6..],
        _ => return RangeOutcome::Full,
    };
    if spec.contains(',') {
        return RangeOutcome::Full;
    }
    let Some((a, b)) = spec.trim().split_once('-') else { return RangeOutcome::Full };
    let (a, b) = (a.trim(), b.trim());
    let parse = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            None
        } else {
            s.parse().ok()
        }
    };
    match (a.is_empty(), b.is_empty()) {
        (true, true) => RangeOutcome::Full,
        (true, false) => match parse(b) {
            None => RangeOutcome::Full,
            Some(0) => RangeOutcome::Unsatisfiable,
            Some(_) if size == 0 => RangeOutcome::Unsatisfiable,
            Some(n) => RangeOutcome::Partial { start: size.saturating_sub(n), end: size - 1 },
        },
        (false, _) => {
            let Some(start) = parse(a) else { return RangeOutcome::Full };
            let end = if b.is_empty() {
                None
            } else {
                match parse(b) {
                    Some(e) if e >= start => Some(e),
                    _ => return RangeOutcome::Full,
                }
            };
            if start >= size {
                return RangeOutcome::Unsatisfiable;
            }
            let end = end.map_or(size - 1, |e| e.min(size - 1));
            RangeOutcome::Partial { start, end }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RangeOutcome::*;

    #[test]
    fn ranges() {
        assert_eq!(range("bytes=0-0", 10), Partial { start: 0, end: 0 });
        assert_eq!(range("bytes=5-", 10), Partial { start: 5, end: 9 });
        assert_eq!(range("bytes=-3", 10), Partial { start: 7, end: 9 });
        assert_eq!(range("bytes=-30", 10), Partial { start: 0, end: 9 });
        assert_eq!(range("bytes=2-100", 10), Partial { start: 2, end: 9 });
        assert_eq!(range("bytes=10-", 10), Unsatisfiable);
        assert_eq!(range("bytes=-0", 10), Unsatisfiable);
        assert_eq!(range("bytes=0-", 0), Unsatisfiable);
        assert_eq!(range("bytes=0-1,3-4", 10), Full);
        assert_eq!(range("bytes=5-2", 10), Full);
        assert_eq!(range("items=0-1", 10), Full);
        assert_eq!(range("bytes=x-1", 10), Full);
        assert_eq!(range("Bytes=0-1", 10), Partial { start: 0, end: 1 });
        assert_eq!(range("BYTES=-2", 10), Partial { start: 8, end: 9 });
        assert_eq!(range("byte=0-1", 10), Full);
        assert_eq!(range("bytés=0-1", 10), Full);
    }

    fn validators(etag: &str) -> Validators<'_> {
        Validators { etag, modified: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000) }
    }

    #[test]
    fn if_range_is_one_validator() {
        let v = validators("\"a-1\"");
        let date = httpdate::fmt_http_date(v.modified);
        for (value, want) in [
            ("\"a-1\"", true),
            (" \"a-1\" ", true),
            ("W/\"a-1\"", false),
            ("\"b\"", false),
            ("\"a-1\", \"b\"", false),
            ("\"b\", \"a-1\"", false),
            ("\"a-1\", \"a-1\"", false),
            ("\"a-1", false),
            (date.as_str(), true),
            ("Tue, 14 Nov 2023 22:13:21 GMT", false),
            ("garbage", false),
        ] {
            assert_eq!(if_range_matches(value, &v), want, "{value:?}");
        }
    }

    #[test]
    fn joined_lists_evaluate_as_one() {
        use super::super::request::Request;
        let v = validators("\"a-1\"");
        let req = |inm: Option<&str>, im: Option<&str>| Request {
            if_none_match: inm.map(str::to_string),
            if_match: im.map(str::to_string),
            ..Request::default()
        };
        for (inm, im, want) in [
            (Some("\"x\", \"a-1\""), None, Outcome::NotModified),
            (Some("\"a-1\", \"x\""), None, Outcome::NotModified),
            (Some("\"x\", \"y\""), None, Outcome::Proceed),
            (Some("W/\"a-1\""), None, Outcome::NotModified),
            (None, Some("\"x\", \"a-1\""), Outcome::Proceed),
            (None, Some("\"a-1\", \"x\""), Outcome::Proceed),
            (None, Some("\"x\", W/\"a-1\""), Outcome::Failed),
            (None, Some("*"), Outcome::Proceed),
        ] {
            assert_eq!(evaluate(&req(inm, im), &v), want, "{inm:?} {im:?}");
        }
    }

    #[test]
    fn etag_lists_keep_commas_inside_quotes() {
        assert_eq!(etag_list("\"a,b\", W/\"c\" ,,\"d\"").collect::<Vec<_>>(), ["\"a,b\"", "W/\"c\"", "\"d\""]);
        assert!(etag_list_matches("\"x\", \"a,b\"", "\"a,b\"", false));
    }

    #[test]
    fn etags() {
        assert!(etag_list_matches("\"a\", \"b\"", "\"b\"", true));
        assert!(etag_list_matches("W/\"b\"", "\"b\"", true));
        assert!(!etag_list_matches("W/\"b\"", "\"b\"", false));
        assert!(etag_list_matches("*", "\"b\"", false));
    }
}
