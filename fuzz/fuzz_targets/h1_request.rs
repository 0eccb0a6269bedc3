//! The HTTP/1 request-head parser (`http/h1/parse.rs`) on arbitrary bytes. Besides
//! never panicking, a parsed head:
//! - took no more than the buffer and the head-size limit, and has a path;
//! - does not depend on the bytes after it (`buf[..used]` alone parses the same);
//! - was never refused while incomplete: every shorter prefix of it is "incomplete"
//!   (a client's head split across reads gets the same answer as one sent at once);
//! - never has both a chunked body and a Content-Length.
//!
//! The first input byte picks the head-size limit, so that 414 and 431 are reached.
#![no_main]

use ktlsd::fuzzing::{h1_is_head, h1_request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&limit, buf)) = data.split_first() else { return };
    let max_head = if limit < 0x80 { 16 * 1024 } else { 16 + usize::from(limit & 0x7f) * 8 };
    let whole = h1_request(buf, max_head);
    let _ = h1_is_head(buf);
    let Ok(Some(head)) = &whole else { return };
    assert!(head.used <= buf.len() && head.used <= max_head, "{head:?}");
    assert!(!head.path.is_empty(), "{head:?}");
    assert!(!(head.chunked && head.content_length > 0), "{head:?}");
    assert_eq!(h1_request(&buf[..head.used], max_head), whole, "the head alone");
    let step = (head.used / 64).max(1);
    for n in (0..head.used).step_by(step) {
        assert_eq!(h1_request(&buf[..n], max_head), Ok(None), "prefix of {n} bytes");
    }
});
