//! The kernel record layer (kTLS): after the handshake the traffic keys go to the
//! kernel, which then encrypts and decrypts every record on this socket. This
//! module adapts the `kernel-tls` crate to the worker's event loop: reads of
//! application data and control records (close_notify, alerts, KeyUpdate), and
//! the bookkeeping the kernel cannot do (confidentiality limits, counters).
//!
//! The receive buffer is the worker's ([`crate::tls::pool`]), borrowed for one
//! `recv` and the record it returns: the kernel hands out whole records, so a
//! connection keeps no input between reads (a partial request head is the HTTP
//! layer's).

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

pub mod body;

use kernel_tls::{Capabilities, ControlOutcome, KtlsConnection, LimitStatus, Prepared, RxError};
use rustls::server::UnbufferedServerConnection;
use rustls::SupportedCipherSuite;
use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::net;
use crate::tls::error::SessionError;
use crate::tls::pool::{self, Pool};
use crate::tls::sizing::{RecordPolicy, MAX_RECORD};

/// What the running kernel can do, probed once at start-up.
pub struct Support {
    caps: Capabilities,
}

impl Support {
    pub fn probe() -> Support {
        Support { caps: kernel_tls::probe() }
    }

    pub fn usable(&self) -> bool {
        self.caps.usable()
    }

    /// Why kTLS cannot be used, with what to do about it.
    pub fn unavailable_reason(&self) -> Option<String> {
        match &self.caps.unavailable {
            Some(u) => Some(format!("{}; {}", u.reason(), u.advice())),
            None if !self.caps.usable() => Some("no cipher suite works in both directions".into()),
            None => None,
        }
    }

    /// One line: which suites run in the kernel, and whether keys can be updated.
    pub fn summary(&self) -> String {
        let both: Vec<String> = self
            .caps
            .suites
            .iter()
            .filter(|s| s.tx && s.rx)
            .map(|s| format!("{} {}", s.version.name(), s.cipher.name()))
            .collect();
        format!(
            "TX+RX for {}; TLS 1.3 key update {}",
            both.join(", "),
            if self.caps.rekey_supported() {
                "supported"
            } else {
                "not supported (connections that update keys are closed)"
            }
        )
    }

    /// The record cap to ask the kernel for (`TLS_TX_MAX_PAYLOAD_LEN`), when it has
    /// the option and the policy is a fixed size below the maximum: the kernel then
    /// cuts records itself and the body writer can hand it large `sendfile`s.
    pub fn record_cap(&self, policy: RecordPolicy) -> Option<u16> {
        match policy {
            RecordPolicy::Static(n) if n < MAX_RECORD && self.caps.record_size_cap() => u16::try_from(n).ok(),
            _ => None,
        }
    }

    /// Whether a connection with this suite can run entirely in the kernel.
    pub fn supports_both(&self, suite: SupportedCipherSuite) -> bool {
        self.caps.supports_suite(suite) == (true, true)
    }
}

/// Largest record plaintext plus room: control records must arrive whole.
const RX_BUF: usize = MAX_RECORD + 256;

thread_local! {
    static RX: Pool<Box<[u8]>> = const { Pool::new(pool::KEEP) };
}

fn new_rx() -> Box<[u8]> {
    vec![0u8; RX_BUF].into_boxed_slice()
}

/// A connection whose records the kernel protects.
pub struct KernelTls {
    conn: KtlsConnection,
    /// The kernel cuts records at the policy's size (`TLS_TX_MAX_PAYLOAD_LEN` is set).
    kernel_cuts_records: bool,
    /// TLS 1.3 KeyUpdates installed on this connection.
    key_updates: u64,
    /// The pipe that bytes queued in another socket pass through on their way in
    /// (`body::send_queued`), kept empty between calls; made at first use.
    pipe: Option<kernel_tls::Pipe>,
}

impl KernelTls {
    /// Checks that this connection can move into the kernel and attaches the `tls`
    /// ULP, without consuming the rustls state: on error it can carry on in user space.
    pub fn prepare<'s>(
        stream: &'s TcpStream,
        conn: &UnbufferedServerConnection,
    ) -> Result<Prepared<'s>, kernel_tls::Error> {
        KtlsConnection::prepare(stream, conn)
    }

    /// Hands the finished handshake to the kernel on the socket `prepared` was made
    /// for. On error the connection cannot continue (its rustls state is consumed)
    /// and must be closed.
    pub fn install(
        stream: &TcpStream,
        prepared: Prepared<'_>,
        conn: UnbufferedServerConnection,
        record_cap: Option<u16>,
    ) -> Result<KernelTls, kernel_tls::Error> {
        let conn = KtlsConnection::install(prepared, conn)?;
        // Set before any data, while no record is open (the kernel ignores it otherwise).
        let kernel_cuts_records =
            record_cap.is_some_and(|cap| kernel_tls::set_tx_max_payload_len(stream.as_fd(), cap).is_ok());
        Ok(KernelTls { conn, kernel_cuts_records, key_updates: 0, pipe: None })
    }

    /// Whether the kernel cuts records at the policy's size by itself.
    pub fn kernel_cuts_records(&self) -> bool {
        self.kernel_cuts_records
    }

    /// Appends decrypted application data to `out`; 0 once the peer has closed.
    ///
    /// # Cancel safety
    /// Cancel-safe. Each `recv` takes one whole record from the kernel and the data
    /// is appended before any other wait; a KeyUpdate answer cut short stays owed
    /// and is sent by the next read or send.
    pub async fn read(
        &mut self,
        stream: &TcpStream,
        out: &mut Vec<u8>,
        timeout: Duration,
    ) -> Result<usize, SessionError> {
        loop {
            // Borrowed only inside each attempt: none is held while waiting.
            let got = net::retry_recv(stream, timeout, || {
                let mut rx = pool::borrow(&RX, new_rx);
                match kernel_tls::recv_record(stream.as_fd(), &mut rx) {
                    Ok(rec) => Ok((rec, rx)),
                    Err(e) => {
                        pool::give_back(&RX, rx);
                        Err(e)
                    }
                }
            })
            .await;
            let (rec, rx) = match got {
                Ok(got) => got,
                Err(e) => {
                    let class = RxError::classify(&e);
                    match class {
                        RxError::Interrupted | RxError::KeyExpired => continue,
                        RxError::ConnectionLost => return Err(SessionError::PeerClosed),
                        _ => {}
                    }
                    if let Some(alert) = class.alert() {
                        let sent = send_fatal_alert(stream, alert);
                        return Err(SessionError::RecordRejected { reason: class.name(), alert, sent });
                    }
                    return Err(e.into());
                }
            };
            if rec.is_application_data() && self.conn.in_handshake_message() {
                pool::give_back(&RX, rx);
                let e = kernel_tls::Error::Protocol(kernel_tls::ProtocolError::InterleavedHandshake);
                return Err(control_error(stream, e));
            }
            if rec.is_application_data() {
                out.extend_from_slice(&rx[..rec.len]);
                pool::give_back(&RX, rx);
                return Ok(rec.len);
            }
            let handled = self.conn.handle_control(stream.as_fd(), rec.content_type, &rx[..rec.len]);
            pool::give_back(&RX, rx);
            match handled {
                Ok(ControlOutcome::CloseNotify) => return Ok(0),
                Ok(ControlOutcome::Warning(_) | ControlOutcome::Partial) => {}
                Ok(ControlOutcome::RenegotiationRefused) => {
                    // RFC 5746 §4.4: a warning, and the connection goes on.
                    let refusal = kernel_tls::Alert::warning(rustls::AlertDescription::NoRenegotiation);
                    let send = || kernel_tls::send_alert_record(stream.as_fd(), refusal);
                    net::retry(stream, Interest::WRITABLE, timeout, send).await?;
                }
                Ok(ControlOutcome::KeyUpdated { .. }) => {
                    self.key_updates += 1;
                    self.complete_tx_update(stream, timeout).await?;
                }
                Ok(ControlOutcome::PeerAlert(desc)) => return Err(SessionError::PeerAlert(desc)),
                Err(e) => return Err(control_error(stream, e)),
            }
        }
    }

    /// Sends a KeyUpdate we owe the peer, once the socket has room for it.
    async fn complete_tx_update(&mut self, stream: &TcpStream, timeout: Duration) -> Result<(), SessionError> {
        let conn = &mut self.conn;
        if !conn.has_pending_tx_update() {
            return Ok(());
        }
        let r = net::retry_as(
            stream,
            Interest::WRITABLE,
            timeout,
            || conn.complete_tx_update(stream.as_fd()),
            kernel_tls::Error::is_would_block,
        )
        .await;
        r.map_err(session_error)
    }

    /// Before sending: settle owed key updates and respect the cipher's
    /// confidentiality limit (update the key on TLS 1.3, close on TLS 1.2).
    pub async fn before_send(&mut self, stream: &TcpStream, timeout: Duration) -> Result<(), SessionError> {
        self.complete_tx_update(stream, timeout).await?;
        match self.conn.limit_status() {
            LimitStatus::Fine => Ok(()),
            LimitStatus::UpdateKey => {
                let conn = &mut self.conn;
                let r = net::retry_as(
                    stream,
                    Interest::WRITABLE,
                    timeout,
                    || conn.initiate_key_update(stream.as_fd(), false),
                    kernel_tls::Error::is_would_block,
                )
                .await;
                r.map_err(session_error)
            }
            LimitStatus::Close => Err(SessionError::ConfidentialityLimit),
        }
    }

    /// Counts records sent under the current key (the kernel does not tell us).
    pub fn note_sent(&mut self, bytes: u64) {
        self.conn.note_records_sent(kernel_tls::records_for(bytes));
    }

    /// Sends close_notify (as its own alert record).
    pub async fn close_notify(&mut self, stream: &TcpStream, timeout: Duration) -> Result<(), SessionError> {
        Ok(net::retry(stream, Interest::WRITABLE, timeout, || kernel_tls::send_close_notify(stream.as_fd())).await?)
    }

    /// TLS 1.3 KeyUpdates installed so far.
    pub fn key_updates(&self) -> u64 {
        self.key_updates
    }
}

/// A failed control record: the alert it calls for goes out first.
fn control_error(stream: &TcpStream, e: kernel_tls::Error) -> SessionError {
    if let Some(alert) = e.alert() {
        send_fatal_alert(stream, alert);
    }
    // The kernel refused the peer's new RX key before our TX key changed:
    // the peer still reads our current key, so close cleanly.
    if matches!(e, kernel_tls::Error::RekeyUnsupported { direction: kernel_tls::Direction::Rx, .. }) {
        let _ = kernel_tls::send_close_notify(stream.as_fd());
    }
    session_error(e)
}

fn session_error(e: kernel_tls::Error) -> SessionError {
    match e {
        kernel_tls::Error::Io(io) => io.into(),
        kernel_tls::Error::RekeyUnsupported { .. } => SessionError::RekeyUnsupported,
        kernel_tls::Error::ConfidentialityLimit => SessionError::ConfidentialityLimit,
        e => match e.alert() {
            Some(alert) => SessionError::Protocol { alert, detail: e.to_string() },
            None => SessionError::Io(io::Error::other(e.to_string())),
        },
    }
}

/// Sends a fatal alert before the connection is dropped, then FIN, so the peer
/// sees the end at once whatever the later close() does (with unread input
/// left, it sends a reset). Best effort; returns whether the alert left.
///
/// After a record fails authentication the kernel sets the socket's pending
/// error (`sk_err`, EBADMSG), and every send fails while it is set. Reading it
/// (`SO_ERROR`) clears it; the alert is then tried once more.
fn send_fatal_alert(stream: &TcpStream, alert: rustls::AlertDescription) -> bool {
    let mut sent = kernel_tls::send_alert(stream.as_fd(), alert);
    if sent.is_err() {
        let pending = stream.take_error();
        sent = kernel_tls::send_alert(stream.as_fd(), alert);
        if let Err(e) = &sent {
            tracing::debug!("kTLS: the {alert:?} alert was not sent: {e} (pending socket error: {pending:?})");
        }
    }
    let _ = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Write);
    sent.is_ok()
}
