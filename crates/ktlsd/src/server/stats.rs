//! Per-worker counters. Each worker owns its own (no sharing on the hot path);
//! they are summed once, at exit.

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
    handshake_failures: "Handshakes that failed (TLS errors, garbage, resets).",
    handshake_timeouts: "Handshakes that took longer than handshake_timeout.",
    ktls: "Connections whose record layer ran in the kernel.",
    userspace: "Connections whose record layer ran in user space.",
    ktls_install_failures: "Connections lost because the kernel refused the keys.",
    ktls_record_errors: "kTLS connections closed on a record the kernel rejected (EBADMSG, EMSGSIZE, EINVAL).",
    rekey_unsupported: "TLS 1.3 KeyUpdates the kernel could not install (connection closed).",
    key_updates: "TLS 1.3 KeyUpdates installed in the kernel.",
    timeouts: "Connections closed on an idle, header or send timeout.",
    errors: "Connections cut by socket or TLS errors after the handshake.",
}

impl Stats {
    pub fn bump(c: &Cell<u64>) {
        c.set(c.get() + 1);
    }
}
