//! # kernel-tls: Linux kernel TLS (kTLS) for rustls connections
//!
//! rustls performs the handshake; this crate moves the resulting record
//! layer into the Linux kernel, so `send`, `sendfile` and `recv` on the TCP
//! socket carry encrypted TLS records without user-space copies. It is
//! protocol-agnostic: nothing here knows about HTTP. It is not a TLS
//! implementation (rustls keeps the handshake and key schedule) and not a
//! socket wrapper (every function takes the caller's socket as an
//! [`AsFd`](std::os::fd::AsFd)).
//!
//! Every public item lives at the crate root; the modules below are private
//! and listed to show how the crate is organised.
//!
//! ## Layers
//!
//! | module | job |
//! |---|---|
//! | `types` | [`TlsVersion`], [`Cipher`], [`Direction`]: the vocabulary every other module shares |
//! | `error` | [`Error`] and [`ProtocolError`]: what went wrong and what to do |
//! | `ulp` | [`enable_ulp`] attaches the `tls` ULP (cheap, per connection) |
//! | `diagnose` | [`diagnose`] explains a missing ULP as an [`Unavailable`] (start-up only) |
//! | `probe` | [`probe()`] what the running kernel supports ([`Capabilities`]; start-up only) |
//! | `crypto_info` | [`CryptoInfo`]: keys in the kernel's `tls12_crypto_info_*` layout |
//! | `keys` | [`set_tx`]/[`set_rx`] install keys; [`update_tx`]/[`update_rx`] re-key; record-layer socket options |
//! | `record` | [`send`], [`sendfile`], [`send_record`], alerts, [`recv_record`], [`RxError`] |
//! | `message` | [`Alert`] and `KeyUpdate` encoding/parsing (pure functions) |
//! | `connection` | [`KtlsConnection`]: a rustls server connection living in the kernel, via [`Prepared`] |
//! | `splice` | [`Pipe`]: socket to socket by `splice(2)`, never through user space (into a kTLS socket, encrypted by the kernel) |
//! | `stat` | [`TlsStat`]: `/proc/net/tls_stat` counters |
//! | `uapi`, `sys` | `linux/tls.h` constants and structures; the system calls and the crate's only `unsafe` (internal) |
//!
//! ## Typical server flow
//!
//! 1. At start-up, [`probe()`] once; if `!caps.usable()`, report
//!    `caps.unavailable` and use user-space TLS. Restrict the rustls
//!    `ServerConfig` to suites for which [`Capabilities::supports_suite`]
//!    is `(true, true)`, and set `enable_secret_extraction = true`.
//! 2. Drive a `rustls::server::UnbufferedServerConnection` through the
//!    handshake until it reports `WriteTraffic` (all handshake bytes written,
//!    all received bytes processed).
//! 3. [`KtlsConnection::prepare`]`(&socket, &conn)` checks the connection
//!    and attaches the ULP; on error carry on in user space. Then
//!    [`KtlsConnection::install`]`(prepared, conn)` installs the keys.
//! 4. Serve: [`send`]/[`sendfile`] for data (count records with
//!    [`KtlsConnection::note_records_sent`]); [`recv_record`] for input.
//!    Every record that is not application data goes to
//!    [`KtlsConnection::handle_control`]: it applies peer `KeyUpdate`s and
//!    reports `close_notify` and alerts. Errors carry the alert to send
//!    ([`Error::alert`], [`RxError::alert`]).
//! 5. When [`KtlsConnection::limit_status`] says so, update the TX key
//!    (TLS 1.3) or close (TLS 1.2). Finish with [`send_close_notify`].
//!
//! ## Non-blocking use
//!
//! Socket functions take any [`AsFd`](std::os::fd::AsFd) (e.g.
//! `&tokio::net::TcpStream`), perform one system call and return the raw
//! [`std::io::Error`], `WouldBlock` included, so they fit tokio's `try_io`.
//! Nothing on the per-connection path blocks, reads files or spawns
//! anything. The start-up functions do: [`probe()`] connects short-lived
//! loopback sockets, and [`diagnose`] reads `/proc`, `/sys`, `/lib/modules`
//! and the kernel config (running `gzip` for `/proc/config.gz`).
//!
//! ## Kernel versions
//!
//! TX needs Linux 4.13, RX 4.17, TLS 1.3 5.1, ChaCha20-Poly1305 5.11,
//! `TLS_RX_EXPECT_NO_PAD` 6.0, key update (re-keying) 6.14, and
//! `TLS_TX_MAX_PAYLOAD_LEN` a recent kernel. [`probe()`] tests instead of
//! trusting these numbers. On kernels without re-keying, a peer's
//! `KeyUpdate` yields [`Error::RekeyUnsupported`]: close the connection.

#![deny(unsafe_code)]
#![forbid(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod connection;
mod crypto_info;
mod diagnose;
mod error;
mod keys;
mod message;
mod probe;
mod record;
mod splice;
mod stat;
#[allow(unsafe_code)] // the crate's one module of `unsafe` code
mod sys;
mod types;
mod uapi;
mod ulp;

pub use connection::{confidentiality_limit, records_for, ControlOutcome, KtlsConnection, LimitStatus, Prepared};
pub use crypto_info::CryptoInfo;
pub use diagnose::{diagnose, Unavailable};
pub use error::{Error, ProtocolError};
pub use keys::{
    set_rx, set_rx_expect_no_pad, set_tx, set_tx_max_payload_len, set_tx_zerocopy_sendfile, tx_max_payload_len,
    update_rx, update_tx,
};
pub use message::{key_update_message, parse_server_post_handshake, Alert, PostHandshake, PostHandshakeOutcome};
pub use probe::{probe, Capabilities, RekeySupport, SuiteSupport};
pub use record::{
    recv_record, send, send_alert, send_alert_record, send_close_notify, send_key_update, send_record, sendfile,
    Received, RxError,
};
pub use splice::{queued, Pipe};
pub use stat::TlsStat;
pub use types::{Cipher, Direction, TlsVersion};
/// Largest plaintext one TLS record carries (16 KiB), the kernel's record limit too.
pub use uapi::TLS_MAX_PLAINTEXT;
pub use ulp::enable_ulp;
