//! Byte ranges (RFC 9110 section 14): the one Range form this server honours, a
//! single byte range, and what it selects of a file. Several ranges, other units
//! and malformed values are ignored, so the whole file is sent (as nginx does for
//! what it cannot serve as one part).

use std::ops::Range;

/// One byte range as requested, before the file's size is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteRangeSpec {
    /// `first-` or `first-last` (inclusive `last`, as written on the wire).
    From { first: u64, last: Option<u64> },
    /// `-n`: the last `n` bytes.
    Suffix(u64),
}

/// What a range selects of a representation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeOutcome {
    /// Send the whole file with 200.
    Full,
    /// Send these bytes with 206 (half-open, non-empty, within the file).
    Partial(Range<u64>),
    /// 416 Range Not Satisfiable.
    Unsatisfiable,
}

impl ByteRangeSpec {
    /// Parses a Range value; `None` when it is not a single byte range.
    pub fn parse(value: &str) -> Option<ByteRangeSpec> {
        // The range unit is case-insensitive (RFC 9110 section 14.1).
        let value = value.trim();
        let spec = match value.get(..6) {
            Some(unit) if unit.eq_ignore_ascii_case("bytes=") => &value[6..],
            _ => return None,
        };
        if spec.contains(',') {
            return None;
        }
        let (a, b) = spec.trim().split_once('-')?;
        let (a, b) = (a.trim(), b.trim());
        // 1*DIGIT only: u64's parser would also take a leading '+'.
        let number = |s: &str| -> Option<u64> {
            if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
                None
            } else {
                s.parse().ok()
            }
        };
        match (a.is_empty(), b.is_empty()) {
            (true, true) => None,
            (true, false) => number(b).map(ByteRangeSpec::Suffix),
            (false, _) => {
                let first = number(a)?;
                let last = if b.is_empty() {
                    None
                } else {
                    // A last position before the first makes the whole value invalid.
                    Some(number(b).filter(|&l| l >= first)?)
                };
                Some(ByteRangeSpec::From { first, last })
            }
        }
    }

    /// What this range selects of `size` bytes.
    pub fn resolve(self, size: u64) -> RangeOutcome {
        match self {
            ByteRangeSpec::Suffix(0) => RangeOutcome::Unsatisfiable,
            ByteRangeSpec::Suffix(_) if size == 0 => RangeOutcome::Unsatisfiable,
            ByteRangeSpec::Suffix(n) => RangeOutcome::Partial(size.saturating_sub(n)..size),
            ByteRangeSpec::From { first, .. } if first >= size => RangeOutcome::Unsatisfiable,
            ByteRangeSpec::From { first, last } => {
                let end = last.map_or(size, |l| l.saturating_add(1).min(size));
                RangeOutcome::Partial(first..end)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RangeOutcome::*;

    fn range(value: &str, size: u64) -> RangeOutcome {
        ByteRangeSpec::parse(value).map_or(Full, |s| s.resolve(size))
    }

    #[test]
    fn ranges() {
        for (value, size, want) in [
            ("bytes=0-0", 10, Partial(0..1)),
            ("bytes=5-", 10, Partial(5..10)),
            ("bytes=-3", 10, Partial(7..10)),
            ("bytes=-30", 10, Partial(0..10)),
            ("bytes=2-100", 10, Partial(2..10)),
            ("bytes=9-9", 10, Partial(9..10)),
            ("bytes=0-18446744073709551615", 10, Partial(0..10)),
            (" bytes= 1 - 2 ", 10, Partial(1..3)),
            ("bytes=10-", 10, Unsatisfiable),
            ("bytes=10-20", 10, Unsatisfiable),
            ("bytes=-0", 10, Unsatisfiable),
            ("bytes=0-", 0, Unsatisfiable),
            ("bytes=-1", 0, Unsatisfiable),
            ("bytes=0-1,3-4", 10, Full),
            ("bytes=5-2", 10, Full),
            ("bytes=-", 10, Full),
            ("bytes=", 10, Full),
            ("bytes=1", 10, Full),
            ("bytes=+1-2", 10, Full),
            ("bytes=1-+2", 10, Full),
            ("bytes=-+2", 10, Full),
            ("items=0-1", 10, Full),
            ("bytes=x-1", 10, Full),
            ("Bytes=0-1", 10, Partial(0..2)),
            ("BYTES=-2", 10, Partial(8..10)),
            ("byte=0-1", 10, Full),
            ("bytés=0-1", 10, Full),
            ("bytes=99999999999999999999-", 10, Full),
        ] {
            assert_eq!(range(value, size), want, "{value:?} of {size}");
        }
    }
}
