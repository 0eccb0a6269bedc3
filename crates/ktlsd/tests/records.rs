//! On-wire TLS record sizes for each record-size policy.
//!
//! Record headers are cleartext, so a client that keeps a copy of every byte it
//! reads can list the record lengths the server produced. The client speaks TLS 1.2,
//! whose session ticket arrives inside the handshake: every record after the
//! handshake is response data, and its plaintext is the record length minus the
//! AES-GCM expansion (8 nonce + 16 tag bytes). Bodies are checked too.
//!
//! These run on the userspace record layer; `record_size_policies` in the VM
//! suite (`tests/ktls/records.rs`) checks the same policies on the kernel's.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use testkit::{client_config, pattern, Server};

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// TLS 1.2 AES-GCM record expansion: explicit nonce and tag.
const EXPANSION: usize = 8 + 16;

/// A TLS 1.2 client that remembers the raw bytes it received after the handshake.
struct WireClient {
    tcp: TcpStream,
    tls: rustls::ClientConnection,
    /// Raw bytes received since the handshake finished.
    wire: Vec<u8>,
    plain: Vec<u8>,
}

impl WireClient {
    fn connect(server: &Server) -> WireClient {
        Self::connect_mss(server, None)
    }

    /// With `mss`, the client advertises that segment size, as a client behind a
    /// 1500-byte MTU would (loopback's own segments are 64 KiB).
    fn connect_mss(server: &Server, mss: Option<u32>) -> WireClient {
        let cfg = client_config(&[&rustls::version::TLS12]);
        let name = "localhost".try_into().unwrap();
        let tls = rustls::ClientConnection::new(cfg, name).unwrap();
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        if let Some(mss) = mss {
            sock.set_tcp_mss(mss).unwrap();
        }
        sock.connect(&server.addr().into()).unwrap();
        let tcp: TcpStream = sock.into();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut c = WireClient { tcp, tls, wire: Vec::new(), plain: Vec::new() };
        while c.tls.is_handshaking() {
            c.tls.complete_io(&mut c.tcp).unwrap();
        }
        c
    }

    fn get(&mut self, path: &str) {
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        self.tls.writer().write_all(req.as_bytes()).unwrap();
        while self.tls.wants_write() {
            self.tls.write_tls(&mut self.tcp).unwrap();
        }
    }

    /// Reads until `n` plaintext bytes arrived in total.
    fn read_plain(&mut self, n: usize) {
        let mut buf = vec![0u8; 65536];
        while self.plain.len() < n {
            let got = self.tcp.read(&mut buf).unwrap();
            assert!(got > 0, "server closed after {} of {n} bytes", self.plain.len());
            self.wire.extend_from_slice(&buf[..got]);
            // read_tls takes what fits in its buffer: feed the rest in turns.
            let mut input = &buf[..got];
            while !input.is_empty() {
                self.tls.read_tls(&mut input).unwrap();
                self.tls.process_new_packets().unwrap();
                let mut tmp = vec![0u8; 65536];
                loop {
                    match self.tls.reader().read(&mut tmp) {
                        Ok(0) => break,
                        Ok(k) => self.plain.extend_from_slice(&tmp[..k]),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
        }
    }

    /// Plaintext lengths of the application-data records seen on the wire.
    fn record_lengths(&self) -> Vec<usize> {
        let mut out = Vec::new();
        let mut w = &self.wire[..];
        while w.len() >= 5 {
            let len = u16::from_be_bytes([w[3], w[4]]) as usize;
            assert_eq!(w[0], 23, "non-application-data record after the handshake");
            out.push(len - EXPANSION);
            w = &w[(5 + len).min(w.len())..];
        }
        out
    }
}

/// Serves `size` bytes under the policy and returns (head length, record plaintext lengths).
fn one_response(policy: &str, size: usize, mss: Option<u32>) -> (usize, Vec<usize>) {
    let body = pattern(size, 7);
    let server = Server::builder(BIN).file("f.bin", &body).arg("--record-size").arg(policy).start();
    let mut c = WireClient::connect_mss(&server, mss);
    c.get("/f.bin");
    let head_len = head_len_of(&mut c, size);
    assert_eq!(&c.plain[head_len..], &body[..], "body differs");
    (head_len, c.record_lengths())
}

/// Reads one whole response of a `size`-byte body; returns the head's length.
fn head_len_of(c: &mut WireClient, size: usize) -> usize {
    c.read_plain(1);
    loop {
        if let Some(i) = c.plain.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = i + 4;
            c.read_plain(head + size);
            return head;
        }
        let n = c.plain.len() + 1;
        c.read_plain(n);
    }
}

fn assert_static(lens: &[usize], size: usize, total: usize) {
    let (last, full) = lens.split_last().unwrap();
    assert!(full.iter().all(|&l| l == size), "records {lens:?} are not all {size}");
    assert!(*last <= size && *last > 0);
    assert_eq!(lens.iter().sum::<usize>(), total);
}

#[test]
fn static_16k_records_are_full_size() {
    let (head, lens) = one_response("static:16k", 200_000, None);
    assert_static(&lens, 16384, head + 200_000);
    assert_eq!(lens.len(), (head + 200_000).div_ceil(16384));
}

#[test]
fn static_4k_records_are_4096_bytes() {
    let (head, lens) = one_response("static:4k", 100_000, None);
    assert_static(&lens, 4096, head + 100_000);
}

#[test]
fn dynamic_records_ramp_in_stages() {
    let (head, lens) = one_response("dynamic", 400_000, None);
    assert_eq!(lens.iter().sum::<usize>(), head + 400_000);
    assert!(lens[..40].iter().all(|&l| l == 1369), "{lens:?}");
    assert!(lens[40..80].iter().all(|&l| l == 4229), "{lens:?}");
    let (_, rest) = lens[80..].split_last().unwrap();
    assert!(rest.iter().all(|&l| l == 16384), "{lens:?}");
}

#[test]
fn dynamic_records_start_small_again_after_idle() {
    let body = pattern(50_000, 3);
    let server =
        Server::builder(BIN).file("f.bin", &body).arg("--record-size").arg("dynamic:threshold=2,timeout=300ms").start();
    let mut c = WireClient::connect(&server);
    c.get("/f.bin");
    let head = head_len_of(&mut c, body.len());
    let first = c.record_lengths();
    assert_eq!(&first[..5], &[1369, 1369, 4229, 4229, 16384], "{first:?}");

    // Back to back: the ramp goes on at full size.
    c.wire.clear();
    c.plain.clear();
    c.get("/f.bin");
    head_len_of(&mut c, body.len());
    let second = c.record_lengths();
    assert_eq!(second[0], 16384, "{second:?}");

    // After more than the idle timeout: small records again.
    std::thread::sleep(Duration::from_millis(600));
    c.wire.clear();
    c.plain.clear();
    c.get("/f.bin");
    let h3 = head_len_of(&mut c, body.len());
    assert_eq!(h3, head);
    let third = c.record_lengths();
    assert_eq!(&third[..3], &[1369, 1369, 4229], "{third:?}");
}

#[test]
fn adaptive_records_grow_with_the_window() {
    let (head, lens) = one_response("adaptive", 3_000_000, Some(1400));
    assert_eq!(lens.iter().sum::<usize>(), head + 3_000_000);
    // A fresh connection (initial window: 10 segments) starts with one-segment records,
    // exactly: its header and expansion fill the segment (1400 bytes, 1388 with TCP timestamps).
    let wire = lens[0] + 5 + EXPANSION;
    assert!(wire == 1400 || wire == 1388, "first record is {wire} bytes on the wire: {:?}", &lens[..10]);
    // ...and reaches 16 KiB records as the window opens.
    assert!(lens.contains(&16384), "never reached full records: {:?}", &lens[..20]);
    // Growth, not noise: the first records are never larger than the last full ones.
    let first_full = lens.iter().position(|&l| l == 16384).unwrap();
    assert!(lens[..first_full].iter().all(|&l| l < 16384));
}
