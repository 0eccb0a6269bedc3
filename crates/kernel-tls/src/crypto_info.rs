//! Key material in the exact binary form the kernel's `TLS_TX`/`TLS_RX`
//! socket options expect.
//!
//! rustls hands out traffic secrets as a [`ConnectionTrafficSecrets`] (an AEAD
//! key plus a 12-byte IV) and a record sequence number. The kernel wants a
//! `tls12_crypto_info_*` structure (the name is historical: the same layout
//! serves TLS 1.3) in which the IV is split in a cipher-specific way:
//!
//! | cipher            | `salt`        | `iv`           | `rec_seq`            |
//! |-------------------|---------------|----------------|----------------------|
//! | AES-128/256-GCM   | IV bytes 0..4 | IV bytes 4..12 | sequence, big-endian |
//! | ChaCha20-Poly1305 | (none)        | IV bytes 0..12 | sequence, big-endian |
//!
//! [`CryptoInfo`] builds that structure, and wipes the key from memory when
//! dropped.
//! It only lays out bytes; handing them to the kernel is [`set_tx`](crate::set_tx)'s
//! and [`set_rx`](crate::set_rx)'s job.
//!
//! ## TLS 1.2 AES-GCM: the explicit nonce
//!
//! In every case but one the kernel forms each record's nonce as rustls
//! does: IV XOR sequence number. The exception is TLS 1.2 AES-GCM, whose
//! 8-byte explicit nonce travels in the record: there the kernel sends the
//! `iv` field as the explicit nonce and *adds one* to it per record, while
//! rustls used `IV[4..12] XOR seq` for the records it protected before the
//! hand-over. Passing `IV[4..12]` unchanged with a sequence number `n > 0`
//! would make the kernel repeat nonces rustls already used (at least the one
//! of the `Finished` record, sequence 0) — fatal for GCM. So for TLS 1.2
//! AES-GCM the `iv` field is `IV[4..12] + n` (big-endian, wrapping): every
//! value rustls used, `IV[4..12] XOR s` for `s < n`, lies strictly within
//! `n` of `IV[4..12]`, and the kernel only counts upwards from `+ n`. (For
//! RX the kernel reads the explicit nonce from each record and ignores the
//! field.) With `n == 0` this is the plain split.

use core::fmt;

use rustls::{ConnectionTrafficSecrets, ProtocolVersion};

use crate::error::Error;
use crate::sys;
use crate::types::{Cipher, TlsVersion};
use crate::uapi;

/// One direction's keys, laid out as a kernel `tls12_crypto_info_*` structure.
///
/// Pass it to [`set_tx`](crate::set_tx)/[`set_rx`](crate::set_rx) (first
/// installation) or [`update_tx`](crate::update_tx)/[`update_rx`](crate::update_rx)
/// (TLS 1.3 key update). The key bytes are zeroed when the value is dropped,
/// and `Debug` never prints them.
pub struct CryptoInfo {
    inner: Inner,
}

enum Inner {
    Aes128Gcm(uapi::Tls12CryptoInfoAesGcm128),
    Aes256Gcm(uapi::Tls12CryptoInfoAesGcm256),
    Chacha20Poly1305(uapi::Tls12CryptoInfoChacha20Poly1305),
}

impl CryptoInfo {
    /// Builds the structure from what rustls extracted for one direction.
    ///
    /// `seq` is the sequence number of the next record in that direction
    /// (from `ExtractedSecrets`, or 0 after a key update).
    ///
    /// Fails with [`Error::UnsupportedCipher`] for a protocol version other
    /// than TLS 1.2/1.3 or a cipher the kernel interface has no structure for.
    pub fn new(version: ProtocolVersion, secrets: &ConnectionTrafficSecrets, seq: u64) -> Result<Self, Error> {
        let tls_version = TlsVersion::from_rustls(version)
            .ok_or(Error::UnsupportedCipher { what: "only TLS 1.2 and TLS 1.3 can be handed to the kernel" })?;
        let (cipher, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (Cipher::Aes128Gcm, key.as_ref(), iv.as_ref()),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (Cipher::Aes256Gcm, key.as_ref(), iv.as_ref()),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (Cipher::Chacha20Poly1305, key.as_ref(), iv.as_ref())
            }
            _ => return Err(Error::UnsupportedCipher { what: "the negotiated AEAD has no kernel TLS equivalent" }),
        };
        let iv: &[u8; 12] =
            iv.try_into().map_err(|_| Error::UnsupportedCipher { what: "the traffic IV is not 12 bytes long" })?;
        Self::from_parts(tls_version, cipher, key, iv, seq)
    }

    /// Builds the structure from raw parts: a key of [`Cipher::key_len`]
    /// bytes, the full 12-byte IV (the split is done here) and the next
    /// record sequence number.
    pub fn from_parts(version: TlsVersion, cipher: Cipher, key: &[u8], iv: &[u8; 12], seq: u64) -> Result<Self, Error> {
        if key.len() != cipher.key_len() {
            return Err(Error::UnsupportedCipher { what: "the key length does not match the cipher" });
        }
        let info = uapi::TlsCryptoInfo { version: version.kernel_value(), cipher_type: cipher.kernel_value() };
        let rec_seq = seq.to_be_bytes();
        let gcm_iv = gcm_explicit_iv(version, iv, seq);
        let inner = match cipher {
            Cipher::Aes128Gcm => {
                let mut s = uapi::Tls12CryptoInfoAesGcm128 { info, rec_seq, iv: gcm_iv, ..Default::default() };
                s.salt.copy_from_slice(&iv[..4]);
                s.key.copy_from_slice(key);
                Inner::Aes128Gcm(s)
            }
            Cipher::Aes256Gcm => {
                let mut s = uapi::Tls12CryptoInfoAesGcm256 { info, rec_seq, iv: gcm_iv, ..Default::default() };
                s.salt.copy_from_slice(&iv[..4]);
                s.key.copy_from_slice(key);
                Inner::Aes256Gcm(s)
            }
            Cipher::Chacha20Poly1305 => {
                let mut s = uapi::Tls12CryptoInfoChacha20Poly1305 { info, rec_seq, ..Default::default() };
                s.iv.copy_from_slice(iv);
                s.key.copy_from_slice(key);
                Inner::Chacha20Poly1305(s)
            }
        };
        Ok(Self { inner })
    }

    /// The protocol version this structure announces.
    pub fn version(&self) -> TlsVersion {
        if self.header().version == uapi::TLS_1_3_VERSION {
            TlsVersion::Tls13
        } else {
            TlsVersion::Tls12
        }
    }

    /// The cipher this structure carries keys for.
    pub fn cipher(&self) -> Cipher {
        match self.inner {
            Inner::Aes128Gcm(_) => Cipher::Aes128Gcm,
            Inner::Aes256Gcm(_) => Cipher::Aes256Gcm,
            Inner::Chacha20Poly1305(_) => Cipher::Chacha20Poly1305,
        }
    }

    fn header(&self) -> &uapi::TlsCryptoInfo {
        match &self.inner {
            Inner::Aes128Gcm(s) => &s.info,
            Inner::Aes256Gcm(s) => &s.info,
            Inner::Chacha20Poly1305(s) => &s.info,
        }
    }

    /// The structure's bytes, exactly as passed to `setsockopt(2)`.
    ///
    /// Contains the key: handle with care.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.inner {
            Inner::Aes128Gcm(s) => sys::struct_bytes(s),
            Inner::Aes256Gcm(s) => sys::struct_bytes(s),
            Inner::Chacha20Poly1305(s) => sys::struct_bytes(s),
        }
    }
}

/// The `iv` field for AES-GCM: `IV[4..12]`, advanced by `seq` for TLS 1.2
/// (see the module docs, "TLS 1.2 AES-GCM: the explicit nonce").
fn gcm_explicit_iv(version: TlsVersion, iv: &[u8; 12], seq: u64) -> [u8; 8] {
    let mut tail = [0u8; 8];
    tail.copy_from_slice(&iv[4..]);
    match version {
        TlsVersion::Tls13 => tail,
        TlsVersion::Tls12 => u64::from_be_bytes(tail).wrapping_add(seq).to_be_bytes(),
    }
}

impl Drop for CryptoInfo {
    fn drop(&mut self) {
        let (key, iv, salt): (&mut [u8], &mut [u8], &mut [u8]) = match &mut self.inner {
            Inner::Aes128Gcm(s) => (&mut s.key, &mut s.iv, &mut s.salt),
            Inner::Aes256Gcm(s) => (&mut s.key, &mut s.iv, &mut s.salt),
            Inner::Chacha20Poly1305(s) => (&mut s.key, &mut s.iv, &mut s.salt),
        };
        for secret in [key, iv, salt] {
            sys::wipe(secret);
        }
    }
}

impl fmt::Debug for CryptoInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CryptoInfo")
            .field("version", &self.version())
            .field("cipher", &self.cipher())
            .field("key", &"<redacted>")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::cipher::{AeadKey, Iv};

    const IV: [u8; 12] = [0xa0, 0xa1, 0xa2, 0xa3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8, 0xb9, 0xba, 0xbb];

    fn key32() -> [u8; 32] {
        let mut k = [0u8; 32];
        for (i, b) in k.iter_mut().enumerate() {
            *b = 0x10 + i as u8;
        }
        k
    }

    fn native(v: u16) -> [u8; 2] {
        v.to_ne_bytes()
    }

    #[test]
    fn sizes_match_linux_tls_h() {
        assert_eq!(size_of::<uapi::Tls12CryptoInfoAesGcm128>(), 40);
        assert_eq!(size_of::<uapi::Tls12CryptoInfoAesGcm256>(), 56);
        assert_eq!(size_of::<uapi::Tls12CryptoInfoChacha20Poly1305>(), 56);
        assert_eq!(Cipher::Aes128Gcm.crypto_info_len(), 40);
        assert_eq!(Cipher::Aes256Gcm.crypto_info_len(), 56);
        assert_eq!(Cipher::Chacha20Poly1305.crypto_info_len(), 56);
    }

    #[test]
    fn constants_match_libc() {
        assert_eq!(uapi::SOL_TLS, libc::SOL_TLS);
        assert_eq!(uapi::TCP_ULP, libc::TCP_ULP);
        assert_eq!(uapi::SOL_TCP, libc::SOL_TCP);
    }

    #[test]
    fn aes128_tls13_layout() {
        // rustls only lets outside code build 32-byte `AeadKey`s, so the
        // 16-byte case goes through `from_parts` (which `new` calls).
        let info =
            CryptoInfo::from_parts(TlsVersion::Tls13, Cipher::Aes128Gcm, &key32()[..16], &IV, 0x0102_0304_0506_0708)
                .unwrap();
        let b = info.as_bytes();
        assert_eq!(b.len(), 40);
        assert_eq!(&b[0..2], &native(0x0304));
        assert_eq!(&b[2..4], &native(51));
        assert_eq!(&b[4..12], &IV[4..12], "iv = IV[4..12]");
        assert_eq!(&b[12..28], &key32()[..16], "key");
        assert_eq!(&b[28..32], &IV[0..4], "salt = IV[0..4]");
        assert_eq!(&b[32..40], &[1, 2, 3, 4, 5, 6, 7, 8], "rec_seq big-endian");
        assert_eq!(info.version(), TlsVersion::Tls13);
        assert_eq!(info.cipher(), Cipher::Aes128Gcm);
    }

    #[test]
    fn aes256_tls12_layout_from_rustls() {
        let secrets = ConnectionTrafficSecrets::Aes256Gcm { key: AeadKey::from(key32()), iv: Iv::new(IV) };
        let info = CryptoInfo::new(ProtocolVersion::TLSv1_2, &secrets, 7).unwrap();
        let b = info.as_bytes();
        assert_eq!(b.len(), 56);
        assert_eq!(&b[0..2], &native(0x0303));
        assert_eq!(&b[2..4], &native(52));
        // TLS 1.2 GCM: explicit nonce continues past what rustls used.
        let explicit = u64::from_be_bytes(IV[4..12].try_into().unwrap());
        assert_eq!(&b[4..12], &(explicit + 7).to_be_bytes());
        assert_eq!(&b[12..44], &key32());
        assert_eq!(&b[44..48], &IV[0..4]);
        assert_eq!(&b[48..56], &7u64.to_be_bytes());
    }

    #[test]
    fn tls12_gcm_seq0_is_plain_split() {
        let info = CryptoInfo::from_parts(TlsVersion::Tls12, Cipher::Aes128Gcm, &[1; 16], &IV, 0).unwrap();
        assert_eq!(&info.as_bytes()[4..12], &IV[4..12]);
        assert_eq!(&info.as_bytes()[28..32], &IV[0..4]);
    }

    /// The kernel's TLS 1.2 AES-GCM explicit nonces (field, field+1, ...)
    /// never repeat one rustls used before the hand-over (IV XOR s, s < n),
    /// including when the IV tail's low bits are all ones or it wraps.
    #[test]
    fn tls12_gcm_kernel_nonces_never_repeat_rustls_nonces() {
        let tails = [0u64, 1, 0xff, 0x1234_5678_9abc_def7, u64::MAX, u64::MAX - 3, 0x8000_0000_0000_0000];
        for &e in &tails {
            for n in 0..40u64 {
                let mut iv = IV;
                iv[4..].copy_from_slice(&e.to_be_bytes());
                let field = u64::from_be_bytes(gcm_explicit_iv(TlsVersion::Tls12, &iv, n));
                let used: Vec<u64> = (0..n).map(|s| e ^ s).collect();
                for k in 0..10_000u64 {
                    let kernel = field.wrapping_add(k);
                    assert!(!used.contains(&kernel), "e={e:#x} n={n} k={k}");
                }
            }
        }
    }

    #[test]
    fn tls13_gcm_iv_is_not_shifted() {
        let info = CryptoInfo::from_parts(TlsVersion::Tls13, Cipher::Aes256Gcm, &key32(), &IV, 99).unwrap();
        assert_eq!(&info.as_bytes()[4..12], &IV[4..12]);
    }

    #[test]
    fn chacha_layout_has_whole_iv_and_no_salt() {
        let secrets = ConnectionTrafficSecrets::Chacha20Poly1305 { key: AeadKey::from(key32()), iv: Iv::new(IV) };
        let info = CryptoInfo::new(ProtocolVersion::TLSv1_3, &secrets, 1).unwrap();
        let b = info.as_bytes();
        assert_eq!(b.len(), 56);
        assert_eq!(&b[0..2], &native(0x0304));
        assert_eq!(&b[2..4], &native(54));
        assert_eq!(&b[4..16], &IV, "iv = whole IV");
        assert_eq!(&b[16..48], &key32());
        assert_eq!(&b[48..56], &1u64.to_be_bytes());
        assert_eq!(info.cipher(), Cipher::Chacha20Poly1305);
    }

    #[test]
    fn rejects_unsupported_versions_and_bad_keys() {
        let secrets = ConnectionTrafficSecrets::Aes256Gcm { key: AeadKey::from(key32()), iv: Iv::new(IV) };
        assert!(matches!(CryptoInfo::new(ProtocolVersion::TLSv1_1, &secrets, 0), Err(Error::UnsupportedCipher { .. })));
        assert!(matches!(
            CryptoInfo::from_parts(TlsVersion::Tls13, Cipher::Aes128Gcm, &[0; 32], &IV, 0),
            Err(Error::UnsupportedCipher { .. })
        ));
    }

    #[test]
    fn debug_redacts_key() {
        let info = CryptoInfo::from_parts(TlsVersion::Tls12, Cipher::Aes256Gcm, &key32(), &IV, 0).unwrap();
        let s = format!("{info:?}");
        assert!(s.contains("redacted"));
        assert!(!s.contains("16, 17"));
    }
}
