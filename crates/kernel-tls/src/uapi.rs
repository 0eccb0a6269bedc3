//! Constants and structures of the Linux kTLS user-space interface.
//!
//! This module mirrors `include/uapi/linux/tls.h` (and the handful of TCP
//! and socket constants kTLS needs) so the rest of the crate does not depend
//! on which of them a given `libc` release happens to export. Everything here
//! is plain data: no system calls, no `unsafe`.
//! It is internal: callers use the typed API ([`Cipher`](crate::Cipher),
//! [`TlsVersion`](crate::TlsVersion), [`CryptoInfo`](crate::CryptoInfo)).
//!
//! The `#[repr(C)]` structures are laid out byte for byte like their C
//! namesakes; compile-time assertions below pin their sizes (40, 56 and
//! 56 bytes) so a mistake cannot reach the kernel.

use core::mem::size_of;

/// `setsockopt(2)` level for TLS options (`SOL_TLS`).
pub const SOL_TLS: libc::c_int = 282;
/// `setsockopt(2)` level for TCP options (`SOL_TCP`, equal to `IPPROTO_TCP`).
pub const SOL_TCP: libc::c_int = libc::IPPROTO_TCP;
/// TCP option that attaches an upper-layer protocol such as `"tls"` (`TCP_ULP`).
pub const TCP_ULP: libc::c_int = 31;

/// `SOL_TLS` option: install transmit keys (`TLS_TX`).
pub const TLS_TX: libc::c_int = 1;
/// `SOL_TLS` option: install receive keys (`TLS_RX`).
pub const TLS_RX: libc::c_int = 2;
/// `SOL_TLS` option: zero-copy `sendfile` on TX (`TLS_TX_ZEROCOPY_RO`, Linux 5.19+).
pub const TLS_TX_ZEROCOPY_RO: libc::c_int = 3;
/// `SOL_TLS` option: expect TLS 1.3 records without padding (`TLS_RX_EXPECT_NO_PAD`, Linux 6.0+).
pub const TLS_RX_EXPECT_NO_PAD: libc::c_int = 4;
/// `SOL_TLS` option: cap the plaintext size of transmitted records
/// (`TLS_TX_MAX_PAYLOAD_LEN`, a `u16`; only in recent kernels, absent from
/// older headers).
pub const TLS_TX_MAX_PAYLOAD_LEN: libc::c_int = 5;

/// Control-message type carrying the record type of a record to send.
pub const TLS_SET_RECORD_TYPE: libc::c_int = 1;
/// Control-message type carrying the record type of a received record.
pub const TLS_GET_RECORD_TYPE: libc::c_int = 2;

/// `tls_crypto_info.version` for TLS 1.2 (`TLS_1_2_VERSION`, 0x0303).
pub const TLS_1_2_VERSION: u16 = 0x0303;
/// `tls_crypto_info.version` for TLS 1.3 (`TLS_1_3_VERSION`, 0x0304).
pub const TLS_1_3_VERSION: u16 = 0x0304;

/// `tls_crypto_info.cipher_type` for AES-128-GCM.
pub const TLS_CIPHER_AES_GCM_128: u16 = 51;
/// `tls_crypto_info.cipher_type` for AES-256-GCM.
pub const TLS_CIPHER_AES_GCM_256: u16 = 52;
/// `tls_crypto_info.cipher_type` for ChaCha20-Poly1305.
pub const TLS_CIPHER_CHACHA20_POLY1305: u16 = 54;

/// Largest plaintext a TLS record may carry (2^14 bytes).
pub const TLS_MAX_PLAINTEXT: usize = 1 << 14;

/// `struct tls_crypto_info`: the header every crypto-info structure starts with.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlsCryptoInfo {
    /// `TLS_1_2_VERSION` or `TLS_1_3_VERSION`, in host byte order.
    pub version: u16,
    /// One of the `TLS_CIPHER_*` constants, in host byte order.
    pub cipher_type: u16,
}

/// `struct tls12_crypto_info_aes_gcm_128` (40 bytes). Used for TLS 1.2 and 1.3.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Tls12CryptoInfoAesGcm128 {
    /// Header.
    pub info: TlsCryptoInfo,
    /// Last 8 bytes of the 12-byte IV.
    pub iv: [u8; 8],
    /// AEAD key.
    pub key: [u8; 16],
    /// First 4 bytes of the 12-byte IV.
    pub salt: [u8; 4],
    /// Next record sequence number, big-endian.
    pub rec_seq: [u8; 8],
}

/// `struct tls12_crypto_info_aes_gcm_256` (56 bytes). Used for TLS 1.2 and 1.3.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Tls12CryptoInfoAesGcm256 {
    /// Header.
    pub info: TlsCryptoInfo,
    /// Last 8 bytes of the 12-byte IV.
    pub iv: [u8; 8],
    /// AEAD key.
    pub key: [u8; 32],
    /// First 4 bytes of the 12-byte IV.
    pub salt: [u8; 4],
    /// Next record sequence number, big-endian.
    pub rec_seq: [u8; 8],
}

/// `struct tls12_crypto_info_chacha20_poly1305` (56 bytes; its `salt` is
/// empty). Used for TLS 1.2 and 1.3.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Tls12CryptoInfoChacha20Poly1305 {
    /// Header.
    pub info: TlsCryptoInfo,
    /// The whole 12-byte IV.
    pub iv: [u8; 12],
    /// AEAD key.
    pub key: [u8; 32],
    /// Empty: ChaCha20-Poly1305 has no salt.
    pub salt: [u8; 0],
    /// Next record sequence number, big-endian.
    pub rec_seq: [u8; 8],
}

// The kernel checks `optlen` against these exact sizes; any padding would
// also leak uninitialised bytes into the kernel. Pin both at compile time.
const _: () = assert!(size_of::<TlsCryptoInfo>() == 4);
const _: () = assert!(size_of::<Tls12CryptoInfoAesGcm128>() == 4 + 8 + 16 + 4 + 8);
const _: () = assert!(size_of::<Tls12CryptoInfoAesGcm128>() == 40);
const _: () = assert!(size_of::<Tls12CryptoInfoAesGcm256>() == 4 + 8 + 32 + 4 + 8);
const _: () = assert!(size_of::<Tls12CryptoInfoAesGcm256>() == 56);
const _: () = assert!(size_of::<Tls12CryptoInfoChacha20Poly1305>() == 4 + 12 + 32 + 8);
const _: () = assert!(size_of::<Tls12CryptoInfoChacha20Poly1305>() == 56);
