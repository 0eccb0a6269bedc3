//! HPACK (RFC 7541) for the codec: our decoder (`decoder`, with `huffman`) behind
//! the limits a server needs against decompression bombs: a dynamic table bounded by
//! our SETTINGS_HEADER_TABLE_SIZE and a bounded decoded field list, counted as RFC
//! 9113 section 6.5.2 counts it (name + value + 32 per field) while decoding,
//! without copying the fields that would exceed it.
//!
//! Encoding is ours too (`encoder`): response fields go by static-table index, with
//! no table search per field.
//!
//! Not here: what the fields mean (see `request`), or how field blocks are framed.

mod decoder;
mod encoder;
mod huffman;

pub use decoder::DecodeError;

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
    inner: decoder::FieldDecoder,
    max_list_size: usize,
}

impl Decoder {
    /// `table_size` is our SETTINGS_HEADER_TABLE_SIZE: the peer may not grow the
    /// dynamic table past it.
    pub fn new(table_size: u32, max_list_size: u32) -> Decoder {
        Decoder { inner: decoder::FieldDecoder::new(table_size as usize), max_list_size: max_list_size as usize }
    }

    /// Decodes one whole field block; an error is a COMPRESSION_ERROR on the
    /// connection, since the table can no longer be trusted.
    pub fn decode(&mut self, block: &[u8]) -> Result<Decoded, DecodeError> {
        let mut fields = Vec::with_capacity(8);
        let mut size = 0usize;
        let max = self.max_list_size;
        self.inner.decode(block, |name, value| {
            size = size.saturating_add(name.len() + value.len() + FIELD_OVERHEAD);
            // Past the limit nothing more is copied: an indexed reference to a large
            // table entry costs the peer one byte and would cost us kilobytes.
            if size <= max {
                fields.push((name.to_vec(), value.to_vec()));
            }
        })?;
        Ok(if size <= max { Decoded::Fields(fields) } else { Decoded::TooLarge })
    }
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

    /// Starts a block in `block` (emptied first); its fields follow with [`Encoder::field`].
    pub fn start(&mut self, block: &mut Vec<u8>) {
        block.clear();
        if let Some(size) = self.pending_update.take() {
            // Dynamic Table Size Update: 001xxxxx with a 5-bit prefix integer.
            encoder::put_integer(block, size as usize, 5, 0x20);
        }
    }

    /// Appends one field to the block begun by [`Encoder::start`].
    pub fn field(&mut self, name: &[u8], value: &[u8], block: &mut Vec<u8>) {
        self.inner.field(name, value, block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of hex digits written with spaces anywhere, as RFC 7541's examples are.
    pub(super) fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    fn count(d: Decoded) -> Option<usize> {
        match d {
            Decoded::Fields(f) => Some(f.len()),
            Decoded::TooLarge => None,
        }
    }

    /// The list limit counts name + value + 32 per field, and a block over it
    /// still updates the table.
    #[test]
    fn bounds_the_field_list_and_keeps_the_table() {
        // RFC 7541 C.4.1: 4 fields of 7+3, 7+4, 5+1, 10+15 bytes, 180 bytes with the overheads.
        let c41 = hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff");
        let cases: [(u32, Option<usize>); 3] = [(180, Some(4)), (179, None), (0, None)];
        for (limit, expected) in cases {
            let mut d = Decoder::new(4096, limit);
            assert_eq!(count(d.decode(&c41).unwrap()), expected, "limit {limit}");
            // The next block refers to the :authority entry the first one inserted.
            let mut roomy = Decoder::new(4096, 1024);
            roomy.decode(&c41).unwrap();
            assert_eq!(count(roomy.decode(&hex("8286 84be")).unwrap()), Some(4));
        }
        assert!(Decoder::new(4096, 1024).decode(&hex("be")).is_err());
    }

    /// Blocks from an independent encoder (loona-hpack: raw strings, indexed fields) decode to what
    /// it was given, over many blocks sharing one table.
    #[test]
    fn round_trips_an_independent_encoder() {
        let mut enc = loona_hpack::Encoder::new();
        let mut dec = Decoder::new(4096, 1 << 20);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for i in 0..500 {
            let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            for j in 0..(i % 9) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let name = format!("x-field-{}", state % 23).into_bytes();
                let value: Vec<u8> =
                    (0..(state % 60) as usize).map(|k| (state >> (k % 50)) as u8 | (j as u8)).collect();
                fields.push((name, value));
            }
            fields.push((b":path".to_vec(), format!("/file/{}.bin?q={}", i % 7, state % 1000).into_bytes()));
            let block = enc.encode(fields.iter().map(|(n, v)| (&n[..], &v[..])));
            match dec.decode(&block).unwrap() {
                Decoded::Fields(got) => assert_eq!(got, fields, "block {i}"),
                Decoded::TooLarge => panic!("block {i} too large"),
            }
        }
    }
}
