//! Kernel TLS (kTLS) integration suite: the real `ktlsd` binary, its record
//! layer in the kernel, driven by `curl`, `openssl s_client` and an in-process
//! rustls client.
//!
//! Every test needs a kernel with kTLS, so all of them are `#[ignore]`d and run
//! inside throw-away VMs on real Debian kernels by `tests/ktls-vm`:
//!
//! ```text
//! tests/ktls-vm                  # both kernels (6.1 and backports)
//! tests/ktls-vm --kernel 6.1     # one kernel
//! tests/ktls-vm -- matrix::tls12 # a subset (test-name filter)
//! ```
//!
//! A test fails unless kTLS really carried its connections:
//! - `/proc/net/tls_stat`: `TlsTxSw` and `TlsRxSw` rose by one per connection,
//!   `TlsDecryptError` did not rise, and the `TlsCurr*` gauges went back to
//!   where they were once the server stopped;
//! - the server's own view: every access log line ends in `tls=ktls`, and the
//!   shutdown line reports `ktls=N userspace=0`.
//!
//! The counters are machine-wide, so run the binary with `--test-threads=1`.
//! Each test prints one `[tls_stat]` summary line of what changed.
//!
//! Environment: `KTLSD_BIN` (the server binary; default: the one cargo
//! built), `KTLSD_VM_FLAVOR` (set by the VM harness: `6.1` or `backports`,
//! cross-checked against what the kernel reports).
//!
//! The server process, curl, s_client and the rustls client configuration
//! come from the test kit (`crates/testkit`); these modules keep what is
//! kTLS-specific, by subject.

/// One `#[test]` per cell of a version × cipher table, named by its cell
/// (`matrix::tls13_chacha20`), each calling `$run(name, version, cipher)`
/// where `name` is the test's own name: a failure names its cell.
macro_rules! cells {
    ($run:ident; $($cell:ident: $v:ident $c:ident),+ $(,)?) => {$(
        #[test]
        #[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
        fn $cell() {
            let name = concat!(module_path!(), "::", stringify!($cell));
            let name = name.split_once("::").map_or(name, |(_, test)| test);
            $run(name, $crate::suites::V::$v, $crate::suites::Cipher::$c);
        }
    )+};
}

/// [`cells!`] over the whole table: both versions × the three ciphers ktlsd offers.
macro_rules! every_cell {
    ($run:ident) => {
        cells!($run;
            tls12_aes128gcm: Tls12 Aes128Gcm,
            tls12_aes256gcm: Tls12 Aes256Gcm,
            tls12_chacha20: Tls12 Chacha20,
            tls13_aes128gcm: Tls13 Aes128Gcm,
            tls13_aes256gcm: Tls13 Aes256Gcm,
            tls13_chacha20: Tls13 Chacha20,
        );
    };
}

/// The binary cargo built; `KTLSD_BIN` overrides it (see [`testkit::bin_from_env`]).
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

mod harness;
mod suites;
mod wire;

mod accel;
mod admin;
mod backpressure;
mod bad_records;
mod cache;
mod conformance;
mod connections;
mod doctor;
mod features;
mod h2;
mod handshake;
mod key_update;
mod matrix;
mod records;
mod splice;
mod tunnel;
