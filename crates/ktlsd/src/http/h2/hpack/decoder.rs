//! The HPACK (RFC 7541) decoder of the peer's field blocks: integers, string
//! literals (raw or Huffman, see `huffman`), the static table of appendix A and a
//! dynamic table bounded by our SETTINGS_HEADER_TABLE_SIZE. Every violation of RFC
//! 7541 is an error that the codec turns into a COMPRESSION_ERROR on the
//! connection, since the peer's table and ours can no longer be trusted to agree.
//!
//! Not here: the limit on a decoded field list (the parent module counts it while
//! fields are handed over), or what the fields mean.

use std::collections::VecDeque;

use super::huffman;

/// RFC 7541 appendix A.
const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// Bytes a table entry counts besides its name and value (RFC 7541 section 4.1).
const ENTRY_OVERHEAD: usize = 32;

/// Why a field block cannot be decoded; each is a COMPRESSION_ERROR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// The block ends inside a representation.
    Truncated,
    /// An integer past 2^28, more than any field or table can need.
    IntegerOverflow,
    /// Index 0, or past the end of the static and dynamic tables.
    BadIndex,
    /// A Huffman string that section 5.2 forbids.
    Huffman(huffman::HuffmanError),
    /// A dynamic table size update above our SETTINGS_HEADER_TABLE_SIZE.
    TableSizeTooLarge,
    /// A dynamic table size update after a field (section 4.2 puts them first).
    LateTableSizeUpdate,
}

/// An HPACK integer (section 5.1) with a `prefix`-bit prefix at `buf[*at]`;
/// advances `at` past it.
pub(super) fn integer(buf: &[u8], at: &mut usize, prefix: u8) -> Result<usize, DecodeError> {
    let max = (1usize << prefix) - 1;
    let mut value = usize::from(*buf.get(*at).ok_or(DecodeError::Truncated)?) & max;
    *at += 1;
    if value < max {
        return Ok(value);
    }
    for shift in [0, 7, 14, 21] {
        let b = *buf.get(*at).ok_or(DecodeError::Truncated)?;
        *at += 1;
        value += usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(DecodeError::IntegerOverflow)
}

/// A string literal (section 5.2) at `buf[*at]`, decoded into `out`.
fn string(buf: &[u8], at: &mut usize, out: &mut Vec<u8>) -> Result<(), DecodeError> {
    let huffman = buf.get(*at).ok_or(DecodeError::Truncated)? & 0x80 != 0;
    let len = integer(buf, at, 7)?;
    let end = at.checked_add(len).filter(|&end| end <= buf.len()).ok_or(DecodeError::Truncated)?;
    let bytes = &buf[*at..end];
    *at = end;
    if huffman {
        huffman::decode(bytes, out).map_err(DecodeError::Huffman)
    } else {
        out.extend_from_slice(bytes);
        Ok(())
    }
}

/// The decoding side's dynamic table (section 2.3.2), newest entry first.
pub struct FieldDecoder {
    entries: VecDeque<(Vec<u8>, Vec<u8>)>,
    /// Sum of the entries' sizes (section 4.1).
    size: usize,
    /// The table's current maximum size, as the peer last set it.
    max_size: usize,
    /// Our SETTINGS_HEADER_TABLE_SIZE: the peer may not set more.
    allowed: usize,
}

impl FieldDecoder {
    pub fn new(allowed: usize) -> FieldDecoder {
        FieldDecoder { entries: VecDeque::new(), size: 0, max_size: allowed, allowed }
    }

    fn evict_to(&mut self, limit: usize) {
        while self.size > limit {
            let Some((name, value)) = self.entries.pop_back() else { break };
            self.size -= name.len() + value.len() + ENTRY_OVERHEAD;
        }
    }

    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let size = name.len() + value.len() + ENTRY_OVERHEAD;
        // An entry larger than the table empties it and is not added (section 4.4).
        self.evict_to(self.max_size.saturating_sub(size));
        if size <= self.max_size {
            self.size += size;
            self.entries.push_front((name, value));
        }
    }

    /// Entry `index` of the static table followed by the dynamic one (section 2.3.3).
    fn entry(&self, index: usize) -> Result<(&[u8], &[u8]), DecodeError> {
        match index {
            0 => Err(DecodeError::BadIndex),
            1..=61 => Ok(STATIC[index - 1]),
            _ => self.entries.get(index - 62).map(|(n, v)| (&n[..], &v[..])).ok_or(DecodeError::BadIndex),
        }
    }

    /// Decodes one whole field block, calling `field` with each field in order. On
    /// an error the table is left as far as the block got: the connection must end.
    pub fn decode(&mut self, block: &[u8], mut field: impl FnMut(&[u8], &[u8])) -> Result<(), DecodeError> {
        let mut at = 0;
        let mut seen_field = false;
        let (mut name, mut value) = (Vec::new(), Vec::new());
        while let Some(&first) = block.get(at) {
            if first & 0xe0 == 0x20 {
                // Dynamic table size update: only before the block's first field.
                if seen_field {
                    return Err(DecodeError::LateTableSizeUpdate);
                }
                let size = integer(block, &mut at, 5)?;
                if size > self.allowed {
                    return Err(DecodeError::TableSizeTooLarge);
                }
                self.max_size = size;
                self.evict_to(size);
                continue;
            }
            seen_field = true;
            if first & 0x80 != 0 {
                // Indexed field (section 6.1).
                let index = integer(block, &mut at, 7)?;
                let (n, v) = self.entry(index)?;
                field(n, v);
                continue;
            }
            // Literal field: with incremental indexing (01), else without or never indexed.
            let indexing = first & 0xc0 == 0x40;
            let index = integer(block, &mut at, if indexing { 6 } else { 4 })?;
            name.clear();
            value.clear();
            if index == 0 {
                string(block, &mut at, &mut name)?;
            } else {
                name.extend_from_slice(self.entry(index)?.0);
            }
            string(block, &mut at, &mut value)?;
            field(&name, &value);
            if indexing {
                self.insert(std::mem::take(&mut name), std::mem::take(&mut value));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::hex;
    use super::*;

    fn decode(d: &mut FieldDecoder, block: &str) -> Result<Vec<(String, String)>, DecodeError> {
        let mut out = Vec::new();
        d.decode(&hex(block), |n, v| {
            out.push((String::from_utf8(n.to_vec()).unwrap(), String::from_utf8(v.to_vec()).unwrap()))
        })?;
        Ok(out)
    }

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    fn table(d: &FieldDecoder) -> (Vec<(String, String)>, usize) {
        let entries = d
            .entries
            .iter()
            .map(|(n, v)| (String::from_utf8(n.clone()).unwrap(), String::from_utf8(v.clone()).unwrap()))
            .collect();
        (entries, d.size)
    }

    /// RFC 7541 appendix C.2 (single fields), each with its table afterwards.
    #[test]
    fn decodes_appendix_c2() {
        let cases: [(&str, (&str, &str), usize); 4] = [
            ("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572", ("custom-key", "custom-header"), 55),
            ("040c 2f73 616d 706c 652f 7061 7468", (":path", "/sample/path"), 0),
            ("1008 7061 7373 776f 7264 0673 6563 7265 74", ("password", "secret"), 0),
            ("82", (":method", "GET"), 0),
        ];
        for (block, field, size) in cases {
            let mut d = FieldDecoder::new(4096);
            assert_eq!(decode(&mut d, block), Ok(pairs(&[field])), "{block}");
            assert_eq!(d.size, size, "{block}");
        }
    }

    /// RFC 7541 appendix C.3 and C.4: three requests sharing a table, raw and Huffman.
    #[test]
    fn decodes_appendix_c3_and_c4() {
        let requests = [
            (
                "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
                "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
                vec![(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")],
                57,
            ),
            (
                "8286 84be 5808 6e6f 2d63 6163 6865",
                "8286 84be 5886 a8eb 1064 9cbf",
                vec![
                    (":method", "GET"),
                    (":scheme", "http"),
                    (":path", "/"),
                    (":authority", "www.example.com"),
                    ("cache-control", "no-cache"),
                ],
                110,
            ),
            (
                "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
                vec![
                    (":method", "GET"),
                    (":scheme", "https"),
                    (":path", "/index.html"),
                    (":authority", "www.example.com"),
                    ("custom-key", "custom-value"),
                ],
                164,
            ),
        ];
        let (mut raw, mut coded) = (FieldDecoder::new(4096), FieldDecoder::new(4096));
        for (plain, huff, fields, size) in requests {
            assert_eq!(decode(&mut raw, plain), Ok(pairs(&fields)));
            assert_eq!(decode(&mut coded, huff), Ok(pairs(&fields)));
            assert_eq!(raw.size, size);
            assert_eq!(table(&raw), table(&coded));
        }
        assert_eq!(table(&raw).0[0], ("custom-key".into(), "custom-value".into()));
    }

    /// RFC 7541 appendix C.5: responses with a 256-byte table, so entries are evicted.
    #[test]
    fn decodes_appendix_c5_with_eviction() {
        let mut d = FieldDecoder::new(256);
        let first = "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 \
                     2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 \
                     6c65 2e63 6f6d";
        decode(&mut d, first).unwrap();
        assert_eq!(d.size, 222);
        assert_eq!(decode(&mut d, "4803 3330 37c1 c0bf").unwrap()[0], (":status".into(), "307".into()));
        assert_eq!(d.size, 222);
        let (entries, _) = table(&d);
        assert_eq!(entries[0], (":status".into(), "307".into()));
        assert_eq!(entries.len(), 4);
    }

    #[test]
    fn refuses_what_rfc7541_forbids() {
        let cases: [(&str, DecodeError); 9] = [
            // Indexed field 0.
            ("80", DecodeError::BadIndex),
            // Index 62 with an empty dynamic table.
            ("be", DecodeError::BadIndex),
            // A literal whose name index is past both tables.
            ("7f 00 01 61", DecodeError::BadIndex),
            // An integer that never ends within 2^28.
            ("ff ff ff ff ff 01", DecodeError::IntegerOverflow),
            // Cut inside an integer, a length and a string.
            ("ff", DecodeError::Truncated),
            ("40", DecodeError::Truncated),
            ("04 05 2f 61", DecodeError::Truncated),
            // Table size update above SETTINGS_HEADER_TABLE_SIZE (4096), and one after a field.
            ("3f e2 1f", DecodeError::TableSizeTooLarge),
            ("82 20", DecodeError::LateTableSizeUpdate),
        ];
        for (block, err) in cases {
            assert_eq!(decode(&mut FieldDecoder::new(4096), block), Err(err), "{block}");
        }
        let padding = decode(&mut FieldDecoder::new(4096), "04 81 00");
        assert_eq!(padding, Err(DecodeError::Huffman(huffman::HuffmanError::Padding)));
    }

    #[test]
    fn size_updates_evict_and_bound_the_table() {
        let mut d = FieldDecoder::new(4096);
        decode(&mut d, "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572").unwrap();
        assert_eq!(d.size, 55);
        // Two updates at the start of a block (0, then 4096) empty the table, then a reference to it fails.
        assert_eq!(decode(&mut d, "20 3f e1 1f 82"), Ok(pairs(&[(":method", "GET")])));
        assert_eq!(d.size, 0);
        assert_eq!(decode(&mut d, "be"), Err(DecodeError::BadIndex));
        // An entry larger than the table empties it and is not added.
        let mut small = FieldDecoder::new(40);
        decode(&mut small, "4001 61 01 62").unwrap();
        assert_eq!(small.size, 34);
        decode(&mut small, "4001 61 0a 30313233343536373839").unwrap();
        assert_eq!((small.size, small.entries.len()), (0, 0));
    }
}
