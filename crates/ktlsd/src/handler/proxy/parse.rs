//! Reading an upstream's HTTP/1.x response, as pure functions over bytes: the head
//! (status, fields, how the body is framed, whether the connection may be reused) and
//! the chunked coding's decoder. Everything an upstream gets wrong is an [`Invalid`]
//! saying what, which the exchange turns into a 502.
//!
//! No I/O: the exchange reads, this decides.

use crate::handler::response::{field_name, FieldName};

/// The largest response head accepted from an upstream (nginx's default
/// `proxy_buffer_size` is one page; 64 KiB leaves room for many cookies).
pub const MAX_HEAD: usize = 64 * 1024;

/// Most fields in an upstream response head.
const MAX_FIELDS: usize = 128;

/// Longest chunk-size line (size, extensions) a decoder accepts.
const MAX_CHUNK_LINE: usize = 4096;

/// Most trailer bytes after the last chunk (they are read and dropped).
const MAX_TRAILERS: usize = 16 * 1024;

/// How the response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (HEAD, 204, 304).
    None,
    Length(u64),
    Chunked,
    /// Until the upstream closes.
    Close,
}

/// A parsed response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    /// `1.0` or `1.1`, as `Via` names it.
    pub version: &'static str,
    /// The fields in order; values as text (obs-text bytes replaced).
    pub fields: Vec<(FieldName, String)>,
    pub framing: Framing,
    /// Whether the connection may carry another request after this response's body.
    pub reusable: bool,
}

/// What is wrong with an upstream's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub &'static str);

/// Parses the response head at the front of `buf` for a request of `method`.
/// `Ok(None)`: incomplete (an error once `buf` holds [`MAX_HEAD`] bytes); an interim
/// 1xx response is returned as it is, its `framing` [`Framing::None`], for the caller
/// to drop and read on. A 101 is refused: nothing asked for it.
pub fn head(buf: &[u8], method: &str) -> Result<Option<(Head, usize)>, Invalid> {
    head_for(buf, method, false)
}

/// [`head`] for a request that may have asked for an upgrade (`upgrading`): then a
/// 101 is returned as it is (no body, the connection not reusable), for the
/// tunnel to check ([`super::tunnel::check_switch`]).
pub fn head_for(buf: &[u8], method: &str, upgrading: bool) -> Result<Option<(Head, usize)>, Invalid> {
    let window = &buf[..buf.len().min(MAX_HEAD)];
    let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
    let mut r = httparse::Response::new(&mut fields);
    let used = match r.parse(window) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if window.len() < MAX_HEAD => return Ok(None),
        Ok(httparse::Status::Partial) => return Err(Invalid("response head larger than 64 KiB")),
        Err(httparse::Error::TooManyHeaders) => return Err(Invalid("more than 128 response header fields")),
        Err(_) => return Err(Invalid("malformed response head")),
    };
    let status = r.code.unwrap_or(0);
    if !(100..=599).contains(&status) {
        return Err(Invalid("response status out of range"));
    }
    if status == 101 && !upgrading {
        return Err(Invalid("protocol upgrade (101) is not forwarded"));
    }
    let version = if r.version == Some(0) { "1.0" } else { "1.1" };
    let mut reusable = version == "1.1";
    let mut length: Option<u64> = None;
    let mut chunked = None;
    let mut out = Vec::with_capacity(r.headers.len());
    for h in r.headers.iter() {
        let value = String::from_utf8_lossy(h.value).trim().to_string();
        if h.name.eq_ignore_ascii_case("content-length") {
            // Several equal values (or one list of them) are one length (RFC 9110 section 8.6).
            for v in value.split(',').map(str::trim) {
                if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(Invalid("invalid Content-Length"));
                }
                let n: u64 = v.parse().map_err(|_| Invalid("invalid Content-Length"))?;
                if length.is_some_and(|l| l != n) {
                    return Err(Invalid("conflicting Content-Length values"));
                }
                length = Some(n);
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let last = value.rsplit(',').next().unwrap_or("").trim().to_ascii_lowercase();
            chunked = Some(last == "chunked");
        } else if h.name.eq_ignore_ascii_case("connection") {
            for t in value.split(',').map(str::trim) {
                if t.eq_ignore_ascii_case("close") {
                    reusable = false;
                } else if t.eq_ignore_ascii_case("keep-alive") && version == "1.0" {
                    reusable = true;
                }
            }
        }
        out.push((field_name(h.name), value));
    }
    let no_body = method == "HEAD" || (100..200).contains(&status) || status == 204 || status == 304;
    let framing = match (no_body, chunked, length) {
        (true, _, _) => Framing::None,
        // Transfer-Encoding overrides Content-Length (RFC 9112 section 6.3); such a
        // response may be an attempt at smuggling, so its connection is not reused.
        (false, Some(true), l) => {
            reusable &= l.is_none();
            Framing::Chunked
        }
        (false, Some(false), _) => Framing::Close,
        (false, None, Some(n)) => Framing::Length(n),
        (false, None, None) => Framing::Close,
    };
    if framing == Framing::Close || status == 101 {
        reusable = false;
    }
    Ok(Some((Head { status, version, fields: out, framing, reusable }, used)))
}

/// The chunked coding's decoder (RFC 9112 section 7.1): fed bytes as they arrive, it
/// hands out the data and says when the last chunk and the trailers are through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chunked {
    state: State,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum State {
    /// Reading a chunk-size line (the bytes so far).
    #[default]
    Size,
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: trailer lines until an empty one (bytes read so far).
    Trailers(usize),
    Done,
}

impl Chunked {
    /// Decodes from the front of `input`, appending data to `out`; returns how many
    /// bytes of `input` were used. Bytes it cannot use yet (an incomplete line) are
    /// left for the next call with more.
    pub fn decode(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, Invalid> {
        let mut at = 0;
        loop {
            let rest = &input[at..];
            match self.state {
                State::Done => return Ok(at),
                State::Size => {
                    let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
                        if rest.len() > MAX_CHUNK_LINE {
                            return Err(Invalid("chunk-size line too long"));
                        }
                        return Ok(at);
                    };
                    // The same verdict whether the line came in one read or in pieces.
                    if nl > MAX_CHUNK_LINE {
                        return Err(Invalid("chunk-size line too long"));
                    }
                    let line = rest[..nl].strip_suffix(b"\r").ok_or(Invalid("chunk-size line without CRLF"))?;
                    let size = line.split(|&b| b == b';').next().unwrap_or_default();
                    let size = std::str::from_utf8(size).map_err(|_| Invalid("invalid chunk size"))?.trim_end();
                    if size.is_empty() || size.len() > 15 || !size.bytes().all(|b| b.is_ascii_hexdigit()) {
                        return Err(Invalid("invalid chunk size"));
                    }
                    let n = u64::from_str_radix(size, 16).map_err(|_| Invalid("invalid chunk size"))?;
                    self.state = if n == 0 { State::Trailers(0) } else { State::Data(n) };
                    at += nl + 1;
                }
                State::Data(left) => {
                    if rest.is_empty() {
                        return Ok(at);
                    }
                    let take = (rest.len() as u64).min(left) as usize;
                    out.extend_from_slice(&rest[..take]);
                    at += take;
                    self.state = if take as u64 == left { State::DataEnd } else { State::Data(left - take as u64) };
                }
                State::DataEnd => {
                    if rest.len() < 2 {
                        return Ok(at);
                    }
                    if &rest[..2] != b"\r\n" {
                        return Err(Invalid("chunk data longer than its size"));
                    }
                    at += 2;
                    self.state = State::Size;
                }
                State::Trailers(seen) => {
                    let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
                        if seen + rest.len() > MAX_TRAILERS {
                            return Err(Invalid("trailers too long"));
                        }
                        return Ok(at);
                    };
                    at += nl + 1;
                    let empty = rest[..nl] == *b"\r" || nl == 0;
                    self.state = if empty { State::Done } else { State::Trailers(seen + nl + 1) };
                    if seen + nl + 1 > MAX_TRAILERS {
                        return Err(Invalid("trailers too long"));
                    }
                }
            }
        }
    }

    /// Whether the last chunk and the trailers have been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads() {
        let ok = |raw: &str, method: &str| head(raw.as_bytes(), method).unwrap().unwrap().0;
        let h = ok("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello", "GET");
        assert_eq!((h.status, h.framing, h.reusable, h.version), (200, Framing::Length(5), true, "1.1"));
        assert_eq!(h.fields[1], ("X-A".into(), "b".to_string()));
        let cases = [
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "GET", Framing::Chunked, true),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 3\r\n\r\n",
                "GET",
                Framing::Chunked,
                false,
            ),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "GET", Framing::Close, false),
            ("HTTP/1.1 200 OK\r\n\r\n", "GET", Framing::Close, false),
            ("HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\n", "GET", Framing::Length(7), false),
            ("HTTP/1.0 200 OK\r\nContent-Length: 7\r\n\r\n", "GET", Framing::Length(7), false),
            ("HTTP/1.0 200 OK\r\nContent-Length: 7\r\nConnection: keep-alive\r\n\r\n", "GET", Framing::Length(7), true),
            ("HTTP/1.1 200 OK\r\nContent-Length: 7, 7\r\nContent-Length: 7\r\n\r\n", "GET", Framing::Length(7), true),
            ("HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n", "HEAD", Framing::None, true),
            ("HTTP/1.1 304 Not Modified\r\n\r\n", "GET", Framing::None, true),
            ("HTTP/1.1 204 No Content\r\n\r\n", "GET", Framing::None, true),
            ("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", "GET", Framing::None, true),
        ];
        for (raw, method, framing, reusable) in cases {
            let h = ok(raw, method);
            assert_eq!((h.framing, h.reusable), (framing, reusable), "{raw:?}");
        }
        assert_eq!(head(b"HTTP/1.1 200 OK\r\nContent-Len", "GET"), Ok(None));
        for (raw, why) in [
            ("garbage\r\n\r\n", "malformed response head"),
            ("HTTP/1.1 2000 OK\r\n\r\n", "malformed response head"),
            ("HTTP/1.1 099 Low\r\n\r\n", "response status out of range"),
            (
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
                "protocol upgrade (101) is not forwarded",
            ),
            ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", "conflicting Content-Length values"),
            ("HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\n", "invalid Content-Length"),
            ("HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n", "invalid Content-Length"),
            ("HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n", "malformed response head"),
        ] {
            assert_eq!(head(raw.as_bytes(), "GET"), Err(Invalid(why)), "{raw:?}");
        }
        let many: String = (0..200).map(|i| format!("X-{i}: v\r\n")).collect();
        let raw = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
        assert_eq!(head(raw.as_bytes(), "GET"), Err(Invalid("more than 128 response header fields")));
        let huge = format!("HTTP/1.1 200 OK\r\nX: {}", "a".repeat(MAX_HEAD));
        assert_eq!(head(huge.as_bytes(), "GET"), Err(Invalid("response head larger than 64 KiB")));
    }

    /// Decodes `input` fed in pieces of `step` bytes (each call given what is unused plus the next piece).
    fn decode_in_steps(input: &[u8], step: usize) -> Result<(Vec<u8>, bool, usize), Invalid> {
        let (mut d, mut out, mut pending, mut used_total) = (Chunked::default(), Vec::new(), Vec::new(), 0);
        for piece in input.chunks(step) {
            pending.extend_from_slice(piece);
            let used = d.decode(&pending, &mut out)?;
            used_total += used;
            pending.drain(..used);
            if d.is_done() {
                break;
            }
        }
        Ok((out, d.is_done(), used_total))
    }

    #[test]
    fn chunked_bodies() {
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\nNEXT";
        for step in [1, 2, 3, 7, 100] {
            let (out, done, used) = decode_in_steps(body, step).unwrap();
            assert_eq!((out.as_slice(), done), (&b"hello world"[..], true), "step {step}");
            assert_eq!(&body[used..], b"NEXT", "step {step}");
        }
        let (out, done, _) = decode_in_steps(b"A\r\n0123456789\r\n0\r\n\r\n", 4).unwrap();
        assert_eq!((out.as_slice(), done), (&b"0123456789"[..], true));
        let (out, done, _) = decode_in_steps(b"5\r\nhel", 100).unwrap();
        assert_eq!((out.as_slice(), done), (&b"hel"[..], false), "an unfinished body is not done");
        for (bad, why) in [
            (&b"zz\r\nhello\r\n"[..], "invalid chunk size"),
            (b"\r\n", "invalid chunk size"),
            (b"-1\r\n", "invalid chunk size"),
            (b"fffffffffffffffff\r\n", "invalid chunk size"),
            (b"5\nhello\r\n", "chunk-size line without CRLF"),
            (b"3\r\nhello\r\n", "chunk data longer than its size"),
        ] {
            assert_eq!(decode_in_steps(bad, 100), Err(Invalid(why)), "{bad:?}");
        }
        let endless = vec![b'1'; MAX_CHUNK_LINE + 10];
        assert_eq!(decode_in_steps(&endless, 1000), Err(Invalid("chunk-size line too long")));
        // A long extension is refused whether it comes whole or in pieces.
        let mut long = b"1;".to_vec();
        long.extend(std::iter::repeat_n(b'e', 5000));
        long.extend_from_slice(b"\r\nx\r\n0\r\n\r\n");
        for step in [1, 100, long.len()] {
            assert_eq!(decode_in_steps(&long, step), Err(Invalid("chunk-size line too long")), "{step}");
        }
        let mut trailers = b"0\r\n".to_vec();
        trailers.extend(std::iter::repeat_n(b"X: yyyyyyyyyyyyyyyyyy\r\n".to_vec(), 2000).flatten());
        assert_eq!(decode_in_steps(&trailers, 512), Err(Invalid("trailers too long")));
    }
}
