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

fn etag_list_matches(list: &str, etag: &str, weak: bool) -> bool {
    let list = list.trim();
    if list == "*" {
        return true;
    }
    let strip = |t: &str| t.trim().strip_prefix("W/").unwrap_or(t.trim()).to_string();
    list.split(',').any(|t| {
        let t = t.trim();
        if weak {
            strip(t) == strip(etag)
        } else {
            !t.starts_with("W/") && t == etag
        }
    })
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

/// Whether an If-Range validator still matches (else the Range is ignored).
pub fn if_range_matches(if_range: &str, v: &Validators<'_>) -> bool {
    let s = if_range.trim();
    if s.starts_with('"') || s.starts_with("W/") {
        etag_list_matches(s, v.etag, false)
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
    let Some(spec) = value.trim().strip_prefix("bytes=") else { return RangeOutcome::Full };
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
    }

    #[test]
    fn etags() {
        assert!(etag_list_matches("\"a\", \"b\"", "\"b\"", true));
        assert!(etag_list_matches("W/\"b\"", "\"b\"", true));
        assert!(!etag_list_matches("W/\"b\"", "\"b\"", false));
        assert!(etag_list_matches("*", "\"b\"", false));
    }
}
