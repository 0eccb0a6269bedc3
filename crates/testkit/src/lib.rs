//! The test kit of the workspace: the real `ktlsd` binary on a real socket,
//! driven by real clients (`curl`, `openssl s_client`, a pebble ACME CA) and by
//! in-process rustls clients for byte-exact requests and forged records, with a
//! Python origin behind it for the proxy (`origin`) and Python upstreams of a test's
//! own (`script`).
//!
//! Every test starts its own server on an ephemeral port (`127.0.0.1:0`) with a
//! temporary ROOT, so tests can run in parallel. The kit is for tests only: it
//! panics on anything unexpected, with what it saw.
//!
//! Modules by subject; everything is also re-exported here, so a test file
//! takes `use testkit::*;`.

pub mod browser;
pub mod certs;
pub mod curl;
pub mod data;
pub mod etcd;
pub mod forge;
pub mod haproxy;
pub mod nghttpd;
pub mod openssl;
pub mod origin;
pub mod pebble;
pub mod process;
pub mod reload;
pub mod script;
pub mod server;
pub mod tls;
pub mod verify;

pub use browser::*;
pub use certs::*;
pub use curl::*;
pub use data::*;
pub use forge::*;
pub use nghttpd::Nghttpd;
pub use openssl::*;
pub use origin::Origin;
pub use process::*;
pub use reload::reload;
pub use script::ScriptUpstream;
pub use server::*;
pub use tls::*;
pub use verify::AcceptAnyCert;
