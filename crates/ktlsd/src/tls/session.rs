//! A connection after its handshake: the socket, the record layer it uses, and the
//! body writer state. The HTTP layer talks only to this type.

use std::fmt;
use std::io;
use std::time::Duration;

use tokio::net::TcpStream;

use super::kernel::KernelTls;
use super::userspace::UserspaceTls;
use crate::body::{self, FileRange, RecordSizer};

/// Where a connection's records are encrypted and decrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    Kernel,
    Userspace,
}

impl fmt::Display for TlsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsMode::Kernel => "ktls",
            TlsMode::Userspace => "userspace",
        })
    }
}

enum RecordLayer {
    // Boxed: a connection holds one or the other for its whole life.
    Userspace(Box<(UserspaceTls, body::userspace::Buffers)>),
    Kernel(Box<KernelTls>),
}

/// An established TLS connection, ready for application data.
pub struct Session {
    stream: TcpStream,
    layer: RecordLayer,
    sizer: RecordSizer,
    send_timeout: Duration,
}

impl Session {
    pub fn userspace(stream: TcpStream, tls: UserspaceTls, sizer: RecordSizer, send_timeout: Duration) -> Session {
        Session { stream, layer: RecordLayer::Userspace(Box::new((tls, Default::default()))), sizer, send_timeout }
    }

    pub fn kernel(stream: TcpStream, tls: KernelTls, sizer: RecordSizer, send_timeout: Duration) -> Session {
        Session { stream, layer: RecordLayer::Kernel(Box::new(tls)), sizer, send_timeout }
    }

    pub fn mode(&self) -> TlsMode {
        match self.layer {
            RecordLayer::Userspace(..) => TlsMode::Userspace,
            RecordLayer::Kernel(_) => TlsMode::Kernel,
        }
    }

    /// Appends decrypted application data to `out`, waiting at most `timeout`.
    /// Returns 0 when the peer has closed (close_notify or end of stream).
    pub async fn read(&mut self, out: &mut Vec<u8>, timeout: Duration) -> io::Result<usize> {
        match &mut self.layer {
            RecordLayer::Userspace(u) => u.0.read(&self.stream, out, timeout).await,
            RecordLayer::Kernel(tls) => tls.read(&self.stream, out, timeout).await,
        }
    }

    /// Sends a response head followed by an optional file range; returns body bytes sent.
    pub async fn send_response(&mut self, head: &[u8], body: Option<FileRange<'_>>) -> io::Result<u64> {
        match &mut self.layer {
            RecordLayer::Userspace(u) => {
                let (tls, bufs) = &mut **u;
                body::userspace::send(tls, &self.stream, &mut self.sizer, bufs, head, body, self.send_timeout).await
            }
            RecordLayer::Kernel(tls) => {
                body::kernel::send(tls, &self.stream, &mut self.sizer, head, body, self.send_timeout).await
            }
        }
    }

    /// Adds this connection's record-layer counters to the worker's.
    pub fn count_into(&self, stats: &crate::server::stats::Stats) {
        if let RecordLayer::Kernel(tls) = &self.layer {
            tls.count_into(stats);
        }
    }

    /// Ends the connection cleanly: close_notify, then the socket closes on drop.
    pub async fn close(mut self) {
        let t = self.send_timeout.min(Duration::from_secs(1));
        match &mut self.layer {
            RecordLayer::Userspace(u) => {
                let tls = &mut u.0;
                if tls.queue_close_notify().is_ok() {
                    let _ = tls.flush(&self.stream, t).await;
                }
            }
            RecordLayer::Kernel(tls) => {
                let _ = tls.close_notify(&self.stream, t).await;
            }
        }
    }
}
