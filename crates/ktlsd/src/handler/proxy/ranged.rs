//! The cold range fill: a `Range` request that misses on a cacheable object goes
//! upstream without its `Range` (and `If-Range`), the whole answer is stored as any
//! miss, and the client's range is cut out of the body as it streams past
//! ([`Window`]), so the client has its `206` as soon as its bytes have arrived.
//!
//! Not here: the lookup that decides a request is filled this way (`super::cached`)
//! and the streaming itself (`super::forward`).

use std::ops::Range;

use super::parse;
use crate::handler::cache;
use crate::handler::range::RangeOutcome;
use crate::handler::request::Headers;

/// The request fields that select a part: not sent upstream by a cold range fill.
const RANGE_FIELDS: [&str; 2] = ["range", "if-range"];

/// `fields` without `Range` and `If-Range`, and whether one was taken out.
pub fn without_range(fields: &mut Vec<(String, String)>) -> bool {
    let before = fields.len();
    fields.retain(|(n, _)| !RANGE_FIELDS.iter().any(|r| n.eq_ignore_ascii_case(r)));
    fields.len() != before
}

/// What a cold range fill does with the upstream's head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cold {
    /// The object is larger than `max_object_size`: never filled this way; the
    /// request is sent again with its `Range`, as without a cache.
    Again,
    /// Answer `206` with these bytes of a body of `size` bytes.
    Window { range: Range<u64>, size: u64 },
    /// Answer `416` (the body has `size` bytes).
    Unsatisfiable { size: u64 },
    /// Pass the answer as it is (not a 200 with a known length, or a range the
    /// cache answers whole: several ranges, an `If-Range` that does not match).
    Whole,
}

impl Cold {
    /// The verdict on the upstream's `head` for a request with fields `req`, when the
    /// cache stores bodies up to `max_object_size`.
    pub fn of(head: &parse::Head, req: &Headers, max_object_size: u64) -> Cold {
        let size = match head.framing {
            parse::Framing::Length(n) if head.status == 200 && n > 0 => n,
            _ => return Cold::Whole,
        };
        if size > max_object_size {
            return Cold::Again;
        }
        let field =
            |name: &str| head.fields.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str());
        match cache::range_of(req, field("etag"), field("last-modified"), size) {
            RangeOutcome::Partial(range) => Cold::Window { range, size },
            RangeOutcome::Unsatisfiable => Cold::Unsatisfiable { size },
            RangeOutcome::Full | RangeOutcome::Multi(_) => Cold::Whole,
        }
    }
}

/// The client's part of a body that streams whole: which bytes of each piece it gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    range: Range<u64>,
    /// Body bytes that went past so far.
    pos: u64,
}

impl Window {
    pub fn new(range: Range<u64>) -> Window {
        Window { range, pos: 0 }
    }

    /// The client's bytes of `piece`, the body's next bytes (empty when none).
    pub fn clip<'a>(&mut self, piece: &'a [u8]) -> &'a [u8] {
        let at = self.pos;
        self.pos = at.saturating_add(piece.len() as u64);
        let from = self.range.start.clamp(at, self.pos) - at;
        let to = self.range.end.clamp(at, self.pos) - at;
        // Both within the piece: `from <= to <= piece.len()`.
        piece.get(from as usize..to as usize).unwrap_or_default()
    }

    /// Whether every byte of the range went past.
    pub fn done(&self) -> bool {
        self.pos >= self.range.end
    }

    /// How many bytes the client gets.
    pub fn len(&self) -> u64 {
        self.range.end - self.range.start
    }
}

/// What the client gets of `piece`, the body's next bytes (`end`: its last): all of
/// it, or with a cold range fill's `window` the part in its range; and whether the
/// client's answer ends with it (with the body, or with its range).
pub fn to_client<'a>(window: Option<&mut Window>, piece: &'a [u8], end: bool) -> (&'a [u8], bool) {
    match window {
        Some(w) => {
            let out = w.clip(piece);
            (out, end || w.done())
        }
        None => (piece, end),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One piece of a body: its size, the part of it the client gets, and whether
    /// the range is done after it.
    type Piece = (usize, (usize, usize), bool);

    #[test]
    fn windows_cut_the_range_out_of_the_pieces() {
        let cases: [(Range<u64>, Vec<Piece>); 6] = [
            (0..1, vec![(10, (0, 1), true)]),
            (3..7, vec![(10, (3, 7), true)]),
            (3..7, vec![(2, (0, 0), false), (2, (1, 2), false), (2, (0, 2), false), (2, (0, 1), true)]),
            (5..10, vec![(5, (0, 0), false), (5, (0, 5), true)]),
            (9..10, vec![(4, (0, 0), false), (4, (0, 0), false), (2, (1, 2), true)]),
            (0..8, vec![(4, (0, 4), false), (0, (0, 0), false), (4, (0, 4), true), (4, (0, 0), true)]),
        ];
        for (range, pieces) in cases {
            let mut w = Window::new(range.clone());
            let mut offset = 0u8;
            for (n, (from, to), done) in pieces {
                let piece: Vec<u8> = (0..n as u8).map(|i| offset + i).collect();
                offset += n as u8;
                assert_eq!(w.clip(&piece), &piece[from..to], "{range:?} at {offset}");
                assert_eq!(w.done(), done, "{range:?} at {offset}");
            }
        }
    }

    #[test]
    fn the_fill_drops_range_and_if_range_only() {
        let mut fields: Vec<(String, String)> = [("Accept", "*/*"), ("Range", "bytes=0-9"), ("if-range", "\"x\"")]
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert!(without_range(&mut fields));
        assert_eq!(fields, [("Accept".to_string(), "*/*".to_string())]);
        assert!(!without_range(&mut fields));
    }

    fn head(status: u16, framing: parse::Framing, fields: &[(&str, &str)]) -> parse::Head {
        let fields = fields.iter().map(|(n, v)| (n.to_string().into(), v.to_string())).collect();
        parse::Head { status, version: "1.1", fields, framing, reusable: true }
    }

    #[test]
    fn cold_verdicts() {
        let req = |range: &str, if_range: Option<&str>| Headers {
            range: crate::handler::range::RangeSet::parse(range),
            if_range: if_range.map(crate::handler::request::IfRange::parse),
            ..Headers::default()
        };
        let tagged = [("ETag", "\"v1\"")];
        let n = parse::Framing::Length(100);
        let cases = [
            (head(200, n, &tagged), req("bytes=0-9", None), Cold::Window { range: 0..10, size: 100 }),
            (head(200, n, &tagged), req("bytes=-10", None), Cold::Window { range: 90..100, size: 100 }),
            (head(200, n, &tagged), req("bytes=95-", None), Cold::Window { range: 95..100, size: 100 }),
            (head(200, n, &tagged), req("bytes=100-", None), Cold::Unsatisfiable { size: 100 }),
            (head(200, n, &tagged), req("bytes=0-1,5-6", None), Cold::Whole),
            (head(200, n, &tagged), req("bytes=0-9", Some("\"v1\"")), Cold::Window { range: 0..10, size: 100 }),
            (head(200, n, &tagged), req("bytes=0-9", Some("\"v2\"")), Cold::Whole),
            (head(200, parse::Framing::Length(1000), &tagged), req("bytes=0-9", None), Cold::Again),
            (head(200, parse::Framing::Chunked, &tagged), req("bytes=0-9", None), Cold::Whole),
            (head(404, n, &tagged), req("bytes=0-9", None), Cold::Whole),
            (head(200, parse::Framing::Length(0), &tagged), req("bytes=0-9", None), Cold::Whole),
        ];
        for (i, (h, r, want)) in cases.into_iter().enumerate() {
            assert_eq!(Cold::of(&h, &r, 500), want, "case {i}");
        }
    }

    #[test]
    fn what_the_client_gets() {
        // (window, pieces with their `end`): what the client gets of each, and whether it ends.
        let mut w = Window::new(3..7);
        let got: Vec<(&[u8], bool)> = [(&b"abcd"[..], false), (b"efgh", false), (b"ij", true)]
            .iter()
            .map(|&(p, e)| to_client(Some(&mut w), p, e))
            .collect();
        assert_eq!(got, [(&b"d"[..], false), (b"efg", true), (b"", true)]);
        assert_eq!(to_client(None, b"abc", false), (&b"abc"[..], false));
        assert_eq!(to_client(None, b"", true), (&b""[..], true));
    }
}
