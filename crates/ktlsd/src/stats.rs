//! Per-worker counters. Each worker owns its own (no sharing on the hot path);
//! they are summed once, at exit. A leaf: any layer may add to them, and it
//! knows nothing of who does. Not a metrics exporter.

use std::cell::Cell;
use std::fmt;

macro_rules! counters {
    ($($name:ident: $doc:literal),* $(,)?) => {
        /// Counters of one worker (or, summed, of the server).
        #[derive(Debug, Default)]
        pub struct Stats { $(#[doc = $doc] pub $name: Cell<u64>,)* }

        impl Stats {
            pub fn add(&self, other: &Stats) {
                $(self.$name.set(self.$name.get() + other.$name.get());)*
            }
        }

        impl fmt::Display for Stats {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut first = true;
                $(
                    if !first { f.write_str(" ")?; }
                    first = false;
                    write!(f, "{}={}", stringify!($name), self.$name.get())?;
                )*
                let _ = first;
                Ok(())
            }
        }
    };
}

counters! {
    connections: "Accepted connections.",
    handshake_failures: "Handshakes that failed, for any of the reasons below.",
    handshake_timeouts: "Handshakes that took longer than handshake_timeout.",
    handshake_protocol_errors: "Handshakes refused for a TLS protocol error (an alert was sent when rustls had one).",
    handshake_client_alerts: "Handshakes the client ended with a fatal alert.",
    handshake_resets: "Handshakes cut by the client closing or resetting the connection, or by a socket error.",
    handshake_plain_http: "Connections that sent plain HTTP to the TLS port (answered 400).",
    ktls: "Connections whose record layer ran in the kernel.",
    userspace: "Connections whose record layer ran in user space.",
    ktls_install_failures: "Connections lost because the kernel refused the keys.",
    ktls_record_errors: "kTLS connections closed on a record the kernel rejected (EBADMSG, EMSGSIZE, EINVAL).",
    rekey_unsupported: "TLS 1.3 KeyUpdates the kernel could not install (connection closed).",
    key_updates: "TLS 1.3 KeyUpdates installed in the kernel.",
    timeouts: "Connections closed on an idle, header or send timeout.",
    errors: "Connections cut by socket or TLS errors after the handshake.",
    panics: "Connection tasks that panicked (a bug; each is logged with its peer).",
}

impl Stats {
    pub fn bump(c: &Cell<u64>) {
        c.set(c.get() + 1);
    }

    pub fn add_to(c: &Cell<u64>, n: u64) {
        c.set(c.get() + n);
    }
}
