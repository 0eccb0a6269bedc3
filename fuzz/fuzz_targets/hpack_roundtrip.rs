//! HPACK (RFC 7541) round trips over one connection's worth of field blocks, the
//! dynamic tables carried from block to block:
//! - the codec's encoder, then its decoder: the same fields, through peer table-size
//!   changes (size updates at the start of a block);
//! - an independent encoder (loona-hpack), then the codec's decoder;
//! - the codec's encoder, then the independent decoder.
#![no_main]

use arbitrary::Arbitrary;
use ktlsd::fuzzing::{HpackDecoder, HpackEncoder};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Name {
    Status,
    Server,
    Date,
    ContentType,
    Etag,
    Other(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Block {
    /// A new SETTINGS_HEADER_TABLE_SIZE from the peer before this block.
    table_size: Option<u16>,
    fields: Vec<(Name, Vec<u8>)>,
}

/// The block's fields after `:status`, which starts every response's block (so that a
/// table size update never ends a block, which loona-hpack refuses).
fn fields(block: &Block) -> Vec<(Vec<u8>, Vec<u8>)> {
    let name = |n: &Name| -> Vec<u8> {
        match n {
            Name::Status => b":status".to_vec(),
            Name::Server => b"server".to_vec(),
            Name::Date => b"date".to_vec(),
            Name::ContentType => b"content-type".to_vec(),
            Name::Etag => b"etag".to_vec(),
            Name::Other(b) => b.clone(),
        }
    };
    let status = (b":status".to_vec(), b"200".to_vec());
    std::iter::once(status).chain(block.fields.iter().map(|(n, v)| (name(n), v.clone()))).collect()
}

fuzz_target!(|blocks: Vec<Block>| {
    let (mut ours_enc, mut ours_dec) = (HpackEncoder::default(), HpackDecoder::new(4096, u32::MAX));
    let (mut loona_enc, mut dec_of_loona) = (loona_hpack::Encoder::new(), HpackDecoder::new(4096, u32::MAX));
    let mut loona_dec = loona_hpack::Decoder::new();
    loona_dec.set_max_allowed_table_size(4096);
    for block in blocks.iter().take(64) {
        let want = fields(block);
        if let Some(size) = block.table_size {
            ours_enc.set_peer_table_size(u32::from(size));
        }
        let ours = ours_enc.encode(&want);
        assert_eq!(ours_dec.decode(&ours), Ok(Some(want.clone())), "our encoder, our decoder");
        assert_eq!(loona_dec.decode(&ours).ok(), Some(want.clone()), "our encoder, loona-hpack's decoder");
        let theirs = loona_enc.encode(want.iter().map(|(n, v)| (&n[..], &v[..])));
        assert_eq!(dec_of_loona.decode(&theirs), Ok(Some(want)), "loona-hpack's encoder, our decoder");
    }
});
