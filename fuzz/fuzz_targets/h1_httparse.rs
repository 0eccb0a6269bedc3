//! The HTTP/1 request-head parser against httparse's verdict on the same bytes (the
//! version token rewritten by ktlsd, `HTTP/1.2` and the like, aside):
//! - httparse refuses the head: ktlsd refuses it (400, 431 or 505);
//! - httparse wants more: ktlsd wants more;
//! - httparse parses it: ktlsd takes the same bytes, method and target, or refuses it
//!   for a reason of its own (Host, framing, expectations);
//! - ktlsd accepts no head that is ambiguous about its body: Content-Length with
//!   Transfer-Encoding, two different Content-Lengths, or two Hosts.
#![no_main]

use ktlsd::fuzzing::h1_request;
use libfuzzer_sys::fuzz_target;

const MAX_HEAD: usize = 16 * 1024;

/// Whether the request line's version token is another than HTTP/1.0 or HTTP/1.1 (or,
/// while the line is incomplete, the start of another): ktlsd reads those itself
/// before httparse.
fn rewritten(buf: &[u8]) -> bool {
    let start = buf.iter().position(|&b| b != b'\r' && b != b'\n').unwrap_or(buf.len());
    let (line, complete) = match buf[start..].iter().position(|&b| b == b'\n') {
        Some(nl) => (&buf[start..start + nl], true),
        None => (&buf[start..], false),
    };
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().filter(|&&b| b == b' ').count() < 2 {
        return false;
    }
    let token = line.rsplit(|&b| b == b' ').next().unwrap_or_default();
    let plain = |v: &[u8]| if complete { token == v } else { v.starts_with(token) };
    !plain(b"HTTP/1.1") && !plain(b"HTTP/1.0")
}

fuzz_target!(|data: &[u8]| {
    let window = &data[..data.len().min(MAX_HEAD)];
    let ours = h1_request(data, MAX_HEAD);
    if rewritten(window) {
        return;
    }
    let mut fields = [httparse::EMPTY_HEADER; 100];
    let mut req = httparse::Request::new(&mut fields);
    match req.parse(window) {
        Err(httparse::Error::TooManyHeaders) => assert_eq!(ours.map_err(|e| e.0), Err(431)),
        Err(e) => assert!(matches!(ours, Err((400 | 505, _))), "httparse: {e:?}, ktlsd: {ours:?}"),
        Ok(httparse::Status::Partial) if window.len() < MAX_HEAD => assert_eq!(ours, Ok(None)),
        Ok(httparse::Status::Partial) => assert!(matches!(ours, Err((414 | 431, _))), "{ours:?}"),
        Ok(httparse::Status::Complete(n)) => {
            let headers: &[httparse::Header<'_>] = req.headers;
            let field = |name: &'static str| headers.iter().filter(move |h| h.name.eq_ignore_ascii_case(name));
            let lengths: Vec<&[u8]> = field("content-length").map(|h| h.value.trim_ascii()).collect();
            let ambiguous = (field("transfer-encoding").count() > 0 && !lengths.is_empty())
                || lengths.windows(2).any(|w| w[0] != w[1])
                || field("host").count() > 1;
            match ours {
                Ok(Some(head)) => {
                    assert!(!ambiguous, "an ambiguous head was accepted: {head:?}");
                    assert_eq!(head.used, n);
                    assert_eq!(Some(head.method.as_str()), req.method);
                    assert_eq!(Some(head.target.as_str()), req.path);
                    assert_eq!(head.http10, req.version == Some(0));
                    if let Some(cl) = lengths.first() {
                        assert_eq!(
                            std::str::from_utf8(cl).ok().and_then(|s| s.parse().ok()),
                            Some(head.content_length)
                        );
                    }
                    if head.chunked {
                        assert!(field("transfer-encoding").count() > 0);
                    }
                }
                Ok(None) => panic!("httparse parsed {n} bytes, ktlsd wants more"),
                Err((status, _)) => assert!([400, 411, 417, 431, 501, 505].contains(&status), "refused with {status}"),
            }
        }
    }
});
