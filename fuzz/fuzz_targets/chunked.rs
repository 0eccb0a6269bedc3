//! The chunked decoder (`handler/proxy/parse.rs`) of request bodies and upstream
//! responses. The same bytes decode to the same data and the same verdict whether they
//! arrive at once or in pieces of any size (the first input byte picks it), and the
//! decoder never hands out more bytes than it was given.
#![no_main]

use ktlsd::fuzzing::Chunked;
use libfuzzer_sys::fuzz_target;

/// Decodes `input` fed `step` bytes at a time: data, whether the body ended, bytes used.
fn decode(input: &[u8], step: usize) -> Result<(Vec<u8>, bool, usize), &'static str> {
    let (mut d, mut out, mut pending, mut used_total) = (Chunked::default(), Vec::new(), Vec::new(), 0);
    for piece in input.chunks(step) {
        pending.extend_from_slice(piece);
        let used = d.decode(&pending, &mut out)?;
        assert!(used <= pending.len());
        used_total += used;
        pending.drain(..used);
        if d.is_done() {
            break;
        }
    }
    assert!(out.len() <= used_total);
    Ok((out, d.is_done(), used_total))
}

fuzz_target!(|data: &[u8]| {
    let Some((&step, body)) = data.split_first() else { return };
    let whole = decode(body, body.len().max(1));
    let pieces = decode(body, usize::from(step % 32) + 1);
    match (&whole, &pieces) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(_), Err(_)) => {}
        _ => panic!("at once: {whole:?}; in pieces of {}: {pieces:?}", step % 32 + 1),
    }
});
