//! # kernel-tls: Linux kernel TLS (kTLS) for rustls connections
//!
//! rustls performs the handshake; this crate moves the resulting record
//! layer into the Linux kernel, so `send`, `sendfile` and `recv` on the TCP
//! socket carry encrypted TLS records without user-space copies. It is
//! protocol-agnostic: nothing here knows about HTTP.
//!
//! ## Layers
//!
//! | module | job |
//! |---|---|
//! | [`probe`](mod@probe) | [`probe()`] what the running kernel supports ([`Capabilities`]) |
//! | [`ulp`] | [`enable_ulp`] attaches the `tls` ULP; [`Unavailable`] explains failures |
//! | [`crypto_info`] | [`CryptoInfo`]: keys in the kernel's `tls12_crypto_info_*` layout |
//! | [`keys`] | [`set_tx`]/[`set_rx`] install keys; [`update_tx`]/[`update_rx`] re-key |
//! | [`record`] | [`send`], [`sendfile`], [`send_record`], alerts, [`recv_record`], [`RxError`] |
//! | [`message`] | alert and `KeyUpdate` encoding/parsing (pure functions) |
//! | [`connection`] | [`KtlsConnection`]: a rustls server connection living in the kernel |
//! | [`stat`] | [`TlsStat`]: `/proc/net/tls_stat` counters |
//! | [`uapi`] | constants and `#[repr(C)]` structures from `linux/tls.h` |
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
//! 3. [`KtlsConnection::install`]`(socket, conn)`; optionally call
//!    [`KtlsConnection::prepare`] first to keep a user-space fallback.
//! 4. Serve: [`send`]/[`sendfile`] for data (count records with
//!    [`KtlsConnection::note_records_sent`]); [`recv_record`] for input.
//!    Every record with `content_type != 23` goes to
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
//! Nothing in this crate blocks or spawns threads; [`probe()`] uses its own
//! short-lived loopback sockets.
//!
//! ## Kernel versions
//!
//! TX needs Linux 4.13, RX 4.17, TLS 1.3 5.1, ChaCha20-Poly1305 5.11,
//! `TLS_RX_EXPECT_NO_PAD` 6.0, key update (re-keying) 6.14, and
//! `TLS_TX_MAX_PAYLOAD_LEN` a recent kernel. [`probe()`] tests instead of
//! trusting these numbers. On kernels without re-keying, a peer's
//! `KeyUpdate` yields [`Error::RekeyUnsupported`]: close the connection.

#![forbid(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod connection;
pub mod crypto_info;
pub mod error;
pub mod keys;
pub mod message;
pub mod probe;
pub mod record;
pub mod stat;
mod sys;
pub mod uapi;
pub mod ulp;

pub use connection::{records_for, confidentiality_limit, ControlOutcome, KtlsConnection, LimitStatus};
pub use crypto_info::{Cipher, CryptoInfo, TlsVersion};
pub use error::{Direction, Error, ProtocolError};
pub use keys::{
    set_rx, set_rx_expect_no_pad, set_tx, set_tx_max_payload_len, set_tx_zerocopy_sendfile,
    tx_max_payload_len, update_rx, update_tx,
};
pub use message::Alert;
pub use probe::{available_congestion_control, probe, Capabilities, RekeySupport, SuiteSupport};
pub use record::{
    recv_record, send, send_alert, send_alert_record, send_close_notify, send_key_update,
    send_record, sendfile, Received, RxError,
};
pub use stat::TlsStat;
pub use ulp::{diagnose, enable_ulp, Unavailable};
