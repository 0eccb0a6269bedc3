//! Thin wrappers over the system calls kTLS needs, and the crate's only
//! `unsafe` code.
//!
//! Each system-call function does one call, checks its return value and
//! converts failures to [`io::Error`] (including `EAGAIN`, which surfaces as
//! `WouldBlock`). Nothing here retries, blocks or interprets errors: that is
//! left to the callers. Besides the calls, two memory operations on key
//! material live here: viewing a key structure as the bytes the kernel reads
//! ([`struct_bytes`]) and wiping it ([`wipe`]).

use core::mem;
use std::io;
use std::os::fd::RawFd;

use crate::uapi;

/// Converts a `-1`-on-error return value into an `io::Result`.
fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Converts a `-1`-on-error byte count into an `io::Result<usize>`.
fn check_len(ret: libc::ssize_t) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        // A non-negative ssize_t always fits in usize.
        Ok(ret as usize)
    }
}

/// `setsockopt(fd, level, name, value.as_ptr(), value.len())`.
pub(crate) fn setsockopt(fd: RawFd, level: libc::c_int, name: libc::c_int, value: &[u8]) -> io::Result<()> {
    let len = libc::socklen_t::try_from(value.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `value` is a live slice of exactly `len` readable bytes; the
    // kernel only reads from it during the call. An invalid `fd` yields EBADF.
    check(unsafe { libc::setsockopt(fd, level, name, value.as_ptr().cast(), len) }).map(drop)
}

/// `getsockopt(fd, level, name, out, &len)`; returns how many bytes the kernel wrote.
pub(crate) fn getsockopt(fd: RawFd, level: libc::c_int, name: libc::c_int, out: &mut [u8]) -> io::Result<usize> {
    let mut len = libc::socklen_t::try_from(out.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `out` is a live, exclusively borrowed buffer of `len` writable
    // bytes and `len` is a valid socklen_t the kernel updates in place; the
    // kernel never writes more than the `len` it was given.
    check(unsafe { libc::getsockopt(fd, level, name, out.as_mut_ptr().cast(), &mut len) })?;
    Ok((len as usize).min(out.len()))
}

/// `send(fd, buf, flags)`.
pub(crate) fn send(fd: RawFd, buf: &[u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: `buf` is a live slice of `buf.len()` readable bytes for the
    // duration of the call.
    check_len(unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), flags) })
}

/// Control-message buffer, aligned for `cmsghdr` and large enough for one
/// one-byte TLS record-type message (`CMSG_SPACE(1)` is 16–24 bytes) plus
/// room for any unexpected extra message the kernel might add.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

/// `CMSG_SPACE(1)`: bytes of control buffer a one-byte message occupies.
fn cmsg_space_1() -> usize {
    // SAFETY: CMSG_SPACE is pure arithmetic on its argument.
    unsafe { libc::CMSG_SPACE(1) as usize }
}

/// `CMSG_LEN(1)`: the `cmsg_len` of a one-byte message.
fn cmsg_len_1() -> usize {
    // SAFETY: CMSG_LEN is pure arithmetic on its argument.
    unsafe { libc::CMSG_LEN(1) as usize }
}

/// Builds a zeroed `msghdr`.
fn empty_msghdr() -> libc::msghdr {
    // SAFETY: `msghdr` is a plain C struct of integers and raw pointers (plus
    // padding on some targets); all-zero is its documented empty value
    // (null pointers, zero lengths).
    unsafe { mem::zeroed() }
}

/// `sendmsg` of `buf` as one TLS record of type `record_type`
/// (`SOL_TLS`/`TLS_SET_RECORD_TYPE` control message).
pub(crate) fn sendmsg_record(fd: RawFd, record_type: u8, buf: &[u8], flags: libc::c_int) -> io::Result<usize> {
    let mut control = CmsgBuf([0; 64]);
    let mut iov = libc::iovec {
        // The kernel only reads through this pointer (sendmsg).
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut msg = empty_msghdr();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = cmsg_space_1() as _;

    // SAFETY: `msg.msg_control` points at `control`, which is aligned for
    // `cmsghdr` and whose 64 bytes exceed `msg_controllen` (= CMSG_SPACE(1)),
    // so CMSG_FIRSTHDR returns a non-null, in-bounds, aligned header.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    if cmsg.is_null() {
        return Err(io::Error::other("control buffer too small for a cmsghdr"));
    }
    // SAFETY: `cmsg` is valid for writes (see above); CMSG_DATA(cmsg) points
    // inside the CMSG_SPACE(1) bytes reserved for this message, so writing
    // one byte there stays in bounds.
    unsafe {
        (*cmsg).cmsg_level = uapi::SOL_TLS;
        (*cmsg).cmsg_type = uapi::TLS_SET_RECORD_TYPE;
        (*cmsg).cmsg_len = cmsg_len_1() as _;
        *libc::CMSG_DATA(cmsg) = record_type;
    }
    // SAFETY: `msg` references `iov` (→ `buf`) and `control`, all alive for
    // the duration of the call; the kernel only reads from them.
    check_len(unsafe { libc::sendmsg(fd, &msg, flags) })
}

/// Result of [`recvmsg_record`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecvMsg {
    /// Bytes written to the buffer.
    pub len: usize,
    /// Record type from a `TLS_GET_RECORD_TYPE` control message, if any.
    pub record_type: Option<u8>,
}

/// `recvmsg` into `buf` with room for the kernel's record-type control message.
pub(crate) fn recvmsg_record(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<RecvMsg> {
    let mut control = CmsgBuf([0; 64]);
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut msg = empty_msghdr();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len() as _;

    // SAFETY: `msg` points at `iov` (→ `buf`, exclusively borrowed and
    // `buf.len()` bytes long) and at `control` (64 bytes); the kernel writes
    // at most those lengths and both outlive the call.
    let len = check_len(unsafe { libc::recvmsg(fd, &mut msg, flags) })?;

    let mut record_type = None;
    // SAFETY: the kernel updated `msg_controllen` to the bytes it wrote into
    // `control`; CMSG_FIRSTHDR/CMSG_NXTHDR only return headers that lie
    // entirely within that range (or null), and `control` is aligned.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: non-null headers from CMSG_FIRSTHDR/NXTHDR are in bounds
        // and aligned (see above).
        let hdr = unsafe { &*cmsg };
        if hdr.cmsg_level == uapi::SOL_TLS
            && hdr.cmsg_type == uapi::TLS_GET_RECORD_TYPE
            && hdr.cmsg_len as usize >= cmsg_len_1()
        {
            // SAFETY: `cmsg_len >= CMSG_LEN(1)` guarantees one data byte
            // inside the header's range.
            record_type = Some(unsafe { *libc::CMSG_DATA(cmsg) });
        }
        // SAFETY: `cmsg` is a valid header of `msg` (see above).
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    Ok(RecvMsg { len, record_type })
}

/// `sendfile(out_fd, in_fd, &offset, count)`.
pub(crate) fn sendfile(out_fd: RawFd, in_fd: RawFd, offset: &mut libc::off_t, count: usize) -> io::Result<usize> {
    // SAFETY: `offset` is a valid, exclusively borrowed off_t the kernel
    // reads and updates; the fds are plain integers (invalid ones give EBADF).
    check_len(unsafe { libc::sendfile(out_fd, in_fd, offset, count) })
}

/// The running kernel's release string (`uname -r`), if `uname(2)` works.
pub(crate) fn kernel_release() -> Option<String> {
    // SAFETY: `utsname` is a struct of fixed-size char arrays; all-zero is valid.
    let mut uts: libc::utsname = unsafe { mem::zeroed() };
    // SAFETY: `uts` is a valid, exclusively borrowed utsname to fill in.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return None;
    }
    let bytes: Vec<u8> = uts.release.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Views one of the padding-free uapi structures as bytes.
pub(crate) fn struct_bytes<T: NoPadding>(value: &T) -> &[u8] {
    // SAFETY: `T` is one of the `#[repr(C)]` uapi structures (sealed by the
    // `NoPadding` trait), whose sizes are asserted at compile time to be
    // the sum of their fields: they have no padding, so all `size_of::<T>()`
    // bytes are initialised. `u8` has alignment 1 and the slice borrows
    // `value`, so it cannot outlive it.
    unsafe { core::slice::from_raw_parts((value as *const T).cast::<u8>(), mem::size_of::<T>()) }
}

/// Marker for the padding-free structures [`struct_bytes`] may view.
pub(crate) trait NoPadding {}
impl NoPadding for uapi::Tls12CryptoInfoAesGcm128 {}
impl NoPadding for uapi::Tls12CryptoInfoAesGcm256 {}
impl NoPadding for uapi::Tls12CryptoInfoChacha20Poly1305 {}

/// Overwrites `secret` with zeros in a way the compiler cannot elide (key
/// material about to be dropped).
pub(crate) fn wipe(secret: &mut [u8]) {
    for byte in secret {
        // SAFETY: `byte` is a valid, aligned, exclusive reference; a
        // volatile write keeps the compiler from eliding the wipe.
        unsafe { core::ptr::write_volatile(byte, 0) };
    }
}

/// The symbolic name of an errno value, for messages (`"EBUSY"`).
pub(crate) fn errno_name(code: i32) -> &'static str {
    match code {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EINVAL => "EINVAL",
        libc::EPIPE => "EPIPE",
        libc::ENOTSOCK => "ENOTSOCK",
        libc::EMSGSIZE => "EMSGSIZE",
        libc::ENOPROTOOPT => "ENOPROTOOPT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENOTCONN => "ENOTCONN",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::EBADMSG => "EBADMSG",
        libc::EKEYEXPIRED => "EKEYEXPIRED",
        libc::ENOSPC => "ENOSPC",
        _ => "errno",
    }
}

/// `pipe2(O_NONBLOCK | O_CLOEXEC)`: the read end, then the write end.
pub(crate) fn pipe_nonblocking() -> io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds: [libc::c_int; 2] = [-1, -1];
    // SAFETY: `fds` is a valid, exclusively borrowed array of two ints for the
    // kernel to fill in.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both are open descriptors that nothing else
    // owns; each `OwnedFd` takes one and closes it on drop.
    Ok(unsafe { (std::os::fd::OwnedFd::from_raw_fd(fds[0]), std::os::fd::OwnedFd::from_raw_fd(fds[1])) })
}

/// `ioctl(fd, SIOCINQ)`: the bytes in a TCP socket's receive queue, not yet read.
pub(crate) fn queued(fd: RawFd) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCINQ (FIONREAD) writes one int through the pointer, which points
    // at `n`, exclusively borrowed for the call.
    check(unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n as *mut libc::c_int) })?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// `splice(fd_in, NULL, fd_out, NULL, len, flags)`: both ends are streams (a
/// socket or a pipe), so neither takes an offset.
pub(crate) fn splice(fd_in: RawFd, fd_out: RawFd, len: usize, flags: libc::c_uint) -> io::Result<usize> {
    // SAFETY: null offsets are allowed for pipes and sockets (the kernel
    // rejects them with ESPIPE otherwise); the fds are plain integers
    // (invalid ones give EBADF). No memory of ours is read or written.
    check_len(unsafe { libc::splice(fd_in, std::ptr::null_mut(), fd_out, std::ptr::null_mut(), len, flags) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmsg_sizes_fit() {
        assert!(cmsg_space_1() <= 64);
        assert!(cmsg_len_1() <= cmsg_space_1());
    }

    #[test]
    fn release_is_known() {
        let r = kernel_release().expect("uname works");
        assert!(!r.is_empty());
    }

    #[test]
    fn bad_fd_is_an_error_not_a_panic() {
        let e = setsockopt(-1, uapi::SOL_TCP, uapi::TCP_ULP, b"tls").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
        let mut buf = [0u8; 8];
        assert!(recvmsg_record(-1, &mut buf, 0).is_err());
        assert!(sendmsg_record(-1, 21, &[1, 0], 0).is_err());
    }
}
