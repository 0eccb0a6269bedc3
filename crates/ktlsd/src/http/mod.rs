//! HTTP codecs: how requests arrive and answers leave over a [`Transport`]. The
//! answers themselves come from [`crate::handler`]; HTTP/1.x lives in [`h1`],
//! HTTP/2 in [`h2`], HTTP/3 in [`h3`], and what both share around a connection (its [`Context`],
//! how it [`End`]s, its access-log entries) in [`conn`]; HTTP/2 and HTTP/3 read their requests'
//! fields into a request through [`fields`].

pub mod conn;
pub mod fields;
pub mod h1;
pub mod h2;
pub mod h3;
pub mod host;
pub mod parts;
#[cfg(test)]
pub mod testing;
pub mod transport;

pub use crate::vocab::Spliced;
pub use conn::{Context, End};
pub use transport::Transport;
