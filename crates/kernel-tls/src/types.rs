//! The vocabulary every other module shares: TLS protocol versions, the
//! AEAD ciphers the kernel runs, and the two directions of a connection.
//!
//! Plain values with their kernel and rustls spellings; no I/O and no
//! errors, so any module (errors included) can depend on this one without
//! this one depending back.

use core::fmt;
use core::mem::size_of;

use rustls::{CipherSuite, ProtocolVersion};

use crate::uapi;

/// A TLS protocol version the kernel can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TlsVersion {
    /// TLS 1.2.
    Tls12,
    /// TLS 1.3.
    Tls13,
}

impl TlsVersion {
    /// Both versions, oldest first.
    pub const ALL: [TlsVersion; 2] = [TlsVersion::Tls12, TlsVersion::Tls13];

    /// Maps a rustls protocol version; `None` for anything but TLS 1.2/1.3.
    pub fn from_rustls(version: ProtocolVersion) -> Option<Self> {
        match version {
            ProtocolVersion::TLSv1_2 => Some(TlsVersion::Tls12),
            ProtocolVersion::TLSv1_3 => Some(TlsVersion::Tls13),
            _ => None,
        }
    }

    /// The rustls protocol version.
    pub fn to_rustls(self) -> ProtocolVersion {
        match self {
            TlsVersion::Tls12 => ProtocolVersion::TLSv1_2,
            TlsVersion::Tls13 => ProtocolVersion::TLSv1_3,
        }
    }

    /// The rustls version a configuration enables to offer this one.
    pub fn supported(self) -> &'static rustls::SupportedProtocolVersion {
        match self {
            TlsVersion::Tls12 => &rustls::version::TLS12,
            TlsVersion::Tls13 => &rustls::version::TLS13,
        }
    }

    /// The value of `tls_crypto_info.version` (`TLS_1_2_VERSION`/`TLS_1_3_VERSION`).
    pub fn kernel_value(self) -> u16 {
        match self {
            TlsVersion::Tls12 => uapi::TLS_1_2_VERSION,
            TlsVersion::Tls13 => uapi::TLS_1_3_VERSION,
        }
    }

    /// `"TLS1.2"` or `"TLS1.3"`.
    pub fn name(self) -> &'static str {
        match self {
            TlsVersion::Tls12 => "TLS1.2",
            TlsVersion::Tls13 => "TLS1.3",
        }
    }
}

impl fmt::Display for TlsVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An AEAD the kernel can run for TLS records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cipher {
    /// AES-128-GCM (`TLS_CIPHER_AES_GCM_128`).
    Aes128Gcm,
    /// AES-256-GCM (`TLS_CIPHER_AES_GCM_256`).
    Aes256Gcm,
    /// ChaCha20-Poly1305 (`TLS_CIPHER_CHACHA20_POLY1305`).
    Chacha20Poly1305,
}

impl Cipher {
    /// All ciphers this crate can hand to the kernel.
    pub const ALL: [Cipher; 3] = [Cipher::Aes128Gcm, Cipher::Aes256Gcm, Cipher::Chacha20Poly1305];

    /// The value of `tls_crypto_info.cipher_type`.
    pub fn kernel_value(self) -> u16 {
        match self {
            Cipher::Aes128Gcm => uapi::TLS_CIPHER_AES_GCM_128,
            Cipher::Aes256Gcm => uapi::TLS_CIPHER_AES_GCM_256,
            Cipher::Chacha20Poly1305 => uapi::TLS_CIPHER_CHACHA20_POLY1305,
        }
    }

    /// Key length in bytes.
    pub fn key_len(self) -> usize {
        match self {
            Cipher::Aes128Gcm => 16,
            Cipher::Aes256Gcm | Cipher::Chacha20Poly1305 => 32,
        }
    }

    /// Size of the kernel structure for this cipher (40 or 56 bytes).
    pub fn crypto_info_len(self) -> usize {
        match self {
            Cipher::Aes128Gcm => size_of::<uapi::Tls12CryptoInfoAesGcm128>(),
            Cipher::Aes256Gcm => size_of::<uapi::Tls12CryptoInfoAesGcm256>(),
            Cipher::Chacha20Poly1305 => size_of::<uapi::Tls12CryptoInfoChacha20Poly1305>(),
        }
    }

    /// Short display name: `"AES-128-GCM"`, `"AES-256-GCM"`, `"CHACHA20-POLY1305"`.
    pub fn name(self) -> &'static str {
        match self {
            Cipher::Aes128Gcm => "AES-128-GCM",
            Cipher::Aes256Gcm => "AES-256-GCM",
            Cipher::Chacha20Poly1305 => "CHACHA20-POLY1305",
        }
    }

    /// The kernel cipher a rustls cipher suite uses, if it has one.
    ///
    /// Covers the TLS 1.3 suites and the TLS 1.2 ECDHE AEAD suites rustls
    /// implements; returns `None` for anything else.
    pub fn for_suite(suite: CipherSuite) -> Option<Cipher> {
        match suite {
            CipherSuite::TLS13_AES_128_GCM_SHA256
            | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
            | CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => Some(Cipher::Aes128Gcm),
            CipherSuite::TLS13_AES_256_GCM_SHA384
            | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
            | CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => Some(Cipher::Aes256Gcm),
            CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
            | CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
            | CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => Some(Cipher::Chacha20Poly1305),
            _ => None,
        }
    }
}

impl fmt::Display for Cipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which half of the connection an operation concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Transmit (`TLS_TX`).
    Tx,
    /// Receive (`TLS_RX`).
    Rx,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Tx => "TX",
            Direction::Rx => "RX",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suite_mapping() {
        assert_eq!(Cipher::for_suite(CipherSuite::TLS13_AES_256_GCM_SHA384), Some(Cipher::Aes256Gcm));
        assert_eq!(
            Cipher::for_suite(CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256),
            Some(Cipher::Chacha20Poly1305)
        );
        assert_eq!(Cipher::for_suite(CipherSuite::TLS_RSA_WITH_AES_128_GCM_SHA256), None);
    }

    #[test]
    fn versions_round_trip_through_rustls() {
        for v in TlsVersion::ALL {
            assert_eq!(TlsVersion::from_rustls(v.to_rustls()), Some(v));
        }
        assert_eq!(TlsVersion::from_rustls(ProtocolVersion::TLSv1_1), None);
        for v in TlsVersion::ALL {
            assert_eq!(v.supported().version, v.to_rustls());
        }
    }
}
