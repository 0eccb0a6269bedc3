//! TLS: configuration, the userspace handshake, and the two record layers a
//! finished handshake can continue on: the kernel's (kTLS) or rustls' in user space.

pub mod config;
pub mod handshake;
pub mod kernel;
pub mod session;
pub mod userspace;

pub use session::{Session, TlsMode};

use rustls::unbuffered::{EncodeError, EncodeTlsData};

/// Appends the handshake record rustls wants sent to `out[..*used]`, growing `out` as needed.
fn encode_into<Data>(enc: &mut EncodeTlsData<'_, Data>, out: &mut Vec<u8>, used: &mut usize) {
    loop {
        match enc.encode(&mut out[*used..]) {
            Ok(n) => {
                *used += n;
                return;
            }
            Err(EncodeError::InsufficientSize(e)) => out.resize(*used + e.required_size, 0),
            Err(EncodeError::AlreadyEncoded) => return,
        }
    }
}
