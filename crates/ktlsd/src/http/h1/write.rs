//! HTTP/1.1 response heads: the status line, Server and Date, the response's own
//! header fields in order, and the Connection field that tells the connection's fate.

use super::parse::Version;
use crate::handler::{Body, Response};
use crate::http::conn::with_http_date_now;

/// The head of `response`. The status line always says HTTP/1.1, the version the
/// server implements, for 1.0 requests too (RFC 9110 section 6.2; nginx answers the
/// same); the Connection field follows the request's version and `keep_alive`.
pub fn head(response: &Response, version: Version, keep_alive: bool) -> Vec<u8> {
    head_into(Vec::with_capacity(256), response, version, keep_alive)
}

/// [`head`] written in `out`'s memory (a buffer the caller reuses; its bytes are dropped).
pub fn head_into(out: Vec<u8>, response: &Response, version: Version, keep_alive: bool) -> Vec<u8> {
    let mut buf = status_line(out, response);
    buf.push_str("Server: ktlsd\r\nDate: ");
    with_http_date_now(|d| buf.push_str(d));
    buf.push_str("\r\n");
    push_fields(&mut buf, response);
    match (keep_alive, version) {
        (false, _) => buf.push_str("Connection: close\r\n"),
        (true, Version::Http10) => buf.push_str("Connection: keep-alive\r\n"),
        (true, Version::Http11) => {}
    }
    buf.push_str("\r\n");
    buf.into_bytes()
}

/// The head followed by the in-memory body, if any: a whole response when the body
/// is no file (a file body is sent by the transport after the head).
pub fn head_and_bytes(response: &Response, version: Version, keep_alive: bool) -> Vec<u8> {
    let mut out = head(response, version, keep_alive);
    if let Body::Bytes(b) = &response.body {
        out.extend_from_slice(b);
    }
    out
}

/// An interim (1xx) response's head: the status line and its fields, no Server,
/// Date or Connection (those are the final response's).
pub fn interim_into(out: Vec<u8>, response: &Response) -> Vec<u8> {
    let mut buf = status_line(out, response);
    push_fields(&mut buf, response);
    buf.push_str("\r\n");
    buf.into_bytes()
}

/// `response`'s status line, written in `out`'s memory (its bytes dropped).
fn status_line(mut out: Vec<u8>, response: &Response) -> String {
    out.clear();
    let mut buf = String::from_utf8(out).unwrap_or_default(); // empty, so always text
    buf.push_str("HTTP/1.1 ");
    buf.push_str(itoa::Buffer::new().format(response.status.0));
    buf.push(' ');
    buf.push_str(response.status.reason());
    buf.push_str("\r\n");
    buf
}

/// `response`'s own fields, one line each.
fn push_fields(buf: &mut String, response: &Response) {
    for h in &response.headers {
        buf.push_str(h.name());
        buf.push_str(": ");
        h.write_value(buf);
        buf.push_str("\r\n");
    }
}

/// The interim response that invites the body of an `Expect: 100-continue` request.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::{Header, Status};

    fn text(b: Vec<u8>) -> String {
        String::from_utf8(b).unwrap()
    }

    #[test]
    fn heads() {
        let r = Response::page(Status::MOVED_PERMANENTLY).with(Header::Location("/d/".into()));
        let h = text(head(&r, Version::Http11, true));
        assert!(h.starts_with("HTTP/1.1 301 Moved Permanently\r\nServer: ktlsd\r\nDate: "), "{h}");
        let page = "<html><head><title>301 Moved Permanently</title></head><body><h1>301 Moved Permanently</h1></body></html>\n";
        let tail = format!(
            "Content-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nLocation: /d/\r\n\r\n",
            page.len()
        );
        assert!(h.ends_with(&tail), "{h}");
        let h = text(head(&r, Version::Http10, true));
        assert!(h.ends_with("Location: /d/\r\nConnection: keep-alive\r\n\r\n"), "{h}");
        for v in [Version::Http10, Version::Http11] {
            let h = text(head(&r, v, false));
            assert!(h.ends_with("Location: /d/\r\nConnection: close\r\n\r\n"), "{h}");
        }
        let hints = Response {
            status: Status(103),
            headers: vec![Header::Field("Link".into(), "</a.css>; rel=preload".into())],
            body: crate::handler::Body::Empty,
            refused: None,
        };
        assert_eq!(
            text(interim_into(Vec::new(), &hints)),
            "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
        );
        let whole = text(head_and_bytes(&r, Version::Http11, true));
        assert!(whole.ends_with(&format!("{tail}{page}")), "{whole}");
        let head_only = text(head_and_bytes(&r.without_body(), Version::Http11, true));
        assert!(head_only.ends_with(&tail), "{head_only}");
    }
}
