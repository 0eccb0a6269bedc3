//! Records forged with a connection's own keys, for protocol-violation tests:
//! [`ForgingClient`] completes a real rustls handshake, then takes the record
//! layer over; [`bad_records`] is the table of records that break the protocol
//! after the handshake, with the alert each record layer answers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::tls::{client_config_with, closing_of, get_request, parse_response, Closing, RawResponse};

/// One direction's record protection, taken from a finished rustls handshake.
struct RecordKeys {
    key: aws_lc_rs::aead::LessSafeKey,
    iv: [u8; 12],
    seq: u64,
}

impl RecordKeys {
    fn new((seq, secrets): (u64, rustls::ConnectionTrafficSecrets)) -> RecordKeys {
        use aws_lc_rs::aead::{UnboundKey, AES_128_GCM, AES_256_GCM, CHACHA20_POLY1305};
        use rustls::ConnectionTrafficSecrets as S;
        let (alg, key, iv) = match &secrets {
            S::Aes128Gcm { key, iv } => (&AES_128_GCM, key, iv),
            S::Aes256Gcm { key, iv } => (&AES_256_GCM, key, iv),
            S::Chacha20Poly1305 { key, iv } => (&CHACHA20_POLY1305, key, iv),
            _ => panic!("traffic secrets for a cipher this harness does not know"),
        };
        let key = aws_lc_rs::aead::LessSafeKey::new(UnboundKey::new(alg, key.as_ref()).expect("AEAD key"));
        RecordKeys { key, iv: iv.as_ref().try_into().expect("12-byte IV"), seq }
    }

    /// The per-record nonce (IV XOR sequence number), then the sequence moves on.
    fn next_nonce(&mut self) -> [u8; 12] {
        let mut n = self.iv;
        for (b, s) in n[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        self.seq += 1;
        n
    }
}

/// The server's side of a connection a [`ForgingClient`] saw end.
#[derive(Debug)]
pub struct ServerEnd {
    /// Every record the server sent, decrypted: (content type, plaintext).
    pub records: Vec<(u8, Vec<u8>)>,
    /// How the TCP connection ended.
    pub how: Closing,
    /// From the call to the end.
    pub elapsed: Duration,
}

impl ServerEnd {
    /// The alerts among the records: (level, description).
    pub fn alerts(&self) -> Vec<(u8, u8)> {
        self.records.iter().filter(|(t, p)| *t == 21 && p.len() == 2).map(|(_, p)| (p[0], p[1])).collect()
    }

    /// Application data the server sent.
    pub fn data(&self) -> Vec<u8> {
        self.records.iter().filter(|(t, _)| *t == 23).flat_map(|(_, p)| p.iter().copied()).collect()
    }
}

/// A client that completes a real rustls handshake and then takes the record
/// layer over with the connection's extracted keys: it protects any record a
/// test asks for, well-formed or not, and decrypts what the server answers.
pub struct ForgingClient {
    pub sock: TcpStream,
    pub tls13: bool,
    /// TLS 1.2 AES-GCM records carry an 8-byte explicit nonce (ChaCha20 does not).
    explicit_nonce: bool,
    tx: RecordKeys,
    rx: RecordKeys,
    inbuf: Vec<u8>,
}

impl ForgingClient {
    /// Connects to `addr` with one protocol version and, when given, one suite.
    pub fn connect(
        addr: SocketAddr,
        version: &'static rustls::SupportedProtocolVersion,
        suite: Option<rustls::SupportedCipherSuite>,
    ) -> ForgingClient {
        let mut cfg = (*client_config_with(&[version], suite)).clone();
        cfg.enable_secret_extraction = true;
        // No ticket to store: the server's NewSessionTicket records are read by `read_records`.
        cfg.resumption = rustls::client::Resumption::disabled();
        let mut sock = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect");
        sock.set_nodelay(true).expect("nodelay");
        sock.set_read_timeout(Some(Duration::from_secs(30))).expect("read timeout");
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(cfg), name).expect("client connection");
        while conn.is_handshaking() {
            conn.complete_io(&mut sock).expect("handshake");
        }
        while conn.wants_write() {
            conn.write_tls(&mut sock).expect("client Finished");
        }
        let tls13 = conn.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3);
        let chacha = matches!(
            conn.negotiated_cipher_suite().map(|s| s.suite()),
            Some(rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256)
                | Some(rustls::CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256)
        );
        let secrets = conn.dangerous_extract_secrets().expect("extract secrets");
        ForgingClient {
            sock,
            tls13,
            explicit_nonce: !tls13 && !chacha,
            tx: RecordKeys::new(secrets.tx),
            rx: RecordKeys::new(secrets.rx),
            inbuf: Vec::new(),
        }
    }

    /// One protected record of content type `typ` carrying `plaintext`. In TLS 1.3
    /// the type goes inside (followed by `pad` zero bytes) and the header says
    /// application_data.
    pub fn seal(&mut self, typ: u8, plaintext: &[u8], pad: usize) -> Vec<u8> {
        if self.tls13 {
            let mut inner = plaintext.to_vec();
            inner.push(typ);
            inner.resize(inner.len() + pad, 0);
            self.seal_raw(23, &inner)
        } else {
            self.seal_raw(typ, plaintext)
        }
    }

    /// One record with header type `typ` whose protected content is exactly
    /// `inner` (in TLS 1.3: content type and padding included by the caller).
    pub fn seal_raw(&mut self, typ: u8, inner: &[u8]) -> Vec<u8> {
        use aws_lc_rs::aead::{Aad, Nonce};
        let seq = self.tx.seq;
        let nonce = self.tx.next_nonce();
        let explicit = if self.explicit_nonce { 8 } else { 0 };
        let wire_len = explicit + inner.len() + 16;
        let header = [typ, 3, 3, (wire_len >> 8) as u8, wire_len as u8];
        let aad: Vec<u8> = if self.tls13 {
            header.to_vec()
        } else {
            let mut a = seq.to_be_bytes().to_vec();
            a.extend_from_slice(&[typ, 3, 3, (inner.len() >> 8) as u8, inner.len() as u8]);
            a
        };
        let mut body = inner.to_vec();
        let tag = self
            .tx
            .key
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut body)
            .expect("seal");
        let mut rec = header.to_vec();
        if explicit > 0 {
            rec.extend_from_slice(&nonce[4..]);
        }
        rec.extend_from_slice(&body);
        rec.extend_from_slice(tag.as_ref());
        rec
    }

    /// Writes raw bytes to the socket.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).expect("write to the server");
    }

    /// Sends `data` as one application-data record.
    pub fn send_data(&mut self, data: &[u8]) {
        let rec = self.seal(23, data, 0);
        self.send_raw(&rec);
    }

    /// Decrypts one complete record off the front of the input buffer.
    fn open_one(&mut self) -> Option<(u8, Vec<u8>)> {
        use aws_lc_rs::aead::{Aad, Nonce};
        if self.inbuf.len() < 5 {
            return None;
        }
        let len = u16::from_be_bytes([self.inbuf[3], self.inbuf[4]]) as usize;
        if self.inbuf.len() < 5 + len {
            return None;
        }
        let rec: Vec<u8> = self.inbuf.drain(..5 + len).collect();
        let typ = rec[0];
        let seq = self.rx.seq;
        let mut nonce = self.rx.next_nonce();
        let mut body = rec[5..].to_vec();
        let aad = if self.tls13 {
            rec[..5].to_vec()
        } else {
            if self.explicit_nonce {
                nonce[4..].copy_from_slice(&body[..8]);
                body.drain(..8);
            }
            let plain_len = body.len() - 16;
            let mut a = seq.to_be_bytes().to_vec();
            a.extend_from_slice(&[typ, 3, 3, (plain_len >> 8) as u8, plain_len as u8]);
            a
        };
        let plain = self
            .rx
            .key
            .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut body)
            .unwrap_or_else(|e| panic!("a record from the server does not decrypt ({e:?}); header {:?}", &rec[..5]))
            .to_vec();
        if self.tls13 {
            let end = plain.iter().rposition(|&b| b != 0).expect("TLS 1.3 record without a content type");
            Some((plain[end], plain[..end].to_vec()))
        } else {
            Some((typ, plain))
        }
    }

    /// Reads and decrypts records until the server ends the connection or
    /// `limit` passes (then `how` is `TimedOut`).
    pub fn read_until_end(&mut self, limit: Duration) -> ServerEnd {
        let start = Instant::now();
        let mut records = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let how = loop {
            while let Some(r) = self.open_one() {
                records.push(r);
            }
            let left = limit.saturating_sub(start.elapsed());
            if left.is_zero() {
                break Closing::TimedOut;
            }
            self.sock.set_read_timeout(Some(left)).expect("read timeout");
            match self.sock.read(&mut buf) {
                Ok(0) => break Closing::Eof,
                Ok(n) => self.inbuf.extend_from_slice(&buf[..n]),
                Err(e) => break closing_of(&e),
            }
        };
        ServerEnd { records, how, elapsed: start.elapsed() }
    }

    /// Sends a GET and reads records until a whole response has arrived.
    pub fn get(&mut self, path: &str) -> RawResponse {
        self.send_data(get_request(path).as_bytes());
        let mut plain = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        self.sock.set_read_timeout(Some(Duration::from_secs(30))).expect("read timeout");
        loop {
            while let Some((typ, p)) = self.open_one() {
                if typ == 23 {
                    plain.extend_from_slice(&p);
                }
            }
            if let Some((r, _)) = parse_response(&plain, false) {
                return r;
            }
            let n = self.sock.read(&mut buf).expect("reading a response");
            assert!(n > 0, "the server closed before a complete response to GET {path}");
            self.inbuf.extend_from_slice(&buf[..n]);
        }
    }
}

/// Alert descriptions the bad-record table expects (RFC 8446 §6.2).
pub mod alert {
    pub const UNEXPECTED_MESSAGE: u8 = 10;
    pub const BAD_RECORD_MAC: u8 = 20;
    pub const RECORD_OVERFLOW: u8 = 22;
    pub const ILLEGAL_PARAMETER: u8 = 47;
    pub const DECODE_ERROR: u8 = 50;
}

/// Which protocol versions a [`BadRecord`] applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Versions {
    Both,
    Tls13,
    Tls12,
}

/// A record that breaks the protocol after the handshake, and the fatal alert
/// each record layer answers it with.
pub struct BadRecord {
    pub name: &'static str,
    pub versions: Versions,
    /// The bytes to send, protected with the connection's keys where they need to be.
    pub forge: fn(&mut ForgingClient) -> Vec<u8>,
    /// The alert of the userspace record layer: the one the RFCs prescribe
    /// (RFC 8446 §5, §5.2, §5.4, §6; RFC 5246 §6); always sent.
    pub userspace: u8,
    /// The alert of the kernel record layer; `None`: none is sent. After a
    /// record fails authentication every send fails while the socket's pending
    /// error (EBADMSG) is set; ktlsd reads it (`SO_ERROR`, which clears it) and
    /// then sends the alert.
    pub kernel: Option<u8>,
}

/// The bad records both record-layer suites send, one per way of breaking the
/// protocol after the handshake.
pub fn bad_records() -> Vec<BadRecord> {
    use alert::*;
    vec![
        BadRecord {
            name: "tag does not authenticate",
            versions: Versions::Both,
            forge: |c| {
                let mut r = c.seal(23, get_request("/").as_bytes(), 0);
                let last = r.len() - 1;
                r[last] ^= 1;
                r
            },
            userspace: BAD_RECORD_MAC,
            kernel: Some(BAD_RECORD_MAC),
        },
        BadRecord {
            name: "record shorter than its tag",
            versions: Versions::Both,
            // Followed by more bytes, as from a peer that goes on sending: a
            // kernel reads a TLS 1.2 AES-GCM record's explicit nonce (8 bytes)
            // before it judges the length, and would wait for them.
            forge: |_| {
                let mut r = vec![23, 3, 3, 0, 5, 1, 2, 3, 4, 5];
                r.extend_from_slice(&[23, 3, 3, 0, 32, 0, 0, 0]);
                r
            },
            userspace: BAD_RECORD_MAC,
            kernel: Some(BAD_RECORD_MAC),
        },
        BadRecord {
            name: "plaintext over 2^14 bytes",
            versions: Versions::Both,
            forge: |c| c.seal(23, &[b'a'; 16 * 1024 + 1], 0),
            userspace: RECORD_OVERFLOW,
            kernel: Some(RECORD_OVERFLOW),
        },
        BadRecord {
            name: "header announces more than any record may carry",
            versions: Versions::Both,
            forge: |_| {
                let mut r = vec![23, 3, 3, 0x48, 0x01];
                r.extend_from_slice(&[0u8; 64]);
                r
            },
            userspace: RECORD_OVERFLOW,
            kernel: Some(RECORD_OVERFLOW),
        },
        BadRecord {
            name: "KeyUpdate with request_update 2",
            versions: Versions::Tls13,
            forge: |c| c.seal(22, &[24, 0, 0, 1, 2], 0),
            userspace: ILLEGAL_PARAMETER,
            kernel: Some(ILLEGAL_PARAMETER),
        },
        BadRecord {
            name: "KeyUpdate with a two-byte body",
            versions: Versions::Tls13,
            forge: |c| c.seal(22, &[24, 0, 0, 2, 0, 0], 0),
            userspace: DECODE_ERROR,
            kernel: Some(DECODE_ERROR),
        },
        BadRecord {
            name: "KeyUpdate not last in its record",
            versions: Versions::Tls13,
            forge: |c| c.seal(22, &[24, 0, 0, 1, 0, 24, 0, 0, 1, 0], 0),
            userspace: UNEXPECTED_MESSAGE,
            kernel: Some(UNEXPECTED_MESSAGE),
        },
        BadRecord {
            name: "KeyUpdate on TLS 1.2",
            versions: Versions::Tls12,
            forge: |c| c.seal(22, &[24, 0, 0, 1, 0], 0),
            userspace: UNEXPECTED_MESSAGE,
            kernel: Some(UNEXPECTED_MESSAGE),
        },
        BadRecord {
            name: "ChangeCipherSpec after Finished",
            versions: Versions::Tls13,
            forge: |c| c.seal(20, &[1], 0),
            userspace: UNEXPECTED_MESSAGE,
            kernel: Some(UNEXPECTED_MESSAGE),
        },
        BadRecord {
            name: "ChangeCipherSpec after Finished",
            versions: Versions::Tls12,
            forge: |c| c.seal(20, &[1], 0),
            userspace: UNEXPECTED_MESSAGE,
            kernel: Some(UNEXPECTED_MESSAGE),
        },
        BadRecord {
            name: "empty alert",
            versions: Versions::Both,
            forge: |c| c.seal(21, &[], 0),
            // RFC 8446 §5.4, as nginx answers.
            userspace: UNEXPECTED_MESSAGE,
            kernel: Some(UNEXPECTED_MESSAGE),
        },
        BadRecord {
            name: "inner plaintext without a content type",
            versions: Versions::Tls13,
            forge: |c| c.seal_raw(23, &[0, 0, 0]),
            // RFC 8446 §5.4: unexpected_message. The kernel reports it as a
            // record that failed authentication.
            userspace: UNEXPECTED_MESSAGE,
            kernel: Some(BAD_RECORD_MAC),
        },
        BadRecord {
            name: "content type 0",
            versions: Versions::Tls12,
            forge: |c| c.seal_raw(0, b"x"),
            // RFC 5246 §6: an unknown record type is unexpected_message. The
            // kernel refuses the record before it could deliver its type.
            userspace: UNEXPECTED_MESSAGE,
            kernel: Some(BAD_RECORD_MAC),
        },
    ]
}
