//! Handshakes made by hand or bent out of shape: rejected 0-RTT data, and
//! refusals for which rustls queues no alert. Each refused client must get an
//! alert record and then an orderly end (FIN), not a reset, even with input
//! the server never read.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{AlertDescription, SignatureScheme};

use super::{accept, HandshakeError};
use crate::tls::userspace::tests::test_server_config;
use crate::vocab::TlsVersion;

/// Runs `client` against [`accept`] on ktlsd's test configuration; returns
/// how the handshake ended and what the client made of it.
fn against_accept<T: Send + 'static>(
    config: Arc<rustls::ServerConfig>,
    client: impl FnOnce(TcpStream) -> T + Send + 'static,
) -> (Result<(), HandshakeError>, T) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            let sock = TcpStream::connect(addr).unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            client(sock)
        });
        let (stream, _) = listener.accept().await.unwrap();
        let ended = accept(&stream, config, Duration::from_secs(5)).await.map(|_| ());
        drop(stream);
        (ended, tokio::task::spawn_blocking(move || client.join().unwrap()).await.unwrap())
    })
}

/// Sends `bytes` (a refused handshake, then input the server never reads) and
/// returns everything the server sent until its FIN, or the read error.
fn refused(bytes: Vec<u8>) -> (Result<(), HandshakeError>, Result<Vec<u8>, std::io::ErrorKind>) {
    let (config, _) = test_server_config(vec![TlsVersion::Tls13, TlsVersion::Tls12]);
    against_accept(config, move |mut sock| {
        sock.write_all(&bytes).unwrap();
        // Unread input: closing over it without draining would reset the connection.
        let _ = sock.write_all(&[0x17; 4096]);
        let mut got = Vec::new();
        sock.read_to_end(&mut got).map(|_| got).map_err(|e| e.kind())
    })
}

/// The first flight of a rustls client for `versions`, with `verifier` deciding
/// the signature schemes it offers.
fn client_config(
    versions: &[&'static rustls::SupportedProtocolVersion],
    verifier: Option<Arc<dyn ServerCertVerifier>>,
    root: CertificateDer<'static>,
) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root).unwrap();
    let builder = rustls::ClientConfig::builder_with_protocol_versions(versions);
    match verifier {
        Some(v) => builder.dangerous().with_custom_certificate_verifier(v).with_no_client_auth(),
        None => builder.with_root_certificates(roots).with_no_client_auth(),
    }
}

fn first_flight(cfg: rustls::ClientConfig) -> Vec<u8> {
    let mut conn = rustls::ClientConnection::new(Arc::new(cfg), ServerName::try_from("localhost").unwrap()).unwrap();
    let mut out = Vec::new();
    conn.write_tls(&mut out).unwrap();
    out
}

/// The fatal alert record `alert`, as sent before the handshake keys.
fn alert_record(alert: AlertDescription) -> Vec<u8> {
    vec![0x15, 3, 3, 0, 2, 2, u8::from(alert)]
}

fn assert_alert_then_fin(
    name: &str,
    got: (Result<(), HandshakeError>, Result<Vec<u8>, std::io::ErrorKind>),
    alert: AlertDescription,
) {
    let (ended, seen) = got;
    assert!(matches!(ended, Err(ref e) if e.kind() == super::FailureKind::Protocol), "{name}: {ended:?}");
    let seen = seen.unwrap_or_else(|e| panic!("{name}: the client saw {e:?} instead of an alert and FIN"));
    assert!(seen.ends_with(&alert_record(alert)), "{name}: {seen:02x?}");
}

/// RFC 8446 §5.2: a record header announcing more than 2^14 + 256 bytes is
/// record_overflow; a ClientHello over rustls's 65,535-byte limit gets an alert.
#[test]
fn oversized_records_and_messages_get_an_alert() {
    assert_alert_then_fin("0xffff header", refused(vec![0x16, 3, 1, 0xff, 0xff]), AlertDescription::RecordOverflow);
    assert_alert_then_fin(
        "65,536-byte ClientHello",
        refused(vec![0x16, 3, 1, 0, 4, 1, 1, 0, 0]),
        AlertDescription::DecodeError,
    );
}

/// Zero-length application data where the handshake goes on: unexpected_message.
#[test]
fn application_data_in_the_handshake_is_unexpected() {
    let (_, root) = test_server_config(vec![TlsVersion::Tls12]);
    let mut bytes = first_flight(client_config(&[&rustls::version::TLS12], None, root));
    bytes.extend_from_slice(&[0x17, 3, 3, 0, 0]);
    assert_alert_then_fin("empty application data", refused(bytes), AlertDescription::UnexpectedMessage);
}

/// A TLS 1.2 client whose only signature scheme the P-256 certificate cannot
/// make: handshake_failure.
#[test]
fn no_common_signature_scheme_is_handshake_failure() {
    let (_, root) = test_server_config(vec![TlsVersion::Tls12]);
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let only_p384 = Arc::new(testkit::AcceptAnyCert::offering(&provider, &[SignatureScheme::ECDSA_NISTP384_SHA384]));
    let bytes = first_flight(client_config(&[&rustls::version::TLS12], Some(only_p384), root));
    assert_alert_then_fin("ecdsa_secp384r1_sha384 only", refused(bytes), AlertDescription::HandshakeFailure);
}

/// Issues no stateless tickets: resumption state stays on the server.
#[derive(Debug)]
struct NoTickets;

impl rustls::server::ProducesTickets for NoTickets {
    fn enabled(&self) -> bool {
        false
    }
    fn lifetime(&self) -> u32 {
        0
    }
    fn encrypt(&self, _: &[u8]) -> Option<Vec<u8>> {
        None
    }
    fn decrypt(&self, _: &[u8]) -> Option<Vec<u8>> {
        None
    }
}

/// RFC 8446 §4.2.10: early data the server rejects is skipped (rustls allows
/// 16,384 bytes), however the client cuts it into records, and the handshake
/// completes. The ticket comes from a server that allows early data; ktlsd
/// cannot resume it and rejects the data.
#[test]
fn rejected_early_data_is_skipped() {
    let (config, root) = test_server_config(vec![TlsVersion::Tls13]);
    // A server sharing ktlsd's ticket keys that allows early data, for the ticket.
    // rustls offers early data only with tickets kept on the server's side.
    let mut ticket_server = (*config).clone();
    ticket_server.max_early_data_size = 16384;
    ticket_server.ticketer = Arc::new(NoTickets);
    ticket_server.session_storage = rustls::server::ServerSessionMemoryCache::new(16);
    let ticket_server = Arc::new(ticket_server);
    let mut client = client_config(&[&rustls::version::TLS13], None, root);
    client.enable_early_data = true;
    let client = Arc::new(client);
    let name = ServerName::try_from("localhost").unwrap();
    for cuts in [vec![8000], vec![1000; 10], vec![4000, 4000, 4000]] {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = {
            let cfg = ticket_server.clone();
            std::thread::spawn(move || {
                let (sock, _) = listener.accept().unwrap();
                let mut tls = rustls::StreamOwned::new(rustls::ServerConnection::new(cfg).unwrap(), sock);
                tls.write_all(b"x").unwrap();
                tls.flush().unwrap();
                let _ = tls.read_to_end(&mut Vec::new());
            })
        };
        let mut first = rustls::StreamOwned::new(
            rustls::ClientConnection::new(client.clone(), name.clone()).unwrap(),
            TcpStream::connect(addr).unwrap(),
        );
        first.read_exact(&mut [0u8; 1]).unwrap();
        first.conn.send_close_notify();
        let _ = first.conn.complete_io(&mut first.sock);
        drop(first);
        server.join().unwrap();

        let (client, name, total) = (client.clone(), name.clone(), cuts.iter().sum::<usize>());
        let (ended, seen) = against_accept(config.clone(), move |mut sock| {
            let mut conn = rustls::ClientConnection::new(client, name).unwrap();
            let mut early = conn.early_data().ok_or("no early data offered")?;
            for n in &cuts {
                early.write_all(&vec![7u8; *n]).map_err(|e| format!("early data: {e}"))?;
            }
            while conn.is_handshaking() {
                conn.complete_io(&mut sock).map_err(|e| format!("handshake: {e}"))?;
            }
            Ok::<_, String>(conn.is_early_data_accepted())
        });
        assert_eq!(seen, Ok(false), "{total} bytes: the client saw");
        assert!(ended.is_ok(), "{total} bytes of early data: {ended:?}");
    }
}

/// Keeps the client's handshake traffic secret (TLS 1.3) from the key log.
#[derive(Debug, Default)]
struct HandshakeSecret(std::sync::Mutex<Vec<u8>>);

impl rustls::KeyLog for HandshakeSecret {
    fn log(&self, label: &str, _: &[u8], secret: &[u8]) {
        if label == "CLIENT_HANDSHAKE_TRAFFIC_SECRET" {
            *self.0.lock().unwrap() = secret.to_vec();
        }
    }
}

/// HKDF-Expand-Label (RFC 8446 §7.1) over SHA-256 with an empty context.
fn expand_label(secret: &[u8], label: &str, len: usize) -> Vec<u8> {
    use aws_lc_rs::hkdf;
    struct Len(usize);
    impl hkdf::KeyType for Len {
        fn len(&self) -> usize {
            self.0
        }
    }
    let full = format!("tls13 {label}");
    let mut info = vec![(len >> 8) as u8, len as u8, full.len() as u8];
    info.extend_from_slice(full.as_bytes());
    info.push(0);
    let mut out = vec![0; len];
    let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, secret);
    prk.expand(&[&info], Len(len)).unwrap().fill(&mut out).unwrap();
    out
}

/// RFC 8446 §5.4: where the client's Finished should come, a record protected with
/// its handshake key whose inner plaintext is all zeros (no content type):
/// unexpected_message (tlsfuzzer's test-tls13-zero-content-type.py), for every
/// length of zeros.
#[test]
fn handshake_record_without_a_content_type_is_unexpected() {
    for zeros in [1, 3, 100] {
        let (config, root) = test_server_config(vec![TlsVersion::Tls13]);
        let mut provider = rustls::crypto::aws_lc_rs::default_provider();
        provider.cipher_suites = vec![rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256];
        let mut roots = rustls::RootCertStore::empty();
        roots.add(root).unwrap();
        let mut client = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let secret = Arc::new(HandshakeSecret::default());
        client.key_log = secret.clone();
        let got = against_accept(config, move |mut sock| {
            let name = ServerName::try_from("localhost").unwrap();
            let mut conn = rustls::ClientConnection::new(Arc::new(client), name).unwrap();
            conn.write_tls(&mut sock).unwrap();
            // The server's flight, up to its Finished; the client's answer is not sent.
            while conn.is_handshaking() {
                assert!(conn.read_tls(&mut sock).unwrap() > 0, "the server closed during its flight");
                conn.process_new_packets().unwrap();
            }
            let secret = secret.0.lock().unwrap().clone();
            let (key, iv) = (expand_label(&secret, "key", 16), expand_label(&secret, "iv", 12));
            let key = aws_lc_rs::aead::UnboundKey::new(&aws_lc_rs::aead::AES_128_GCM, &key).unwrap();
            let header = [0x17, 3, 3, 0, (zeros + 16) as u8];
            let mut record = vec![0u8; zeros];
            // The first record under this key: sequence number 0, so the nonce is the IV.
            let nonce = aws_lc_rs::aead::Nonce::try_assume_unique_for_key(&iv).unwrap();
            aws_lc_rs::aead::LessSafeKey::new(key)
                .seal_in_place_append_tag(nonce, aws_lc_rs::aead::Aad::from(header), &mut record)
                .unwrap();
            sock.write_all(&[&header[..], &record].concat()).unwrap();
            let mut got = Vec::new();
            sock.read_to_end(&mut got).map(|_| got).map_err(|e| e.kind())
        });
        assert_alert_then_fin(&format!("{zeros} zero bytes"), got, AlertDescription::UnexpectedMessage);
    }
}
