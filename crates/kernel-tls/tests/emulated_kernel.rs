//! End-to-end check of the key hand-over without a kTLS kernel.
//!
//! A real rustls client handshakes with a rustls `UnbufferedServerConnection`
//! in memory; the server's secrets become [`CryptoInfo`] structures, and an
//! *emulated kernel* protects records using only those structure bytes,
//! following the kernel's rules (nonce = salt‖iv XOR sequence for TLS 1.3
//! and ChaCha20-Poly1305; for TLS 1.2 AES-GCM an explicit nonce that starts
//! at the `iv` field and counts up). The client must accept what the
//! emulated kernel sends and vice versa — including across TLS 1.3 key
//! updates driven the way `KtlsConnection::handle_control` drives them.
//!
//! This pins down the byte layout *semantics* (which IV bytes are salt,
//! which sequence number goes where); the VM suite checks the real kernel.

use std::io::{Read, Write};
use std::sync::Arc;

use kernel_tls::{key_update_message, parse_server_post_handshake, Cipher, CryptoInfo, TlsVersion};
use rustls::crypto::cipher::{
    AeadKey, InboundOpaqueMessage, Iv, MessageDecrypter, MessageEncrypter, OutboundChunks, OutboundPlainMessage,
};
use rustls::crypto::{aws_lc_rs, CryptoProvider};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::ConnectionState;
use rustls::{ClientConfig, ClientConnection, ContentType, ProtocolVersion, ServerConfig, SupportedCipherSuite};
use testkit::AcceptAnyCert;

fn configs(suite: SupportedCipherSuite) -> (Arc<ServerConfig>, Arc<ClientConfig>) {
    let provider = Arc::new(CryptoProvider { cipher_suites: vec![suite], ..aws_lc_rs::default_provider() });
    let versions = [suite.version()];
    let cert = CertificateDer::from(include_bytes!("data/cert.der").to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(include_bytes!("data/key.pk8.der").to_vec()));
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    server.enable_secret_extraction = true;
    let client = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCert::new(&provider)))
        .with_no_client_auth();
    (Arc::new(server), Arc::new(client))
}

/// Runs the handshake until the server may be handed to the kernel.
fn handshake(suite: SupportedCipherSuite) -> (UnbufferedServerConnection, ClientConnection) {
    let (server_config, client_config) = configs(suite);
    let mut server = UnbufferedServerConnection::new(server_config).unwrap();
    let mut client = ClientConnection::new(client_config, ServerName::try_from("localhost").unwrap()).unwrap();
    let mut to_server: Vec<u8> = Vec::new();
    let mut out = vec![0u8; 64 * 1024];
    for _ in 0..100 {
        while client.wants_write() {
            client.write_tls(&mut to_server).unwrap();
        }
        let status = server.process_tls_records(&mut to_server);
        let discard = status.discard;
        let mut to_client = Vec::new();
        let mut done = false;
        match status.state.unwrap() {
            ConnectionState::EncodeTlsData(mut s) => {
                let n = s.encode(&mut out).unwrap();
                to_client.extend_from_slice(&out[..n]);
            }
            ConnectionState::TransmitTlsData(t) => t.done(),
            ConnectionState::BlockedHandshake => {}
            ConnectionState::WriteTraffic(_) => done = true,
            other => panic!("unexpected server state {other:?}"),
        }
        to_server.drain(..discard);
        if !to_client.is_empty() {
            client.read_tls(&mut &to_client[..]).unwrap();
            client.process_new_packets().unwrap();
        }
        if done && !server.is_handshaking() && to_server.is_empty() && !client.wants_write() {
            assert!(!client.is_handshaking());
            return (server, client);
        }
    }
    panic!("handshake did not finish");
}

/// The kernel's view of a `CryptoInfo`: key, salt, iv, rec_seq.
struct KernelKeys {
    cipher: Cipher,
    key: [u8; 32],
    salt: Vec<u8>,
    iv: Vec<u8>,
    seq: u64,
}

fn kernel_view(info: &CryptoInfo) -> KernelKeys {
    let b = info.as_bytes();
    let (iv, key, salt, seq) = match info.cipher() {
        Cipher::Aes128Gcm => (&b[4..12], &b[12..28], &b[28..32], &b[32..40]),
        Cipher::Aes256Gcm => (&b[4..12], &b[12..44], &b[44..48], &b[48..56]),
        Cipher::Chacha20Poly1305 => (&b[4..16], &b[16..48], &b[48..48], &b[48..56]),
    };
    let mut k = [0u8; 32];
    assert_eq!(key.len(), 32, "only 32-byte keys can be re-imported into rustls");
    k.copy_from_slice(key);
    KernelKeys {
        cipher: info.cipher(),
        key: k,
        salt: salt.to_vec(),
        iv: iv.to_vec(),
        seq: u64::from_be_bytes(seq.try_into().unwrap()),
    }
}

/// Emulates the kernel's record layer for one direction.
struct EmulatedKernel {
    keys: KernelKeys,
    suite: SupportedCipherSuite,
    /// Records protected so far under these keys.
    count: u64,
}

impl EmulatedKernel {
    fn new(info: &CryptoInfo, suite: SupportedCipherSuite) -> Self {
        EmulatedKernel { keys: kernel_view(info), suite, count: 0 }
    }

    fn seq(&self) -> u64 {
        self.keys.seq + self.count
    }

    fn full_iv(&self) -> [u8; 12] {
        let mut iv = [0u8; 12];
        iv[..self.keys.salt.len()].copy_from_slice(&self.keys.salt);
        iv[self.keys.salt.len()..].copy_from_slice(&self.keys.iv);
        iv
    }

    fn encrypter(&self) -> Box<dyn MessageEncrypter> {
        let key = AeadKey::from(self.keys.key);
        match self.suite {
            SupportedCipherSuite::Tls13(s) => s.aead_alg.encrypter(key, Iv::new(self.full_iv())),
            SupportedCipherSuite::Tls12(s) => match self.keys.cipher {
                Cipher::Chacha20Poly1305 => s.aead_alg.encrypter(key, &self.keys.iv, &[]),
                _ => {
                    // Kernel: explicit nonce = iv field + records sent.
                    // rustls builds salt‖(extra XOR seq): choose `extra` so
                    // both agree for this one record.
                    let field = u64::from_be_bytes(self.keys.iv.clone().try_into().unwrap());
                    let explicit = field.wrapping_add(self.count);
                    let extra = (explicit ^ self.seq()).to_be_bytes();
                    s.aead_alg.encrypter(key, &self.keys.salt, &extra)
                }
            },
        }
    }

    fn decrypter(&self) -> Box<dyn MessageDecrypter> {
        let key = AeadKey::from(self.keys.key);
        match self.suite {
            SupportedCipherSuite::Tls13(s) => s.aead_alg.decrypter(key, Iv::new(self.full_iv())),
            SupportedCipherSuite::Tls12(s) => match self.keys.cipher {
                Cipher::Chacha20Poly1305 => s.aead_alg.decrypter(key, &self.keys.iv),
                // The explicit nonce comes from the record; `iv` is ignored.
                _ => s.aead_alg.decrypter(key, &self.keys.salt),
            },
        }
    }

    /// Protects one record, as `send`/`sendmsg` would.
    fn seal(&mut self, typ: ContentType, data: &[u8]) -> Vec<u8> {
        let msg =
            OutboundPlainMessage { typ, version: ProtocolVersion::TLSv1_2, payload: OutboundChunks::Single(data) };
        let record = self.encrypter().encrypt(msg, self.seq()).unwrap().encode();
        self.count += 1;
        record
    }

    /// Opens one record, as `recvmsg` would: (content type, plaintext).
    fn open(&mut self, record: &[u8]) -> (u8, Vec<u8>) {
        assert!(record.len() >= 5);
        let mut payload = record[5..].to_vec();
        let typ = ContentType::from(record[0]);
        let msg = InboundOpaqueMessage::new(typ, ProtocolVersion::TLSv1_2, &mut payload);
        let plain = self.decrypter().decrypt(msg, self.seq()).unwrap();
        self.count += 1;
        (u8::from(plain.typ), plain.payload.to_vec())
    }
}

/// Splits a byte stream into TLS records.
fn records(mut stream: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while stream.len() >= 5 {
        let len = u16::from_be_bytes([stream[3], stream[4]]) as usize;
        out.push(stream[..5 + len].to_vec());
        stream = &stream[5 + len..];
    }
    assert!(stream.is_empty(), "partial record");
    out
}

fn client_receive(client: &mut ClientConnection, bytes: &[u8]) -> Vec<u8> {
    client.read_tls(&mut &bytes[..]).unwrap();
    client.process_new_packets().unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match client.reader().read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    got
}

fn client_send(client: &mut ClientConnection, data: &[u8]) -> Vec<Vec<u8>> {
    if !data.is_empty() {
        client.writer().write_all(data).unwrap();
    }
    let mut wire = Vec::new();
    while client.wants_write() {
        client.write_tls(&mut wire).unwrap();
    }
    records(&wire)
}

fn exercise(suite: SupportedCipherSuite) {
    let (server, mut client) = handshake(suite);
    let version = TlsVersion::from_rustls(suite.version().version).unwrap();
    let (secrets, mut kernel_conn) = server.dangerous_into_kernel_connection().unwrap();
    let protocol = kernel_conn.protocol_version();
    let tx = CryptoInfo::new(protocol, &secrets.tx.1, secrets.tx.0).unwrap();
    let rx = CryptoInfo::new(protocol, &secrets.rx.1, secrets.rx.0).unwrap();
    assert_eq!(tx.version(), version);
    let mut ktx = EmulatedKernel::new(&tx, suite);
    let mut krx = EmulatedKernel::new(&rx, suite);

    // Server -> client through the emulated kernel, several records.
    let mut wire = Vec::new();
    for part in [&b"hello "[..], b"from ", b"the kernel"] {
        wire.extend(ktx.seal(ContentType::ApplicationData, part));
    }
    assert_eq!(client_receive(&mut client, &wire), b"hello from the kernel");

    // Client -> server.
    let recs = client_send(&mut client, b"ping");
    let mut got = Vec::new();
    for r in &recs {
        let (typ, data) = krx.open(r);
        assert_eq!(typ, 23);
        got.extend(data);
    }
    assert_eq!(got, b"ping");

    // An alert under the kernel's key: close_notify reaches the client.
    if version == TlsVersion::Tls12 {
        let alert = ktx.seal(ContentType::Alert, &[1, 0]);
        client.read_tls(&mut &alert[..]).unwrap();
        client.process_new_packets().unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(client.reader().read(&mut buf).unwrap(), 0, "clean close");
        return;
    }

    // TLS 1.3 key update, initiated by the client with update_requested:
    // exactly the steps KtlsConnection::handle_control performs.
    client.refresh_traffic_keys().unwrap();
    let recs = client_send(&mut client, b"after update");
    let (typ, ku) = krx.open(&recs[0]);
    assert_eq!(typ, 22);
    let update_requested = parse_server_post_handshake(version, &ku).unwrap();
    assert!(update_requested);
    // 1. new RX key
    let (seq, secrets) = kernel_conn.update_rx_secret().unwrap();
    let rx2 = CryptoInfo::new(protocol, &secrets, seq).unwrap();
    let mut krx = EmulatedKernel::new(&rx2, suite);
    let mut got = Vec::new();
    for r in &recs[1..] {
        got.extend(krx.open(r).1);
    }
    assert_eq!(got, b"after update");
    // 2. our KeyUpdate(update_not_requested) under the OLD TX key ...
    let mut wire = ktx.seal(ContentType::Handshake, &key_update_message(false));
    // 3. ... then the new TX key.
    let (seq, secrets) = kernel_conn.update_tx_secret().unwrap();
    let tx2 = CryptoInfo::new(protocol, &secrets, seq).unwrap();
    let mut ktx = EmulatedKernel::new(&tx2, suite);
    wire.extend(ktx.seal(ContentType::ApplicationData, b"new key"));
    assert_eq!(client_receive(&mut client, &wire), b"new key");

    // Server-initiated update (confidentiality limit): KeyUpdate, new key.
    let mut wire = ktx.seal(ContentType::Handshake, &key_update_message(false));
    let (seq, secrets) = kernel_conn.update_tx_secret().unwrap();
    let mut ktx = EmulatedKernel::new(&CryptoInfo::new(protocol, &secrets, seq).unwrap(), suite);
    wire.extend(ktx.seal(ContentType::ApplicationData, b"third key"));
    assert_eq!(client_receive(&mut client, &wire), b"third key");
    // The client did not answer (update_not_requested), and RX still works.
    let recs = client_send(&mut client, b"still here");
    assert_eq!(krx.open(&recs[0]).1, b"still here");
}

#[test]
fn tls13_aes256gcm() {
    exercise(aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384);
}

#[test]
fn tls13_chacha20() {
    exercise(aws_lc_rs::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256);
}

#[test]
fn tls12_aes256gcm() {
    exercise(aws_lc_rs::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384);
}

#[test]
fn tls12_chacha20() {
    exercise(aws_lc_rs::cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256);
}

/// TLS 1.2 AES-GCM: the emulated kernel's explicit nonces must differ from
/// the one rustls used for the server's Finished (sequence 0).
#[test]
fn tls12_gcm_first_kernel_nonce_differs_from_finished() {
    let suite = aws_lc_rs::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384;
    let (server, _client) = handshake(suite);
    let (secrets, _k) = server.dangerous_into_kernel_connection().unwrap();
    assert!(secrets.tx.0 >= 1, "Finished was sent under this key");
    let rustls_iv = match &secrets.tx.1 {
        rustls::ConnectionTrafficSecrets::Aes256Gcm { iv, .. } => iv.as_ref().to_vec(),
        _ => unreachable!(),
    };
    let info = CryptoInfo::new(ProtocolVersion::TLSv1_2, &secrets.tx.1, secrets.tx.0).unwrap();
    let used: Vec<u64> =
        (0..secrets.tx.0).map(|s| u64::from_be_bytes(rustls_iv[4..12].try_into().unwrap()) ^ s).collect();
    let field = u64::from_be_bytes(kernel_view(&info).iv.try_into().unwrap());
    for k in 0..1000 {
        assert!(!used.contains(&field.wrapping_add(k)));
    }
}
