//! Protection of single TLS records in user space: AEAD seal and open, in place,
//! with the traffic keys rustls hands over once the handshake is done (the same
//! keys the kernel gets under kTLS).
//!
//! This is only the cryptographic framing of RFC 8446 §5.2 (TLS 1.3) and RFC 5246
//! §6.2.3.3 / RFC 7905 (TLS 1.2 AES-GCM / ChaCha20-Poly1305): nonces, additional
//! data, the inner content type and its padding, length limits. It keeps no
//! buffers and makes no policy: what a control record means, when keys change and
//! which alert to send are [`super::UserspaceTls`]'s business.
//!
//! Sealing writes into a slot the caller has laid out with [`RecordKey::prefix_len`]
//! bytes before the plaintext and [`RecordKey::suffix_len`] after it, so a body
//! read straight into the slot is encrypted where it lies: no copy in user space.

use std::fmt;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM, CHACHA20_POLY1305, NONCE_LEN};
use kernel_tls::TlsVersion;
use rustls::{AlertDescription, ConnectionTrafficSecrets, ContentType};

use crate::tls::sizing::MAX_RECORD;

pub use crate::tls::RECORD_HEADER_LEN as HEADER_LEN;
const TAG_LEN: usize = 16;
/// TLS 1.2 AES-GCM carries the last 8 bytes of each record's nonce in clear.
const EXPLICIT_NONCE_LEN: usize = 8;
/// Largest ciphertext a peer may send (RFC 8446 §5.2; RFC 5246 §6.2.3 allows 2048).
const MAX_CIPHERTEXT_13: usize = MAX_RECORD + 256;
const MAX_CIPHERTEXT_12: usize = MAX_RECORD + 2048;
/// Largest record on the wire, header included: what an input buffer must hold.
pub const MAX_WIRE_RECORD: usize = HEADER_LEN + MAX_CIPHERTEXT_12;

/// Why a received record was refused, with the alert that tells the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenError {
    /// Authentication failed: a forged, corrupted or replayed record, or one
    /// protected with another key.
    BadRecordMac,
    /// A length beyond the limits of the version.
    RecordOverflow,
    /// A record type that cannot arrive here (TLS 1.3 outer type other than
    /// application_data, a TLS 1.3 record with no inner type, an unknown type).
    UnexpectedMessage,
}

impl OpenError {
    pub fn alert(self) -> AlertDescription {
        match self {
            OpenError::BadRecordMac => AlertDescription::BadRecordMac,
            OpenError::RecordOverflow => AlertDescription::RecordOverflow,
            OpenError::UnexpectedMessage => AlertDescription::UnexpectedMessage,
        }
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpenError::BadRecordMac => "a record failed authentication",
            OpenError::RecordOverflow => "a record longer than the protocol allows",
            OpenError::UnexpectedMessage => "a record of a type that cannot arrive after the handshake",
        })
    }
}

/// rustls handed over keys of a cipher this layer does not implement.
#[derive(Debug)]
pub struct UnsupportedCipher;

/// One direction's traffic key and record sequence number.
pub struct RecordKey {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
    version: TlsVersion,
    /// TLS 1.2 AES-GCM: 8 nonce bytes travel in each record.
    explicit_nonce: bool,
}

impl RecordKey {
    /// The key of `secrets` for `version`, whose next record has sequence number `seq`.
    pub fn new(
        version: TlsVersion,
        secrets: &ConnectionTrafficSecrets,
        seq: u64,
    ) -> Result<RecordKey, UnsupportedCipher> {
        let (alg, key, iv, gcm) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&AES_128_GCM, key.as_ref(), iv.as_ref(), true),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&AES_256_GCM, key.as_ref(), iv.as_ref(), true),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&CHACHA20_POLY1305, key.as_ref(), iv.as_ref(), false)
            }
            _ => return Err(UnsupportedCipher),
        };
        let key = UnboundKey::new(alg, key).map_err(|_| UnsupportedCipher)?;
        let iv: [u8; NONCE_LEN] = iv.try_into().map_err(|_| UnsupportedCipher)?;
        let explicit_nonce = gcm && version == TlsVersion::Tls12;
        Ok(RecordKey { key: LessSafeKey::new(key), iv, seq, version, explicit_nonce })
    }

    /// Records protected with this key so far (the next record's sequence number).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Bytes before a record's plaintext: header, and TLS 1.2 AES-GCM's explicit nonce.
    pub fn prefix_len(&self) -> usize {
        prefix_len(self.explicit_nonce)
    }

    /// Bytes after a record's plaintext: TLS 1.3's inner content type, and the tag.
    pub fn suffix_len(&self) -> usize {
        suffix_len(self.version)
    }

    /// The nonce of the record with sequence number `seq`: the IV XOR the number
    /// (RFC 8446 §5.3; rustls does the same for TLS 1.2, whose explicit part is then
    /// the last 8 bytes).
    fn nonce(&self, seq: u64) -> [u8; NONCE_LEN] {
        let mut nonce = self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
            *n ^= s;
        }
        nonce
    }

    /// TLS 1.2's additional data: sequence number, type, the record's version (as
    /// received when opening, so that a changed version fails authentication as RFC
    /// 5246 section 6.2.3.3 has it), plaintext length.
    fn aad12(seq: u64, typ: u8, version: [u8; 2], len: usize) -> [u8; 13] {
        let mut aad = [0u8; 13];
        aad[..8].copy_from_slice(&seq.to_be_bytes());
        aad[8] = typ;
        aad[9..11].copy_from_slice(&version);
        aad[11..].copy_from_slice(&(len as u16).to_be_bytes());
        aad
    }

    /// Seals the record laid out in `record`: `prefix_len()` bytes of room, then
    /// `len` bytes of plaintext, then `suffix_len()` bytes of room. `len` is at
    /// most [`MAX_RECORD`]; `record` is exactly that long.
    pub fn seal(&mut self, typ: ContentType, record: &mut [u8], len: usize) {
        debug_assert!(len <= MAX_RECORD && record.len() == self.prefix_len() + len + self.suffix_len());
        let seq = self.seq;
        self.seq += 1;
        let nonce = self.nonce(seq);
        let prefix = self.prefix_len();
        let wire_len = record.len() - HEADER_LEN;
        let (outer, aad12);
        let (body, aad): (&mut [u8], Aad<&[u8]>) = if self.version == TlsVersion::Tls13 {
            record[prefix + len] = u8::from(typ);
            outer = header(ContentType::ApplicationData, wire_len);
            record[..HEADER_LEN].copy_from_slice(&outer);
            let (_, rest) = record.split_at_mut(HEADER_LEN);
            (&mut rest[..len + 1], Aad::from(&outer[..]))
        } else {
            record[..HEADER_LEN].copy_from_slice(&header(typ, wire_len));
            if self.explicit_nonce {
                record[HEADER_LEN..prefix].copy_from_slice(&nonce[4..]);
            }
            aad12 = Self::aad12(seq, u8::from(typ), [3, 3], len);
            (&mut record[prefix..prefix + len], Aad::from(&aad12[..]))
        };
        let body_len = body.len();
        // Sealing fails only for inputs beyond the cipher's limits, which a record never reaches.
        let tag = match self.key.seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), aad, body) {
            Ok(tag) => tag,
            Err(_) => unreachable!("AEAD seal of a {body_len}-byte record failed"),
        };
        let at = prefix + body_len;
        record[at..at + TAG_LEN].copy_from_slice(tag.as_ref());
    }

    /// Opens the whole record `record` (header included) in place; returns its
    /// content type and where its plaintext lies in `record`.
    pub fn open(&mut self, record: &mut [u8]) -> Result<(ContentType, std::ops::Range<usize>), OpenError> {
        let (typ, len) = parse_header(record).ok_or(OpenError::UnexpectedMessage)?;
        if len > max_ciphertext(self.version) {
            return Err(OpenError::RecordOverflow);
        }
        debug_assert_eq!(record.len(), HEADER_LEN + len);
        let seq = self.seq;
        self.seq = self.seq.checked_add(1).ok_or(OpenError::BadRecordMac)?;
        let (header_bytes, body) = record.split_at_mut(HEADER_LEN);
        if self.version == TlsVersion::Tls13 {
            // RFC 8446 §5: after the handshake every protected record is application_data outside.
            if typ != ContentType::ApplicationData {
                return Err(OpenError::UnexpectedMessage);
            }
            let nonce = Nonce::assume_unique_for_key(self.nonce(seq));
            let plain = self
                .key
                .open_in_place(nonce, Aad::from(&header_bytes[..]), body)
                .map_err(|_| OpenError::BadRecordMac)?;
            // The inner type is the last non-zero byte; zeros after it are padding.
            let inner = plain.iter().rposition(|&b| b != 0).ok_or(OpenError::UnexpectedMessage)?;
            if inner > MAX_RECORD {
                return Err(OpenError::RecordOverflow);
            }
            Ok((ContentType::from(plain[inner]), HEADER_LEN..HEADER_LEN + inner))
        } else {
            let explicit = if self.explicit_nonce { EXPLICIT_NONCE_LEN } else { 0 };
            let plain_len = len.checked_sub(explicit + TAG_LEN).ok_or(OpenError::BadRecordMac)?;
            if plain_len > MAX_RECORD {
                return Err(OpenError::RecordOverflow);
            }
            let nonce = if self.explicit_nonce {
                let mut n = [0u8; NONCE_LEN];
                n[..4].copy_from_slice(&self.iv[..4]);
                n[4..].copy_from_slice(&body[..EXPLICIT_NONCE_LEN]);
                n
            } else {
                self.nonce(seq)
            };
            let aad = Self::aad12(seq, u8::from(typ), [header_bytes[1], header_bytes[2]], plain_len);
            self.key
                .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(&aad[..]), &mut body[explicit..])
                .map_err(|_| OpenError::BadRecordMac)?;
            let start = HEADER_LEN + explicit;
            Ok((typ, start..start + plain_len))
        }
    }
}

fn prefix_len(explicit_nonce: bool) -> usize {
    HEADER_LEN + if explicit_nonce { EXPLICIT_NONCE_LEN } else { 0 }
}

fn suffix_len(version: TlsVersion) -> usize {
    TAG_LEN + usize::from(version == TlsVersion::Tls13)
}

/// Bytes each record adds to its plaintext under `version` (with AES-GCM or
/// not): the same for both record layers, since the kernel frames records alike.
pub fn expansion(version: TlsVersion, gcm: bool) -> usize {
    prefix_len(gcm && version == TlsVersion::Tls12) + suffix_len(version)
}

fn header(typ: ContentType, len: usize) -> [u8; HEADER_LEN] {
    let [hi, lo] = (len as u16).to_be_bytes();
    [u8::from(typ), 3, 3, hi, lo]
}

/// The type and body length of the record that starts `input`, once its header is
/// there; `None` for a header that cannot start a record (unknown type, a major
/// version other than 3).
fn parse_header(input: &[u8]) -> Option<(ContentType, usize)> {
    let h: &[u8; HEADER_LEN] = input.get(..HEADER_LEN)?.try_into().ok()?;
    let typ = ContentType::from(h[0]);
    let known = matches!(
        typ,
        ContentType::ApplicationData | ContentType::Alert | ContentType::Handshake | ContentType::ChangeCipherSpec
    );
    (known && h[1] == 3).then_some((typ, usize::from(u16::from_be_bytes([h[3], h[4]]))))
}

/// The length of the record starting `input` once its header is complete (body
/// included), or the error that refuses it before its body arrives.
pub fn record_len(input: &[u8], version: TlsVersion) -> Option<Result<usize, OpenError>> {
    if input.len() < HEADER_LEN {
        return None;
    }
    Some(match parse_header(input) {
        None => Err(OpenError::UnexpectedMessage),
        Some((_, len)) if len > max_ciphertext(version) => Err(OpenError::RecordOverflow),
        Some((_, len)) => Ok(HEADER_LEN + len),
    })
}

fn max_ciphertext(version: TlsVersion) -> usize {
    match version {
        TlsVersion::Tls13 => MAX_CIPHERTEXT_13,
        _ => MAX_CIPHERTEXT_12,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(version: TlsVersion, chacha: bool) -> RecordKey {
        let (key, iv) = (rustls::crypto::cipher::AeadKey::from([7u8; 32]), rustls::crypto::cipher::Iv::new([9u8; 12]));
        let secrets = if chacha {
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv }
        } else {
            ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        };
        RecordKey::new(version, &secrets, 0).expect("key")
    }

    /// A record whose header bytes were changed on the way never opens: TLS 1.3
    /// authenticates the whole header, TLS 1.2 its type, version and length (a
    /// changed TLS 1.2 version once went unnoticed: found by the `tls_records` fuzz target).
    #[test]
    fn a_changed_header_fails_authentication() {
        for (version, chacha) in [
            (TlsVersion::Tls12, false),
            (TlsVersion::Tls12, true),
            (TlsVersion::Tls13, false),
            (TlsVersion::Tls13, true),
        ] {
            let mut tx = key(version, chacha);
            let mut rec = vec![0u8; tx.prefix_len() + 5 + tx.suffix_len()];
            rec[tx.prefix_len()..tx.prefix_len() + 5].copy_from_slice(b"hello");
            tx.seal(ContentType::ApplicationData, &mut rec, 5);
            let mut opened = rec.clone();
            let (typ, plain) = key(version, chacha).open(&mut opened).expect("intact record");
            assert_eq!((typ, &opened[plain]), (ContentType::ApplicationData, &b"hello"[..]));
            for version_minor in [0x01, 0x83] {
                let mut changed = rec.clone();
                changed[2] = version_minor;
                assert_eq!(
                    key(version, chacha).open(&mut changed).map(|(t, _)| t),
                    Err(OpenError::BadRecordMac),
                    "{version:?} chacha={chacha}: version 3.{version_minor}"
                );
            }
        }
    }

    /// RFC 8446 §5.2 and RFC 5246 §6.2.3.3 / RFC 7905: header 5, tag 16, plus TLS
    /// 1.3's content type or TLS 1.2 AES-GCM's 8-byte explicit nonce.
    #[test]
    fn expansion_per_version_and_cipher() {
        for (version, gcm, want) in [
            (TlsVersion::Tls13, true, 22),
            (TlsVersion::Tls13, false, 22),
            (TlsVersion::Tls12, true, 29),
            (TlsVersion::Tls12, false, 21),
        ] {
            assert_eq!(expansion(version, gcm), want, "{version:?} gcm={gcm}");
        }
    }
}
