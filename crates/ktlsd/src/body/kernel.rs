//! The kernel body writer: the head goes out with `MSG_MORE`, the body with
//! `sendfile()`, and the kernel encrypts both on their way out. Wiring pending.

use std::io;
use std::time::Duration;

use tokio::net::TcpStream;

use super::{FileRange, RecordSizer};
use crate::tls::kernel::KernelTls;

pub async fn send(
    _tls: &mut KernelTls,
    _stream: &TcpStream,
    _sizer: &mut RecordSizer,
    _head: &[u8],
    _body: Option<FileRange<'_>>,
    _timeout: Duration,
) -> io::Result<u64> {
    Err(io::ErrorKind::Unsupported.into())
}
