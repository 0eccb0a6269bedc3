//! One connection to an upstream: plain TCP, TLS (rustls, verified against the
//! rule's roots) or a Unix socket, opened within the connect timeout, each read and write bounded by
//! the rule's read and send timeouts.
//!
//! Not here: which upstream, pooling (`pool`), or what the bytes mean (`parse`).

use std::future::Future;
use std::io;
use std::task::Poll;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use super::{TlsClient, Upstream};

/// Why talking to an upstream failed.
#[derive(Debug)]
pub enum IoFailure {
    /// The time allowed ran out (the upstream is too slow: 504).
    TimedOut,
    /// This host ran short of what a connection needs (see [`local_shortage`]): not
    /// the upstream's failure, so its health is left alone (503).
    Local(io::Error),
    /// Refused, reset, closed or a TLS failure (502).
    Failed(io::Error),
}

/// Whether `e` says this host, not the upstream, is short of something: descriptors
/// (`EMFILE`, `ENFILE`), socket buffers (`ENOBUFS`) or memory (`ENOMEM`).
pub fn local_shortage(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// The error of an upstream that closed before the end of its Content-Length body.
pub fn closed_early() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "closed the connection before the end of the body")
}

impl std::fmt::Display for IoFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IoFailure::TimedOut => f.write_str("timed out"),
            IoFailure::Local(e) | IoFailure::Failed(e) => write!(f, "{e}"),
        }
    }
}

/// An open connection.
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    Unix(UnixStream),
}

/// Connects to `upstream` (its name resolved each time, so a changed address is seen)
/// within `timeout`, the TLS handshake included. A shortage of this host's own
/// (descriptors, buffers, memory) is [`IoFailure::Local`].
///
/// # Cancel safety
/// Cancel-safe: dropping it drops the half-open connection.
pub async fn connect(upstream: &Upstream, tls: Option<&TlsClient>, timeout: Duration) -> Result<Conn, IoFailure> {
    let open = async {
        if let Some(path) = &upstream.unix {
            return Ok(Conn::Unix(UnixStream::connect(path).await?));
        }
        let tcp = TcpStream::connect((upstream.host.as_str(), upstream.port)).await?;
        tcp.set_nodelay(true)?;
        if !upstream.tls {
            return Ok(Conn::Plain(tcp));
        }
        let Some(tls) = tls else {
            return Err(io::Error::other("no TLS configuration for an https:// upstream"));
        };
        let name = rustls_pki_types::ServerName::try_from(upstream.host.clone()).map_err(io::Error::other)?;
        let config = if upstream.h2 { tls.h2.clone() } else { tls.config.clone() };
        let stream = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
        if upstream.h2 && stream.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Err(io::Error::other("the upstream did not agree to HTTP/2 (ALPN h2)"));
        }
        Ok(Conn::Tls(Box::new(stream)))
    };
    match tokio::time::timeout(timeout, open).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) if local_shortage(&e) => Err(IoFailure::Local(e)),
        Ok(Err(e)) => Err(IoFailure::Failed(e)),
        Err(_) => Err(IoFailure::TimedOut),
    }
}

/// `io` within `timeout`, its timer armed only once `io` has to wait: a write or a
/// read of bytes already there completes at the first poll, and a timer is a
/// registration with the runtime's timer wheel (and its removal) for nothing.
///
/// # Cancel safety
/// As `io`'s.
async fn bounded<T>(io: impl Future<Output = io::Result<T>>, timeout: Duration) -> Result<T, IoFailure> {
    let mut io = std::pin::pin!(io);
    let first = std::future::poll_fn(|cx| Poll::Ready(io.as_mut().poll(cx))).await;
    let r = match first {
        Poll::Ready(r) => r,
        Poll::Pending => match tokio::time::timeout(timeout, io).await {
            Ok(r) => r,
            Err(_) => return Err(IoFailure::TimedOut),
        },
    };
    r.map_err(IoFailure::Failed)
}

impl Conn {
    /// Writes all of `bytes` within `timeout`.
    ///
    /// # Cancel safety
    /// Not cancel-safe: part of `bytes` may have been written.
    pub async fn write_all(&mut self, bytes: &[u8], timeout: Duration) -> Result<(), IoFailure> {
        let write = async {
            match self {
                Conn::Plain(s) => s.write_all(bytes).await,
                Conn::Unix(s) => s.write_all(bytes).await,
                Conn::Tls(s) => {
                    s.write_all(bytes).await?;
                    s.flush().await
                }
            }
        };
        bounded(write, timeout).await
    }

    /// Appends what arrives to `buf` (at most `max` bytes) within `timeout`; 0: the
    /// upstream closed.
    ///
    /// # Cancel safety
    /// Cancel-safe: bytes are only appended once read.
    pub async fn read(&mut self, buf: &mut Vec<u8>, max: usize, timeout: Duration) -> Result<usize, IoFailure> {
        use bytes::BufMut;
        // Into the spare capacity, not zero-filled first: `max` is up to 64 KiB per read.
        buf.reserve(max);
        let mut room = buf.limit(max);
        let read = async {
            match self {
                Conn::Plain(s) => s.read_buf(&mut room).await,
                Conn::Unix(s) => s.read_buf(&mut room).await,
                // A peer that closes without close_notify ends the body as plain TCP would;
                // whether that is a complete body is the framing's to say.
                Conn::Tls(s) => match s.read_buf(&mut room).await {
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(0),
                    r => r,
                },
            }
        };
        bounded(read, timeout).await
    }

    /// Whether an idle connection still looks usable: the upstream has neither closed
    /// it nor sent anything unasked. The event loop's readiness answers without a
    /// system call: a socket nothing arrived on since its last read found it empty is
    /// taken as alive (a close still in flight is caught by the retry of a stale
    /// connection, as nginx does); only one marked readable is looked at (`MSG_PEEK`).
    pub fn looks_alive(&self) -> bool {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let sock = match self {
            Conn::Plain(s) => pending_or(s.poll_read_ready(&mut cx), socket2::SockRef::from(s)),
            Conn::Tls(s) => pending_or(s.get_ref().0.poll_read_ready(&mut cx), socket2::SockRef::from(s.get_ref().0)),
            Conn::Unix(s) => pending_or(s.poll_read_ready(&mut cx), socket2::SockRef::from(s)),
        };
        let Some(sock) = sock else { return true };
        match sock.peek(&mut [std::mem::MaybeUninit::new(0u8); 1]) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => true,
            // Closed (0), bytes nobody asked for, or an error: not reusable. A TLS
            // upstream's session ticket or close_notify counts as such bytes too.
            _ => false,
        }
    }
}

/// The connection as a byte stream, for the HTTP/2 client (`super::multiplex`),
/// which frames and buffers on its own.
impl tokio::io::AsyncRead for Conn {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Conn::Unix(s) => std::pin::Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Conn {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Conn::Unix(s) => std::pin::Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => std::pin::Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => std::pin::Pin::new(s).poll_flush(cx),
            Conn::Unix(s) => std::pin::Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Conn::Unix(s) => std::pin::Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// `sock` to look at when its readiness is not pending, else `None` (alive).
fn pending_or<T>(ready: Poll<T>, sock: socket2::SockRef<'_>) -> Option<socket2::SockRef<'_>> {
    ready.is_ready().then_some(sock)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only this host's shortages are local; what the upstream or the network did is not.
    #[test]
    fn local_shortages() {
        let cases = [
            (libc::EMFILE, true),
            (libc::ENFILE, true),
            (libc::ENOBUFS, true),
            (libc::ENOMEM, true),
            (libc::ECONNREFUSED, false),
            (libc::ECONNRESET, false),
            (libc::EHOSTUNREACH, false),
            (libc::ENETUNREACH, false),
            (libc::ETIMEDOUT, false),
        ];
        for (errno, local) in cases {
            assert_eq!(local_shortage(&io::Error::from_raw_os_error(errno)), local, "errno {errno}");
        }
        assert!(!local_shortage(&closed_early()));
    }
}
