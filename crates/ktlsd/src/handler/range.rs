//! Byte ranges (RFC 9110 section 14): a Range field of up to [`MAX_RANGES`] byte
//! ranges, and what it selects of a file. One satisfiable range is answered with a
//! single 206 part; several with `multipart/byteranges` (built in [`multipart`]).
//!
//! Ranges that overlap or touch are coalesced into one (RFC 9110 section 14.3
//! allows it); the others keep the order the client gave them. Ranges that
//! cannot be satisfied are left out, and when none is left the answer is 416.
//! More than [`MAX_RANGES`] ranges, other units and malformed values make the
//! field ignored, so the whole file is sent with 200 (RFC 9110 section 14.2
//! lets a server ignore Range; nginx does the same past its own limit).

use std::ops::Range;

/// One byte range as requested, before the file's size is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteRangeSpec {
    /// `first-` or `first-last` (inclusive `last`, as written on the wire).
    From { first: u64, last: Option<u64> },
    /// `-n`: the last `n` bytes.
    Suffix(u64),
}

/// Most ranges one request may ask for; a Range field with more is ignored.
pub const MAX_RANGES: usize = 16;

/// What a Range field selects of a representation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeOutcome {
    /// Send the whole file with 200.
    Full,
    /// Send these bytes with 206 (half-open, non-empty, within the file).
    Partial(Range<u64>),
    /// Send these ranges as a 206 `multipart/byteranges` body: two or more,
    /// non-empty, within the file, none overlapping or touching another, in the
    /// client's order.
    Multi(Vec<Range<u64>>),
    /// 416 Range Not Satisfiable.
    Unsatisfiable,
}

/// The byte ranges of a Range field, as requested (1 to [`MAX_RANGES`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet(Vec<ByteRangeSpec>);

impl RangeSet {
    /// Parses a Range value; `None` when it is not a list of 1 to [`MAX_RANGES`]
    /// well-formed byte ranges (then the field is ignored).
    pub fn parse(value: &str) -> Option<RangeSet> {
        // The range unit is case-insensitive (RFC 9110 section 14.1).
        let value = value.trim();
        let specs = match value.get(..6) {
            Some(unit) if unit.eq_ignore_ascii_case("bytes=") => &value[6..],
            _ => return None,
        };
        let mut out = Vec::new();
        // Empty list members are allowed and mean nothing (RFC 9110 section 5.6.1).
        for spec in specs.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if out.len() == MAX_RANGES {
                return None;
            }
            out.push(ByteRangeSpec::parse(spec)?);
        }
        (!out.is_empty()).then_some(RangeSet(out))
    }

    /// The first byte asked for, when the field asks for one range that names it
    /// (`first-` or `first-last`); `None` for a suffix range or several ranges.
    pub fn first_byte(&self) -> Option<u64> {
        match self.0.as_slice() {
            [ByteRangeSpec::From { first, .. }] => Some(*first),
            _ => None,
        }
    }

    /// What these ranges select of `size` bytes: the satisfiable ones, coalesced
    /// where they overlap or touch, in the order asked.
    pub fn resolve(&self, size: u64) -> RangeOutcome {
        let mut ranges: Vec<Range<u64>> = Vec::with_capacity(self.0.len());
        for spec in &self.0 {
            let RangeOutcome::Partial(mut r) = spec.resolve(size) else { continue };
            // Merge every range already taken that overlaps or touches this one, into the first of them.
            let mut at = None;
            let mut i = 0;
            while i < ranges.len() {
                let o = &ranges[i];
                if o.start <= r.end && r.start <= o.end {
                    r = o.start.min(r.start)..o.end.max(r.end);
                    if at.is_none() {
                        at = Some(i);
                        i += 1;
                    } else {
                        ranges.remove(i);
                    }
                } else {
                    i += 1;
                }
            }
            match at {
                Some(i) => ranges[i] = r,
                None => ranges.push(r),
            }
        }
        match ranges.len() {
            0 => RangeOutcome::Unsatisfiable,
            1 => RangeOutcome::Partial(ranges.remove(0)),
            _ => RangeOutcome::Multi(ranges),
        }
    }
}

impl ByteRangeSpec {
    /// Parses one range-spec (`0-9`, `5-`, `-3`); `None` when malformed.
    fn parse(spec: &str) -> Option<ByteRangeSpec> {
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

/// One piece of a body made of parts (`response::Body::Parts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Bytes(Vec<u8>),
    /// A range of the body's file, half-open, within its length.
    File(Range<u64>),
}

impl Part {
    pub fn len(&self) -> u64 {
        match self {
            Part::Bytes(b) => b.len() as u64,
            Part::File(r) => r.end - r.start,
        }
    }
}

/// The parts of a `multipart/byteranges` body (RFC 9110 section 14.6) for
/// `ranges` of a `size`-byte file of `content_type`: each range's delimiter and
/// fields in memory, its bytes from the file, then the closing delimiter; and
/// the body's length.
pub fn multipart(ranges: &[Range<u64>], size: u64, content_type: &str, boundary: &str) -> (Vec<Part>, u64) {
    let mut parts = Vec::with_capacity(ranges.len() * 2 + 1);
    let mut len = 0;
    for (i, r) in ranges.iter().enumerate() {
        let crlf = if i == 0 { "" } else { "\r\n" };
        let head = format!(
            "{crlf}--{boundary}\r\nContent-Type: {content_type}\r\nContent-Range: bytes {}-{}/{size}\r\n\r\n",
            r.start,
            r.end - 1
        );
        len += head.len() as u64 + (r.end - r.start);
        parts.push(Part::Bytes(head.into_bytes()));
        parts.push(Part::File(r.clone()));
    }
    let close = format!("\r\n--{boundary}--\r\n");
    len += close.len() as u64;
    parts.push(Part::Bytes(close.into_bytes()));
    (parts, len)
}

/// A fresh boundary: 20 random hexadecimal digits, which no file is likely to hold
/// by chance and which tells nothing of the file.
pub fn boundary() -> String {
    let mut bytes = [0u8; 10];
    if aws_lc_rs::rand::fill(&mut bytes).is_err() {
        // Unpredictability is not needed for correctness: the clock will do.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        bytes.copy_from_slice(&nanos.to_be_bytes()[6..]);
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use RangeOutcome::*;

    fn range(value: &str, size: u64) -> RangeOutcome {
        RangeSet::parse(value).map_or(Full, |s| s.resolve(size))
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

    #[test]
    fn multipart_layout() {
        let (parts, len) = multipart(&[0..2, 5..6], 10, "text/plain", "B");
        let file = b"0123456789";
        let mut body = Vec::new();
        for p in &parts {
            match p {
                Part::Bytes(b) => body.extend_from_slice(b),
                Part::File(r) => body.extend_from_slice(&file[r.start as usize..r.end as usize]),
            }
        }
        let want = "--B\r\nContent-Type: text/plain\r\nContent-Range: bytes 0-1/10\r\n\r\n01\r\n\
                    --B\r\nContent-Type: text/plain\r\nContent-Range: bytes 5-5/10\r\n\r\n5\r\n--B--\r\n";
        assert_eq!(String::from_utf8_lossy(&body), want);
        assert_eq!(len, body.len() as u64);
        assert_eq!(parts.iter().map(Part::len).sum::<u64>(), len);
        let (a, b) = (boundary(), boundary());
        assert_eq!(a.len(), 20);
        assert_ne!(a, b);
    }

    #[test]
    fn several_ranges() {
        let sixteen = (0..16).map(|i| format!("{}-{}", i * 4, i * 4 + 1)).collect::<Vec<_>>().join(",");
        let seventeen = format!("{sixteen},90-91");
        for (value, size, want) in [
            ("bytes=0-1,3-4", 10, Multi(vec![0..2, 3..5])),
            ("bytes=0-9,20-29", 100, Multi(vec![0..10, 20..30])),
            // The client's order is kept.
            ("bytes=20-29,0-9", 100, Multi(vec![20..30, 0..10])),
            ("bytes=-5,0-0", 100, Multi(vec![95..100, 0..1])),
            // Overlapping and touching ranges are coalesced.
            ("bytes=0-5,3-9", 100, Partial(0..10)),
            ("bytes=0-4,5-9", 100, Partial(0..10)),
            ("bytes=0-4,20-29,5-9", 100, Multi(vec![0..10, 20..30])),
            ("bytes=0-1,10-11,1-10", 100, Partial(0..12)),
            ("bytes=50-,0-9,-60", 100, Multi(vec![40..100, 0..10])),
            ("bytes=0-0,0-0,0-0", 100, Partial(0..1)),
            // Unsatisfiable members are left out; none left is 416.
            ("bytes=0-9,200-300", 100, Partial(0..10)),
            ("bytes=200-,300-", 100, Unsatisfiable),
            ("bytes=0-1, ,3-4", 10, Multi(vec![0..2, 3..5])),
            ("bytes=0-1,", 10, Partial(0..2)),
            ("bytes=,", 10, Full),
            ("bytes=0-1,x", 10, Full),
            ("bytes=0-1,5-2", 10, Full),
            (&format!("bytes={sixteen}"), 100, Multi((0..16).map(|i| i * 4..i * 4 + 2).collect())),
            (&format!("bytes={seventeen}"), 100, Full),
        ] {
            assert_eq!(range(value, size), want, "{value:?} of {size}");
        }
    }
}
