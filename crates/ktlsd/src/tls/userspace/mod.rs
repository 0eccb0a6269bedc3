//! The userspace record layer, for kernels without kTLS or suites the kernel cannot
//! carry: records are protected in this process with the traffic keys rustls hands
//! over once the handshake is done, the same keys the kernel would get.
//!
//! rustls keeps the key schedule: its `KernelConnection` derives the next keys when
//! either side updates them (TLS 1.3 KeyUpdate). [`record`] seals and opens single
//! records in place. The body writer lays each record out in the output buffer and
//! reads file bytes straight into it ([`UserspaceTls::begin_record`]), so a body
//! byte is copied once, from the page cache, and encrypted where it lies; several
//! records then leave in one `write`.
//!
//! Input and output buffers are borrowed from the worker's pools
//! ([`crate::tls::pool`]) while a read or a send is under way and given back as
//! soon as they are empty: an idle keep-alive connection holds neither. Only a
//! partial record (input) or records not yet written (output) keep one.
//!
//! When the peer breaks the protocol (a record that fails authentication, an
//! oversized record, a malformed alert or KeyUpdate, ...), this
//! layer seals the fatal alert that says why, sends it and a FIN, and only then
//! returns the error: the peer learns at once why the connection ended. A TLS 1.2
//! renegotiation is refused with the warning `no_renegotiation`, and the
//! connection goes on (RFC 5746 §4.4), as nginx does.

use std::io;
use std::time::Duration;

use kernel_tls::{key_update_message, Alert, PostHandshake, ProtocolError, TlsVersion};
use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::{AlertDescription, ContentType};
use tokio::net::TcpStream;

pub mod body;
#[cfg(test)]
mod conformance_tests;
pub mod record;

use record::{OpenError, RecordKey, MAX_WIRE_RECORD};

use crate::net;
use crate::tls::error::SessionError;
use crate::tls::pool::{self, Pool};
use crate::tls::sizing::MAX_RECORD;

/// Output buffered before a `write`: sixteen full records and their framing. One
/// `write` of 256 KiB costs the kernel less per byte than four of 64 KiB (fewer
/// socket-lock round trips and TCP pushes: see docs/performance.md); the buffer
/// is borrowed only while a response is sent, so idle connections hold none.
const OUT_CAPACITY: usize = 16 * (MAX_RECORD + 64);
/// One whole record of the largest size a peer may send.
const IN_CAPACITY: usize = MAX_WIRE_RECORD;
/// How long a fatal alert may wait for room in the socket before the connection is dropped without it.
const ALERT_TIMEOUT: Duration = Duration::from_secs(1);
/// The highest sequence number rustls lets a key reach (its `SEQ_SOFT_LIMIT`).
const SEQ_SOFT_LIMIT: u64 = 0xffff_ffff_ffff_0000;

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

/// Why received input ended the session.
enum Refused {
    /// A record this side refuses: the alert for it is sent.
    Record(OpenError),
    /// A control record that breaks the protocol: the alert for it is sent.
    Protocol(ProtocolError),
    /// The peer ended the session with a fatal alert: nothing is sent back.
    PeerAlert(AlertDescription),
    /// rustls could not derive the peer's next key.
    Keys(String),
}

impl From<OpenError> for Refused {
    fn from(e: OpenError) -> Self {
        Refused::Record(e)
    }
}

impl From<ProtocolError> for Refused {
    fn from(e: ProtocolError) -> Self {
        Refused::Protocol(e)
    }
}

/// A connection whose records are protected in user space.
pub struct UserspaceTls {
    /// rustls's key schedule, kept for key updates.
    keys: KernelConnection<ServerConnectionData>,
    version: TlsVersion,
    tx: RecordKey,
    rx: RecordKey,
    /// Records one TX key may protect: the suite's confidentiality limit.
    tx_budget: u64,
    /// Key updates made, both directions (for tests; the metric counts kTLS's).
    key_updates: u64,
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
    /// A record [`UserspaceTls::append`] is filling at `outgoing[out_len..]`: the
    /// plaintext size the policy gave it, and the bytes in it so far.
    open: Option<(usize, usize)>,
    /// A control record (a KeyUpdate answer, a warning) waits in the output buffer:
    /// `read` sends it before it blocks. Records of queued responses wait for the
    /// codec's flush instead.
    control_queued: bool,
    /// The peer sent close_notify or closed the stream.
    peer_closed: bool,
    /// The session ended in a fatal alert (sent or received): nothing more is sealed.
    failed: bool,
    /// The peer's post-handshake messages, which may span records.
    handshake: PostHandshake,
}

impl UserspaceTls {
    /// Takes over a finished handshake (complete, nothing left to send, input at a
    /// record boundary: see `handshake::Established`).
    ///
    /// # Errors
    /// rustls refuses to hand its keys over (secret extraction disabled, handshake
    /// not complete), or the suite is one this layer has no cipher for. The
    /// connection cannot go on: its rustls state is consumed.
    pub fn new(conn: UnbufferedServerConnection) -> Result<Self, kernel_tls::Error> {
        let (secrets, keys) = conn.dangerous_into_kernel_connection()?;
        let version = TlsVersion::from_rustls(keys.protocol_version())
            .ok_or(kernel_tls::Error::UnsupportedCipher { what: "only TLS 1.2 and TLS 1.3 are supported" })?;
        let unsupported =
            |_| kernel_tls::Error::UnsupportedCipher { what: "no userspace cipher for the negotiated suite" };
        let tx = RecordKey::new(version, &secrets.tx.1, secrets.tx.0).map_err(unsupported)?;
        let rx = RecordKey::new(version, &secrets.rx.1, secrets.rx.0).map_err(unsupported)?;
        let tx_budget = kernel_tls::confidentiality_limit(&keys.negotiated_cipher_suite()).min(SEQ_SOFT_LIMIT);
        Ok(UserspaceTls {
            keys,
            version,
            tx,
            rx,
            tx_budget,
            key_updates: 0,
            incoming: Box::default(),
            in_len: 0,
            outgoing: Vec::new(),
            out_len: 0,
            out_sent: 0,
            open: None,
            control_queued: false,
            peer_closed: false,
            failed: false,
            handshake: PostHandshake::default(),
        })
    }

    /// TLS 1.3 key updates made so far, in either direction.
    #[cfg(test)]
    fn key_updates(&self) -> u64 {
        self.key_updates
    }

    /// Appends decrypted application data to `out`; returns how much, 0 once the
    /// peer has closed (close_notify or end of stream).
    ///
    /// # Cancel safety
    /// Cancel-safe: input read from the socket is kept in the connection's buffer,
    /// decrypted data is appended before any further wait, and a queued answer
    /// (KeyUpdate) is flushed by the cancel-safe [`Self::flush`].
    pub async fn read(
        &mut self,
        stream: &TcpStream,
        out: &mut Vec<u8>,
        timeout: Duration,
    ) -> Result<usize, SessionError> {
        if self.failed {
            return Err(SessionError::PeerClosed);
        }
        loop {
            let got = match self.open_records(out) {
                Ok(got) => got,
                Err(refused) => return Err(self.fail(stream, refused, timeout).await),
            };
            if got > 0 || self.peer_closed {
                self.release_input();
                return Ok(got);
            }
            if self.control_queued || self.out_sent > 0 {
                // A KeyUpdate answer or a no_renegotiation warning is queued (or a cancelled
                // flush left records half written): send them before blocking on reads.
                self.flush(stream, timeout).await?;
            }
            if self.in_len == IN_CAPACITY {
                // Unreachable: a complete record of at most IN_CAPACITY bytes was opened above.
                return Err(self.fail(stream, Refused::Record(OpenError::RecordOverflow), timeout).await);
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

    /// Opens every whole record in the input buffer: application data goes to
    /// `out`, control records are acted on. Stops after close_notify.
    fn open_records(&mut self, out: &mut Vec<u8>) -> Result<usize, Refused> {
        let (mut pos, mut got) = (0, 0);
        while !self.peer_closed {
            let len = match record::record_len(&self.incoming[pos..self.in_len], self.version) {
                None => break,
                Some(len) => len?,
            };
            if self.in_len - pos < len {
                break;
            }
            let rec = &mut self.incoming[pos..pos + len];
            pos += len;
            let (typ, plain) = self.rx.open(rec)?;
            let plain = &rec[plain];
            if typ != ContentType::Handshake && self.handshake.in_message() {
                return Err(ProtocolError::InterleavedHandshake.into());
            }
            match typ {
                ContentType::ApplicationData => {
                    out.extend_from_slice(plain);
                    got += plain.len();
                }
                ContentType::Alert => {
                    let alert = Alert::parse(plain)?;
                    if alert.description == AlertDescription::CloseNotify {
                        self.peer_closed = true;
                    } else if alert.is_fatal(self.version) {
                        self.failed = true;
                        return Err(Refused::PeerAlert(alert.description));
                    }
                }
                ContentType::Handshake => {
                    let messages = self.handshake.push(self.version, plain)?;
                    if messages.renegotiation {
                        // RFC 5746 §4.4: refuse with a warning and go on.
                        let refusal = Alert::warning(AlertDescription::NoRenegotiation);
                        self.seal_control(ContentType::Alert, &refusal.encode());
                    }
                    if let Some(update_requested) = messages.key_update {
                        self.peer_key_update(update_requested)?;
                    }
                }
                content_type => return Err(ProtocolError::UnexpectedContentType { content_type }.into()),
            }
        }
        if pos > 0 {
            self.incoming.copy_within(pos..self.in_len, 0);
            self.in_len -= pos;
        }
        Ok(got)
    }

    /// The peer's TLS 1.3 KeyUpdate: its next records use the next key; when it
    /// asks, ours answers with a KeyUpdate under the current key and then changes
    /// too (RFC 8446 §4.6.3).
    fn peer_key_update(&mut self, update_requested: bool) -> Result<(), Refused> {
        self.rx = next_key(self.version, self.keys.update_rx_secret()).map_err(Refused::Keys)?;
        self.key_updates += 1;
        if update_requested {
            self.update_tx_key().map_err(Refused::Keys)?;
        }
        Ok(())
    }

    /// Queues our KeyUpdate (update_not_requested) under the current key, then
    /// changes to the next key.
    fn update_tx_key(&mut self) -> Result<(), String> {
        self.seal_control(ContentType::Handshake, &key_update_message(false));
        self.tx = next_key(self.version, self.keys.update_tx_secret())?;
        self.key_updates += 1;
        Ok(())
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

    /// Ends the session over `refused`: seals the alert that says why (none for the
    /// peer's own fatal alert), sends what is buffered, then FIN. Best effort,
    /// within a short bound: the connection is being dropped anyway.
    async fn fail(&mut self, stream: &TcpStream, refused: Refused, timeout: Duration) -> SessionError {
        let (alert, error) = match refused {
            Refused::PeerAlert(desc) => (None, SessionError::PeerAlert(desc)),
            Refused::Record(e) => refusal(e.alert(), e.to_string()),
            Refused::Protocol(e) => refusal(e.alert(), e.to_string()),
            Refused::Keys(detail) => refusal(AlertDescription::InternalError, detail),
        };
        if let Some(alert) = alert.filter(|_| !self.failed) {
            self.seal_control(ContentType::Alert, &Alert::fatal(alert).encode());
        }
        self.failed = true;
        let _ = self.flush(stream, timeout.min(ALERT_TIMEOUT)).await;
        (self.out_sent, self.out_len) = (0, 0);
        self.release_output();
        // FIN right after the alert, so the peer sees the end at once, whatever
        // the later close() does (with unread input left, it sends a reset).
        let _ = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Write);
        error
    }

    /// Room left in the output buffer for plaintext of whole records.
    pub fn spare_plaintext(&self) -> usize {
        OUT_CAPACITY.saturating_sub(self.used()).saturating_sub(self.overhead())
    }

    /// Records of `len` plaintext bytes the output buffer still has room for.
    pub fn spare_records(&self, len: usize) -> usize {
        OUT_CAPACITY.saturating_sub(self.used()) / (len + self.overhead())
    }

    /// Output buffer bytes taken by sealed records and the open one.
    fn used(&self) -> usize {
        self.out_len + self.open.map_or(0, |(cap, _)| cap + self.overhead())
    }

    /// Appends `data` as application data behind what is buffered, packing it into
    /// records: each record is begun with the size `next_len` gives (called once per
    /// record) and sealed when full; the last one stays open for the next `append`
    /// and is sealed by [`Self::close_open`], which every other way of laying out,
    /// sealing or flushing records calls first. Bytes are copied once, into their
    /// place in the record.
    pub fn append(&mut self, mut data: &[u8], mut next_len: impl FnMut() -> usize) -> Result<(), SessionError> {
        while !data.is_empty() {
            let (cap, filled) = match self.open {
                Some(open) => open,
                None => {
                    let cap = next_len().clamp(1, MAX_RECORD);
                    self.begin_record(cap)?;
                    (cap, 0)
                }
            };
            let take = (cap - filled).min(data.len());
            self.slot(cap)[filled..filled + take].copy_from_slice(&data[..take]);
            data = &data[take..];
            self.open = Some((cap, filled + take));
            if filled + take == cap {
                self.close_open();
            }
        }
        Ok(())
    }

    /// Seals the record [`Self::append`] left open, with the bytes it holds.
    pub fn close_open(&mut self) {
        if let Some((_, filled)) = self.open.take() {
            self.seal(ContentType::ApplicationData, filled);
        }
    }

    /// Bytes a record adds to its plaintext.
    fn overhead(&self) -> usize {
        self.tx.prefix_len() + self.tx.suffix_len()
    }

    /// Lays out the next record, of `len` plaintext bytes (at most [`MAX_RECORD`]),
    /// at the end of the output buffer and returns its plaintext slot: fill it,
    /// then [`Self::seal_record`] with the same `len`. A slot left unsealed is
    /// simply overwritten by the next one.
    ///
    /// Keeps the TX key within its confidentiality limit: TLS 1.3 changes keys
    /// first (a KeyUpdate goes out ahead of the record); TLS 1.2 cannot, and the
    /// session ends.
    pub fn begin_record(&mut self, len: usize) -> Result<&mut [u8], SessionError> {
        debug_assert!(len <= MAX_RECORD);
        self.close_open();
        if self.failed {
            return Err(SessionError::PeerClosed);
        }
        if self.tx.seq() >= self.tx_budget {
            if self.version != TlsVersion::Tls13 {
                return Err(SessionError::ConfidentialityLimit);
            }
            self.update_tx_key().map_err(|e| SessionError::Io(io::Error::other(e)))?;
        }
        Ok(self.slot(len))
    }

    /// Lays out `count` records of `len` plaintext bytes each, as [`Self::begin_record`]
    /// does one, and returns their slots in order: fill them all (one vectored read),
    /// then [`Self::seal_records`] with the same `len` and `count`. `None` when the TX
    /// key could not protect them all without a change of keys (lay them out one by one).
    pub fn begin_records(&mut self, len: usize, count: usize) -> Result<Option<Vec<&mut [u8]>>, SessionError> {
        debug_assert!(len <= MAX_RECORD);
        self.close_open();
        if self.failed {
            return Err(SessionError::PeerClosed);
        }
        if self.tx.seq().saturating_add(count as u64) >= self.tx_budget {
            return Ok(None);
        }
        let (prefix, stride) = (self.tx.prefix_len(), len + self.overhead());
        let start = self.out_len;
        reserve_output(&mut self.outgoing, start + count * stride);
        let mut rest = &mut self.outgoing[start..start + count * stride];
        let mut slots = Vec::with_capacity(count);
        for _ in 0..count {
            let (record, after) = rest.split_at_mut(stride);
            slots.push(&mut record[prefix..prefix + len]);
            rest = after;
        }
        Ok(Some(slots))
    }

    /// Seals the `count` records [`Self::begin_records`] laid out, each slot full.
    pub fn seal_records(&mut self, len: usize, count: usize) {
        for _ in 0..count {
            self.seal(ContentType::ApplicationData, len);
        }
    }

    /// Seals the record [`Self::begin_record`] laid out, whose slot now holds `len` bytes.
    pub fn seal_record(&mut self, len: usize) {
        self.seal(ContentType::ApplicationData, len);
    }

    /// Seals a small control record (alert, KeyUpdate) after the buffered ones.
    fn seal_control(&mut self, typ: ContentType, payload: &[u8]) {
        self.close_open();
        self.control_queued = true;
        self.slot(payload.len()).copy_from_slice(payload);
        self.seal(typ, payload.len());
    }

    /// The plaintext slot of a record of `len` bytes after the buffered ones.
    fn slot(&mut self, len: usize) -> &mut [u8] {
        let (start, end) = (self.out_len + self.tx.prefix_len(), self.out_len + len + self.overhead());
        reserve_output(&mut self.outgoing, end);
        &mut self.outgoing[start..start + len]
    }

    /// Seals the record whose [`Self::slot`] holds `len` bytes of type `typ`.
    fn seal(&mut self, typ: ContentType, len: usize) {
        let end = self.out_len + len + self.overhead();
        self.tx.seal(typ, &mut self.outgoing[self.out_len..end], len);
        self.out_len = end;
    }

    /// Writes every buffered record to the socket.
    ///
    /// # Cancel safety
    /// Cancel-safe: what was written before the cancel counts as sent, and the
    /// next flush (or the close) goes on from the first unsent byte. Writing a
    /// record twice would break the peer's record sequence.
    pub async fn flush(&mut self, stream: &TcpStream, timeout: Duration) -> Result<(), SessionError> {
        self.close_open();
        if self.out_sent < self.out_len {
            net::write_tracked(stream, &self.outgoing[..self.out_len], &mut self.out_sent, timeout).await?;
        }
        (self.out_sent, self.out_len, self.control_queued) = (0, 0, false);
        self.release_output();
        Ok(())
    }

    /// Queues a close_notify alert; it leaves with the next flush.
    pub fn queue_close_notify(&mut self) {
        if !self.failed {
            self.seal_control(ContentType::Alert, &Alert::close_notify().encode());
        }
    }
}

/// The key rustls derived for one direction's next traffic secret.
fn next_key(
    version: TlsVersion,
    derived: Result<(u64, rustls::ConnectionTrafficSecrets), rustls::Error>,
) -> Result<RecordKey, String> {
    let (seq, secrets) = derived.map_err(|e| format!("rustls could not derive the next key: {e}"))?;
    RecordKey::new(version, &secrets, seq).map_err(|_| "the next key has another cipher".to_string())
}

/// The alert to send for a refused input, and the error to return.
fn refusal(alert: AlertDescription, detail: String) -> (Option<AlertDescription>, SessionError) {
    (Some(alert), SessionError::Protocol { alert, detail })
}

impl Drop for UserspaceTls {
    fn drop(&mut self) {
        (self.in_len, self.out_len) = (0, 0);
        self.release_input();
        self.release_output();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Read;
    use std::net::SocketAddr;
    use std::sync::{mpsc, Arc};

    use super::*;
    use crate::tls::config::{server_config, Identity, TlsSettings};
    use crate::tls::handshake;
    use crate::tls::sizing::{RecordPolicy, RecordSizer};
    use crate::tls::Session;
    use crate::vocab::TlsVersion;

    /// A server config with ktlsd's own self-signed certificate for `versions`,
    /// and the certificate a client must trust.
    pub(crate) fn test_server_config(
        versions: Vec<TlsVersion>,
    ) -> (Arc<rustls::ServerConfig>, rustls::pki_types::CertificateDer<'static>) {
        let settings = TlsSettings {
            cert: None,
            key: None,
            versions,
            cipher_suites: None,
            state_dir: None,
            ephemeral_cert: true,
            ticket_keys: Vec::new(),
            shared_tickets: None,
            http2: Default::default(),
        };
        let identity = Identity::load(&settings, false).unwrap();
        let root = identity.chain[0].clone();
        let config = server_config(&settings, identity, Vec::new(), crate::vocab::UnknownName::Default, None).unwrap();
        (config, root)
    }

    /// A blocking rustls client on `sock` that trusts `root`, for `localhost`.
    pub(crate) fn test_client(
        sock: std::net::TcpStream,
        root: rustls::pki_types::CertificateDer<'static>,
    ) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
        test_client_for(sock, root, None)
    }

    /// [`test_client`] offering only `suite`, when given.
    fn test_client_for(
        sock: std::net::TcpStream,
        root: rustls::pki_types::CertificateDer<'static>,
        suite: Option<rustls::SupportedCipherSuite>,
    ) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(root).unwrap();
        let mut provider = rustls::crypto::aws_lc_rs::default_provider();
        if let Some(suite) = suite {
            provider.cipher_suites = vec![suite];
        }
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
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
    /// Appended pieces are packed into records of exactly the sizes asked for (the
    /// last one shorter), a control record closes the open one first, and the peer
    /// reads every byte in order.
    #[test]
    fn appended_pieces_fill_records_of_the_asked_size() {
        let pieces: Vec<Vec<u8>> = (0..40).map(|i| vec![i as u8; 37 * i + 1]).collect();
        let data: Vec<u8> = pieces.concat();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let got = rt.block_on(async {
            let (stream, mut tls, go_tx, client) = session_with_client(None).await;
            let seq = tls.tx.seq();
            let mut asked = 0;
            for piece in &pieces {
                tls.append(piece, || {
                    asked += 1;
                    1000
                })
                .unwrap();
            }
            assert_eq!(asked, data.len().div_ceil(1000), "one size asked per record");
            assert_eq!(tls.tx.seq() - seq, (data.len() / 1000) as u64, "full records sealed, the last left open");
            tls.queue_close_notify();
            assert_eq!(tls.tx.seq() - seq, data.len().div_ceil(1000) as u64 + 1, "open record sealed before the alert");
            assert_eq!(tls.out_len, data.len() + (asked + 1) * tls.overhead() + 2);
            go_tx.send(()).unwrap();
            tls.flush(&stream, Duration::from_secs(10)).await.unwrap();
            drop(stream);
            client.join().unwrap()
        });
        assert_received(got, &data);
    }

    /// A server session over loopback (its send buffer set to `send_buffer` when
    /// given) with [`client`] at the other end, which reads once told to go.
    async fn session_with_client(
        send_buffer: Option<usize>,
    ) -> (tokio::net::TcpStream, UserspaceTls, mpsc::Sender<()>, std::thread::JoinHandle<Result<Vec<u8>, String>>) {
        let (config, root) = test_server_config(vec![TlsVersion::Tls13, TlsVersion::Tls12]);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (go_tx, go_rx) = mpsc::channel();
        let client = client(listener.local_addr().unwrap(), root, go_rx);
        let (stream, _) = listener.accept().await.unwrap();
        if let Some(bytes) = send_buffer {
            socket2::SockRef::from(&stream).set_send_buffer_size(bytes).unwrap();
        }
        let established = handshake::accept(&stream, config, Duration::from_secs(10)).await.unwrap();
        (stream, UserspaceTls::new(established.conn).unwrap(), go_tx, client)
    }

    fn assert_received(got: Result<Vec<u8>, String>, data: &[u8]) {
        match got {
            Ok(got) => assert!(got == data, "received {} bytes, sent {}", got.len(), data.len()),
            Err(e) => panic!("the client saw: {e}"),
        }
    }

    #[test]
    fn cancelled_flush_then_close_sends_each_record_once() {
        let data: Vec<u8> = (0..64 * MAX_RECORD).map(|i| (i % 251) as u8).collect();

        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let got = rt.block_on(async {
            let (stream, mut tls, go_tx, client) = session_with_client(Some(4096)).await;
            for chunk in data.chunks(MAX_RECORD) {
                tls.begin_record(chunk.len()).unwrap().copy_from_slice(chunk);
                tls.seal_record(chunk.len());
            }
            let cut =
                tokio::time::timeout(Duration::from_millis(200), tls.flush(&stream, Duration::from_secs(10))).await;
            assert!(cut.is_err(), "the flush finished although the client reads nothing");
            assert!(
                tls.out_sent > 0 && tls.out_sent < tls.out_len,
                "the cancelled flush should have written part of the buffer ({} of {})",
                tls.out_sent,
                tls.out_len
            );
            go_tx.send(()).unwrap();
            let session =
                Session::userspace(stream, tls, RecordSizer::new(RecordPolicy::default(), 22), Duration::from_secs(10));
            session.close().await;
            client.join().unwrap()
        });
        assert_received(got, &data);
    }

    /// Records sealed and opened here are the records a real rustls peer sends and
    /// accepts, for every suite and both versions, across key updates: ours when
    /// the TX key reaches its budget (set tiny here), and the peer's with
    /// update_requested, which this side must answer before its next data.
    /// TLS 1.2 has no key update: at the budget the session ends instead.
    #[test]
    fn records_round_trip_with_a_rustls_peer_across_key_updates() {
        use rustls::crypto::aws_lc_rs::cipher_suite as cs;
        let table = [
            (cs::TLS13_AES_128_GCM_SHA256, true),
            (cs::TLS13_AES_256_GCM_SHA384, true),
            (cs::TLS13_CHACHA20_POLY1305_SHA256, true),
            (cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, false),
            (cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, false),
            (cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, false),
        ];
        // Sizes that cross the edges: empty, one byte, a full record.
        let sizes = [1usize, 0, 1000, MAX_RECORD, 7, MAX_RECORD - 1];
        let (config, root) = test_server_config(vec![TlsVersion::Tls13, TlsVersion::Tls12]);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        for (suite, tls13) in table {
            let name = format!("{:?}", suite.suite());
            let data: Vec<Vec<u8>> =
                sizes.iter().enumerate().map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect()).collect();
            let expected: Vec<u8> = data.concat();
            rt.block_on(async {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = listener.local_addr().unwrap();
                let root = root.clone();
                let want = expected.len();
                let client = std::thread::spawn(move || {
                    let sock = std::net::TcpStream::connect(addr).unwrap();
                    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let mut tls = test_client_for(sock, root, Some(suite));
                    let mut got = vec![0u8; want];
                    tls.read_exact(&mut got).map_err(|e| format!("reading the records: {e}"))?;
                    if tls13 {
                        tls.conn.refresh_traffic_keys().map_err(|e| format!("client key update: {e}"))?;
                    }
                    std::io::Write::write_all(&mut tls, b"ping").map_err(|e| format!("writing: {e}"))?;
                    let mut pong = [0u8; 4];
                    tls.read_exact(&mut pong).map_err(|e| format!("reading the answer: {e}"))?;
                    Ok::<_, String>((got, pong))
                });
                let (stream, _) = listener.accept().await.unwrap();
                let established = handshake::accept(&stream, config.clone(), Duration::from_secs(10)).await.unwrap();
                let mut tls = UserspaceTls::new(established.conn).unwrap();
                // Two records per key; the handshake's key already protected its tickets.
                tls.tx_budget = 2;
                let under_first_key = 2u64.saturating_sub(tls.tx.seq()) as usize;
                let ours = if tls13 { (data.len() - under_first_key).div_ceil(2) as u64 } else { 0 };
                let mut sealed = 0;
                for chunk in &data {
                    match tls.begin_record(chunk.len()) {
                        Ok(slot) => slot.copy_from_slice(chunk),
                        Err(SessionError::ConfidentialityLimit) if !tls13 => break,
                        Err(e) => panic!("{name}: {e}"),
                    }
                    tls.seal_record(chunk.len());
                    sealed += 1;
                }
                tls.flush(&stream, Duration::from_secs(10)).await.unwrap();
                if !tls13 {
                    assert_eq!(sealed, under_first_key, "{name}: TLS 1.2 must stop at the budget");
                    assert_eq!(tls.key_updates(), 0);
                    return;
                }
                let mut ping = Vec::new();
                let n = tls.read(&stream, &mut ping, Duration::from_secs(10)).await.unwrap();
                assert_eq!(&ping[..n], b"ping", "{name}");
                tls.tx_budget = u64::MAX;
                tls.begin_record(4).unwrap().copy_from_slice(b"pong");
                tls.seal_record(4);
                tls.flush(&stream, Duration::from_secs(10)).await.unwrap();
                let (got, pong) = tokio::task::spawn_blocking(move || client.join().unwrap()).await.unwrap().unwrap();
                assert!(got == expected, "{name}: the client read other bytes");
                assert_eq!(&pong, b"pong", "{name}");
                // Ours at the budget, then the peer's and our answer to it.
                assert!(ours >= 2);
                assert_eq!(tls.key_updates(), ours + 2, "{name}");
            });
        }
    }
}
