//! `multipart/byteranges` bodies (`handler/range.rs`): a Range value (the input after
//! its first 4 bytes, the file size) resolved against the file, and when it selects
//! several ranges the body built from them, laid out with the file's bytes. The body
//! is then read back as a client would: its length is the announced one, and each part
//! is delimited by the boundary, names its Content-Range, and holds exactly the
//! file's bytes of that range, in the order of the ranges.
#![no_main]

use ktlsd::fuzzing::{multipart, BodyPart, RangeOutcome, RangeSet};
use libfuzzer_sys::fuzz_target;

const BOUNDARY: &str = "0123456789abcdef0123";

fuzz_target!(|data: &[u8]| {
    let Some((size, value)) = data.split_first_chunk::<4>() else { return };
    let size = u64::from(u32::from_le_bytes(*size) % 100_000);
    let Ok(value) = std::str::from_utf8(value) else { return };
    let Some(set) = RangeSet::parse(value) else { return };
    let RangeOutcome::Multi(ranges) = set.resolve(size) else { return };
    let file: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let (parts, len) = multipart(&ranges, size, "text/plain; charset=utf-8", BOUNDARY);
    let mut body = Vec::new();
    for p in &parts {
        match p {
            BodyPart::Bytes(b) => body.extend_from_slice(b),
            BodyPart::File(r) => {
                assert!(r.start < r.end && r.end <= size, "{r:?}");
                body.extend_from_slice(&file[r.start as usize..r.end as usize]);
            }
        }
    }
    assert_eq!(body.len() as u64, len, "announced length");
    // Read it back: "--B\r\nfields\r\n\r\nbytes\r\n--B\r\n...\r\n--B--\r\n".
    let delimiter = format!("--{BOUNDARY}");
    let close = format!("\r\n--{BOUNDARY}--\r\n");
    assert!(body.starts_with(delimiter.as_bytes()) && body.ends_with(close.as_bytes()));
    let mut at = 0;
    for r in &ranges {
        let rest = &body[at..];
        let head_end = rest.windows(4).position(|w| w == b"\r\n\r\n").expect("a part's fields") + 4;
        let head = std::str::from_utf8(&rest[..head_end]).expect("fields are text");
        let want = format!("Content-Range: bytes {}-{}/{size}\r\n", r.start, r.end - 1);
        assert!(head.contains(&want), "{head:?} lacks {want:?}");
        let bytes = &rest[head_end..head_end + (r.end - r.start) as usize];
        assert_eq!(bytes, &file[r.start as usize..r.end as usize]);
        at += head_end + bytes.len();
        assert!(body[at..].starts_with(format!("\r\n--{BOUNDARY}").as_bytes()));
    }
    assert_eq!(&body[at..], close.as_bytes(), "the closing delimiter after the last part");
});
