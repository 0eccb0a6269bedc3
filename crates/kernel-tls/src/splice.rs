//! Moving bytes from one socket to another without passing them through user
//! space: `splice(2)` from the source socket into a pipe, then from the pipe
//! into the destination socket. Into a socket with kTLS keys the kernel
//! encrypts the pipe's pages on their way out, as it does for `sendfile`.
//!
//! [`Pipe`] is the pipe in between and what it holds. Each method is one system
//! call and returns [`io::Error`] unchanged (`WouldBlock` included), so
//! readiness-based callers can retry. Nothing here knows what the bytes mean or
//! when to stop: the caller counts.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use crate::sys;

/// A non-blocking pipe between two sockets, and how many bytes it holds.
///
/// Dropping it closes both ends and discards what it still holds.
#[derive(Debug)]
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    held: usize,
}

impl Pipe {
    /// Bytes one pipe holds by default (16 pages): the most [`Pipe::fill_from`]
    /// moves at once.
    pub const CAPACITY: usize = 64 * 1024;

    /// A new, empty pipe (`pipe2` with `O_NONBLOCK | O_CLOEXEC`).
    pub fn new() -> io::Result<Pipe> {
        let (read, write) = sys::pipe_nonblocking()?;
        Ok(Pipe { read, write, held: 0 })
    }

    /// Bytes taken from the source and not yet given to the destination.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Moves up to `max` bytes from the socket `src` into the pipe (at most
    /// what the pipe has room for). Returns 0 when `src` has reached its end;
    /// `WouldBlock` when it has nothing now (or the pipe is full).
    pub fn fill_from(&mut self, src: impl AsFd, max: usize) -> io::Result<usize> {
        let room = Self::CAPACITY.saturating_sub(self.held).min(max);
        if room == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
        let n = sys::splice(src.as_fd().as_raw_fd(), self.write.as_raw_fd(), room, flags)?;
        self.held += n;
        Ok(n)
    }

    /// Moves what the pipe holds (as much as the socket `dst` takes now) into
    /// `dst`. With `more` (`SPLICE_F_MORE`, as `MSG_MORE`), more data follows: a
    /// kTLS socket keeps its record open for it. `WouldBlock` when `dst` takes
    /// nothing now.
    pub fn drain_to(&mut self, dst: impl AsFd, more: bool) -> io::Result<usize> {
        if self.held == 0 {
            return Ok(0);
        }
        let mut flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
        if more {
            flags |= libc::SPLICE_F_MORE;
        }
        let n = sys::splice(self.read.as_raw_fd(), dst.as_fd().as_raw_fd(), self.held, flags)?;
        self.held -= n.min(self.held);
        Ok(n)
    }
}

/// The bytes waiting in the receive queue of the TCP socket `src` (`SIOCINQ`):
/// that many can be moved by [`Pipe::fill_from`] at once, without waiting.
pub fn queued(src: impl AsFd) -> io::Result<usize> {
    sys::queued(src.as_fd().as_raw_fd())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// `queued` counts the bytes a socket has received and nobody has read.
    #[test]
    fn queued_counts_unread_bytes() {
        let (mut w, r) = pair();
        assert_eq!(queued(&r).unwrap(), 0);
        w.write_all(&[7u8; 5000]).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while queued(&r).unwrap() < 5000 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(queued(&r).unwrap(), 5000);
    }

    /// Bytes written into one connection come out of another, whole and in
    /// order, through the pipe; the source's end reads as 0.
    #[test]
    fn socket_to_socket() {
        let (mut src_w, src_r) = pair();
        let (dst_w, mut dst_r) = pair();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let writer = {
            let data = data.clone();
            std::thread::spawn(move || {
                src_w.write_all(&data).unwrap();
            })
        };
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            dst_r.read_to_end(&mut got).unwrap();
            got
        });
        let mut pipe = Pipe::new().unwrap();
        let mut moved = 0;
        loop {
            match pipe.fill_from(&src_r, usize::MAX) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("fill: {e}"),
            }
            while pipe.held() > 0 {
                match pipe.drain_to(&dst_w, true) {
                    Ok(n) => moved += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                    Err(e) => panic!("drain: {e}"),
                }
            }
        }
        writer.join().unwrap();
        drop(dst_w);
        assert_eq!(moved, data.len());
        assert_eq!(reader.join().unwrap(), data);
    }
}
