//! The operating system calls of ktlsd, each behind a small safe function: the
//! only module of the crate with `unsafe` code. Calls that rustix offers safely
//! go through it; the rest call libc, each `unsafe` block stating why it is sound.
//! libc stays where it must: set*id and setgroups through glibc, which applies
//! them to every thread of the process (rustix's apply to one thread only);
//! the user and group databases (NSS lives in libc); `TCP_INFO`; and the
//! descriptors that socket activation hands over.
//!
//! Not the kTLS system calls (see the `kernel-tls` crate), and not the policy
//! around any call: callers decide what a failure means.

use std::ffi::{c_char, c_int, CStr};
use std::fs::File;
use std::io;
use std::mem::MaybeUninit;
use std::num::NonZeroU64;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, RawFd};

use rustix::fs::{Access, Advice, Mode, OFlags, ResolveFlags};
use rustix::process::{Resource, Rlimit};

pub use libc::{gid_t, uid_t};

/// `getuid()`, `geteuid()`, `getgid()`, `getegid()`: the process's real and
/// effective user and group ids.
pub fn ids() -> Ids {
    use rustix::process::{getegid, geteuid, getgid, getuid};
    Ids { ruid: getuid().as_raw(), euid: geteuid().as_raw(), rgid: getgid().as_raw(), egid: getegid().as_raw() }
}

/// The process's real and effective ids, as [`ids`] reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    pub ruid: uid_t,
    pub euid: uid_t,
    pub rgid: gid_t,
    pub egid: gid_t,
}

/// `geteuid()`: the effective user id.
pub fn effective_uid() -> uid_t {
    rustix::process::geteuid().as_raw()
}

/// `setgroups(groups)` for the whole process.
pub fn set_groups(groups: &[gid_t]) -> io::Result<()> {
    // SAFETY: `groups` is a live slice of `groups.len()` gids, read by the call only.
    check(unsafe { libc::setgroups(groups.len(), groups.as_ptr()) })
}

/// `setgid(gid)` for the whole process (glibc applies it to every thread).
pub fn set_gid(gid: gid_t) -> io::Result<()> {
    // SAFETY: a system call on an integer; no memory is passed.
    check(unsafe { libc::setgid(gid) })
}

/// `setuid(uid)` for the whole process (glibc applies it to every thread).
pub fn set_uid(uid: uid_t) -> io::Result<()> {
    // SAFETY: a system call on an integer; no memory is passed.
    check(unsafe { libc::setuid(uid) })
}

/// The uid and primary gid of user `name` (`getpwnam_r`); `None` when there is
/// no such user.
pub fn user_ids(name: &CStr) -> io::Result<Option<(uid_t, gid_t)>> {
    by_name(name, libc::getpwnam_r, |pw: &libc::passwd| (pw.pw_uid, pw.pw_gid))
}

/// The gid of group `name` (`getgrnam_r`); `None` when there is no such group.
pub fn group_id(name: &CStr) -> io::Result<Option<gid_t>> {
    by_name(name, libc::getgrnam_r, |gr: &libc::group| gr.gr_gid)
}

/// `getpwnam_r` and `getgrnam_r` share this shape: name, entry, string buffer
/// and its length, result pointer.
type ByName<T> = unsafe extern "C" fn(*const c_char, *mut T, *mut c_char, libc::size_t, *mut *mut T) -> c_int;

/// Looks `name` up with `call`, growing the string buffer while the entry does
/// not fit (up to 1 MiB), and picks what is wanted from the entry found.
fn by_name<T, R>(name: &CStr, call: ByName<T>, pick: impl Fn(&T) -> R) -> io::Result<Option<R>> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let mut entry = MaybeUninit::<T>::uninit();
        let mut found: *mut T = std::ptr::null_mut();
        // SAFETY: `call` is getpwnam_r or getgrnam_r with its own entry type `T`:
        // `name` is NUL-terminated, `entry` has room for one `T`, the strings the
        // entry points to go into `buf` of `buf.len()` bytes, and `found` is
        // writable; all outlive the call.
        let rc = unsafe { call(name.as_ptr(), entry.as_mut_ptr(), buf.as_mut_ptr().cast(), buf.len(), &mut found) };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        if found.is_null() {
            return Ok(None);
        }
        // SAFETY: success with a non-null result means `entry` was filled in; the
        // strings it points to are in `buf`, still alive while `pick` reads.
        return Ok(Some(pick(unsafe { entry.assume_init_ref() })));
    }
}

/// The groups of user `name` as `initgroups` would set them, `gid` included
/// (`getgrouplist`); `None` when the list cannot be had (more than 65,536).
pub fn group_list(name: &CStr, gid: gid_t) -> Option<Vec<gid_t>> {
    let mut groups: Vec<gid_t> = vec![0; 64];
    loop {
        let mut n = c_int::try_from(groups.len()).ok()?;
        // SAFETY: `name` is NUL-terminated and `groups` holds `n` entries;
        // getgrouplist writes at most `n` of them and sets `n`.
        let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n.max(0) as usize);
            return Some(groups);
        }
        // Too small: `n` is now the number needed.
        if (n as usize) <= groups.len() || n > 65_536 {
            return None;
        }
        groups.resize(n as usize, 0);
    }
}

/// The `RLIMIT_NOFILE` soft and hard limits; `RLIM_INFINITY` for unlimited.
pub fn nofile_limit() -> (u64, u64) {
    let r = rustix::process::getrlimit(Resource::Nofile);
    (r.current.unwrap_or(libc::RLIM_INFINITY), r.maximum.unwrap_or(libc::RLIM_INFINITY))
}

/// Sets the `RLIMIT_NOFILE` soft and hard limits (`RLIM_INFINITY` for unlimited).
pub fn set_nofile_limit(soft: u64, hard: u64) -> io::Result<()> {
    let limit = |n| (n != libc::RLIM_INFINITY).then_some(n);
    Ok(rustix::process::setrlimit(Resource::Nofile, Rlimit { current: limit(soft), maximum: limit(hard) })?)
}

/// `CLOCK_MONOTONIC` now, in microseconds.
pub fn monotonic_usec() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// Takes descriptor `fd` as a socket, when it is open. Only for the descriptors
/// that socket activation hands to this process (`LISTEN_FDS`), each taken once.
pub fn take_passed_socket(fd: RawFd) -> Option<socket2::Socket> {
    // SAFETY: F_GETFD only reads the descriptor's flags; it fails on a closed one.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: by the socket-activation protocol, descriptors 3..3+LISTEN_FDS are
    // handed to this process and nothing else in it owns them; the caller takes
    // each once.
    Some(unsafe { socket2::Socket::from_raw_fd(fd) })
}

/// `openat2(dir, path, O_RDONLY|O_NONBLOCK|O_CLOEXEC|O_NOCTTY, RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS)`.
/// O_NONBLOCK keeps a FIFO planted in the tree from blocking the worker.
pub fn open_beneath(dir: &File, path: &CStr) -> io::Result<File> {
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    Ok(File::from(rustix::fs::openat2(dir, path, flags, Mode::empty(), resolve)?))
}

/// `preadv2(fd, [buf], offset, RWF_NOWAIT)`: reads only what is in the page cache.
pub fn read_nowait(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    // Offsets past `off_t` are refused (rustix would read `u64::MAX` as "the file's own offset").
    libc::off_t::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut iov = [io::IoSliceMut::new(buf)];
    Ok(rustix::io::preadv2(fd, &mut iov, offset, rustix::io::ReadWriteFlags::NOWAIT)?)
}

/// `preadv2(fd, bufs, offset, RWF_NOWAIT)`: fills `bufs` in order with what is in
/// the page cache, in one call; a short count where the cached bytes end.
pub fn read_nowait_vectored(fd: BorrowedFd<'_>, bufs: &mut [io::IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
    libc::off_t::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    Ok(rustix::io::preadv2(fd, bufs, offset, rustix::io::ReadWriteFlags::NOWAIT)?)
}

/// `posix_fadvise(fd, start, len, WILLNEED)`: asks the kernel to read the range
/// in (a `len` of 0: to the end of the file).
pub fn will_need(file: &File, start: u64, len: u64) -> io::Result<()> {
    Ok(rustix::fs::fadvise(file, start, NonZeroU64::new(len), Advice::WillNeed)?)
}

/// The size of a memory page.
pub fn page_size() -> u64 {
    rustix::param::page_size() as u64
}

/// `access(path, W_OK | X_OK)`: whether the real user may create files in the
/// directory `path`.
pub fn can_write_dir(path: &CStr) -> io::Result<()> {
    Ok(rustix::fs::access(path, Access::WRITE_OK | Access::EXEC_OK)?)
}

/// `getsockopt(fd, IPPROTO_TCP, TCP_INFO)`.
pub fn tcp_info(fd: BorrowedFd<'_>) -> io::Result<libc::tcp_info> {
    let mut info = MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is a writable tcp_info of `len` bytes and `fd` is a live socket
    // borrowed for the duration of the call; the kernel writes at most `len` bytes
    // (an older kernel fewer: the rest stays zero).
    let rc = unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_INFO, info.as_mut_ptr().cast(), &mut len)
    };
    check(rc)?;
    // SAFETY: tcp_info is plain integers, for which all-zero (where the kernel
    // wrote nothing) is a valid value.
    Ok(unsafe { info.assume_init() })
}

/// A libc return code: 0 is success, anything else the error in `errno`.
fn check(rc: c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A current-thread event loop with I/O and timers: what each of ktlsd's helper
/// threads (admin, cluster, ACME, health checks) and the signal wait runs on.
pub fn event_loop() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()
}

/// A thread named `name` running [`event_loop`] on the future `main` makes there,
/// until it completes; the loop's handle, for spawning more tasks onto it. The
/// loop is built before the thread starts: either failure is returned here.
pub fn event_loop_thread<F, Fut>(
    name: &str,
    main: F,
) -> io::Result<(std::thread::JoinHandle<Fut::Output>, tokio::runtime::Handle)>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future,
    Fut::Output: Send + 'static,
{
    let rt = event_loop()?;
    let handle = rt.handle().clone();
    let thread = std::thread::Builder::new().name(name.into()).spawn(move || rt.block_on(main()))?;
    Ok((thread, handle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups() {
        assert_eq!(user_ids(c"root").unwrap(), Some((0, 0)));
        assert_eq!(group_id(c"root").unwrap(), Some(0));
        assert_eq!(user_ids(c"no-such-user-ktlsd").unwrap(), None);
        assert_eq!(group_id(c"no-such-group-ktlsd").unwrap(), None);
        assert!(group_list(c"root", 0).unwrap().contains(&0));
    }

    #[test]
    fn limits_and_clock() {
        let (soft, hard) = nofile_limit();
        assert!(soft <= hard);
        assert!(page_size() >= 4096);
        let a = monotonic_usec();
        assert!(monotonic_usec() >= a);
    }
}
