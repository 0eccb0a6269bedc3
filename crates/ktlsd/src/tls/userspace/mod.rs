//! The userspace record layer: rustls encrypts and decrypts records in this
//! process, for kernels without kTLS or suites the kernel cannot carry.
//!
//! Each `encrypt` call produces exactly one record into the connection's output
//! buffer, so the body writer alone decides record boundaries; several records
//! then leave in one `write`.
//!
//! Its input and output buffers are borrowed from the worker's pools
//! ([`crate::tls::pool`]) while a read or a send is under way and given back as
//! soon as they are empty: an idle keep-alive connection holds neither. Only a
//! partial record (input) or records not yet written (output) keep one.
//!
//! When the peer breaks the protocol after the handshake (a record that fails
//! authentication, an oversized record, a malformed KeyUpdate, ...), rustls
//! queues the fatal alert for it; this layer sends that alert and a FIN before
//! the error reaches the caller, so the peer learns at once why the connection
//! ended. (For the few errors rustls queues no alert for, such as a TLS 1.3
//! record without a content type, only the FIN is sent: once rustls has failed,
//! nothing can encrypt one.)

use std::io;
use std::time::Duration;

use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncryptError};
use tokio::net::TcpStream;

pub mod body;

use crate::net;
use crate::tls::pool::{self, Pool};
use crate::tls::error::{SentAlert, SessionError};
use crate::tls::sizing::MAX_RECORD;

/// Per-record expansion: header (5) + explicit nonce (8, TLS 1.2) + tag (16) + type (1, TLS 1.3).
pub const RECORD_OVERHEAD: usize = 5 + 8 + 16 + 1;
/// Output buffered before a `write`: four full records.
const OUT_CAPACITY: usize = 4 * (MAX_RECORD + RECORD_OVERHEAD);
const IN_CAPACITY: usize = 5 + MAX_RECORD + 2048;
/// How long a fatal alert may wait for room in the socket before the connection is dropped without it.
const ALERT_TIMEOUT: Duration = Duration::from_secs(1);

thread_local! {
    static INPUT: Pool<Box<[u8]>> = const { Pool::new(pool::KEEP) };
    static OUTPUT: Pool<Vec<u8>> = const { Pool::new(pool::KEEP) };
}

fn new_input() -> Box<[u8]> {
    vec![0u8; IN_CAPACITY].into_boxed_slice()
}

fn new_output() -> Vec<u8> {
    vec![0u8; OUT_CAPACITY]
}

/// Makes sure the output buffer `out` holds at least `needed` bytes, borrowing it first if need be.
fn reserve_output(out: &mut Vec<u8>, needed: usize) {
    if out.capacity() == 0 {
        *out = pool::borrow(&OUTPUT, new_output);
    }
    if out.len() < needed {
        out.resize(needed, 0);
    }
}

/// A connection whose records are protected by rustls in user space.
pub struct UserspaceTls {
    conn: UnbufferedServerConnection,
    /// Borrowed from [`INPUT`] to read into, and kept while it holds a partial
    /// record (`in_len > 0`); empty otherwise.
    incoming: Box<[u8]>,
    in_len: usize,
    /// Borrowed from [`OUTPUT`] while records wait to be written; empty otherwise.
    outgoing: Vec<u8>,
    /// Records ready to send: `outgoing[out_sent..out_len]`. What a cancelled
    /// flush already wrote is never written again.
    out_len: usize,
    out_sent: usize,
    peer_closed: bool,
    /// Plaintext decrypted while looking for a writable state, handed out by the next read.
    stash: Vec<u8>,
    /// rustls rejected the peer's input: the connection is over, and the fatal
    /// alert rustls queued for it (if any) is in the output buffer.
    failed: Option<SentAlert>,
}

impl UserspaceTls {
    pub fn new(conn: UnbufferedServerConnection) -> Self {
        UserspaceTls {
            conn,
            incoming: Box::default(),
            in_len: 0,
            outgoing: Vec::new(),
            out_len: 0,
            out_sent: 0,
            peer_closed: false,
            stash: Vec::new(),
            failed: None,
        }
    }

    /// Appends decrypted application data to `out`; returns how much, 0 once the
    /// peer has closed (close_notify or end of stream).
    ///
    /// # Cancel safety
    /// Cancel-safe: input read from the socket is kept in the connection's buffer,
    /// decrypted data is appended before any further wait, and a queued answer
    /// (KeyUpdate) is flushed by the cancel-safe [`Self::flush`].
    pub async fn read(&mut self, stream: &TcpStream, out: &mut Vec<u8>, timeout: Duration) -> Result<usize, SessionError> {
        if !self.stash.is_empty() {
            // Taken, not drained: the stash keeps no capacity once handed out.
            let stash = std::mem::take(&mut self.stash);
            out.extend_from_slice(&stash);
            return Ok(stash.len());
        }
        loop {
            let got = match self.process(out) {
                Ok(got) => got,
                Err(e) => {
                    self.send_alert(stream, timeout).await;
                    return Err(e);
                }
            };
            if got > 0 || self.peer_closed {
                self.release_input();
                return Ok(got);
            }
            if self.out_len > 0 {
                // A KeyUpdate answer (or similar) is queued: send it before blocking on reads.
                self.flush(stream, timeout).await?;
            }
            if self.in_len == IN_CAPACITY {
                return Err(SessionError::Protocol {
                    sent: SentAlert::Nothing,
                    detail: "a TLS record larger than allowed".into(),
                });
            }
            let n = self.read_input(stream, timeout).await?;
            if n == 0 {
                self.peer_closed = true;
                self.release_input();
                return Ok(0);
            }
            self.in_len += n;
        }
    }

    /// Reads what the socket has after the buffered input. The input buffer is
    /// borrowed only to read into: while waiting with no partial record, the
    /// connection holds none.
    ///
    /// # Cancel safety
    /// Cancel-safe: bytes read are counted in `in_len` before any further wait.
    async fn read_input(&mut self, stream: &TcpStream, timeout: Duration) -> Result<usize, SessionError> {
        loop {
            if self.incoming.is_empty() {
                self.incoming = pool::borrow(&INPUT, new_input);
            }
            match net::try_read_draining(stream, &mut self.incoming[self.in_len..]) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                other => return Ok(other?),
            }
            self.release_input();
            net::ready(stream, tokio::io::Interest::READABLE, timeout).await?;
        }
    }

    /// Gives the input buffer back when it holds no partial record.
    fn release_input(&mut self) {
        if self.in_len == 0 && !self.incoming.is_empty() {
            pool::give_back(&INPUT, std::mem::take(&mut self.incoming));
        }
    }

    /// Gives the output buffer back when every record in it was written.
    fn release_output(&mut self) {
        if self.out_len == 0 && self.outgoing.capacity() > 0 {
            let mut out = std::mem::take(&mut self.outgoing);
            // Only buffers of the usual size go back; one grown larger is freed.
            if out.capacity() <= OUT_CAPACITY * 2 {
                out.resize(OUT_CAPACITY, 0);
                pool::give_back(&OUTPUT, out);
            }
        }
    }


    /// Runs rustls over the buffered input until it needs more bytes; plaintext
    /// goes to `out`, handshake answers to the output buffer.
    fn process(&mut self, out: &mut Vec<u8>) -> Result<usize, SessionError> {
        let mut got = 0;
        loop {
            let status = self.conn.process_tls_records(&mut self.incoming[..self.in_len]);
            let discard = status.discard;
            let mut progressed = true;
            let state = match status.state {
                Ok(state) => state,
                Err(e) => {
                    self.discard(discard);
                    return Err(self.fail(e));
                }
            };
            match state {
                ConnectionState::ReadTraffic(mut r) => {
                    // `next_record` only hands out records rustls already decrypted.
                    while let Some(Ok(rec)) = r.next_record() {
                        got += rec.payload.len();
                        out.extend_from_slice(rec.payload);
                    }
                }
                ConnectionState::EncodeTlsData(mut enc) => {
                    reserve_output(&mut self.outgoing, self.out_len);
                    super::encode_into(&mut enc, &mut self.outgoing, &mut self.out_len)
                }
                // Queued bytes leave with the next flush, in order.
                ConnectionState::TransmitTlsData(tx) => tx.done(),
                ConnectionState::PeerClosed | ConnectionState::Closed => {
                    self.peer_closed = true;
                    progressed = false;
                }
                _ => progressed = false,
            }
            self.discard(discard);
            if !progressed {
                return Ok(got);
            }
        }
    }

    /// Drops the first `n` input bytes, which rustls has consumed.
    fn discard(&mut self, n: usize) {
        if n > 0 {
            self.incoming.copy_within(n..self.in_len, 0);
            self.in_len -= n;
        }
    }

    /// rustls rejected the peer's input with `e`. It has queued the fatal alert
    /// for it, handed out by the next `process_tls_records` call(s) as
    /// `EncodeTlsData`: encode it into the output buffer, and describe `e`.
    fn fail(&mut self, e: rustls::Error) -> SessionError {
        let mut sent = SentAlert::Nothing;
        // Bounded: rustls queues one alert; more rounds would only see its error again.
        for _ in 0..4 {
            let status = self.conn.process_tls_records(&mut self.incoming[..self.in_len]);
            let discard = status.discard;
            let encoded = match status.state {
                Ok(ConnectionState::EncodeTlsData(mut enc)) => {
                    reserve_output(&mut self.outgoing, self.out_len);
                    super::encode_into(&mut enc, &mut self.outgoing, &mut self.out_len);
                    sent = SentAlert::FromRustls;
                    true
                }
                _ => false,
            };
            self.discard(discard);
            if !encoded {
                break;
            }
        }
        self.failed = Some(sent);
        SessionError::Protocol { sent, detail: e.to_string() }
    }

    /// After a failure: sends what is buffered, which ends with the fatal alert,
    /// and shuts the write side so the peer sees the end at once. Best effort,
    /// within a short bound: the connection is being dropped anyway.
    async fn send_alert(&mut self, stream: &TcpStream, timeout: Duration) {
        if self.failed.is_none() {
            return;
        }
        let _ = self.flush(stream, timeout.min(ALERT_TIMEOUT)).await;
        (self.out_sent, self.out_len) = (0, 0);
        self.release_output();
        // FIN right after the alert, so the peer sees the end at once, whatever
        // the later close() does (with unread input left, it sends a reset).
        let _ = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Write);
    }

    /// Room left in the output buffer for plaintext of whole records.
    pub fn spare_plaintext(&self) -> usize {
        OUT_CAPACITY.saturating_sub(self.out_len).saturating_sub(RECORD_OVERHEAD)
    }

    /// Encrypts `data` (at most [`MAX_RECORD`] bytes) as exactly one record.
    pub fn encrypt_record(&mut self, data: &[u8]) -> Result<(), SessionError> {
        debug_assert!(data.len() <= MAX_RECORD);
        reserve_output(&mut self.outgoing, self.out_len + data.len() + RECORD_OVERHEAD);
        loop {
            let status = self.conn.process_tls_records(&mut self.incoming[..self.in_len]);
            let discard = status.discard;
            let state = match status.state {
                Ok(state) => state,
                // Only input `read` left incomplete is looked at here (it processes
                // every complete record); should it break the protocol, the
                // response ends with the error.
                Err(e) => {
                    self.discard(discard);
                    return Err(self.fail(e));
                }
            };
            let done = match state {
                ConnectionState::WriteTraffic(mut w) => {
                    match w.encrypt(data, &mut self.outgoing[self.out_len..]) {
                        Ok(n) => self.out_len += n,
                        Err(EncryptError::InsufficientSize(e)) => {
                            return Err(SessionError::Io(io::Error::other(format!("record buffer too small: {e:?}"))))
                        }
                        Err(e) => return Err(SessionError::Io(io::Error::other(e.to_string()))),
                    }
                    true
                }
                // Pipelined input decrypted on the way: keep it for the next read.
                ConnectionState::ReadTraffic(mut r) => {
                    while let Some(Ok(rec)) = r.next_record() {
                        self.stash.extend_from_slice(rec.payload);
                    }
                    false
                }
                ConnectionState::EncodeTlsData(mut enc) => {
                    super::encode_into(&mut enc, &mut self.outgoing, &mut self.out_len);
                    // Keep room for the record being encrypted after it.
                    reserve_output(&mut self.outgoing, self.out_len + data.len() + RECORD_OVERHEAD);
                    false
                }
                ConnectionState::TransmitTlsData(tx) => {
                    tx.done();
                    false
                }
                ConnectionState::PeerClosed => {
                    self.peer_closed = true;
                    false
                }
                // The peer's close_notify (or an earlier failure) ended the session.
                _ => return Err(SessionError::PeerClosed),
            };
            self.discard(discard);
            if done {
                return Ok(());
            }
        }
    }

    /// Writes every buffered record to the socket.
    ///
    /// # Cancel safety
    /// Cancel-safe: what was written before the cancel counts as sent, and the
    /// next flush (or the close) goes on from the first unsent byte. Writing a
    /// record twice would break the peer's record sequence.
    pub async fn flush(&mut self, stream: &TcpStream, timeout: Duration) -> Result<(), SessionError> {
        if self.out_sent < self.out_len {
            net::write_tracked(stream, &self.outgoing[..self.out_len], &mut self.out_sent, timeout).await?;
        }
        (self.out_sent, self.out_len) = (0, 0);
        self.release_output();
        Ok(())
    }

    /// Queues a close_notify alert; it leaves with the next flush.
    pub fn queue_close_notify(&mut self) {
        reserve_output(&mut self.outgoing, self.out_len + 64);
        let status = self.conn.process_tls_records(&mut self.incoming[..self.in_len]);
        if let Ok(ConnectionState::WriteTraffic(mut w)) = status.state {
            if let Ok(n) = w.queue_close_notify(&mut self.outgoing[self.out_len..]) {
                self.out_len += n;
            }
        }
    }
}

impl Drop for UserspaceTls {
    fn drop(&mut self) {
        (self.in_len, self.out_len) = (0, 0);
        self.release_input();
        self.release_output();
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::SocketAddr;
    use std::sync::{mpsc, Arc};

    use super::*;
    use crate::tls::config::{server_config, Identity, TlsSettings, TlsVersion};
    use crate::tls::handshake;
    use crate::tls::sizing::{RecordPolicy, RecordSizer};
    use crate::tls::Session;

    /// A server config with ktlsd's own self-signed certificate for `versions`,
    /// and the certificate a client must trust.
    pub(crate) fn test_server_config(versions: Vec<TlsVersion>) -> (Arc<rustls::ServerConfig>, rustls::pki_types::CertificateDer<'static>) {
        let settings = TlsSettings {
            cert: None,
            key: None,
            versions,
            cipher_suites: None,
            state_dir: None,
            ephemeral_cert: true,
            ticket_keys: Vec::new(),
            http2: Default::default(),
        };
        let identity = Identity::load(&settings, false).unwrap();
        let root = identity.chain[0].clone();
        let config = server_config(&settings, identity, Vec::new(), crate::tls::sni::UnknownName::Default, None).unwrap();
        (config, root)
    }

    /// A blocking rustls client on `sock` that trusts `root`, for `localhost`.
    pub(crate) fn test_client(
        sock: std::net::TcpStream,
        root: rustls::pki_types::CertificateDer<'static>,
    ) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(root).unwrap();
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
        rustls::StreamOwned::new(conn, sock)
    }

    /// A blocking rustls client with a small receive buffer that completes the
    /// handshake, waits for `go`, then reads until close_notify. Returns the
    /// plaintext, or the error that ended the read.
    fn client(
        addr: SocketAddr,
        root: rustls::pki_types::CertificateDer<'static>,
        go: mpsc::Receiver<()>,
    ) -> std::thread::JoinHandle<Result<Vec<u8>, String>> {
        std::thread::spawn(move || {
            let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            // Set before connecting, so the window stays small and the server's writes block.
            sock.set_recv_buffer_size(4096).unwrap();
            sock.connect(&addr.into()).unwrap();
            let sock: std::net::TcpStream = sock.into();
            sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut tls = test_client(sock, root);
            while tls.conn.is_handshaking() {
                tls.conn.complete_io(&mut tls.sock).map_err(|e| format!("handshake: {e}"))?;
            }
            go.recv().unwrap();
            let mut got = Vec::new();
            match tls.read_to_end(&mut got) {
                Ok(_) => Ok(got),
                Err(e) => Err(format!("after {} bytes: {e}", got.len())),
            }
        })
    }

    /// A flush cancelled half-way (as inside `select!`), then the session's close:
    /// the client receives every record exactly once, then close_notify. Writing
    /// the buffer again from its start would repeat records, which the client
    /// rejects (bad_record_mac: the record sequence is off).
    #[test]
    fn cancelled_flush_then_close_sends_each_record_once() {
        let (config, root) = test_server_config(vec![TlsVersion::Tls13, TlsVersion::Tls12]);
        let data: Vec<u8> = (0..64 * MAX_RECORD).map(|i| (i % 251) as u8).collect();

        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let got = rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let (go_tx, go_rx) = mpsc::channel();
            let client = client(listener.local_addr().unwrap(), root, go_rx);
            let (stream, _) = listener.accept().await.unwrap();
            socket2::SockRef::from(&stream).set_send_buffer_size(4096).unwrap();
            let established = handshake::accept(&stream, config, Duration::from_secs(10)).await.unwrap();
            let mut tls = UserspaceTls::new(established.conn);
            for chunk in data.chunks(MAX_RECORD) {
                tls.encrypt_record(chunk).unwrap();
            }
            let cut = tokio::time::timeout(Duration::from_millis(200), tls.flush(&stream, Duration::from_secs(10))).await;
            assert!(cut.is_err(), "the flush finished although the client reads nothing");
            assert!(
                tls.out_sent > 0 && tls.out_sent < tls.out_len,
                "the cancelled flush should have written part of the buffer ({} of {})",
                tls.out_sent,
                tls.out_len
            );
            go_tx.send(()).unwrap();
            let session = Session::userspace(stream, tls, RecordSizer::new(RecordPolicy::default(), 22), Duration::from_secs(10));
            session.close().await;
            client.join().unwrap()
        });
        match got {
            Ok(got) => assert!(got == data, "received {} bytes, sent {}", got.len(), data.len()),
            Err(e) => panic!("the client saw: {e}"),
        }
    }
}
