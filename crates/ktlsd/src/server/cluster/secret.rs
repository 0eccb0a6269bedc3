//! The fleet's secret (`[cluster] secret_file`: the same 32 or more random bytes on
//! every member) and what is derived from it with HKDF-SHA256: the key that seals
//! every record the members keep in the store, and the secret of QUIC's stateless
//! reset and Retry token keys. Not the records' meaning (`tickets`), nor the store.

use std::path::Path;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use aws_lc_rs::hkdf;
use aws_lc_rs::rand::{SecureRandom, SystemRandom};

/// The fewest bytes a secret file may hold.
pub const MIN_SECRET: usize = 32;
/// The first bytes of a sealed record: its format.
const SEALED_V1: &[u8] = b"ktlsd-sealed-1\n";

/// Why the secret file is refused.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("[cluster] secret_file {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error(
        "[cluster] secret_file {path}: {len} bytes, expected at least {MIN_SECRET} random bytes; make one with `openssl rand 32 > {path}` and copy it to every member"
    )]
    Short { path: String, len: usize },
}

/// Why a sealed record is not used.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("not a sealed record")]
    Format,
    #[error("it does not open with this member's secret_file (another fleet's, or altered)")]
    Forged,
}

/// The fleet's secret, read once.
pub struct Secret {
    seal: LessSafeKey,
    quic: [u8; 32],
    peers: [u8; 32],
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// Reads `path`; an error names it and says what to do.
    pub fn read(path: &Path) -> Result<Secret, SecretError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|error| SecretError::Read { path: shown.clone(), error })?;
        if bytes.len() < MIN_SECRET {
            return Err(SecretError::Short { path: shown, len: bytes.len() });
        }
        Ok(Secret::from_bytes(&bytes))
    }

    /// A secret of the given bytes, for tests.
    #[cfg(test)]
    pub fn from_test_bytes(bytes: &[u8]) -> Secret {
        Secret::from_bytes(bytes)
    }

    fn from_bytes(bytes: &[u8]) -> Secret {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"ktlsd cluster").extract(bytes);
        let mut seal = [0u8; 32];
        let mut quic = [0u8; 32];
        // 32 bytes is HKDF-SHA256's own output length: expanding cannot fail.
        let _ = prk.expand(&[b"store records"], hkdf::HKDF_SHA256).and_then(|okm| okm.fill(&mut seal));
        let _ = prk.expand(&[b"quic endpoint"], hkdf::HKDF_SHA256).and_then(|okm| okm.fill(&mut quic));
        let mut peers = [0u8; 32];
        let _ = prk.expand(&[b"cache peers"], hkdf::HKDF_SHA256).and_then(|okm| okm.fill(&mut peers));
        // A 32-byte key is what AES-256-GCM takes: `new` cannot refuse it.
        let seal = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &seal).unwrap_or_else(|_| unreachable!()));
        Secret { seal, quic, peers }
    }

    /// The key cache peers' requests are authenticated with, the same on every member.
    pub fn peers(&self) -> &[u8; 32] {
        &self.peers
    }

    /// The secret QUIC's endpoint keys are derived from, the same on every member.
    pub fn quic(&self) -> &[u8; 32] {
        &self.quic
    }

    /// `plain` sealed for the record `name` (AES-256-GCM, the name authenticated,
    /// so a record copied under another name does not open); `None` only when the
    /// system's random source fails.
    pub fn seal(&self, name: &str, plain: &[u8]) -> Option<Vec<u8>> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).ok()?;
        let mut body = plain.to_vec();
        self.seal
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(name.as_bytes()), &mut body)
            .ok()?;
        Some([SEALED_V1, &nonce[..], &body].concat())
    }

    /// The plain bytes of a record [`Secret::seal`] made for `name`.
    pub fn open(&self, name: &str, sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
        let rest = sealed.strip_prefix(SEALED_V1).ok_or(OpenError::Format)?;
        if rest.len() < NONCE_LEN {
            return Err(OpenError::Format);
        }
        let (nonce, body) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| OpenError::Format)?;
        let mut body = body.to_vec();
        let plain =
            self.seal.open_in_place(nonce, Aad::from(name.as_bytes()), &mut body).map_err(|_| OpenError::Forged)?;
        Ok(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_open_only_whole_under_their_name_and_secret() {
        let a = Secret::from_bytes(&[1; 32]);
        let same = Secret::from_bytes(&[1; 32]);
        let other = Secret::from_bytes(&[2; 32]);
        let sealed = a.seal("/ktlsd/tickets", b"keys").unwrap();
        assert_eq!(same.open("/ktlsd/tickets", &sealed).as_deref(), Ok(&b"keys"[..]));
        assert_eq!(other.open("/ktlsd/tickets", &sealed), Err(OpenError::Forged));
        assert_eq!(a.open("/ktlsd/other", &sealed), Err(OpenError::Forged));
        assert_ne!(a.seal("n", b"x"), a.seal("n", b"x"), "a fresh nonce each time");
        for i in [SEALED_V1.len(), SEALED_V1.len() + 12, sealed.len() - 1] {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert_eq!(a.open("/ktlsd/tickets", &bad), Err(OpenError::Forged), "byte {i}");
        }
        for bad in [&b""[..], b"garbage", &sealed[..SEALED_V1.len() + 3]] {
            assert_eq!(a.open("/ktlsd/tickets", bad), Err(OpenError::Format));
        }
        assert_eq!(a.quic(), same.quic());
        assert_ne!(a.quic(), other.quic());
        assert_eq!(a.peers(), same.peers());
        assert_ne!(a.peers(), other.peers());
        assert_ne!(a.peers(), a.quic());
    }

    #[test]
    fn a_short_or_missing_file_is_refused_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short.key");
        std::fs::write(&short, [7; 31]).unwrap();
        let e = Secret::read(&short).unwrap_err().to_string();
        assert!(e.contains("short.key") && e.contains("31 bytes") && e.contains("openssl rand 32"), "{e}");
        let e = Secret::read(&dir.path().join("missing.key")).unwrap_err().to_string();
        assert!(e.contains("missing.key"), "{e}");
        std::fs::write(&short, [7; 32]).unwrap();
        assert!(Secret::read(&short).is_ok());
    }
}
