//! The codec's HPACK decoder against an independent one (loona-hpack) on the same
//! arbitrary field blocks, one connection's worth, dynamic tables carried along: where
//! both decode a block they give the same fields; where one refuses it, so does the
//! other (then the table is lost and the connection ends: the comparison stops).
//!
//! Known differences, by design, are not counted: ktlsd refuses integers past 2^28
//! (no field or table needs them) where loona-hpack takes up to 2^64, and takes a block
//! of table size updates alone (RFC 7541 section 4.2 does not forbid it), which
//! loona-hpack refuses, and refuses a size update after a field (section 4.2 puts it
//! at the beginning of the block), which loona-hpack takes.
#![no_main]

use ktlsd::fuzzing::HpackDecoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut ours = HpackDecoder::new(4096, u32::MAX);
    let mut theirs = loona_hpack::Decoder::new();
    theirs.set_max_allowed_table_size(4096);
    // Blocks are separated by the two bytes 0xff 0x00 (rare inside one, as a 0xff
    // byte starts an integer continuation or an indexed field).
    let mut rest = data;
    while !rest.is_empty() {
        let end = rest.windows(2).position(|w| w == [0xff, 0x00]).unwrap_or(rest.len());
        let block = &rest[..end];
        rest = rest.get(end + 2..).unwrap_or_default();
        let a = ours.decode(block);
        let b = theirs.decode(block);
        match (&a, &b) {
            (Ok(Some(x)), Ok(y)) => assert_eq!(x, y, "block {block:02x?}"),
            (Ok(None), _) => unreachable!("no list limit"),
            (Err(e), Err(_)) => {
                let _ = e;
                return;
            }
            (Err(e), Ok(_)) if e == "IntegerOverflow" || e == "LateTableSizeUpdate" => return,
            (Ok(Some(x)), Err(loona_hpack::decoder::DecoderError::SizeUpdateAtEnd)) if x.is_empty() => return,
            _ => panic!("ktlsd: {a:?}, loona-hpack: {b:?}, block {block:02x?}"),
        }
    }
});
