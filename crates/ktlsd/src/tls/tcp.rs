//! The connection's live TCP state (`TCP_INFO`) for adaptive record sizing, and
//! the per-connection TCP send options (`TCP_NOTSENT_LOWAT`, `TCP_CONGESTION`).
//! socket2 sets the options; `TCP_INFO`, which it does not offer, is read by
//! `crate::sys`. Not the place for listener options (see `server::listener`).

use std::io;
use std::os::fd::BorrowedFd;

use socket2::SockRef;

/// What adaptive sizing needs to know about the connection right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpState {
    /// Sender maximum segment size, bytes.
    pub mss: u32,
    /// Congestion window, segments.
    pub cwnd: u32,
    /// The connection is recovering from a loss (or its window was cut by one).
    pub recent_loss: bool,
}

/// `tcp_ca_state` values from linux/tcp.h.
const TCP_CA_OPEN: u8 = 0;
const TCP_CA_DISORDER: u8 = 1;

impl TcpState {
    /// Reads `TCP_INFO` for `fd`.
    pub fn read(fd: BorrowedFd<'_>) -> io::Result<TcpState> {
        let info = crate::sys::tcp_info(fd)?;
        Ok(TcpState {
            mss: info.tcpi_snd_mss,
            cwnd: info.tcpi_snd_cwnd,
            recent_loss: info.tcpi_ca_state > TCP_CA_DISORDER
                || (info.tcpi_ca_state != TCP_CA_OPEN && info.tcpi_retrans > 0),
        })
    }
}

/// Reads the figures the advisor keeps of a connection at its end: smoothed
/// RTT, and segments sent and retransmitted over its life.
pub fn read_end(fd: BorrowedFd<'_>) -> io::Result<crate::stats::TcpEnd> {
    let info = crate::sys::tcp_info(fd)?;
    Ok(crate::stats::TcpEnd {
        rtt_us: info.tcpi_rtt,
        retransmits: info.tcpi_total_retrans,
        segments: info.tcpi_segs_out,
    })
}

/// Sets `TCP_NOTSENT_LOWAT`: the socket reports writable only when less than
/// `bytes` remain unsent, which keeps record decisions close to the wire.
pub fn set_notsent_lowat(fd: BorrowedFd<'_>, bytes: u32) -> io::Result<()> {
    SockRef::from(&fd).set_tcp_notsent_lowat(bytes)
}

/// Sets the congestion control algorithm (`TCP_CONGESTION`), e.g. `bbr`.
pub fn set_congestion(fd: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    SockRef::from(&fd).set_tcp_congestion(name.as_bytes())
}
