//! Installing keys on a kTLS socket (`SOL_TLS` socket options).
//!
//! After [`enable_ulp`](crate::enable_ulp), [`set_tx`] and [`set_rx`] hand
//! the kernel the keys for each direction; from then on `send`/`recv` on the
//! socket carry TLS records. [`update_tx`]/[`update_rx`] replace keys on a
//! live TLS 1.3 connection (KeyUpdate), which only Linux 6.14+ allows; older
//! kernels answer [`Error::RekeyUnsupported`].
//!
//! Each function is a single `setsockopt(2)`; none of them block.
//! They do not attach the ULP (that is [`enable_ulp`](crate::enable_ulp))
//! nor build the key structures (that is [`CryptoInfo`]).

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use crate::crypto_info::CryptoInfo;
use crate::error::Error;
use crate::types::Direction;
use crate::{sys, uapi};

fn install(fd: impl AsFd, direction: Direction, info: &CryptoInfo) -> io::Result<()> {
    let name = match direction {
        Direction::Tx => uapi::TLS_TX,
        Direction::Rx => uapi::TLS_RX,
    };
    sys::setsockopt(fd.as_fd().as_raw_fd(), uapi::SOL_TLS, name, info.as_bytes())
}

fn first_install(fd: impl AsFd, direction: Direction, info: &CryptoInfo) -> Result<(), Error> {
    install(fd, direction, info).map_err(|source| match source.raw_os_error() {
        // EBUSY: keys already present in this direction, i.e. this was a
        // re-key on a kernel (or TLS version) that cannot do it.
        Some(libc::EBUSY) => Error::RekeyUnsupported { direction, source },
        _ => Error::KernelRefused { direction, version: info.version(), cipher: info.cipher(), source },
    })
}

fn rekey(fd: impl AsFd, direction: Direction, info: &CryptoInfo) -> Result<(), Error> {
    install(fd, direction, info).map_err(|source| match source.raw_os_error() {
        // Before Linux 6.14 (and for TLS 1.2 always) a second TLS_TX/TLS_RX
        // is EBUSY; device offload answers EOPNOTSUPP; a rekey-capable kernel
        // answers EINVAL if version/cipher differ from the installed ones.
        Some(libc::EBUSY) | Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => {
            Error::RekeyUnsupported { direction, source }
        }
        _ => Error::KernelRefused { direction, version: info.version(), cipher: info.cipher(), source },
    })
}

/// Installs the transmit keys (`setsockopt(SOL_TLS, TLS_TX)`).
///
/// # Errors
/// [`Error::KernelRefused`] (with a hint per errno) if the kernel does not
/// accept this version/cipher; [`Error::RekeyUnsupported`] if TX keys were
/// already installed and the kernel cannot replace them.
pub fn set_tx(fd: impl AsFd, info: &CryptoInfo) -> Result<(), Error> {
    first_install(fd, Direction::Tx, info)
}

/// Installs the receive keys (`setsockopt(SOL_TLS, TLS_RX)`).
///
/// Errors as for [`set_tx`].
pub fn set_rx(fd: impl AsFd, info: &CryptoInfo) -> Result<(), Error> {
    first_install(fd, Direction::Rx, info)
}

/// Replaces the transmit keys on a live TLS 1.3 connection (key update).
///
/// Send the `KeyUpdate` message *before* calling this: it must be encrypted
/// under the old key. Returns [`Error::RekeyUnsupported`] on kernels without
/// kTLS key-update support (before 6.14): close the connection.
pub fn update_tx(fd: impl AsFd, info: &CryptoInfo) -> Result<(), Error> {
    rekey(fd, Direction::Tx, info)
}

/// Replaces the receive keys after the peer's `KeyUpdate` was read.
///
/// On rekey-capable kernels reads fail with `EKEYEXPIRED` between the
/// peer's `KeyUpdate` and this call. Returns [`Error::RekeyUnsupported`] on
/// kernels without kTLS key-update support: close the connection.
pub fn update_rx(fd: impl AsFd, info: &CryptoInfo) -> Result<(), Error> {
    rekey(fd, Direction::Rx, info)
}

/// Caps the plaintext size of transmitted records
/// (`setsockopt(SOL_TLS, TLS_TX_MAX_PAYLOAD_LEN)`, recent kernels only).
///
/// Call after [`set_tx`]. For TLS 1.2 pass the peer's record size limit
/// (RFC 8449); for TLS 1.3 pass the limit minus one (the content-type byte).
/// Kernels without the option answer `ENOPROTOOPT`; out-of-range values
/// (below 64, or 63 for TLS 1.3; above 16384) `EINVAL`.
pub fn set_tx_max_payload_len(fd: impl AsFd, len: u16) -> io::Result<()> {
    sys::setsockopt(fd.as_fd().as_raw_fd(), uapi::SOL_TLS, uapi::TLS_TX_MAX_PAYLOAD_LEN, &len.to_ne_bytes())
}

/// Reads the current record plaintext cap (`getsockopt(SOL_TLS,
/// TLS_TX_MAX_PAYLOAD_LEN)`); `ENOPROTOOPT` on kernels without it.
pub fn tx_max_payload_len(fd: impl AsFd) -> io::Result<u16> {
    let mut buf = [0u8; 2];
    let n = sys::getsockopt(fd.as_fd().as_raw_fd(), uapi::SOL_TLS, uapi::TLS_TX_MAX_PAYLOAD_LEN, &mut buf)?;
    if n != 2 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("TLS_TX_MAX_PAYLOAD_LEN returned {n} bytes, expected 2"),
        ));
    }
    Ok(u16::from_ne_bytes(buf))
}

/// Promises the kernel that the peer does not pad TLS 1.3 records, letting
/// it decrypt straight into user buffers (`TLS_RX_EXPECT_NO_PAD`, Linux 6.0+).
///
/// A wrong guess only costs a re-decryption (counted in `TlsDecryptRetry`),
/// but a hostile peer can use it to double decryption work.
pub fn set_rx_expect_no_pad(fd: impl AsFd, enable: bool) -> io::Result<()> {
    sys::setsockopt(fd.as_fd().as_raw_fd(), uapi::SOL_TLS, uapi::TLS_RX_EXPECT_NO_PAD, &u32::from(enable).to_ne_bytes())
}

/// Lets `sendfile` encrypt directly from the page cache
/// (`TLS_TX_ZEROCOPY_RO`, Linux 5.19+).
///
/// Only safe if files are never modified while being sent: a concurrent
/// write can corrupt the record (the peer then sees a bad MAC).
pub fn set_tx_zerocopy_sendfile(fd: impl AsFd, enable: bool) -> io::Result<()> {
    sys::setsockopt(fd.as_fd().as_raw_fd(), uapi::SOL_TLS, uapi::TLS_TX_ZEROCOPY_RO, &u32::from(enable).to_ne_bytes())
}
