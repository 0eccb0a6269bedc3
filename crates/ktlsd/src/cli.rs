//! Command-line interface: `ktlsd serve`, `ktlsd check` and `ktlsd doctor`.
//!
//! Every `serve` flag is optional here so that it can be merged over the
//! configuration file (CLI wins); defaults live in [`crate::config`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

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
    Doctor {
        /// Print one JSON object instead of the human report.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Default, Clone, Args)]
pub struct ServeArgs {
    /// Directory to serve [default: the current directory]
    pub root: Option<PathBuf>,

    /// TOML configuration file; command-line flags override its keys.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Address to listen on (repeatable; IPv4 or [IPv6]:port) [default: 127.0.0.1:8443]
    #[arg(long = "listen", value_name = "ADDR")]
    pub listen: Vec<String>,

    /// Certificate chain, PEM. Without --cert/--key a self-signed certificate for localhost is generated.
    #[arg(long, value_name = "PEM")]
    pub cert: Option<PathBuf>,

    /// Private key (ECDSA, RSA or Ed25519), PEM.
    #[arg(long, value_name = "PEM")]
    pub key: Option<PathBuf>,

    /// Worker threads, each with its own event loop and listener [default: one per CPU]
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,

    /// Kernel TLS: auto (use it where the kernel can), on (refuse to start without it), off.
    #[arg(long, value_name = "MODE")]
    pub ktls: Option<String>,

    /// TLS protocol versions, comma-separated: 1.2,1.3
    #[arg(long, value_name = "LIST")]
    pub tls_versions: Option<String>,

    /// Cipher suites, comma-separated IANA or OpenSSL names [default: all kTLS-capable suites]
    #[arg(long, value_name = "LIST")]
    pub cipher_suites: Option<String>,

    /// TLS record size policy: static:SIZE (e.g. static:16k), dynamic[:lo=N,hi=N,threshold=N,timeout=1s], adaptive
    #[arg(long, value_name = "POLICY")]
    pub record_size: Option<String>,

    /// TCP_NOTSENT_LOWAT in bytes for accepted connections.
    #[arg(long, value_name = "BYTES")]
    pub tcp_notsent_lowat: Option<u32>,

    /// TCP congestion control for accepted connections (e.g. cubic, bbr).
    #[arg(long, value_name = "NAME")]
    pub tcp_congestion: Option<String>,

    /// Answer directory requests without index.html with an HTML listing instead of 403.
    #[arg(long)]
    pub autoindex: bool,

    /// Serve files and directories whose name starts with a dot.
    #[arg(long)]
    pub dotfiles: bool,

    /// Access log destination: a file path, `-` for standard output, or `off`.
    #[arg(long, value_name = "PATH")]
    pub access_log: Option<String>,

    /// Seconds allowed for the TLS handshake.
    #[arg(long, value_name = "SECS")]
    pub handshake_timeout: Option<f64>,

    /// Seconds allowed to receive a complete request head once it has started.
    #[arg(long, value_name = "SECS")]
    pub header_timeout: Option<f64>,

    /// Seconds a keep-alive connection may stay idle between requests.
    #[arg(long, value_name = "SECS")]
    pub idle_timeout: Option<f64>,

    /// Seconds a send may make no progress before the client is dropped as a slow reader.
    #[arg(long, value_name = "SECS")]
    pub send_timeout: Option<f64>,

    /// Seconds in-flight responses may take to finish after SIGTERM/SIGINT.
    #[arg(long, value_name = "SECS")]
    pub shutdown_timeout: Option<f64>,

    /// Largest request head (request line plus headers) in bytes.
    #[arg(long, value_name = "BYTES")]
    pub max_header_bytes: Option<usize>,

    /// Largest request body that is read and discarded before answering 413.
    #[arg(long, value_name = "BYTES")]
    pub max_body_bytes: Option<u64>,
}
