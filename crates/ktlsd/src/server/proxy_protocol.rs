//! The PROXY protocol (HAProxy's, versions 1 and 2) on connections from the load
//! balancers named by `proxy_protocol_from`: such a connection must begin with a
//! header, whose source address then stands for the client everywhere (access log,
//! `[[access]]`, limits, `X-Forwarded-For` sent upstream). The header is parsed by
//! the `ppp` crate and consumed exactly: the socket is only peeked until a whole
//! header is in, then that many bytes are read, so the TLS handshake (or the plain
//! HTTP request) that follows starts at its first byte.
//!
//! Not here: which connections must carry a header (the listeners decide, with
//! [`covers`]), and refusing a header from anybody else (`tls::handshake`
//! knows its first bytes when it sees them instead of a ClientHello).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;
use ppp::{HeaderResult, PartialResult};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Whether a connection from `peer` must begin with a header: `from` (the
/// `proxy_protocol_from` ranges) covers it.
pub fn covers(from: &[IpNet], peer: IpAddr) -> bool {
    let peer = peer.to_canonical();
    from.iter().any(|net| net.contains(&peer))
}

/// The longest header taken: a version 1 header is at most 107 bytes, a version 2
/// header 16 plus its TLVs, which a balancer keeps to a few hundred bytes.
const MAX_HEADER: usize = 4096;

/// How long to wait before looking again at a header that has not all arrived.
const PARTIAL_WAIT: Duration = Duration::from_millis(5);

/// Why a connection that had to begin with a header was closed.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("no whole PROXY protocol header within the handshake timeout")]
    Timeout,
    #[error("closed before a whole PROXY protocol header")]
    Closed,
    #[error("malformed PROXY protocol header: {0}")]
    Malformed(String),
    #[error("PROXY protocol header longer than {MAX_HEADER} bytes")]
    TooLong,
    #[error("reading the PROXY protocol header: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads the header `stream` begins with, within `timeout`: the client's address it
/// names, or `peer` for a header that names none (a balancer's own health check:
/// version 2 `LOCAL`, version 1 `UNKNOWN`, or an address family other than IP).
///
/// # Cancel safety
/// Not cancel-safe: once the header is parsed its bytes are read; dropped then, the
/// connection must be closed.
pub async fn read_header(stream: &TcpStream, peer: SocketAddr, timeout: Duration) -> Result<SocketAddr, Refused> {
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; MAX_HEADER];
    let (len, source) = loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Err(_) => return Err(Refused::Timeout),
            Ok(r) => r?,
        };
        if n == 0 {
            return Err(Refused::Closed);
        }
        match parse(&buf[..n]) {
            Parsed::Header { len, source } => break (len, source),
            Parsed::Partial if n == buf.len() => return Err(Refused::TooLong),
            // The rest is on its way: the peeked bytes stay readable, so look again shortly.
            Parsed::Partial => {
                if tokio::time::timeout_at(deadline, tokio::time::sleep(PARTIAL_WAIT)).await.is_err() {
                    return Err(Refused::Timeout);
                }
            }
            Parsed::Bad(why) => return Err(Refused::Malformed(why)),
        }
    };
    // The header's bytes were peeked, so they are there to read at once.
    let mut done = 0;
    while done < len {
        stream.readable().await?;
        match stream.try_read(&mut buf[done..len]) {
            Ok(0) => return Err(Refused::Closed),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(Refused::Io(e)),
        }
    }
    Ok(source.unwrap_or(peer))
}

/// What the first bytes of a connection hold.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A whole header of `len` bytes, naming the client's address or none.
    Header { len: usize, source: Option<SocketAddr> },
    /// The beginning of one.
    Partial,
    /// No header, or a broken one: why.
    Bad(String),
}

/// The longest version 1 header, its CRLF included.
const V1_MAX: usize = 107;

/// Parses the header at the start of `bytes`. A version 1 header is framed here
/// (one line, at most 107 bytes, ended by CRLF) and only that line is given to the
/// parser, so that what follows it never changes the verdict.
pub fn parse(bytes: &[u8]) -> Parsed {
    if bytes.starts_with(b"PROXY ") {
        let window = &bytes[..bytes.len().min(V1_MAX)];
        return match window.iter().position(|&b| b == b'\n') {
            None if bytes.len() >= V1_MAX => Parsed::Bad(format!("version 1: no CRLF within {V1_MAX} bytes")),
            None => Parsed::Partial,
            Some(nl) if window[nl - 1] != b'\r' => {
                Parsed::Bad("version 1: a line feed without a carriage return".into())
            }
            Some(nl) => match parse_parts(&bytes[..=nl]) {
                Parsed::Header { len, source } if len == nl + 1 => Parsed::Header { len, source },
                Parsed::Bad(why) => Parsed::Bad(why),
                _ => Parsed::Bad("version 1: not a whole header line".into()),
            },
        };
    }
    if b"PROXY ".starts_with(bytes) {
        return Parsed::Partial;
    }
    parse_parts(bytes)
}

/// [`parse`] by the `ppp` crate alone.
fn parse_parts(bytes: &[u8]) -> Parsed {
    let result = HeaderResult::parse(bytes);
    if result.is_incomplete() {
        return Parsed::Partial;
    }
    match result {
        HeaderResult::V1(Ok(h)) => {
            let source = match h.addresses {
                ppp::v1::Addresses::Tcp4(a) => Some(SocketAddr::new(a.source_address.into(), a.source_port)),
                ppp::v1::Addresses::Tcp6(a) => Some(SocketAddr::new(a.source_address.into(), a.source_port)),
                ppp::v1::Addresses::Unknown => None,
            };
            Parsed::Header { len: h.header.len(), source }
        }
        // TLVs of any type are allowed (unknown ones are ignored), but each must fit:
        // a header whose length runs into what follows fails here.
        HeaderResult::V2(Ok(h)) if h.tlvs().any(|t| t.is_err()) => {
            Parsed::Bad("version 2: TLVs do not add up to the header's length".into())
        }
        HeaderResult::V2(Ok(h)) => {
            let source = match (h.command, h.addresses) {
                (ppp::v2::Command::Proxy, ppp::v2::Addresses::IPv4(a)) => {
                    Some(SocketAddr::new(a.source_address.into(), a.source_port))
                }
                (ppp::v2::Command::Proxy, ppp::v2::Addresses::IPv6(a)) => {
                    Some(SocketAddr::new(a.source_address.into(), a.source_port))
                }
                _ => None,
            };
            Parsed::Header { len: h.len(), source }
        }
        HeaderResult::V1(Err(e)) => Parsed::Bad(format!("version 1: {e}")),
        HeaderResult::V2(Err(e)) => Parsed::Bad(format!("version 2: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(command: u8, family: u8, addresses: &[u8], tlvs: &[u8]) -> Vec<u8> {
        let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
        h.push(0x20 | command);
        h.push(family);
        h.extend(u16::try_from(addresses.len() + tlvs.len()).unwrap().to_be_bytes());
        h.extend(addresses);
        h.extend(tlvs);
        h
    }

    #[test]
    fn headers() {
        let tcp4 = [203, 0, 113, 7, 10, 0, 0, 1, 0x30, 0x39, 0x01, 0xbb];
        let v2_tcp4 = v2(1, 0x11, &tcp4, &[]);
        let v2_tlvs = v2(1, 0x11, &tcp4, &[0xe0, 0, 3, 1, 2, 3, 0x01, 0, 2, b'h', b'2']);
        let v2_local = v2(0, 0x00, &[], &[]);
        let mut v2_tcp6 = [0u8; 36];
        v2_tcp6[..16].copy_from_slice(&"2001:db8::7".parse::<std::net::Ipv6Addr>().unwrap().octets());
        v2_tcp6[32..34].copy_from_slice(&443u16.to_be_bytes());
        let v2_tcp6 = v2(1, 0x21, &v2_tcp6, &[]);
        let v1 = b"PROXY TCP4 203.0.113.7 10.0.0.1 12345 443\r\n";
        let ok = |ip: &str, port| Some(SocketAddr::new(ip.parse().unwrap(), port));
        for (bytes, want) in [
            (&v1[..], Parsed::Header { len: v1.len(), source: ok("203.0.113.7", 12345) }),
            (
                b"PROXY TCP6 2001:db8::7 2001:db8::1 1 2\r\n\x16\x03",
                Parsed::Header { len: 40, source: ok("2001:db8::7", 1) },
            ),
            (b"PROXY UNKNOWN\r\n", Parsed::Header { len: 15, source: None }),
            (&v2_tcp4, Parsed::Header { len: 28, source: ok("203.0.113.7", 12345) }),
            (&v2_tlvs, Parsed::Header { len: v2_tlvs.len(), source: ok("203.0.113.7", 12345) }),
            (&v2_local, Parsed::Header { len: 16, source: None }),
            (&v2_tcp6, Parsed::Header { len: 52, source: ok("2001:db8::7", 443) }),
            (&v1[..20], Parsed::Partial),
            (b"PRO", Parsed::Partial),
            (b"", Parsed::Partial),
            (&v2_tcp4[..14], Parsed::Partial),
            (&v2_tcp4[..20], Parsed::Partial),
        ] {
            assert_eq!(parse(bytes), want, "{bytes:?}");
        }
        for bad in [
            &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"[..],
            b"GET / HTTP/1.1\r\n\r\n",
            b"PROXY TCP4 203.0.113.300 10.0.0.1 1 2\r\n",
            b"PROXY TCP4 203.0.113.7 10.0.0.1 1\r\n",
            b"PROXY TCP9 1.2.3.4 1.2.3.4 1 2\r\n",
            // Found by fuzzing: a bare line feed, which the parser took for an UNKNOWN header's end.
            b"PROXY UNKNOWN TC 4  13KN/////////// \n)\0\r\n",
            b"PROXY UNKNOWN x\n",
        ] {
            assert!(matches!(parse(bad), Parsed::Bad(_)), "{bad:?}");
        }
        // A version 2 header whose length takes in what follows it.
        let mut lying = v2(1, 0x11, &tcp4, &[]);
        lying[15] = 12 + 40;
        lying.extend(b"GET / HTTP/1.1\r\nHost: a\r\nX-Pad: aaaaaaaaaaaaaa\r\n\r\n");
        assert!(matches!(parse(&lying), Parsed::Bad(_)), "{:?}", parse(&lying));
    }

    #[test]
    fn ranges() {
        let from: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
        assert!(covers(&from, "10.1.2.3".parse().unwrap()));
        assert!(covers(&from, "::ffff:10.1.2.3".parse().unwrap()));
        assert!(covers(&from, "::1".parse().unwrap()));
        assert!(!covers(&from, "127.0.0.1".parse().unwrap()));
        assert!(!covers(&[], "10.1.2.3".parse().unwrap()));
    }
}
