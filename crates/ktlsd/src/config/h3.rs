//! The HTTP/3 section: whether QUIC is served beside TCP (`http3`) and its limits
//! (`h3_max_streams`, `quic_retry`).
//!
//! Each key is checked against its range here; the QUIC layer applies them. The idle,
//! handshake and shutdown timeouts, `max_header_bytes` and `max_connections` are the
//! TCP ones: the same values hold for both transports.

use super::options::Options;
use super::{err, ConfigError};
use crate::quic::Retry;

/// HTTP/3 as configured (present only when `http3` is on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Http3 {
    /// Request streams one connection may have open at once (QUIC's `initial_max_streams_bidi`).
    pub max_streams: u32,
    /// When a client's address is checked with a Retry before its handshake.
    pub retry: Retry,
}

/// Default request streams per connection: nginx's `http3_max_concurrent_streams`.
const DEFAULT_MAX_STREAMS: u32 = 128;

/// `http3` and its limits; `None` when HTTP/3 is off (its limits then are not looked at).
pub fn http3(o: &Options) -> Result<Option<Http3>, ConfigError> {
    if o.http3 != Some(true) {
        return Ok(None);
    }
    let max_streams = o.h3_max_streams.unwrap_or(DEFAULT_MAX_STREAMS);
    if !(1..=10_000).contains(&max_streams) {
        return err(format!("h3_max_streams {max_streams}: expected 1 to 10000"));
    }
    Ok(Some(Http3 { max_streams, retry: o.quic_retry.unwrap_or_default() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http3_table() {
        let base = Options::default;
        let on = || Options { http3: Some(true), ..base() };
        for (o, want) in [
            (base(), Ok(None)),
            (Options { http3: Some(false), h3_max_streams: Some(0), ..base() }, Ok(None)),
            (on(), Ok(Some(Http3 { max_streams: 128, retry: Retry::Auto }))),
            (
                Options { h3_max_streams: Some(7), quic_retry: Some(Retry::Always), ..on() },
                Ok(Some(Http3 { max_streams: 7, retry: Retry::Always })),
            ),
            (Options { h3_max_streams: Some(0), ..on() }, Err("h3_max_streams 0: expected 1 to 10000")),
            (Options { h3_max_streams: Some(10_001), ..on() }, Err("h3_max_streams 10001")),
        ] {
            match (http3(&o), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e}"),
                (got, want) => panic!("got {got:?}, want {want:?}"),
            }
        }
    }
}
