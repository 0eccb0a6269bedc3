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

    /// A warning-level alert with the given description.
    pub fn warning(description: AlertDescription) -> Self {
        Alert { level: Alert::LEVEL_WARNING, description }
    }

    /// Parses an alert record's payload, which must be exactly two bytes.
    pub fn parse(payload: &[u8]) -> Result<Self, ProtocolError> {
        match *payload {
            [level, description] => Ok(Alert { level, description: AlertDescription::from(description) }),
            [] => Err(ProtocolError::EmptyAlert),
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

/// What the post-handshake handshake messages completed by one record ask of a server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PostHandshakeOutcome {
    /// A TLS 1.3 `KeyUpdate` ended the record: its `update_requested`.
    pub key_update: Option<bool>,
    /// A TLS 1.2 `ClientHello` asked for renegotiation: refuse it with a
    /// warning-level `no_renegotiation` alert and go on (RFC 5746 §4.4,
    /// RFC 5246 §7.2.2).
    pub renegotiation: bool,
}

/// The kind of the post-handshake message being received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pending {
    KeyUpdate,
    ClientHello,
}

/// Reassembles the handshake messages a client sends after the handshake,
/// which may be split over several records (RFC 8446 §5.1), with a fixed
/// amount of memory: a message header, and one byte of a `KeyUpdate` body.
/// The body of a renegotiating `ClientHello` is skipped, not kept.
///
/// Not a general handshake parser: any message other than TLS 1.3
/// `KeyUpdate` and TLS 1.2 `ClientHello` is refused as soon as its type is
/// known.
#[derive(Clone, Debug, Default)]
pub struct PostHandshake {
    header: [u8; 4],
    header_len: usize,
    /// The message whose body is being received, once its header is whole.
    pending: Option<Pending>,
    /// Body bytes still to come.
    left: usize,
    key_update_byte: u8,
}

impl PostHandshake {
    /// Whether a message has begun and not ended: no record of another type
    /// may come before the rest of it (RFC 8446 §5.1).
    pub fn in_message(&self) -> bool {
        self.header_len > 0
    }

    /// Takes the payload of one handshake record.
    ///
    /// # Errors
    /// `MalformedHandshake` for an empty record or a `KeyUpdate` whose length
    /// is not 1; `KeyUpdateNotLast` when anything follows a `KeyUpdate` in its
    /// record; `KeyUpdateOnTls12`, `Renegotiation` (a client's `HelloRequest`),
    /// `UnexpectedHandshake` for other messages; `InvalidKeyUpdate`.
    pub fn push(&mut self, version: TlsVersion, mut payload: &[u8]) -> Result<PostHandshakeOutcome, ProtocolError> {
        if payload.is_empty() {
            // RFC 8446 §5.1 forbids zero-length handshake fragments.
            return Err(ProtocolError::MalformedHandshake);
        }
        let mut out = PostHandshakeOutcome::default();
        while !payload.is_empty() {
            if out.key_update.is_some() {
                // Key changes align with record boundaries (RFC 8446 §5.1).
                return Err(ProtocolError::KeyUpdateNotLast);
            }
            let pending = match self.pending {
                Some(p) => p,
                None => {
                    let take = (4 - self.header_len).min(payload.len());
                    self.header[self.header_len..self.header_len + take].copy_from_slice(&payload[..take]);
                    self.header_len += take;
                    payload = &payload[take..];
                    if self.header_len < 4 {
                        break;
                    }
                    let [typ, a, b, c] = self.header;
                    self.left = u32::from_be_bytes([0, a, b, c]) as usize;
                    let pending = match (version, HandshakeType::from(typ)) {
                        (TlsVersion::Tls13, HandshakeType::KeyUpdate) if self.left == 1 => Pending::KeyUpdate,
                        (TlsVersion::Tls13, HandshakeType::KeyUpdate) => return Err(ProtocolError::MalformedHandshake),
                        (TlsVersion::Tls12, HandshakeType::KeyUpdate) => return Err(ProtocolError::KeyUpdateOnTls12),
                        (TlsVersion::Tls12, HandshakeType::ClientHello) => Pending::ClientHello,
                        (TlsVersion::Tls12, HandshakeType::HelloRequest) => return Err(ProtocolError::Renegotiation),
                        (_, msg_type) => return Err(ProtocolError::UnexpectedHandshake { msg_type }),
                    };
                    self.pending = Some(pending);
                    pending
                }
            };
            let take = self.left.min(payload.len());
            if pending == Pending::KeyUpdate && take > 0 {
                self.key_update_byte = payload[0];
            }
            self.left -= take;
            payload = &payload[take..];
            if self.left > 0 {
                break;
            }
            match pending {
                Pending::KeyUpdate => out.key_update = Some(parse_key_update(&[self.key_update_byte])?),
                Pending::ClientHello => out.renegotiation = true,
            }
            (self.header_len, self.pending) = (0, None);
        }
        Ok(out)
    }
}

/// Parses a handshake record for a server that has finished its handshake:
/// the only acceptable content is TLS 1.3 `KeyUpdate`, whole, as the last
/// message of the record (RFC 8446 §5.1: key changes align with record
/// boundaries). For messages split over records, see [`PostHandshake`].
///
/// Returns `update_requested` of that `KeyUpdate`.
///
/// # Errors
/// `Renegotiation` for TLS 1.2 `ClientHello`/`HelloRequest`,
/// `KeyUpdateOnTls12`, `KeyUpdateNotLast`, `InvalidKeyUpdate`,
/// `UnexpectedHandshake` for anything else, `MalformedHandshake` for bad framing.
pub fn parse_server_post_handshake(version: TlsVersion, payload: &[u8]) -> Result<bool, ProtocolError> {
    let mut messages = PostHandshake::default();
    let out = messages.push(version, payload)?;
    if out.renegotiation {
        return Err(ProtocolError::Renegotiation);
    }
    match out.key_update {
        Some(requested) if !messages.in_message() => Ok(requested),
        _ => Err(ProtocolError::MalformedHandshake),
    }
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
        // Truncated header, length past the end, empty record.
        for bad in [&[24u8, 0, 0][..], &[24, 0, 0, 2, 0], &[24, 0, 0, 1], &[]] {
            assert_eq!(parse_server_post_handshake(TlsVersion::Tls13, bad), Err(ProtocolError::MalformedHandshake));
        }
        assert_eq!(Alert::parse(&[]), Err(ProtocolError::EmptyAlert));
        assert_eq!(ProtocolError::EmptyAlert.alert(), AlertDescription::UnexpectedMessage);
    }

    /// RFC 8446 §5.1: a message may be split over records, however finely.
    #[test]
    fn key_update_split_over_records() {
        let ku = key_update_message(true);
        for cut in 1..ku.len() {
            let mut p = PostHandshake::default();
            assert_eq!(p.push(TlsVersion::Tls13, &ku[..cut]), Ok(PostHandshakeOutcome::default()));
            assert!(p.in_message());
            let out = p.push(TlsVersion::Tls13, &ku[cut..]).unwrap();
            assert_eq!(out.key_update, Some(true), "cut at {cut}");
            assert!(!p.in_message());
        }
        // One byte per record, then a second KeyUpdate whole.
        let mut p = PostHandshake::default();
        for (i, b) in ku.iter().enumerate() {
            let out = p.push(TlsVersion::Tls13, &[*b]).unwrap();
            assert_eq!(out.key_update.is_some(), i == ku.len() - 1);
        }
        assert_eq!(p.push(TlsVersion::Tls13, &key_update_message(false)).unwrap().key_update, Some(false));
        // The end of a split KeyUpdate must still end its record.
        let mut p = PostHandshake::default();
        p.push(TlsVersion::Tls13, &ku[..2]).unwrap();
        let tail = [&ku[2..], &[24u8][..]].concat();
        assert_eq!(p.push(TlsVersion::Tls13, &tail), Err(ProtocolError::KeyUpdateNotLast));
    }

    /// A TLS 1.2 ClientHello is skipped, however long and however split, and
    /// reported once whole; several can follow one another.
    #[test]
    fn renegotiation_client_hello_is_skipped() {
        let mut hello = vec![1, 0, 0x40, 0];
        hello.extend(std::iter::repeat_n(0xab, 0x4000));
        let mut p = PostHandshake::default();
        let mut seen = 0;
        for chunk in hello.chunks(1000) {
            seen += usize::from(p.push(TlsVersion::Tls12, chunk).unwrap().renegotiation);
        }
        assert_eq!(seen, 1);
        assert!(!p.in_message());
        let two = [&[1u8, 0, 0, 0][..], &[1, 0, 0, 1, 9]].concat();
        assert!(p.push(TlsVersion::Tls12, &two).unwrap().renegotiation);
        assert_eq!(parse_server_post_handshake(TlsVersion::Tls12, &two), Err(ProtocolError::Renegotiation));
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
