//! Conditional requests (RFC 9110 section 13): which of 200, 304 and 412 the
//! validators of the file call for, evaluated in the RFC's order (section 13.2.2),
//! and whether If-Range lets a Range through.

use std::time::SystemTime;

use super::request::{Comparison, EntityTag, Headers, IfRange};

/// What the preconditions decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Send the representation (possibly a range).
    Proceed,
    /// 304 Not Modified.
    NotModified,
    /// 412 Precondition Failed.
    Failed,
}

/// The validators of the file being served.
pub struct Validators {
    pub etag: EntityTag,
    /// Whole seconds, as HTTP dates carry.
    pub modified: SystemTime,
}

/// If-Match, else If-Unmodified-Since; then If-None-Match, else If-Modified-Since.
/// The method is GET or HEAD, so a matching If-None-Match means 304.
pub fn evaluate(h: &Headers, v: &Validators) -> Outcome {
    if let Some(im) = &h.if_match {
        if !im.matches(&v.etag, Comparison::Strong) {
            return Outcome::Failed;
        }
    } else if let Some(t) = h.if_unmodified_since {
        if v.modified > t {
            return Outcome::Failed;
        }
    }
    if let Some(inm) = &h.if_none_match {
        if inm.matches(&v.etag, Comparison::Weak) {
            return Outcome::NotModified;
        }
    } else if let Some(t) = h.if_modified_since {
        if v.modified <= t {
            return Outcome::NotModified;
        }
    }
    Outcome::Proceed
}

/// Whether a Range applies: there is no If-Range, or its one validator still matches
/// (a strong tag compared strongly, or a date equal to Last-Modified).
pub fn range_applies(h: &Headers, v: &Validators) -> bool {
    match &h.if_range {
        None => true,
        Some(IfRange::Tag(t)) => t.strong_eq(&v.etag),
        Some(IfRange::Date(d)) => *d == v.modified,
        Some(IfRange::Invalid) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::request::HeaderFields;
    use std::time::Duration;
    use Outcome::*;

    const T: u64 = 1_700_000_000;

    fn at(secs: u64) -> String {
        httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
    }

    fn headers(fields: &[(&str, &str)]) -> Headers {
        let mut f = HeaderFields::default();
        for (n, v) in fields {
            f.add(n, v);
        }
        f.parse()
    }

    fn validators() -> Validators {
        Validators {
            etag: EntityTag::strong("\"a-1\"".into()),
            modified: SystemTime::UNIX_EPOCH + Duration::from_secs(T),
        }
    }

    #[test]
    fn evaluation_order() {
        let (before, same, after) = (at(T - 1), at(T), at(T + 1));
        for (fields, want) in [
            (vec![], Proceed),
            (vec![("If-None-Match", "\"a-1\"")], NotModified),
            (vec![("If-None-Match", "W/\"a-1\"")], NotModified),
            (vec![("If-None-Match", "\"x\", \"a-1\"")], NotModified),
            (vec![("If-None-Match", "\"x\", \"y\"")], Proceed),
            (vec![("If-None-Match", "*")], NotModified),
            (vec![("If-Match", "\"a-1\"")], Proceed),
            (vec![("If-Match", "\"x\", \"a-1\"")], Proceed),
            (vec![("If-Match", "\"x\", W/\"a-1\"")], Failed),
            (vec![("If-Match", "*")], Proceed),
            (vec![("If-Match", "junk")], Failed),
            (vec![("If-Modified-Since", same.as_str())], NotModified),
            (vec![("If-Modified-Since", after.as_str())], NotModified),
            (vec![("If-Modified-Since", before.as_str())], Proceed),
            (vec![("If-Modified-Since", "not a date")], Proceed),
            (vec![("If-Unmodified-Since", before.as_str())], Failed),
            (vec![("If-Unmodified-Since", same.as_str())], Proceed),
            (vec![("If-Unmodified-Since", "not a date")], Proceed),
            // If-None-Match outranks If-Modified-Since, even when it does not match.
            (vec![("If-None-Match", "\"x\""), ("If-Modified-Since", same.as_str())], Proceed),
            // If-Match outranks If-Unmodified-Since.
            (vec![("If-Match", "\"a-1\""), ("If-Unmodified-Since", before.as_str())], Proceed),
            // 412 comes before 304.
            (vec![("If-Match", "\"x\""), ("If-None-Match", "\"a-1\"")], Failed),
            (vec![("If-Unmodified-Since", before.as_str()), ("If-None-Match", "\"a-1\"")], Failed),
            (vec![("If-Match", "\"a-1\""), ("If-None-Match", "\"a-1\"")], NotModified),
        ] {
            assert_eq!(evaluate(&headers(&fields), &validators()), want, "{fields:?}");
        }
    }

    #[test]
    fn if_range() {
        let v = validators();
        for (value, want) in [
            (Some("\"a-1\""), true),
            (Some("W/\"a-1\""), false),
            (Some("\"b\""), false),
            (Some("\"a-1\", \"a-1\""), false),
            (Some(at(T).as_str()), true),
            (Some(at(T - 1).as_str()), false),
            (Some("garbage"), false),
            (None, true),
        ] {
            let h = headers(&value.map(|v| ("If-Range", v)).into_iter().collect::<Vec<_>>());
            assert_eq!(range_applies(&h, &v), want, "{value:?}");
        }
    }
}
