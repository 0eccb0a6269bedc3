//! A server connection whose record layer runs in the kernel, with rustls
//! keeping the key schedule.
//!
//! The hand-over has two steps. [`KtlsConnection::prepare`] checks the
//! finished rustls connection and attaches the `tls` ULP, leaving both
//! untouched on failure so the caller can stay in user space; it returns a
//! [`Prepared`] token. [`KtlsConnection::install`] consumes that token and
//! the rustls server connection, moves the traffic keys into the kernel and keeps
//! rustls's [`KernelConnection`] for what the kernel cannot do: deriving new
//! keys when either side sends a TLS 1.3 `KeyUpdate`. The caller reads with
//! [`recv_record`](crate::recv_record) and hands every non-data record to
//! [`KtlsConnection::handle_control`], which answers alerts and key updates.
//!
//! It also keeps an approximate count of transmitted records so the caller
//! can respect the cipher's confidentiality limit: see
//! [`KtlsConnection::limit_status`].
//!
//! It is not a transport: sending and receiving are the free functions of
//! the record layer, called with the same socket.

use core::fmt;
use std::os::fd::{AsFd, BorrowedFd};

use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::{AlertDescription, ContentType, ProtocolVersion, SupportedCipherSuite};

use crate::crypto_info::CryptoInfo;
use crate::error::{Error, ProtocolError};
use crate::keys;
use crate::message::{Alert, PostHandshake};
use crate::record::send_key_update;
use crate::types::{Cipher, TlsVersion};
use crate::uapi;
use crate::ulp::enable_ulp;

/// What [`KtlsConnection::handle_control`] made of a control record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlOutcome {
    /// The peer sent `close_notify`: it will send no more data. Finish any
    /// response, send our own `close_notify`, then close.
    CloseNotify,
    /// The peer sent a fatal alert: close without replying.
    PeerAlert(AlertDescription),
    /// A non-fatal warning alert (TLS 1.2 warnings, TLS 1.3 `user_canceled`);
    /// nothing to do.
    Warning(AlertDescription),
    /// The peer's `KeyUpdate` was applied: the new RX key is installed.
    /// `tx_too` is true if the peer asked us to update too and our new TX
    /// key is installed as well. If the peer asked but our `KeyUpdate` could
    /// not be sent yet (socket full), `tx_too` is false and
    /// [`KtlsConnection::has_pending_tx_update`] is true.
    KeyUpdated {
        /// Whether our TX key was updated too.
        tx_too: bool,
    },
    /// The peer asked to renegotiate (TLS 1.2 `ClientHello`): send the
    /// warning alert `no_renegotiation` and go on (RFC 5746 §4.4).
    RenegotiationRefused,
    /// Part of a handshake message split over records: nothing to do yet.
    Partial,
}

/// What the confidentiality limit requires of the sender right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitStatus {
    /// Far from the limit.
    Fine,
    /// TLS 1.3: call [`KtlsConnection::initiate_key_update`] before sending more.
    UpdateKey,
    /// TLS 1.2 (no key update): send `close_notify` and close.
    Close,
}

/// Proof that a socket has the `tls` ULP attached and that a rustls
/// connection was found ready to move into the kernel: the only way to
/// [`KtlsConnection::install`].
///
/// Made by [`KtlsConnection::prepare`] and consumed by `install`, so the
/// ULP is attached exactly once per connection and keys never go to a
/// socket that was not prepared. It borrows the socket, so it cannot
/// outlive it or be used with another one. Dropping it is harmless: the
/// socket stays plain TCP until keys are installed, and user-space TLS can
/// carry on.
///
/// ```no_run
/// use kernel_tls::{Error, KtlsConnection};
/// use rustls::server::UnbufferedServerConnection;
///
/// fn hand_over(socket: &std::net::TcpStream, conn: UnbufferedServerConnection) -> Result<KtlsConnection, Error> {
///     let prepared = KtlsConnection::prepare(socket, &conn)?; // on error: stay in user space
///     KtlsConnection::install(prepared, conn)
/// }
/// ```
///
/// A token cannot be made any other way:
///
/// ```compile_fail
/// fn forge(fd: std::os::fd::BorrowedFd<'_>) -> kernel_tls::Prepared<'_> {
///     kernel_tls::Prepared { fd }
/// }
/// ```
///
/// nor used twice:
///
/// ```compile_fail
/// use kernel_tls::{KtlsConnection, Prepared};
/// use rustls::server::UnbufferedServerConnection;
///
/// fn twice(p: Prepared<'_>, a: UnbufferedServerConnection, b: UnbufferedServerConnection) {
///     let _ = KtlsConnection::install(p, a);
///     let _ = KtlsConnection::install(p, b);
/// }
/// ```
///
/// nor outlive its socket:
///
/// ```compile_fail
/// use kernel_tls::{KtlsConnection, Prepared};
/// use rustls::server::UnbufferedServerConnection;
///
/// fn dangling(conn: &UnbufferedServerConnection) -> Prepared<'static> {
///     let socket = std::net::TcpStream::connect("127.0.0.1:443").unwrap();
///     KtlsConnection::prepare(&socket, conn).unwrap()
/// }
/// ```
#[must_use = "pass it to KtlsConnection::install, or drop it to stay in user space"]
#[derive(Debug)]
pub struct Prepared<'fd> {
    fd: BorrowedFd<'fd>,
}

/// A server connection with both directions in kernel TLS.
pub struct KtlsConnection {
    kernel: KernelConnection<ServerConnectionData>,
    version: TlsVersion,
    cipher: Cipher,
    suite: SupportedCipherSuite,
    /// Records sent under the current TX key (as reported by the caller).
    tx_records: u64,
    /// Records allowed under one TX key before acting (limit minus margin).
    tx_record_budget: u64,
    /// A TX key update that must still be sent: `Some(update_requested)`.
    pending_tx_update: Option<bool>,
    rx_key_updates: u64,
    tx_key_updates: u64,
    /// The peer's post-handshake messages, which may span records.
    handshake: PostHandshake,
}

/// The highest sequence number rustls lets a key reach before refreshing
/// (`SEQ_SOFT_LIMIT` in rustls), applied here too.
const SEQ_SOFT_LIMIT: u64 = 0xffff_ffff_ffff_0000;

impl KtlsConnection {
    /// Checks that `conn` can move into the kernel and attaches the `tls`
    /// ULP to `fd`, without consuming `conn`: the first half of the
    /// hand-over, and the last point at which the caller can still carry on
    /// in user space.
    ///
    /// Cheap and non-blocking (no probing: one or two socket options).
    ///
    /// # Errors
    /// [`Error::Rustls`] if the handshake is not complete (a TLS 1.3 server
    /// reports `WriteTraffic` before the client's `Finished` has arrived);
    /// [`Error::UnsupportedCipher`] for a version or suite the kernel
    /// interface cannot express; the errors of [`enable_ulp`](crate::enable_ulp).
    /// In every case the socket is still plain TCP and `conn` is untouched.
    pub fn prepare<'fd>(fd: &'fd impl AsFd, conn: &UnbufferedServerConnection) -> Result<Prepared<'fd>, Error> {
        check_ready(conn)?;
        let fd = fd.as_fd();
        enable_ulp(fd)?;
        Ok(Prepared { fd })
    }

    /// Moves a finished rustls server connection into kernel TLS on the
    /// socket `prepared` was made for: the second half of the hand-over.
    ///
    /// Requirements (rustls checks the last three):
    /// - `prepared` was made by [`prepare`](Self::prepare) for this `conn`
    ///   on the connected TCP socket the handshake ran on;
    /// - every byte already read from the socket was processed by rustls
    ///   (and any early application data it yielded was taken by the
    ///   caller) — the kernel only sees what is still in the socket;
    /// - the `ServerConfig` had `enable_secret_extraction = true`;
    /// - the handshake is complete and no TLS data is waiting to be sent:
    ///   drive the unbuffered connection until it reports `WriteTraffic`
    ///   *and* `is_handshaking()` is false.
    ///
    /// Steps: extract the secrets, install TX then RX with the extracted
    /// sequence numbers.
    ///
    /// # Errors
    /// `conn` is consumed whatever happens: on any error the connection
    /// cannot continue, in the kernel or in user space. Close it.
    pub fn install(prepared: Prepared<'_>, conn: UnbufferedServerConnection) -> Result<Self, Error> {
        let fd = prepared.fd;
        // Cheap, and guards against a `conn` other than the one prepared.
        check_ready(&conn)?;
        let (secrets, kernel) = conn.dangerous_into_kernel_connection()?;
        let protocol = kernel.protocol_version();
        let version = TlsVersion::from_rustls(protocol)
            .ok_or(Error::UnsupportedCipher { what: "only TLS 1.2 and TLS 1.3 can be handed to the kernel" })?;
        let suite = kernel.negotiated_cipher_suite();
        let (tx_seq, tx_secrets) = secrets.tx;
        let (rx_seq, rx_secrets) = secrets.rx;
        let tx = CryptoInfo::new(protocol, &tx_secrets, tx_seq)?;
        let rx = CryptoInfo::new(protocol, &rx_secrets, rx_seq)?;
        drop((tx_secrets, rx_secrets));
        keys::set_tx(fd, &tx)?;
        keys::set_rx(fd, &rx)?;
        let limit = confidentiality_limit(&suite);
        Ok(KtlsConnection {
            kernel,
            version,
            cipher: tx.cipher(),
            suite,
            // Records already sent under this key during the handshake
            // (NewSessionTicket etc.) count against the same limit.
            tx_records: tx_seq,
            tx_record_budget: record_budget(limit),
            pending_tx_update: None,
            rx_key_updates: 0,
            tx_key_updates: 0,
            handshake: PostHandshake::default(),
        })
    }

    /// The negotiated protocol version.
    pub fn protocol_version(&self) -> ProtocolVersion {
        self.version.to_rustls()
    }

    /// The negotiated protocol version as this crate's type.
    pub fn tls_version(&self) -> TlsVersion {
        self.version
    }

    /// The negotiated cipher suite.
    pub fn suite(&self) -> SupportedCipherSuite {
        self.suite
    }

    /// The kernel cipher in use.
    pub fn cipher(&self) -> Cipher {
        self.cipher
    }

    /// The IANA name of the suite, e.g. `"TLS13_AES_128_GCM_SHA256"`.
    pub fn suite_name(&self) -> &'static str {
        self.suite.suite().as_str().unwrap_or("UNKNOWN")
    }

    /// Handles one control record read with [`recv_record`](crate::recv_record).
    ///
    /// - alert `close_notify` → [`ControlOutcome::CloseNotify`];
    /// - fatal alert → [`ControlOutcome::PeerAlert`]; warning → [`ControlOutcome::Warning`];
    /// - TLS 1.3 `KeyUpdate` → derive and install the new RX key; if the peer
    ///   requested it, send our `KeyUpdate` under the old TX key, then install
    ///   the new TX key → [`ControlOutcome::KeyUpdated`];
    /// - TLS 1.2 `ClientHello` → [`ControlOutcome::RenegotiationRefused`];
    /// - the first part of a message split over records → [`ControlOutcome::Partial`].
    ///
    /// # Errors
    /// - [`Error::Protocol`]: the record breaks the protocol (malformed
    ///   alert/handshake, `NewSessionTicket` or other handshake messages,
    ///   TLS 1.2 renegotiation): send [`Error::alert`] and close;
    /// - [`Error::RekeyUnsupported`]: the kernel cannot take new keys: close
    ///   cleanly and count it;
    /// - [`Error::Rustls`], [`Error::KernelRefused`], [`Error::Io`]: close.
    pub fn handle_control(
        &mut self,
        fd: impl AsFd,
        content_type: ContentType,
        payload: &[u8],
    ) -> Result<ControlOutcome, Error> {
        if content_type != ContentType::Handshake && self.handshake.in_message() {
            return Err(Error::Protocol(ProtocolError::InterleavedHandshake));
        }
        match content_type {
            ContentType::Alert => {
                let alert = Alert::parse(payload)?;
                Ok(if alert.description == AlertDescription::CloseNotify {
                    ControlOutcome::CloseNotify
                } else if alert.is_fatal(self.version) {
                    ControlOutcome::PeerAlert(alert.description)
                } else {
                    ControlOutcome::Warning(alert.description)
                })
            }
            ContentType::Handshake => {
                let out = self.handshake.push(self.version, payload)?;
                match out.key_update {
                    Some(update_requested) => self.apply_peer_key_update(fd.as_fd(), update_requested),
                    None if out.renegotiation => Ok(ControlOutcome::RenegotiationRefused),
                    None => Ok(ControlOutcome::Partial),
                }
            }
            other => Err(Error::Protocol(ProtocolError::UnexpectedContentType { content_type: other })),
        }
    }

    fn apply_peer_key_update(
        &mut self,
        fd: std::os::fd::BorrowedFd<'_>,
        update_requested: bool,
    ) -> Result<ControlOutcome, Error> {
        let (seq, secrets) = self.kernel.update_rx_secret()?;
        let rx = CryptoInfo::new(self.protocol_version(), &secrets, seq)?;
        drop(secrets);
        keys::update_rx(fd, &rx)?;
        self.rx_key_updates += 1;
        if !update_requested {
            return Ok(ControlOutcome::KeyUpdated { tx_too: false });
        }
        // RFC 8446 §4.6.3: answer with update_not_requested. One pending
        // answer covers any number of requests.
        if self.pending_tx_update.is_none() {
            self.pending_tx_update = Some(false);
        }
        match self.complete_tx_update(fd) {
            Ok(()) => Ok(ControlOutcome::KeyUpdated { tx_too: true }),
            Err(e) if e.is_would_block() => Ok(ControlOutcome::KeyUpdated { tx_too: false }),
            Err(e) => Err(e),
        }
    }

    /// Whether a handshake message split over records has begun and not
    /// ended: application data may not arrive now (RFC 8446 §5.1); see
    /// [`ProtocolError::InterleavedHandshake`].
    pub fn in_handshake_message(&self) -> bool {
        self.handshake.in_message()
    }

    /// True if a TX key update is owed (the peer requested one and our
    /// `KeyUpdate` could not be sent yet): call
    /// [`complete_tx_update`](Self::complete_tx_update) when the socket is
    /// writable, before sending more application data.
    pub fn has_pending_tx_update(&self) -> bool {
        self.pending_tx_update.is_some()
    }

    /// Sends the owed `KeyUpdate` under the current TX key, then installs
    /// the next TX key. Does nothing if nothing is owed.
    ///
    /// On `WouldBlock` nothing changed; retry when writable. Do not leave
    /// `MSG_MORE` data pending across this call.
    pub fn complete_tx_update(&mut self, fd: impl AsFd) -> Result<(), Error> {
        let Some(update_requested) = self.pending_tx_update else {
            return Ok(());
        };
        let fd = fd.as_fd();
        send_key_update(fd, update_requested)?;
        // The KeyUpdate is now encrypted under the old key; from here on a
        // failure leaves the peer expecting a key we could not install.
        self.pending_tx_update = None;
        let (seq, secrets) = self.kernel.update_tx_secret()?;
        let tx = CryptoInfo::new(self.protocol_version(), &secrets, seq)?;
        drop(secrets);
        keys::update_tx(fd, &tx)?;
        self.tx_records = 0;
        self.tx_key_updates += 1;
        Ok(())
    }

    /// Starts a TLS 1.3 TX key update: sends `KeyUpdate(update_requested)`
    /// under the current key, then installs the next one. With
    /// `request_peer` the peer will update its key too (its `KeyUpdate`
    /// arrives as a control record).
    ///
    /// # Errors
    /// [`Error::ConfidentialityLimit`] on TLS 1.2 (close instead);
    /// `WouldBlock` (nothing changed, retry when writable);
    /// [`Error::RekeyUnsupported`] on kernels without key-update support.
    pub fn initiate_key_update(&mut self, fd: impl AsFd, request_peer: bool) -> Result<(), Error> {
        if self.version != TlsVersion::Tls13 {
            return Err(Error::ConfidentialityLimit);
        }
        let owed = self.pending_tx_update;
        self.pending_tx_update = Some(request_peer || owed.unwrap_or(false));
        match self.complete_tx_update(fd) {
            Err(e) if e.is_would_block() => {
                self.pending_tx_update = owed;
                Err(e)
            }
            other => other,
        }
    }

    /// Records that about `n` more TLS records were sent under the current
    /// TX key. Count at least one per `send` without `MSG_MORE` and one per
    /// started 16 KiB of payload (see [`records_for`]).
    pub fn note_records_sent(&mut self, n: u64) {
        self.tx_records = self.tx_records.saturating_add(n);
    }

    /// Records counted under the current TX key.
    pub fn records_sent(&self) -> u64 {
        self.tx_records
    }

    /// True when the TX key is near the cipher's confidentiality limit:
    /// see [`limit_status`](Self::limit_status) for what to do.
    pub fn needs_key_update(&self) -> bool {
        self.limit_status() != LimitStatus::Fine
    }

    /// What the confidentiality limit requires now.
    pub fn limit_status(&self) -> LimitStatus {
        if self.tx_records < self.tx_record_budget {
            LimitStatus::Fine
        } else if self.version == TlsVersion::Tls13 {
            LimitStatus::UpdateKey
        } else {
            LimitStatus::Close
        }
    }

    /// Number of peer `KeyUpdate`s applied (RX key changes).
    pub fn rx_key_updates(&self) -> u64 {
        self.rx_key_updates
    }

    /// Number of TX key changes we made.
    pub fn tx_key_updates(&self) -> u64 {
        self.tx_key_updates
    }
}

impl fmt::Debug for KtlsConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KtlsConnection")
            .field("version", &self.version)
            .field("suite", &self.suite_name())
            .field("tx_records", &self.tx_records)
            .field("pending_tx_update", &self.pending_tx_update)
            .finish_non_exhaustive()
    }
}

/// Whether a rustls connection can move into the kernel: handshake
/// complete, TLS 1.2/1.3, a suite the kernel interface can express.
fn check_ready(conn: &UnbufferedServerConnection) -> Result<(), Error> {
    // A TLS 1.3 server reaches `WriteTraffic` (0.5-RTT) before the
    // client's Finished arrives; converting then would fail after
    // consuming the connection.
    if conn.is_handshaking() {
        return Err(Error::Rustls(rustls::Error::HandshakeNotComplete));
    }
    let version = conn.protocol_version().ok_or(Error::Rustls(rustls::Error::HandshakeNotComplete))?;
    TlsVersion::from_rustls(version)
        .ok_or(Error::UnsupportedCipher { what: "only TLS 1.2 and TLS 1.3 can be handed to the kernel" })?;
    let suite = conn.negotiated_cipher_suite().ok_or(Error::Rustls(rustls::Error::HandshakeNotComplete))?;
    Cipher::for_suite(suite.suite())
        .ok_or(Error::UnsupportedCipher { what: "the negotiated cipher suite has no kernel TLS equivalent" })?;
    Ok(())
}

/// The suite's confidentiality limit (records per key).
pub fn confidentiality_limit(suite: &SupportedCipherSuite) -> u64 {
    match suite {
        SupportedCipherSuite::Tls12(s) => s.common.confidentiality_limit,
        SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
    }
}

/// Records allowed before acting: the limit (capped like rustls caps
/// sequence numbers) minus a 1/16 margin, because callers count records
/// approximately.
fn record_budget(limit: u64) -> u64 {
    let limit = limit.min(SEQ_SOFT_LIMIT);
    limit - limit / 16
}

/// A lower bound on the records the kernel makes of `bytes` of payload
/// (one per started 16 KiB; a `send` without `MSG_MORE` closes a record).
pub fn records_for(bytes: u64) -> u64 {
    bytes.div_ceil(uapi::TLS_MAX_PLAINTEXT as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_can_move_between_threads() {
        fn assert_send<T: Send + 'static>() {}
        assert_send::<KtlsConnection>();
    }

    #[test]
    fn budget_leaves_margin() {
        assert_eq!(record_budget(1 << 24), (1 << 24) - (1 << 20));
        assert!(record_budget(u64::MAX) < SEQ_SOFT_LIMIT);
    }

    #[test]
    fn records_for_counts_started_records() {
        assert_eq!(records_for(0), 1);
        assert_eq!(records_for(1), 1);
        assert_eq!(records_for(16384), 1);
        assert_eq!(records_for(16385), 2);
    }

    #[test]
    fn limits_of_rustls_suites() {
        use rustls::crypto::aws_lc_rs::cipher_suite;
        let aes = confidentiality_limit(&cipher_suite::TLS13_AES_128_GCM_SHA256);
        assert_eq!(aes, 1 << 24);
        let chacha = confidentiality_limit(&cipher_suite::TLS13_CHACHA20_POLY1305_SHA256);
        assert_eq!(chacha, u64::MAX);
    }
}
