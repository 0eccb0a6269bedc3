//! Encoding and parsing of the few TLS messages that travel as kTLS control
//! records: alerts and post-handshake handshake messages (`KeyUpdate`).
//!
//! These are pure functions over byte slices — no I/O — so they can be tested
//! in isolation and reused by anything that reads records from the kernel.
//! Everything the peer controls is validated; malformed input yields a
//! [`ProtocolError`] carrying the alert to send back.
//! Sending them is the record layer's job ([`send_alert_record`](crate::send_alert_record),
//! [`send_key_update`](crate::send_key_update)).

use rustls::{AlertDescription, HandshakeType};

use crate::error::ProtocolError;
use crate::types::TlsVersion;

/// A TLS alert: two bytes, level then description.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alert {
    /// [`Alert::LEVEL_WARNING`] or [`Alert::LEVEL_FATAL`]; other values are
    /// kept as received.
    pub level: u8,
    /// What the alert is about.
    pub description: AlertDescription,
}

impl Alert {
    /// Alert level `warning` (1).
    pub const LEVEL_WARNING: u8 = 1;
    /// Alert level `fatal` (2).
    pub const LEVEL_FATAL: u8 = 2;

    /// `close_notify` (warning level, description 0): orderly end of the
    /// sender's data.
    pub fn close_notify() -> Self {
        Alert { level: Alert::LEVEL_WARNING, description: AlertDescription::CloseNotify }
    }

    /// A fatal alert with the given description.
    pub fn fatal(description: AlertDescription) -> Self {
        Alert { level: Alert::LEVEL_FATAL, description }
    }

    /// Parses an alert record's payload, which must be exactly two bytes.
    pub fn parse(payload: &[u8]) -> Result<Self, ProtocolError> {
        match *payload {
            [level, description] => Ok(Alert { level, description: AlertDescription::from(description) }),
            _ => Err(ProtocolError::MalformedAlert { len: payload.len() }),
        }
    }

    /// The two wire bytes.
    pub fn encode(&self) -> [u8; 2] {
        [self.level, u8::from(self.description)]
    }

    /// Whether this alert ends the connection under `version`'s rules: in
    /// TLS 1.3 every alert except `close_notify` and `user_canceled` is fatal
    /// whatever its level (RFC 8446 §6); in TLS 1.2 the level decides.
    pub fn is_fatal(&self, version: TlsVersion) -> bool {
        match self.description {
            AlertDescription::CloseNotify => false,
            AlertDescription::UserCanceled if version == TlsVersion::Tls13 => false,
            _ if version == TlsVersion::Tls13 => true,
            _ => self.level != Alert::LEVEL_WARNING,
        }
    }
}

/// One handshake message inside a handshake record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HandshakeMessage<'a> {
    /// The message type (`msg_type`).
    pub(crate) msg_type: HandshakeType,
    /// The body, without the 4-byte header.
    pub(crate) body: &'a [u8],
}

/// Iterator over the handshake messages of one handshake record.
///
/// Yields an error (and then stops) if a header is truncated or a length
/// runs past the record: this crate does not reassemble messages split
/// across records, which a peer has no reason to do after the handshake.
pub(crate) struct HandshakeMessages<'a> {
    rest: &'a [u8],
    failed: bool,
}

/// Splits a handshake record's payload into messages (`msg_type`, 24-bit
/// length, body). An empty payload yields nothing; callers should treat an
/// empty handshake record as malformed (RFC 8446 §5.1 forbids zero-length
/// handshake fragments), as [`parse_server_post_handshake`] does.
pub(crate) fn handshake_messages(payload: &[u8]) -> HandshakeMessages<'_> {
    HandshakeMessages { rest: payload, failed: false }
}

impl<'a> Iterator for HandshakeMessages<'a> {
    type Item = Result<HandshakeMessage<'a>, ProtocolError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.rest.is_empty() {
            return None;
        }
        let parsed = match self.rest {
            [typ, a, b, c, body @ ..] => {
                let len = u32::from_be_bytes([0, *a, *b, *c]) as usize;
                match (body.get(..len), body.get(len..)) {
                    (Some(msg), Some(rest)) => Some((HandshakeType::from(*typ), msg, rest)),
                    _ => None,
                }
            }
            _ => None,
        };
        match parsed {
            Some((msg_type, body, rest)) => {
                self.rest = rest;
                Some(Ok(HandshakeMessage { msg_type, body }))
            }
            None => {
                self.failed = true;
                self.rest = &[];
                Some(Err(ProtocolError::MalformedHandshake))
            }
        }
    }
}

/// Parses a handshake record for a server that has finished its handshake:
/// the only acceptable content is TLS 1.3 `KeyUpdate`, as the last message
/// of the record (RFC 8446 §5.1: key changes align with record boundaries).
///
/// Returns `update_requested` of that `KeyUpdate`.
///
/// # Errors
/// `Renegotiation` for TLS 1.2 `ClientHello`/`HelloRequest`,
/// `KeyUpdateOnTls12`, `KeyUpdateNotLast`, `InvalidKeyUpdate`,
/// `UnexpectedHandshake` for anything else, `MalformedHandshake` for bad framing.
pub fn parse_server_post_handshake(version: TlsVersion, payload: &[u8]) -> Result<bool, ProtocolError> {
    if payload.is_empty() {
        return Err(ProtocolError::MalformedHandshake);
    }
    let mut key_update: Option<bool> = None;
    for msg in handshake_messages(payload) {
        let msg = msg?;
        if key_update.is_some() {
            // Something follows a KeyUpdate within the same record.
            return Err(ProtocolError::KeyUpdateNotLast);
        }
        match (version, msg.msg_type) {
            (TlsVersion::Tls13, HandshakeType::KeyUpdate) => {
                key_update = Some(parse_key_update(msg.body)?);
            }
            (TlsVersion::Tls12, HandshakeType::KeyUpdate) => return Err(ProtocolError::KeyUpdateOnTls12),
            (TlsVersion::Tls12, HandshakeType::ClientHello | HandshakeType::HelloRequest) => {
                return Err(ProtocolError::Renegotiation)
            }
            (_, other) => return Err(ProtocolError::UnexpectedHandshake { msg_type: other }),
        }
    }
    key_update.ok_or(ProtocolError::MalformedHandshake)
}

/// Parses a `KeyUpdate` body: one byte, 0 (`update_not_requested`) or
/// 1 (`update_requested`). Returns whether an update was requested.
pub(crate) fn parse_key_update(body: &[u8]) -> Result<bool, ProtocolError> {
    match *body {
        [0] => Ok(false),
        [1] => Ok(true),
        [_] => Err(ProtocolError::InvalidKeyUpdate),
        _ => Err(ProtocolError::MalformedHandshake),
    }
}

/// The complete `KeyUpdate` handshake message (type 24, length 1, body).
pub fn key_update_message(update_requested: bool) -> [u8; 5] {
    [u8::from(HandshakeType::KeyUpdate), 0, 0, 1, u8::from(update_requested)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alert_round_trip() {
        assert_eq!(Alert::close_notify().encode(), [1, 0]);
        assert_eq!(Alert::fatal(AlertDescription::BadRecordMac).encode(), [2, 20]);
        let a = Alert::parse(&[2, 40]).unwrap();
        assert_eq!(a.description, AlertDescription::HandshakeFailure);
        assert!(a.is_fatal(TlsVersion::Tls12));
        assert_eq!(Alert::parse(&[1]).unwrap_err(), ProtocolError::MalformedAlert { len: 1 });
        assert!(Alert::parse(&[1, 0, 1, 0]).is_err());
        assert!(Alert::parse(&[]).is_err());
    }

    #[test]
    fn alert_fatality_rules() {
        let warn = |d| Alert { level: Alert::LEVEL_WARNING, description: d };
        assert!(!Alert::close_notify().is_fatal(TlsVersion::Tls13));
        assert!(!warn(AlertDescription::UserCanceled).is_fatal(TlsVersion::Tls13));
        // TLS 1.3: a warning-level alert other than the two above is fatal.
        assert!(warn(AlertDescription::BadCertificate).is_fatal(TlsVersion::Tls13));
        // TLS 1.2: level decides.
        assert!(!warn(AlertDescription::BadCertificate).is_fatal(TlsVersion::Tls12));
        assert!(Alert::fatal(AlertDescription::CloseNotify).level == 2);
    }

    #[test]
    fn key_update_build_and_parse() {
        assert_eq!(key_update_message(false), [24, 0, 0, 1, 0]);
        assert_eq!(key_update_message(true), [24, 0, 0, 1, 1]);
        assert_eq!(parse_server_post_handshake(TlsVersion::Tls13, &key_update_message(true)), Ok(true));
        assert_eq!(parse_server_post_handshake(TlsVersion::Tls13, &key_update_message(false)), Ok(false));
        assert_eq!(parse_key_update(&[2]), Err(ProtocolError::InvalidKeyUpdate));
        assert_eq!(parse_key_update(&[]), Err(ProtocolError::MalformedHandshake));
        assert_eq!(parse_key_update(&[0, 0]), Err(ProtocolError::MalformedHandshake));
    }

    #[test]
    fn handshake_framing() {
        let mut two = Vec::new();
        two.extend_from_slice(&[4, 0, 0, 2, 0xaa, 0xbb]);
        two.extend_from_slice(&key_update_message(false));
        let msgs: Vec<_> = handshake_messages(&two).collect::<Result<_, _>>().unwrap();
        assert_eq!(msgs.len(), 2);
        assert_eq!(msgs[0].msg_type, HandshakeType::NewSessionTicket);
        assert_eq!(msgs[0].body, &[0xaa, 0xbb]);
        assert_eq!(msgs[1].msg_type, HandshakeType::KeyUpdate);

        // Truncated header, length past the end, empty record.
        assert!(handshake_messages(&[24, 0, 0]).any(|m| m.is_err()));
        assert!(handshake_messages(&[24, 0, 0, 2, 0]).any(|m| m.is_err()));
        assert_eq!(handshake_messages(&[]).count(), 0);
        assert_eq!(parse_server_post_handshake(TlsVersion::Tls13, &[]), Err(ProtocolError::MalformedHandshake));
        assert_eq!(
            parse_server_post_handshake(TlsVersion::Tls13, &[24, 0, 0, 2, 0]),
            Err(ProtocolError::MalformedHandshake)
        );
    }

    #[test]
    fn server_rejects_other_post_handshake_messages() {
        // NewSessionTicket from a client.
        assert_eq!(
            parse_server_post_handshake(TlsVersion::Tls13, &[4, 0, 0, 1, 0]),
            Err(ProtocolError::UnexpectedHandshake { msg_type: HandshakeType::NewSessionTicket })
        );
        // KeyUpdate followed by another message in the same record.
        let mut ku_then = key_update_message(false).to_vec();
        ku_then.extend_from_slice(&key_update_message(false));
        assert_eq!(parse_server_post_handshake(TlsVersion::Tls13, &ku_then), Err(ProtocolError::KeyUpdateNotLast));
        // TLS 1.2 renegotiation and KeyUpdate.
        assert_eq!(parse_server_post_handshake(TlsVersion::Tls12, &[1, 0, 0, 0]), Err(ProtocolError::Renegotiation));
        assert_eq!(parse_server_post_handshake(TlsVersion::Tls12, &[0, 0, 0, 0]), Err(ProtocolError::Renegotiation));
        assert_eq!(
            parse_server_post_handshake(TlsVersion::Tls12, &key_update_message(false)),
            Err(ProtocolError::KeyUpdateOnTls12)
        );
        // ClientHello under TLS 1.3 is simply unexpected.
        assert_eq!(
            parse_server_post_handshake(TlsVersion::Tls13, &[1, 0, 0, 0]),
            Err(ProtocolError::UnexpectedHandshake { msg_type: HandshakeType::ClientHello })
        );
        // Invalid request_update value.
        assert_eq!(
            parse_server_post_handshake(TlsVersion::Tls13, &[24, 0, 0, 1, 7]),
            Err(ProtocolError::InvalidKeyUpdate)
        );
    }
}
