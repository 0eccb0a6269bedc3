//! HPACK (RFC 7541) through the `loona-hpack` crate, with the limits a server needs
//! against decompression bombs: a bounded dynamic table and a bounded decoded field
//! list, counted as RFC 9113 section 6.5.2 counts it (name + value + 32 per field)
//! while decoding, without copying the fields that would exceed it.
//!
//! Not here: what the fields mean (see `request`), or how field blocks are framed.

use loona_hpack::decoder::DecoderError;

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

/// Encodes our field blocks.
pub struct Encoder {
    inner: loona_hpack::Encoder<'static>,
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
        Encoder { inner: loona_hpack::Encoder::new(), table_size: ENCODER_TABLE_SIZE, pending_update: None }
    }

    /// Applies the peer's SETTINGS_HEADER_TABLE_SIZE.
    pub fn set_peer_table_size(&mut self, size: u32) {
        let size = size.min(ENCODER_TABLE_SIZE);
        if size != self.table_size {
            self.table_size = size;
            self.inner.set_max_table_size(size as usize);
            self.pending_update = Some(size);
        }
    }

    /// Encodes `fields` as one block.
    pub fn encode<'f>(&mut self, fields: impl IntoIterator<Item = (&'f [u8], &'f [u8])>) -> Vec<u8> {
        let mut block = Vec::new();
        if let Some(size) = self.pending_update.take() {
            // Dynamic Table Size Update: 001xxxxx with a 5-bit prefix integer.
            let mut update = loona_hpack::encoder::encode_integer(size as usize, 5);
            if let Some(first) = update.first_mut() {
                *first |= 0x20;
            }
            block.extend_from_slice(&update);
        }
        // Writing into a Vec cannot fail.
        let _ = self.inner.encode_into(fields, &mut block);
        block
    }
}
