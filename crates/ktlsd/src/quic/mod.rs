//! QUIC (RFC 9000/9001/9002) for HTTP/3: the transport beside [`crate::tls`], on quinn
//! and the same rustls configuration as TCP (certificate resolver, so SNI site choice
//! and ACME renewals apply unchanged; cipher suites; session tickets), offering ALPN
//! `h3` only and no 0-RTT.
//!
//! Here: the quinn server configuration built from the TCP one ([`server_config`]),
//! the endpoint keys shared by every worker and derived from the ticket key files
//! ([`Keys`]), the UDP sockets ([`socket`]) and what happens to a new client before
//! its handshake: accepted, asked to prove its address (Retry) or refused ([`admit`]).
//!
//! Not here: HTTP/3 framing and QPACK (`crate::http::h3`), what a request is answered
//! with (`crate::handler`), or the server's configuration (it takes [`Settings`]).
//! QUIC seals every packet in user space: there is no kTLS or `sendfile` path, so a
//! byte sent over HTTP/3 costs more CPU than one sent over TCP.

pub mod socket;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use aws_lc_rs::{hkdf, hmac};
use quinn::{IdleTimeout, VarInt};

/// When a new client must first prove its address with a Retry (RFC 9000 section
/// 8.1): a round trip more for the client, no state and at most three times the
/// bytes it sent (the amplification limit) for a spoofed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Retry {
    /// When the worker holds more than half of its connection cap.
    #[default]
    Auto,
    /// For every new client.
    Always,
    /// Never.
    Never,
}

/// How QUIC connections are set up; the server builds it from its configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Request streams a connection may have open at once.
    pub max_streams: u32,
    /// How long a connection may stay silent before it is closed.
    pub idle_timeout: Duration,
    /// Time allowed for the handshake, from the first packet.
    pub handshake_timeout: Duration,
    pub retry: Retry,
}

/// QUIC version 1 (RFC 9000).
const QUIC_V1: u32 = 1;

/// Handshakes a worker may have under way before new clients must first answer a
/// Retry (with [`Retry::Auto`]): a flood of Initials from addresses that never
/// complete a handshake then costs a stateless packet each, not a connection's
/// state (about 20 KiB each, measured with `tests/h3/hostile.py`), while a burst of
/// this many real clients per worker is taken without the extra round trip.
pub const MAX_HANDSHAKES_BEFORE_RETRY: usize = 256;

/// Unidirectional streams a client may open: HTTP/3's control stream and QPACK's
/// encoder and decoder streams, with room for reserved (grease) stream types,
/// which are read and discarded.
const UNI_STREAMS: u32 = 8;

/// Receive window of one request stream: requests carry no body worth keeping (a
/// body is read and discarded), so this bounds what a client can make the server
/// buffer per stream.
const STREAM_RECEIVE_WINDOW: u32 = 64 * 1024;

/// Bytes a connection may have sent and not yet acknowledged, over all its
/// streams: a response body is read from its file only as this allows, so it
/// bounds a connection's body memory.
const SEND_WINDOW: u64 = 4 * 1024 * 1024;

/// Ack-eliciting packets a client that speaks QUIC's acknowledgement-frequency extension
/// (draft-ietf-quic-ack-frequency; quinn does) may receive before it must acknowledge:
/// one ACK per 10 packets of a download at most rather than RFC 9000's one per 2, so the
/// server receives, decrypts and processes fewer ACKs and wakes up less (a quinn client,
/// which already acknowledges a received batch at once, sent 40% fewer in `bench/run h3`). Loss
/// is still detected by packet number (the client acknowledges at once any packet that
/// arrives out of order by 2 or more) and within the client's `max_ack_delay`. Clients
/// without the extension acknowledge as RFC 9000 has them.
const ACK_ELICITING_THRESHOLD: u32 = 9;

/// Packets out of order after which the client acknowledges at once: the default
/// packet-reordering loss threshold (3) less one, as the extension recommends.
const ACK_REORDERING_THRESHOLD: u32 = 2;

/// The keys every worker's endpoint shares: stateless-reset tokens (so that a
/// reset any worker sends is one the client accepts) and Retry tokens (so that a
/// token one worker issued validates on another, and, with ticket key files, on
/// another server of the fleet).
#[derive(Clone)]
pub struct Keys {
    reset: Arc<hmac::Key>,
    token: Arc<hkdf::Prk>,
}

impl Keys {
    /// Keys derived (HKDF-SHA256) from the first ticket key file, as every server
    /// given the same file derives them; a random secret per process when none is given.
    pub fn new(ticket_keys: &[PathBuf]) -> Result<Keys, String> {
        let secret = match ticket_keys.first() {
            Some(path) => std::fs::read(path).map_err(|e| {
                format!("ticket key {}: {e}; HTTP/3 derives its reset and Retry keys from it", path.display())
            })?,
            None => random_secret().to_vec(),
        };
        Ok(Keys::from_secret(&secret))
    }

    /// Keys derived (HKDF-SHA256) from `secret`: the same on every server given it.
    pub fn from_secret(secret: &[u8]) -> Keys {
        let prk = |label: &[u8]| hkdf::Salt::new(hkdf::HKDF_SHA256, label).extract(secret);
        let mut reset = [0u8; 32];
        // 32 bytes is HKDF-SHA256's own output length: expanding cannot fail.
        let _ = prk(b"ktlsd quic stateless reset")
            .expand(&[b"hmac key"], hkdf::HKDF_SHA256)
            .and_then(|okm| okm.fill(&mut reset));
        Keys {
            reset: Arc::new(hmac::Key::new(hmac::HMAC_SHA256, &reset)),
            token: Arc::new(prk(b"ktlsd quic retry token")),
        }
    }

    /// The endpoint configuration every worker's endpoint is created with: QUIC v1
    /// only (quinn would also take the drafts 29 to 34, which no current client
    /// sends; a client offering one gets Version Negotiation instead).
    pub fn endpoint_config(&self) -> quinn::EndpointConfig {
        let mut config = quinn::EndpointConfig::new(self.reset.clone());
        config.supported_versions(vec![QUIC_V1]);
        config
    }
}

/// One random secret per process, so that a reload without ticket key files keeps
/// the keys (tokens issued before it stay valid).
fn random_secret() -> &'static [u8; 32] {
    static SECRET: OnceLock<[u8; 32]> = OnceLock::new();
    SECRET.get_or_init(|| {
        let mut s = [0u8; 32];
        if aws_lc_rs::rand::fill(&mut s).is_err() {
            // Without randomness the keys would be guessable: no HTTP/3 client could
            // be told apart from a forger. aws-lc's generator does not fail on Linux.
            tracing::error!("no random bytes for the QUIC endpoint keys; HTTP/3 Retry tokens are weak");
        }
        s
    })
}

/// The quinn server configuration: `tls` (the TCP configuration, its resolver and
/// ticketer shared) with ALPN `h3` only and 0-RTT off, `settings`' limits, `keys`'
/// Retry token key.
pub fn server_config(
    tls: &rustls::ServerConfig,
    settings: &Settings,
    keys: &Keys,
) -> Result<quinn::ServerConfig, String> {
    let mut tls = tls.clone();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    // 0-RTT requests could be replayed; QUIC allows only 0 (off) or u32::MAX.
    tls.max_early_data_size = 0;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).map_err(|e| {
        format!("http3: {e}: QUIC needs TLS 1.3 in tls_versions and TLS_AES_128_GCM_SHA256 in cipher_suites")
    })?;
    let idle = IdleTimeout::try_from(settings.idle_timeout)
        .map_err(|_| format!("http3: idle_timeout {:?} is too long for QUIC", settings.idle_timeout))?;
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(VarInt::from_u32(settings.max_streams))
        .max_concurrent_uni_streams(VarInt::from_u32(UNI_STREAMS))
        .max_idle_timeout(Some(idle))
        .stream_receive_window(VarInt::from_u32(STREAM_RECEIVE_WINDOW))
        .receive_window(VarInt::from_u32(STREAM_RECEIVE_WINDOW.saturating_mul(4)))
        .send_window(SEND_WINDOW)
        .ack_frequency_config(Some(ack_frequency()));
    let mut config = quinn::ServerConfig::new(Arc::new(crypto), keys.token.clone());
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// What the server asks of clients that speak the acknowledgement-frequency extension.
fn ack_frequency() -> quinn::AckFrequencyConfig {
    let mut ack = quinn::AckFrequencyConfig::default();
    ack.ack_eliciting_threshold(VarInt::from_u32(ACK_ELICITING_THRESHOLD))
        .reordering_threshold(VarInt::from_u32(ACK_REORDERING_THRESHOLD));
    ack
}

/// What to do with a client's first packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Accept,
    /// Ask it to prove its address first (a Retry packet), keeping no state.
    Retry,
    /// The worker is full: refuse with CONNECTION_REFUSED.
    Refuse,
}

/// The worker's load when a new client arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// Connections the worker holds (TCP and QUIC), of at most `cap`.
    pub active: usize,
    pub cap: usize,
    /// QUIC handshakes under way.
    pub handshaking: usize,
}

/// Decides for a new client, given whether its address is already validated (it
/// came back with a Retry token), whether a Retry may still be sent, and the
/// worker's load.
pub fn admit(retry: Retry, validated: bool, may_retry: bool, load: Load) -> Admit {
    if load.active >= load.cap {
        return Admit::Refuse;
    }
    let wanted = match retry {
        Retry::Always => true,
        Retry::Auto => load.active > load.cap / 2 || load.handshaking >= MAX_HANDSHAKES_BEFORE_RETRY,
        Retry::Never => false,
    };
    if wanted && !validated && may_retry {
        Admit::Retry
    } else {
        Admit::Accept
    }
}

/// A new client's handshake, bounded by `timeout`: the QUIC connection, or why not.
///
/// # Cancel safety
/// Dropping the future abandons the handshake; the endpoint closes that connection.
pub async fn handshake(
    incoming: quinn::Incoming,
    config: Arc<quinn::ServerConfig>,
    timeout: Duration,
) -> Result<quinn::Connection, HandshakeError> {
    let connecting = incoming.accept_with(config).map_err(HandshakeError::Connection)?;
    match tokio::time::timeout(timeout, connecting).await {
        Ok(r) => r.map_err(HandshakeError::Connection),
        Err(_) => Err(HandshakeError::Timeout),
    }
}

/// Why a QUIC handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("no handshake within the handshake timeout")]
    Timeout,
    #[error("{0}")]
    Connection(quinn::ConnectionError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admit_table() {
        use Admit::{Accept, Refuse};
        let h = MAX_HANDSHAKES_BEFORE_RETRY;
        // (policy, validated, may_retry, active, cap, handshaking, expected)
        for (retry, validated, may, active, cap, handshaking, want) in [
            (Retry::Never, false, true, 0, 10, 0, Accept),
            (Retry::Never, false, true, 10, 10, 0, Refuse),
            (Retry::Never, false, true, 5, 1000, h, Accept),
            (Retry::Always, false, true, 0, 10, 0, Admit::Retry),
            (Retry::Always, true, false, 0, 10, 0, Accept),
            (Retry::Always, false, false, 0, 10, 0, Accept),
            (Retry::Auto, false, true, 5, 10, 0, Accept),
            (Retry::Auto, false, true, 6, 10, 0, Admit::Retry),
            (Retry::Auto, true, false, 6, 10, 0, Accept),
            (Retry::Auto, true, false, 10, 10, 0, Refuse),
            // Many handshakes under way: unvalidated clients answer a Retry first.
            (Retry::Auto, false, true, h, 10_000, h - 1, Accept),
            (Retry::Auto, false, true, h, 10_000, h, Admit::Retry),
            (Retry::Auto, true, false, h, 10_000, h, Accept),
            (Retry::Auto, false, false, h, 10_000, h, Accept),
        ] {
            let load = Load { active, cap, handshaking };
            assert_eq!(admit(retry, validated, may, load), want, "{retry:?} {validated} {may} {load:?}");
        }
    }

    #[test]
    fn keys_follow_the_secret() {
        let sign = |k: &Keys| hmac::sign(&k.reset, b"cid").as_ref().to_vec();
        let (a, b, c) = (Keys::from_secret(&[1; 80]), Keys::from_secret(&[1; 80]), Keys::from_secret(&[2; 80]));
        assert_eq!(sign(&a), sign(&b), "the same file gives the same reset key");
        assert_ne!(sign(&a), sign(&c));
    }
}
