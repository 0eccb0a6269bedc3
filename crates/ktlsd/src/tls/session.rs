//! A connection after its handshake: the socket, the record layer it uses, and the
//! body writer state. The HTTP layer talks to it only through `http::Transport`.
//! Not where the record layer is chosen: see [`super::establish`].

use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::watch;

use super::kernel::KernelTls;
use super::sizing::RecordSizer;
use super::userspace::body::Ending;
use super::userspace::UserspaceTls;
use super::SessionError;
use super::{kernel, userspace};
use crate::files::residency::ColdReads;
use crate::files::FileRange;
use crate::http::{Spliced, Transport};
use crate::stats::Stats;
use crate::vocab::{BodyPath, RecordLayer};

enum Layer {
    // Boxed: a connection holds one or the other for its whole life.
    Userspace(Box<UserspaceTls>),
    Kernel(Box<KernelTls>),
}

/// An established TLS connection, ready for application data.
pub struct Session {
    stream: TcpStream,
    layer: Layer,
    sizer: RecordSizer,
    send_timeout: Duration,
    /// Set when the server ends the connection while the client may still be
    /// sending: `close` then lingers (see [`Session::linger_on_close`]).
    linger: Option<watch::Receiver<bool>>,
    counters: Counters,
    /// Version and suite, for the access log.
    info: Option<crate::log::TlsInfo>,
    /// The subject of the client's verified certificate, for the access log.
    client: Option<Box<str>>,
    /// The server name of the handshake (SNI).
    server_name: Option<Box<str>>,
    /// The next response is the last (see [`Transport::last_response`]).
    last: bool,
    /// close_notify has left already (with the last response).
    notified: bool,
    /// Kernel TLS: plaintext [`Transport::queue`] held back, the frames and small
    /// bodies of several responses, sent as the records the policy allows by one
    /// `send`. Empty (no allocation) between batches. (The userspace layer packs
    /// them straight into its open record instead: see [`UserspaceTls::append`].)
    batch: Vec<u8>,
}

/// Plaintext a batch may reach before it leaves: four full records, within one output
/// buffer of the userspace layer (so one `write`), one `send` on kTLS.
const BATCH_LIMIT: usize = 4 * super::sizing::MAX_RECORD;

/// What ended this session's exchanges, counted from the errors it returned.
#[derive(Debug, Default)]
struct Counters {
    rekey_unsupported: u64,
    record_errors: u64,
    /// Windows of files found out of the page cache, and read ahead off the loop.
    cold: ColdReads,
}

impl Counters {
    /// Counts and logs the causes the server reports on its own (the others end
    /// up in the `errors` and `timeouts` counters of the caller).
    fn note(&mut self, e: &SessionError) {
        match e {
            SessionError::RekeyUnsupported => {
                self.rekey_unsupported += 1;
                tracing::info!("kTLS connection closed: {e}");
            }
            SessionError::RecordRejected { .. } => {
                self.record_errors += 1;
                tracing::info!("kTLS connection closed: {e}");
            }
            _ => {}
        }
    }
}

/// Longest a closing connection's input is drained (nginx's `lingering_time`).
pub const LINGERING_TIME: Duration = Duration::from_secs(30);
/// Longest wait for the next input while draining (nginx's `lingering_timeout`).
pub const LINGERING_TIMEOUT: Duration = Duration::from_secs(5);

impl Session {
    pub(super) fn userspace(
        stream: TcpStream,
        tls: UserspaceTls,
        sizer: RecordSizer,
        send_timeout: Duration,
    ) -> Session {
        Session::new(stream, Layer::Userspace(Box::new(tls)), sizer, send_timeout)
    }

    pub(super) fn kernel(stream: TcpStream, tls: KernelTls, sizer: RecordSizer, send_timeout: Duration) -> Session {
        Session::new(stream, Layer::Kernel(Box::new(tls)), sizer, send_timeout)
    }

    fn new(stream: TcpStream, layer: Layer, sizer: RecordSizer, send_timeout: Duration) -> Session {
        Session {
            stream,
            layer,
            sizer,
            send_timeout,
            linger: None,
            counters: Counters::default(),
            info: None,
            client: None,
            server_name: None,
            last: false,
            notified: false,
            batch: Vec::new(),
        }
    }

    /// Records the negotiated version and suite (see [`Transport::tls`]).
    pub(super) fn with_info(mut self, info: Option<crate::log::TlsInfo>) -> Session {
        self.info = info;
        self
    }

    /// Records the subject of the client's verified certificate (see [`Transport::client_subject`]).
    pub(super) fn with_client(mut self, subject: Option<String>, server_name: Option<&str>) -> Session {
        self.client = subject.map(String::into_boxed_str);
        self.server_name = server_name.map(Box::from);
        self
    }

    pub fn mode(&self) -> RecordLayer {
        match self.layer {
            Layer::Userspace(..) => RecordLayer::Userspace,
            Layer::Kernel(_) => RecordLayer::Kernel,
        }
    }

    /// The connection's socket, for reading its TCP state.
    pub fn socket(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.stream.as_fd()
    }

    /// Appends decrypted application data to `out`, waiting at most `timeout`.
    /// Returns 0 when the peer has closed (close_notify or end of stream).
    ///
    /// # Cancel safety
    /// Cancel-safe: no received byte is lost and no record is sent twice when
    /// the future is dropped; a later `read` or `close` goes on where it stopped.
    pub async fn read(&mut self, out: &mut Vec<u8>, timeout: Duration) -> Result<usize, SessionError> {
        let r = match &mut self.layer {
            Layer::Userspace(tls) => tls.read(&self.stream, out, timeout).await,
            Layer::Kernel(tls) => tls.read(&self.stream, out, timeout).await,
        };
        r.inspect_err(|e| self.counters.note(e))
    }

    /// Sends a response head followed by an optional file range; returns body bytes sent.
    /// An error means the response is incomplete: the connection must not be reused.
    ///
    /// # Cancel safety
    /// Not cancel-safe: a response cut short cannot be resumed (close the
    /// connection), though no record already encrypted is sent twice.
    pub async fn send_response(&mut self, head: &[u8], body: Option<FileRange<'_>>) -> Result<u64, SessionError> {
        self.flush().await?;
        self.send_now(head, body, false).await
    }

    /// Queues a response (or a part of one) behind those queued before: bytes in
    /// memory, and a body the open-file cache holds, join the batch; a body read from
    /// the file leaves at once, after the batch, in records of its own, so a DATA
    /// frame sized to a record stays one record (in user space its records may then
    /// wait for the next write). The batch leaves when it fills (the userspace output
    /// buffer, or [`BATCH_LIMIT`] on kTLS) or at [`Self::flush`].
    ///
    /// # Cancel safety
    /// Not cancel-safe, as [`Self::send_response`].
    pub async fn queue_response(&mut self, head: &[u8], body: Option<FileRange<'_>>) -> Result<u64, SessionError> {
        let len = body.as_ref().map_or(0, |r| r.len());
        let cached = body.as_ref().and_then(|r| r.cached_at(r.range.start, usize::try_from(len).ok()?));
        if let Layer::Userspace(tls) = &mut self.layer {
            if body.is_some() && cached.is_none() {
                return self.send_now(head, body, true).await;
            }
            let (sizer, fd) = (&mut self.sizer, std::os::fd::AsFd::as_fd(&self.stream));
            let mut next_len = || {
                let now = std::time::Instant::now();
                let n = sizer.next_record(fd, now);
                sizer.sent(now);
                n
            };
            tls.append(head, &mut next_len)?;
            tls.append(cached.unwrap_or_default(), &mut next_len)?;
            if tls.spare_plaintext() < super::sizing::MAX_RECORD {
                tls.flush(&self.stream, self.send_timeout).await?;
            }
            return Ok(len);
        }
        match (&body, cached) {
            (None, _) => self.batch.extend_from_slice(head),
            (Some(_), Some(bytes)) => {
                self.batch.extend_from_slice(head);
                self.batch.extend_from_slice(bytes);
            }
            (Some(_), None) => {
                self.flush().await?;
                return self.send_now(head, body, true).await;
            }
        }
        if self.batch.len() >= BATCH_LIMIT {
            self.flush().await?;
        }
        Ok(len)
    }

    /// Sends what [`Self::queue_response`] held back.
    ///
    /// # Cancel safety
    /// Not cancel-safe, as [`Self::send_response`].
    pub async fn flush(&mut self) -> Result<(), SessionError> {
        match &mut self.layer {
            Layer::Userspace(tls) => tls.flush(&self.stream, self.send_timeout).await,
            Layer::Kernel(_) if self.batch.is_empty() => Ok(()),
            Layer::Kernel(_) => {
                let batch = std::mem::take(&mut self.batch);
                self.send_now(&batch, None, false).await.map(|_| ())
            }
        }
    }

    /// Sends `head` then `body` now; with `hold`, the userspace layer may keep the
    /// last records for the next write.
    async fn send_now(&mut self, head: &[u8], body: Option<FileRange<'_>>, hold: bool) -> Result<u64, SessionError> {
        let r = match &mut self.layer {
            Layer::Userspace(tls) => {
                let cold = &mut self.counters.cold;
                let end = match (self.last, hold) {
                    (true, _) => Ending::CloseNotify,
                    (false, true) => Ending::Hold,
                    (false, false) => Ending::KeepOpen,
                };
                let r =
                    userspace::body::send(tls, &self.stream, &mut self.sizer, cold, head, body, end, self.send_timeout)
                        .await;
                self.notified = self.last && r.is_ok();
                r
            }
            Layer::Kernel(tls) => {
                let cold = &mut self.counters.cold;
                kernel::body::send(tls, &self.stream, &mut self.sizer, cold, head, body, self.send_timeout).await
            }
        };
        r.inspect_err(|e| self.counters.note(e))
    }

    /// Adds this connection's record-layer counters to the worker's.
    pub fn count_into(&self, stats: &Stats) {
        let c = &self.counters;
        if let Layer::Kernel(tls) = &self.layer {
            Stats::add_to(&stats.key_updates, tls.key_updates());
        }
        Stats::add_to(&stats.rekey_unsupported, c.rekey_unsupported);
        Stats::add_to(&stats.ktls_record_errors, c.record_errors);
        Stats::add_to(&stats.cold_windows, c.cold.cold_windows);
        Stats::add_to(&stats.readahead_waits, c.cold.readahead_waits);
    }

    /// Asks `close` to linger, as nginx's `lingering_close` does: the server is ending
    /// the connection while the client may have sent bytes it has not read (after
    /// `Connection: close`, HTTP/1.0, or an error). Closing a socket with unread input
    /// makes the kernel send a reset, which discards the tail of the response still
    /// on its way; draining the input first lets the response arrive whole. Lingering
    /// stops at once when `stop` turns true (server shutdown).
    pub fn linger_on_close(&mut self, stop: watch::Receiver<bool>) {
        self.linger = Some(stop);
    }

    /// When a lingering close was asked for, it ends at once when `stop` turns
    /// true instead of the signal the codec passed.
    pub fn linger_until(&mut self, stop: watch::Receiver<bool>) {
        if let Some(l) = &mut self.linger {
            *l = stop;
        }
    }

    /// Ends the connection cleanly: close_notify, then (when asked to linger) the
    /// write side is shut down and input drained and dropped for a bounded time;
    /// the socket closes on drop.
    pub async fn close(mut self) {
        let t = self.send_timeout.min(Duration::from_secs(1));
        // Whatever a codec queued and did not flush goes before the close_notify
        // (the userspace layer's flush below seals its open record first).
        if !self.batch.is_empty() && self.flush().await.is_err() {
            return;
        }
        let sent = match &mut self.layer {
            _ if self.notified => Ok(()),
            Layer::Userspace(tls) => {
                tls.queue_close_notify();
                tls.flush(&self.stream, t).await
            }
            Layer::Kernel(tls) => tls.close_notify(&self.stream, t).await,
        };
        if let (Some(stop), Ok(())) = (self.linger.take(), sent) {
            self.drain_input(stop).await;
        }
    }

    /// Sends FIN after the queued response, then reads and discards whatever the
    /// client still sends until it closes, fails, stays silent for
    /// [`LINGERING_TIMEOUT`], [`LINGERING_TIME`] has passed, or the server stops.
    ///
    /// Plain `recv` serves both record layers: userspace gets raw records, which
    /// nobody needs now; a kTLS socket gives decrypted data, and an error (EIO) at
    /// a control record such as the client's close_notify, which ends the drain too.
    async fn drain_input(&mut self, mut stop: watch::Receiver<bool>) {
        tokio::select! {
            _ = crate::net::linger(&self.stream, LINGERING_TIME, LINGERING_TIMEOUT, usize::MAX) => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    }
}

impl Transport for Session {
    type Error = SessionError;

    fn timed_out(err: &SessionError) -> bool {
        err.is_timeout()
    }

    async fn read(&mut self, buf: &mut Vec<u8>, timeout: Duration) -> Result<usize, SessionError> {
        Session::read(self, buf, timeout).await
    }

    async fn send(&mut self, head: &[u8], body: Option<FileRange<'_>>) -> Result<u64, SessionError> {
        self.send_response(head, body).await
    }

    async fn queue(&mut self, head: &[u8], body: Option<FileRange<'_>>) -> Result<u64, SessionError> {
        self.queue_response(head, body).await
    }

    async fn flush(&mut self) -> Result<(), SessionError> {
        Session::flush(self).await
    }

    fn last_response(&mut self) {
        self.last = true;
    }

    fn next_record(&mut self) -> usize {
        self.sizer.pin_next(std::os::fd::AsFd::as_fd(&self.stream), std::time::Instant::now())
    }

    fn linger_on_close(&mut self, stop: watch::Receiver<bool>) {
        Session::linger_on_close(self, stop)
    }

    fn layer(&self) -> RecordLayer {
        self.mode()
    }

    fn file_path(&self) -> BodyPath {
        match self.layer {
            Layer::Kernel(_) => BodyPath::Sendfile,
            Layer::Userspace(_) => BodyPath::Copy,
        }
    }

    fn can_splice(&self) -> bool {
        matches!(self.layer, Layer::Kernel(_))
    }

    async fn splice(
        &mut self,
        from: &TcpStream,
        len: u64,
        read_timeout: Duration,
    ) -> Result<u64, Spliced<SessionError>> {
        self.flush().await.map_err(Spliced::Peer)?;
        let Layer::Kernel(tls) = &mut self.layer else { return Err(Spliced::Unsupported) };
        let r = kernel::body::splice(tls, &self.stream, from, len, read_timeout, self.send_timeout).await;
        if let Err(Spliced::Peer(e)) = &r {
            self.counters.note(e);
        }
        r
    }

    async fn send_queued(
        &mut self,
        head: &[u8],
        from: std::os::fd::BorrowedFd<'_>,
        len: usize,
    ) -> Result<bool, SessionError> {
        self.flush().await?;
        let Layer::Kernel(tls) = &mut self.layer else { return Ok(false) };
        let r = kernel::body::send_queued(tls, &self.stream, head, from, len, self.send_timeout).await;
        if let Err(e) = &r {
            self.counters.note(e);
        }
        r.map(|()| true)
    }

    fn tls(&self) -> Option<crate::log::TlsInfo> {
        self.info
    }

    fn client_subject(&self) -> Option<&str> {
        self.client.as_deref()
    }

    fn server_name(&self) -> Option<&str> {
        self.server_name.as_deref()
    }
}
