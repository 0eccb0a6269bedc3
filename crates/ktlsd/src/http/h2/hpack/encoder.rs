//! The HPACK (RFC 7541) encoder for our responses, without table searches.
//!
//! A field whose name is in the static table (RFC 7541 appendix A) is sent with
//! that index: fully indexed when the value matches too (`:status: 200`), else as
//! a literal without indexing, its value raw (Huffman coding would save a few
//! bytes for more CPU than it saves). One field is worth the dynamic table,
//! `server`: it is inserted once per connection and referenced by index after.
//! Everything else is a literal that the peer does not index, so our dynamic
//! table never holds more than that one kind of entry.
//!
//! Not here: decoding the peer's blocks (see the parent module).

/// The first static-table index (RFC 7541 appendix A) of a field name, and the
/// index of the whole field when `value` matches an entry with that name.
fn static_index(name: &[u8], value: &[u8]) -> Option<(u8, Option<u8>)> {
    let whole = |entries: &[(&[u8], u8)]| entries.iter().find(|(v, _)| *v == value).map(|&(_, i)| i);
    Some(match name {
        b":authority" => (1, None),
        b":method" => (2, whole(&[(b"GET", 2), (b"POST", 3)])),
        b":path" => (4, whole(&[(b"/", 4), (b"/index.html", 5)])),
        b":scheme" => (6, whole(&[(b"http", 6), (b"https", 7)])),
        b":status" => (
            8,
            whole(&[(b"200", 8), (b"204", 9), (b"206", 10), (b"304", 11), (b"400", 12), (b"404", 13), (b"500", 14)]),
        ),
        b"accept-charset" => (15, None),
        b"accept-encoding" => (16, whole(&[(b"gzip, deflate", 16)])),
        b"accept-language" => (17, None),
        b"accept-ranges" => (18, None),
        b"accept" => (19, None),
        b"access-control-allow-origin" => (20, None),
        b"age" => (21, None),
        b"allow" => (22, None),
        b"authorization" => (23, None),
        b"cache-control" => (24, None),
        b"content-disposition" => (25, None),
        b"content-encoding" => (26, None),
        b"content-language" => (27, None),
        b"content-length" => (28, None),
        b"content-location" => (29, None),
        b"content-range" => (30, None),
        b"content-type" => (31, None),
        b"cookie" => (32, None),
        b"date" => (33, None),
        b"etag" => (34, None),
        b"expect" => (35, None),
        b"expires" => (36, None),
        b"from" => (37, None),
        b"host" => (38, None),
        b"if-match" => (39, None),
        b"if-modified-since" => (40, None),
        b"if-none-match" => (41, None),
        b"if-range" => (42, None),
        b"if-unmodified-since" => (43, None),
        b"last-modified" => (44, None),
        b"link" => (45, None),
        b"location" => (46, None),
        b"max-forwards" => (47, None),
        b"proxy-authenticate" => (48, None),
        b"proxy-authorization" => (49, None),
        b"range" => (50, None),
        b"referer" => (51, None),
        b"refresh" => (52, None),
        b"retry-after" => (53, None),
        b"server" => (54, None),
        b"set-cookie" => (55, None),
        b"strict-transport-security" => (56, None),
        b"transfer-encoding" => (57, None),
        b"user-agent" => (58, None),
        b"vary" => (59, None),
        b"via" => (60, None),
        b"www-authenticate" => (61, None),
        _ => return None,
    })
}

/// The index a field inserted into an empty-looking table gets (the first
/// dynamic index, RFC 7541 section 2.3.3).
const FIRST_DYNAMIC: usize = 62;

/// Bytes a table entry counts besides its name and value (RFC 7541 section 4.1).
const ENTRY_OVERHEAD: usize = 32;

/// Appends an HPACK integer (RFC 7541 section 5.1) with a `prefix`-bit prefix,
/// `flags` filling the first byte's other bits.
pub(super) fn put_integer(out: &mut Vec<u8>, value: usize, prefix: u8, flags: u8) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// A raw (H = 0) string literal.
fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    put_integer(out, s.len(), 7, 0);
    out.extend_from_slice(s);
}

/// Encodes response field blocks for one connection.
pub struct FieldEncoder {
    /// The table size the peer lets us use.
    table_size: usize,
    /// The `server` value last inserted at the first dynamic index, while it is
    /// known to be there.
    server: Option<Vec<u8>>,
}

impl FieldEncoder {
    pub fn new(table_size: usize) -> FieldEncoder {
        FieldEncoder { table_size, server: None }
    }

    /// A new table size: the inserted entry may be gone, so it is inserted anew
    /// when next needed (the newest entry is always the first dynamic index).
    pub fn set_table_size(&mut self, size: usize) {
        self.table_size = size;
        self.server = None;
    }

    /// Appends the fields to `out`.
    #[cfg(test)]
    pub fn encode<'f>(&mut self, fields: impl IntoIterator<Item = (&'f [u8], &'f [u8])>, out: &mut Vec<u8>) {
        for (name, value) in fields {
            self.field(name, value, out);
        }
    }

    /// Appends one field to `out`.
    pub fn field(&mut self, name: &[u8], value: &[u8], out: &mut Vec<u8>) {
        let index = static_index(name, value);
        if let Some((_, Some(whole))) = index {
            put_integer(out, usize::from(whole), 7, 0x80);
            return;
        }
        if name == b"server" {
            if self.server.as_deref() == Some(value) {
                put_integer(out, FIRST_DYNAMIC, 7, 0x80);
                return;
            }
            if name.len() + value.len() + ENTRY_OVERHEAD <= self.table_size {
                // Literal with incremental indexing, indexed name.
                put_integer(out, 54, 6, 0x40);
                put_string(out, value);
                self.server = Some(value.to_vec());
                return;
            }
        }
        match index {
            // Literal without indexing, indexed name.
            Some((name_index, _)) => put_integer(out, usize::from(name_index), 4, 0),
            None => {
                out.push(0);
                put_string(out, name);
            }
        }
        put_string(out, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(dec: &mut loona_hpack::Decoder<'static>, block: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        dec.decode(block).unwrap()
    }

    /// RFC 7541 C.1: integers with 5-bit prefixes and an 8-bit one.
    #[test]
    fn integers_match_rfc7541_c1() {
        for (value, prefix, want) in [(10, 5, vec![0x0a]), (1337, 5, vec![0x1f, 0x9a, 0x0a]), (42, 8, vec![0x2a])] {
            let mut out = Vec::new();
            put_integer(&mut out, value, prefix, 0);
            assert_eq!(out, want, "{value} with a {prefix}-bit prefix");
        }
    }

    #[test]
    fn encodes_by_static_index_and_server_once() {
        let fields: Vec<(&[u8], &[u8])> = vec![
            (b":status", b"200"),
            (b"server", b"ktlsd"),
            (b"content-type", b"text/html"),
            (b"content-length", b"10240"),
            (b"x-custom", b"1"),
        ];
        let mut enc = FieldEncoder::new(4096);
        let mut dec = loona_hpack::Decoder::new();
        let want: Vec<_> = fields.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
        let mut first = Vec::new();
        enc.encode(fields.iter().copied(), &mut first);
        assert_eq!(&first[..3], &[0x88, 0x40 | 54, 5], ":status 200 indexed, server inserted");
        assert_eq!(decode(&mut dec, &first), want);
        let mut second = Vec::new();
        enc.encode(fields.iter().copied(), &mut second);
        assert_eq!(&second[..2], &[0x88, 0x80 | 62], "server from the dynamic table");
        assert_eq!(decode(&mut dec, &second), want);
        // A table too small for the entry: the server field goes as a literal.
        enc.set_table_size(16);
        dec.set_max_table_size(16);
        let mut third = vec![0x30]; // size update to 16
        enc.encode(fields.iter().copied(), &mut third);
        assert_eq!(&third[1..4], &[0x88, 0x0f, 54 - 15], "server: literal, indexed name (4-bit prefix)");
        assert_eq!(decode(&mut dec, &third), want);
    }

    /// Round trip through an independent decoder for every name of the static
    /// table, status codes and long values (multi-byte lengths).
    #[test]
    fn round_trips() {
        let names: [&[u8]; 8] = [b":status", b"date", b"etag", b"vary", b"www-authenticate", b"server", b"x", b"a-b"];
        let values: [&[u8]; 6] = [b"", b"200", b"404", b"ktlsd", b"GET", &[b'v'; 300]];
        let mut enc = FieldEncoder::new(4096);
        let mut dec = loona_hpack::Decoder::new();
        for n in names {
            for v in values {
                let fields = [(n, v), (b"server".as_slice(), v), (n, b"x".as_slice())];
                let mut block = Vec::new();
                enc.encode(fields.iter().copied(), &mut block);
                let want: Vec<_> = fields.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
                assert_eq!(decode(&mut dec, &block), want);
            }
        }
    }
}
