//! What the HTTP layer needs from the connection under it: read application bytes,
//! send a response (a head and an optional file range), and close gracefully.
//!
//! The TLS session implements it for both record layers; tests implement it over
//! in-memory bytes. The HTTP layer never learns which record layer carries it.

use std::time::Duration;

use tokio::sync::watch;

use crate::files::FileRange;
use crate::vocab::{BodyPath, RecordLayer, Spliced};

/// A connection carrying HTTP.
#[allow(async_fn_in_trait)] // used only by static dispatch inside this crate
pub trait Transport {
    /// The transport's own failure; the connection loop hands it back to its caller.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Whether `err` is a timeout (the peer was too slow), as opposed to a failure.
    fn timed_out(err: &Self::Error) -> bool;

    /// Appends received application bytes to `buf`, waiting at most `timeout`.
    /// Returns 0 when the peer has closed.
    ///
    /// # Cancel safety
    /// Must be cancel-safe: HTTP/2 polls it once between frames and drops the
    /// future when nothing has arrived; no received byte may be lost.
    async fn read(&mut self, buf: &mut Vec<u8>, timeout: Duration) -> Result<usize, Self::Error>;

    /// Sends `head`, then the file range if any; returns the body bytes sent. An error
    /// means the response is incomplete and the connection must not be reused.
    async fn send(&mut self, head: &[u8], body: Option<FileRange<'_>>) -> Result<u64, Self::Error>;

    /// Like [`Transport::send`], but the transport may hold the bytes back and pack
    /// them with those of later calls into fewer records and writes; they leave at
    /// the next `send` or [`Transport::flush`], in order. HTTP/2 queues every frame
    /// it has ready, then flushes once before it waits for input.
    ///
    /// # Cancel safety
    /// As `send`: not cancel-safe.
    async fn queue(&mut self, head: &[u8], body: Option<FileRange<'_>>) -> Result<u64, Self::Error> {
        self.send(head, body).await
    }

    /// Sends whatever [`Transport::queue`] held back. An error means the connection
    /// must not be reused.
    ///
    /// # Cancel safety
    /// As `send`: not cancel-safe.
    async fn flush(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }

    /// The next `send` is the connection's last: a record layer may send its
    /// close_notify in the same write instead of a write of its own at close. It
    /// must still never follow an incomplete response.
    fn last_response(&mut self) {}

    /// Payload size of the next record the record policy allows. The next `send`
    /// starts its first record at that size, so a head and body that together fit
    /// it leave as exactly one record (HTTP/2 sizes each DATA frame this way).
    fn next_record(&mut self) -> usize;

    /// Asks the close that follows to drain the peer's unread input first, until
    /// `stop` turns true (see nginx's `lingering_close`).
    fn linger_on_close(&mut self, stop: watch::Receiver<bool>);

    /// How a file body given to [`Transport::send`] leaves: by `sendfile` on kernel
    /// TLS, else copied through user space.
    fn file_path(&self) -> BodyPath {
        BodyPath::Copy
    }

    /// Whether [`Transport::splice`] can move bytes from a socket into this
    /// connection without passing them through user space.
    fn can_splice(&self) -> bool {
        false
    }

    /// Moves `len` bytes from the plain TCP socket `from` to the peer, by
    /// `splice(2)` through a pipe (the kernel encrypts them on their way out):
    /// each wait for `from` is bounded by `read_timeout`, each wait for the peer
    /// by the transport's send timeout. Returns `len` once all have been handed to
    /// the socket. Only where [`Transport::can_splice`] says so; elsewhere it
    /// moves nothing and fails with [`Spliced::Unsupported`].
    ///
    /// # Cancel safety
    /// Not cancel-safe: bytes taken from `from` may be lost and a record left
    /// open; the connection must then be closed, as after any failure here.
    async fn splice(
        &mut self,
        from: &tokio::net::TcpStream,
        len: u64,
        read_timeout: Duration,
    ) -> Result<u64, Spliced<Self::Error>> {
        let _ = (from, len, read_timeout);
        Err(Spliced::Unsupported)
    }

    /// Sends `head`, then `len` bytes waiting in the receive queue of the plain TCP
    /// socket `from` (the caller saw them there), moved by `splice(2)` without
    /// passing through user space: an HTTP/2 DATA frame whose header ends `head`,
    /// one record when it fits one. Only where [`Transport::can_splice`] says so;
    /// elsewhere `Ok(false)`, and nothing is sent. An error means the connection
    /// must not be reused.
    ///
    /// # Cancel safety
    /// Not cancel-safe, as `send`.
    async fn send_queued(
        &mut self,
        head: &[u8],
        from: std::os::fd::BorrowedFd<'_>,
        len: usize,
    ) -> Result<bool, Self::Error> {
        let _ = (head, from, len);
        Ok(false)
    }

    /// Where the bytes are protected, for the access log and metrics.
    fn layer(&self) -> RecordLayer;

    /// The TLS version and cipher suite, for the access log; `None` when there is no TLS.
    fn tls(&self) -> Option<crate::log::TlsInfo> {
        None
    }

    /// The subject of the client's verified certificate (mTLS), for the access log.
    fn client_subject(&self) -> Option<&str> {
        None
    }

    /// The server name the client's handshake named (SNI), which chose its client-certificate check.
    fn server_name(&self) -> Option<&str> {
        None
    }
}
