//! Command-line interface: `ktlsd serve`, `ktlsd check`, `ktlsd doctor` and `ktlsd status`.
//!
//! The options of `serve` and `check` are declared in [`crate::config::options`], once
//! for the command line and the configuration file; this module only names the
//! subcommands.

use clap::{Parser, Subcommand};

pub use crate::config::options::ServeArgs;

#[derive(Debug, Parser)]
#[command(
    name = "ktlsd",
    version,
    about = "A static-content HTTPS server built around Linux kernel TLS (kTLS).",
    long_about = "ktlsd serves a directory over HTTPS. The TLS handshake runs in user space \
                  (rustls); the record layer then moves into the kernel when it supports kTLS, \
                  and file bodies leave with sendfile(). Without kTLS the same server runs a \
                  userspace record layer.\n\nStart with `ktlsd serve` (serves the current \
                  directory on https://127.0.0.1:8443) and `ktlsd doctor` (what the kernel offers)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once at start-up
pub enum Command {
    /// Serve a directory over HTTPS.
    Serve(ServeArgs),
    /// Validate everything `serve` would (configuration, certificate and key, ROOT, ports) without serving.
    Check(ServeArgs),
    /// Report what this machine's kernel offers for kernel TLS, and what to do about gaps.
    ///
    /// Exits 0 when kernel TLS is usable here, 1 when it is not.
    Doctor {
        /// Print one JSON object instead of the human report.
        #[arg(long)]
        json: bool,
    },
    /// Print the status of a running server, read from its admin listener (`serve --admin`).
    Status {
        /// The server's admin address: IP:PORT or a Unix socket path.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9443")]
        admin: String,
    },
}
