//! Answers the RFCs name for inputs that are legal to refuse but easy to get wrong,
//! over real sockets to the real binary: a TLS 1.2 handshake message interleaved
//! with another record type (RFC 5246 6.2.1, RFC 8446 5.1: `unexpected_message`,
//! then an orderly close although the client's bytes were left unread), and the
//! HTTP/1.1 request forms `OPTIONS *` (RFC 9110 9.3.7: 204 with `Allow`, as over
//! HTTP/2) and an empty `Transfer-Encoding` (RFC 9112 6.1: 400, not 411).
//!
//! `KTLSD_BIN` runs another server binary (e.g. an older build, to see these
//! tests fail against it).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

fn server() -> Server {
    Server::builder(BIN).bin_from_env().file("f.txt", "fox\n").start()
}

/// The handshake messages' bytes in the plaintext handshake records of `bytes`.
fn handshake_bytes(bytes: &[u8]) -> Vec<u8> {
    tls_records(bytes).into_iter().filter(|(typ, _)| *typ == 0x16).flat_map(|(_, body)| body).collect()
}

/// Reads until the peer's FIN; a reset is an error (the client's unread bytes were
/// not drained before the close).
fn read_until_fin(s: &mut TcpStream, mut got: Vec<u8>) -> io::Result<Vec<u8>> {
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf)? {
            0 => return Ok(got),
            n => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// A ClientKeyExchange cut after its first two bytes, then a ChangeCipherSpec
/// record before the rest: the handshake message is interleaved with another
/// record type. The client gets one fatal `unexpected_message` alert and a FIN,
/// not a reset, although it sent more bytes that the server never reads.
#[test]
fn interleaved_client_key_exchange_fragment_gets_unexpected_message_then_fin() {
    let srv = server();
    let mut s = TcpStream::connect(srv.addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&client_hello(client_config(&[&rustls::version::TLS12]))).unwrap();

    // The server's first flight, up to ServerHelloDone (type 14, empty).
    let mut flight = Vec::new();
    let mut buf = [0u8; 16384];
    while !handshake_bytes(&flight).ends_with(&[14, 0, 0, 0]) {
        let n = s.read(&mut buf).expect("the server's first flight");
        assert!(n > 0, "closed before ServerHelloDone: {flight:02x?}");
        flight.extend_from_slice(&buf[..n]);
    }
    let mut rest = flight.split_off(tls_records(&flight).iter().map(|(_, b)| 5 + b.len()).sum());
    assert!(rest.is_empty(), "bytes after ServerHelloDone: {rest:02x?}");

    // ClientKeyExchange (type 16) cut after its type and first length byte.
    s.write_all(&[0x16, 3, 3, 0, 2, 16, 0]).unwrap();
    // A ChangeCipherSpec record in the middle of it.
    s.write_all(&[0x14, 3, 3, 0, 1, 1]).unwrap();
    // Input the server will not read: without a drain, its close would reset.
    let _ = s.write_all(&[0x17; 4096]);

    rest = read_until_fin(&mut s, rest).expect("an alert, then FIN (not a reset)");
    let records = tls_records(&rest);
    assert_eq!(records, vec![(0x15, vec![2, 10])], "want one fatal unexpected_message alert, got {rest:02x?}");
    let st = srv.stop();
    assert_eq!(st.stat("handshake_failures"), 1, "{}", st.stderr);
}

/// `OPTIONS *` asks about the server, not a resource: 204 with `Allow` and `Date`,
/// the answer HTTP/2's `:path *` gets, and the connection stays open.
#[test]
fn options_asterisk_is_204_with_allow() {
    let srv = server();
    let mut c = TlsClient::connect(srv.addr());
    c.send(b"OPTIONS * HTTP/1.1\r\nHost: localhost\r\n\r\n");
    let r = c.read_head_response();
    assert_eq!(r.status, 204, "{}", r.body_str());
    assert_eq!(r.header("allow"), Some("GET, HEAD, OPTIONS"));
    assert!(r.header("date").is_some_and(|d| httpdate::parse_http_date(d).is_ok()), "no Date");
    assert_eq!(r.body, b"");
    // Kept alive: the next request on the same connection is served.
    assert_eq!(c.get("/f.txt").body, b"fox\n");
}

/// An empty `Transfer-Encoding` names no coding: the request is malformed (400),
/// not one lacking a length (411); the connection then closes.
#[test]
fn empty_transfer_encoding_is_400() {
    let srv = server();
    for te in ["Transfer-Encoding:", "Transfer-Encoding: ", "Transfer-Encoding:\t"] {
        let mut c = TlsClient::connect(srv.addr());
        c.send(format!("POST /f.txt HTTP/1.1\r\nHost: localhost\r\n{te}\r\n\r\n").as_bytes());
        let r = c.read_response();
        assert_eq!(r.status, 400, "{te:?}: {}", r.body_str());
        assert_eq!(r.header("connection"), Some("close"), "{te:?}");
        let (tail, _) = c.read_until_close();
        assert!(tail.is_empty(), "{te:?}: bytes after the 400: {tail:?}");
    }
}
