//! Body writers: how a response (head, then an optional file range) leaves the process.
//!
//! There is one interface, a head plus an optional [`crate::files::FileRange`], and one implementation per
//! record layer: [`userspace`] reads file chunks, encrypts them record by record and
//! writes them; [`kernel`] sends the head with `MSG_MORE` and `sendfile`s the body,
//! leaving encryption to the kernel. Both take record lengths from the same
//! [`RecordSizer`].

pub mod kernel;
pub mod policy;
pub mod tcp;
pub mod userspace;

pub use policy::{RecordPolicy, RecordSizer, MAX_RECORD};

/// The file changed size under us: the response cannot be completed, and
/// the connection must be cut so the client does not mistake it for whole.
pub fn truncated() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "file shrank while it was being sent")
}
