//! HPACK (RFC 7541): decoding through the `loona-hpack` crate, with the limits a server needs
//! against decompression bombs: a bounded dynamic table and a bounded decoded field
//! list, counted as RFC 9113 section 6.5.2 counts it (name + value + 32 per field)
//! while decoding, without copying the fields that would exceed it.
//!
//! Huffman-coded strings are decoded here, before the block reaches the crate,
//! with one decoder table per thread: the crate builds its Huffman table (257
//! hash-map entries) anew for every string, which cost a third of the server's CPU
//! under h2load. The crate still does everything else (indexing, table, errors).
//!
//! Encoding is ours (`encoder`): response fields go by static-table index, with
//! no table search per field.
//!
//! Not here: what the fields mean (see `request`), or how field blocks are framed.

use std::cell::RefCell;

use loona_hpack::decoder::DecoderError;
use loona_hpack::huffman::HuffmanDecoder;

mod encoder;

/// Bytes RFC 9113 counts for one field besides its name and value.
const FIELD_OVERHEAD: usize = 32;

/// A decoded field block.
pub enum Decoded {
    /// The fields, in order.
    Fields(Vec<(Vec<u8>, Vec<u8>)>),
    /// The block decoded but its fields add up to more than the limit; the dynamic
    /// table is still in step with the peer's, so only this request fails.
    TooLarge,
}

/// Decodes the peer's field blocks.
pub struct Decoder {
    inner: loona_hpack::Decoder<'static>,
    max_list_size: usize,
}

impl Decoder {
    /// `table_size` is our SETTINGS_HEADER_TABLE_SIZE: the peer may not grow the
    /// dynamic table past it.
    pub fn new(table_size: u32, max_list_size: u32) -> Decoder {
        let mut inner = loona_hpack::Decoder::new();
        let table_size = table_size as usize;
        inner.set_max_allowed_table_size(table_size);
        inner.set_max_table_size(table_size);
        Decoder { inner, max_list_size: max_list_size as usize }
    }

    /// Decodes one whole field block; an error is a COMPRESSION_ERROR on the
    /// connection, since the table can no longer be trusted.
    pub fn decode(&mut self, block: &[u8]) -> Result<Decoded, DecoderError> {
        let mut fields = Vec::new();
        let mut size = 0usize;
        let max = self.max_list_size;
        // A block that does not parse goes to the crate as it came, to be refused there.
        let raw = unhuffman(block);
        let block = raw.as_deref().unwrap_or(block);
        self.inner.decode_with_cb(block, |name, value| {
            size = size.saturating_add(name.len() + value.len() + FIELD_OVERHEAD);
            // Past the limit nothing more is copied: an indexed reference to a large
            // table entry costs the peer one byte and would cost us kilobytes.
            if size <= max {
                fields.push((name.into_owned(), value.into_owned()));
            }
        })?;
        Ok(if size <= max { Decoded::Fields(fields) } else { Decoded::TooLarge })
    }
}

thread_local! {
    /// The crate's Huffman decoder keeps no state between strings, so one per
    /// worker thread serves all its connections.
    static HUFFMAN: RefCell<HuffmanDecoder> = RefCell::new(HuffmanDecoder::new());
}

/// `block` with every Huffman-coded string literal (RFC 7541 section 5.2) rewritten
/// as a raw literal, the rest byte for byte; `None` when it has no Huffman string,
/// or does not parse, or a Huffman string is invalid (the crate then refuses the
/// original with the same error).
fn unhuffman(block: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(block.len() * 2);
    let mut huffman = false;
    let mut at = 0;
    while at < block.len() {
        let first = block[at];
        // (prefix bits of the index, whether a literal name and value follow)
        let (prefix, literal) = match first {
            b if b & 0x80 != 0 => (7, false),    // indexed field
            b if b & 0xc0 == 0x40 => (6, true),  // literal, incremental indexing
            b if b & 0xe0 == 0x20 => (5, false), // dynamic table size update
            _ => (4, true),                      // literal, without or never indexed
        };
        let (index, used) = integer(&block[at..], prefix)?;
        out.extend_from_slice(&block[at..at + used]);
        at += used;
        if !literal {
            continue;
        }
        let strings = if index == 0 { 2 } else { 1 };
        for _ in 0..strings {
            let coded = block.get(at)? & 0x80 != 0;
            let (len, used) = integer(&block[at..], 7)?;
            let bytes = block.get(at + used..(at + used).checked_add(len)?)?;
            at += used + len;
            if coded {
                huffman = true;
                let decoded = HUFFMAN.with(|h| h.borrow_mut().decode(bytes)).ok()?;
                // H = 0: the length's first byte carries no flag.
                encoder::put_integer(&mut out, decoded.len(), 7, 0);
                out.extend_from_slice(&decoded);
            } else {
                out.extend_from_slice(&block[at - used - len..at]);
            }
        }
    }
    huffman.then_some(out)
}

/// An HPACK integer (RFC 7541 section 5.1) with a `prefix`-bit prefix at the start
/// of `buf`: its value and the bytes it took. `None` when cut short or past 2^28.
fn integer(buf: &[u8], prefix: u8) -> Option<(usize, usize)> {
    let max = (1usize << prefix) - 1;
    let mut value = usize::from(*buf.first()?) & max;
    if value < max {
        return Some((value, 1));
    }
    for (i, &b) in buf.iter().enumerate().skip(1).take(4) {
        value += usize::from(b & 0x7f) << (7 * (i - 1));
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// Encodes our field blocks.
pub struct Encoder {
    inner: encoder::FieldEncoder,
    /// The table size our encoder uses.
    table_size: u32,
    /// A smaller table size the peer asked for, announced at the start of the next
    /// block (RFC 7541 section 4.2).
    pending_update: Option<u32>,
}

/// Our encoder's table never exceeds the protocol default, whatever the peer
/// allows: responses repeat few fields.
const ENCODER_TABLE_SIZE: u32 = 4096;

impl Encoder {
    pub fn new() -> Encoder {
        Encoder {
            inner: encoder::FieldEncoder::new(ENCODER_TABLE_SIZE as usize),
            table_size: ENCODER_TABLE_SIZE,
            pending_update: None,
        }
    }

    /// Applies the peer's SETTINGS_HEADER_TABLE_SIZE.
    pub fn set_peer_table_size(&mut self, size: u32) {
        let size = size.min(ENCODER_TABLE_SIZE);
        if size != self.table_size {
            self.table_size = size;
            self.inner.set_table_size(size as usize);
            self.pending_update = Some(size);
        }
    }

    /// Encodes `fields` as one block.
    pub fn encode<'f>(&mut self, fields: impl IntoIterator<Item = (&'f [u8], &'f [u8])>) -> Vec<u8> {
        let mut block = Vec::with_capacity(128);
        if let Some(size) = self.pending_update.take() {
            // Dynamic Table Size Update: 001xxxxx with a 5-bit prefix integer.
            encoder::put_integer(&mut block, size as usize, 5, 0x20);
        }
        self.inner.encode(fields, &mut block);
        block
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    fn fields(d: Decoded) -> Vec<(String, String)> {
        match d {
            Decoded::Fields(f) => {
                f.into_iter().map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap())).collect()
            }
            Decoded::TooLarge => panic!("too large"),
        }
    }

    /// RFC 7541 appendix C.4: three requests with Huffman coding, sharing one table.
    #[test]
    fn decodes_rfc7541_huffman_requests() {
        let mut d = Decoder::new(4096, 64 * 1024);
        let pairs = |v: &[(&str, &str)]| v.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect::<Vec<_>>();
        let c41 = hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff");
        assert!(unhuffman(&c41).is_some(), "the block has a Huffman string to rewrite");
        assert_eq!(
            fields(d.decode(&c41).unwrap()),
            pairs(&[(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")])
        );
        assert_eq!(
            fields(d.decode(&hex("8286 84be 5886 a8eb 1064 9cbf")).unwrap()),
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache")
            ])
        );
        assert_eq!(
            fields(d.decode(&hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf")).unwrap()),
            pairs(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value")
            ])
        );
    }

    #[test]
    fn leaves_blocks_without_huffman_and_refuses_bad_huffman() {
        // RFC 7541 C.3.1: the same request with raw strings.
        assert_eq!(unhuffman(&hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d")), None);
        // A Huffman string padded with a zero bit (padding must be the EOS prefix, all ones).
        let mut d = Decoder::new(4096, 64 * 1024);
        assert!(d.decode(&hex("4081 00 81 00")).is_err());
        // A string longer than the block.
        assert!(d.decode(&hex("8286 8441 8cf1 e3")).is_err());
    }
}
