//! The upstream response parser (`handler/proxy/parse.rs`): the head, then the body as
//! its framing says. A parsed head:
//! - took no more than the buffer and 64 KiB, and does not depend on the bytes after it;
//! - has a status from 100 to 599 other than 101;
//! - has no body for HEAD, 1xx, 204 and 304;
//! - is not reusable when the body runs to the close, or when Transfer-Encoding came
//!   with Content-Length (a smuggling attempt);
//! - was never refused while incomplete (every prefix is "incomplete").
//! A chunked body then decodes the same at once and in pieces.
#![no_main]

use ktlsd::fuzzing::{upstream_head, Chunked, Framing};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, buf)) = data.split_first() else { return };
    let method = ["GET", "HEAD", "POST", "OPTIONS"][usize::from(mode & 3)];
    let whole = upstream_head(buf, method);
    let Ok(Some(head)) = &whole else { return };
    assert!(head.used <= buf.len() && head.used <= 64 * 1024);
    assert!((100..=599).contains(&head.status) && head.status != 101, "{head:?}");
    if method == "HEAD" || head.status < 200 || head.status == 204 || head.status == 304 {
        assert_eq!(head.framing, Framing::None);
    }
    let field = |name: &str| head.fields.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    if head.framing == Framing::Close || (field("transfer-encoding") && field("content-length")) {
        assert!(!head.reusable || head.framing == Framing::None, "{head:?}");
    }
    assert_eq!(upstream_head(&buf[..head.used], method), whole, "the head alone");
    let step = (head.used / 32).max(1);
    for n in (0..head.used).step_by(step) {
        assert_eq!(upstream_head(&buf[..n], method), Ok(None), "prefix of {n} bytes");
    }
    if head.framing == Framing::Chunked {
        let body = &buf[head.used..];
        let (mut at_once, mut out1) = (Chunked::default(), Vec::new());
        let r1 = at_once.decode(body, &mut out1);
        let (mut bytewise, mut out2, mut pending, mut r2) = (Chunked::default(), Vec::new(), Vec::new(), Ok(0));
        for &b in body {
            pending.push(b);
            match bytewise.decode(&pending, &mut out2) {
                Ok(n) => {
                    pending.drain(..n);
                    r2 = Ok(r2.unwrap_or(0) + n);
                }
                Err(e) => {
                    r2 = Err(e);
                    break;
                }
            }
            if bytewise.is_done() {
                break;
            }
        }
        match (r1, r2) {
            (Ok(a), Ok(b)) => assert_eq!((a, &out1, at_once.is_done()), (b, &out2, bytewise.is_done())),
            (Err(_), Err(_)) => {}
            (a, b) => panic!("at once: {a:?}, byte by byte: {b:?}"),
        }
    }
});
