//! TLS: configuration, the userspace handshake, and the two record layers a
//! finished handshake can continue on: the kernel's (kTLS) or rustls' in user space.

pub mod config;
pub mod handshake;
pub mod kernel;
pub mod session;
pub mod userspace;

pub use session::{Session, TlsMode};
