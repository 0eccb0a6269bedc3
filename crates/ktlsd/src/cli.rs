//! Command-line interface: `ktlsd serve`, `ktlsd check` and `ktlsd doctor`.
//!
//! Every `serve` flag is optional here so that it can be merged over the
//! configuration file (CLI wins); each switch has a `--no-` form so that the
//! command line can also turn off what the file turns on. Defaults live in
//! [`crate::config`]; each flag's help repeats its default.

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

    /// Certificate chain, PEM [default: a self-signed certificate for localhost, generated at start]
    #[arg(long, value_name = "PEM")]
    pub cert: Option<PathBuf>,

    /// Private key (ECDSA, RSA or Ed25519), PEM [default: the generated certificate's key]
    #[arg(long, value_name = "PEM")]
    pub key: Option<PathBuf>,

    /// Worker threads, each with its own event loop and listener [default: one per CPU]
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,

    /// Kernel TLS: auto (use it where the kernel can), on (refuse to start without it), off [default: auto]
    #[arg(long, value_name = "MODE")]
    pub ktls: Option<String>,

    /// TLS protocol versions, comma-separated [default: 1.2,1.3]
    #[arg(long, value_name = "LIST")]
    pub tls_versions: Option<String>,

    /// Cipher suites, comma-separated IANA or OpenSSL names [default: all kTLS-capable suites]
    #[arg(long, value_name = "LIST")]
    pub cipher_suites: Option<String>,

    /// TLS record size policy: static:SIZE (e.g. static:16k), dynamic[:lo=N,hi=N,threshold=N,timeout=1s], adaptive [default: static:16k]
    #[arg(long, value_name = "POLICY")]
    pub record_size: Option<String>,

    /// TCP_NOTSENT_LOWAT in bytes for accepted connections [default: unset; 16384 with --record-size adaptive]
    #[arg(long, value_name = "BYTES")]
    pub tcp_notsent_lowat: Option<u32>,

    /// TCP congestion control for accepted connections, e.g. cubic, bbr [default: the system's]
    #[arg(long, value_name = "NAME")]
    pub tcp_congestion: Option<String>,

    /// Answer directory requests without index.html with an HTML listing instead of 403 [default: off]
    #[arg(long, overrides_with = "no_autoindex")]
    pub autoindex: bool,

    /// Answer directory requests without index.html with 403, whatever the config file says.
    #[arg(long, overrides_with = "autoindex")]
    pub no_autoindex: bool,

    /// Serve files and directories whose name starts with a dot [default: off]
    #[arg(long, overrides_with = "no_dotfiles")]
    pub dotfiles: bool,

    /// Hide files and directories whose name starts with a dot, whatever the config file says.
    #[arg(long, overrides_with = "dotfiles")]
    pub no_dotfiles: bool,

    /// Access log destination: a file path, `-` for standard output, or `off` [default: -]
    #[arg(long, value_name = "PATH")]
    pub access_log: Option<String>,

    /// Time allowed for the TLS handshake [default: 10s]
    #[arg(long, value_name = "DURATION", help_heading = TIMEOUTS)]
    pub handshake_timeout: Option<String>,

    /// Time allowed to receive a complete request head once it has started [default: 15s]
    #[arg(long, value_name = "DURATION", help_heading = TIMEOUTS)]
    pub header_timeout: Option<String>,

    /// Time a keep-alive connection may stay idle between requests [default: 65s]
    #[arg(long, value_name = "DURATION", help_heading = TIMEOUTS)]
    pub idle_timeout: Option<String>,

    /// Time a send may make no progress before the client is dropped as a slow reader [default: 60s]
    #[arg(long, value_name = "DURATION", help_heading = TIMEOUTS)]
    pub send_timeout: Option<String>,

    /// Time in-flight responses may take to finish after SIGTERM/SIGINT [default: 10s]
    #[arg(long, value_name = "DURATION", help_heading = TIMEOUTS)]
    pub shutdown_timeout: Option<String>,

    /// Largest request head (request line plus headers) in bytes [default: 16384]
    #[arg(long, value_name = "BYTES")]
    pub max_header_bytes: Option<usize>,

    /// Largest request body that is read and discarded before answering 413 [default: 1048576]
    #[arg(long, value_name = "BYTES")]
    pub max_body_bytes: Option<u64>,

    /// Directory keeping the generated self-signed certificate and key between starts [default: /var/lib/ktlsd as root, else $XDG_STATE_HOME/ktlsd or ~/.local/state/ktlsd]
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Without --cert/--key, generate a new self-signed certificate in memory at every start instead of keeping one in --state-dir [default: off]
    #[arg(long, overrides_with = "no_ephemeral_cert")]
    pub ephemeral_cert: bool,

    /// Keep the generated self-signed certificate in --state-dir, whatever the config file says.
    #[arg(long, overrides_with = "ephemeral_cert")]
    pub no_ephemeral_cert: bool,

    /// Session-ticket key file, 80 random bytes as nginx's ssl_session_ticket_key (repeatable; the first encrypts, all decrypt) [default: none: a random key per process]
    #[arg(long = "ticket-keys", value_name = "FILE")]
    pub ticket_keys: Vec<PathBuf>,

    /// Plain-HTTP address answering with a redirect to HTTPS and ACME HTTP-01 challenges from ROOT/.well-known/acme-challenge/ (repeatable; e.g. 0.0.0.0:80, [::]:80) [default: none]
    #[arg(long = "http-listen", value_name = "ADDR")]
    pub http_listen: Vec<String>,

    /// Strict-Transport-Security value sent on every HTTPS response, e.g. "max-age=31536000; includeSubDomains" [default: none]
    #[arg(long, value_name = "VALUE")]
    pub hsts: Option<String>,

    /// User to serve as once the listeners are bound and the keys read (needed when started as root) [default: none]
    #[arg(long, value_name = "NAME", help_heading = PRIVILEGES)]
    pub user: Option<String>,

    /// Group to serve as (with --user) [default: the user's primary group]
    #[arg(long, value_name = "NAME", help_heading = PRIVILEGES)]
    pub group: Option<String>,

    /// Serve as root when started as root without --user (a warning is logged) [default: off]
    #[arg(long, help_heading = PRIVILEGES)]
    pub allow_root: bool,

    /// What a TLS server name or Host that no [[site]] of the config file has gets: "default" (the default site) or "refuse" (the handshake fails with an unrecognized_name alert; a request gets 421) [default: default]
    #[arg(long, value_name = "default|refuse")]
    pub unknown_sni: Option<String>,

    /// Admin listener (plain HTTP: /metrics, /status, /advisor): a loopback IP:PORT such as 127.0.0.1:9443, a Unix socket path, or off [default: off]
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<String>,

    /// Let --admin listen on a non-loopback address (its endpoints have no authentication) [default: off]
    #[arg(long)]
    pub admin_public: bool,

    /// Offer HTTP/2 in ALPN (preferred over HTTP/1.1 when the client offers both) [default: on]
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    pub http2: Option<String>,

    /// Access log line format: ktlsd (common log format plus rt= and tls=), combined (nginx's, with Referer and User-Agent) or json (one object per line) [default: ktlsd]
    #[arg(long, value_name = "FORMAT")]
    pub access_log_format: Option<String>,

    /// Most connections each worker holds at once; more are accepted and closed at once (counted as connections_refused) [default: the file descriptor budget shared among the workers]
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,

    /// HTTP/2: streams one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS); more are refused with REFUSED_STREAM [default: 128]
    #[arg(long, value_name = "N")]
    pub h2_max_streams: Option<u32>,

    /// HTTP/2: largest decoded request header list in bytes, counted as RFC 9113 does (name + value + 32 per field; SETTINGS_MAX_HEADER_LIST_SIZE); a larger request gets 431 [default: 32768]
    #[arg(long, value_name = "BYTES")]
    pub h2_max_header_list: Option<u32>,

    /// HTTP/2: largest HPACK table the client may make the server keep (SETTINGS_HEADER_TABLE_SIZE) [default: 4096]
    #[arg(long, value_name = "BYTES")]
    pub h2_hpack_table: Option<u32>,

    /// HTTP/2: streams a client may cancel (or provoke a reset of) per 10 seconds before the connection ends with ENHANCE_YOUR_CALM (rapid reset) [default: 200]
    #[arg(long, value_name = "N")]
    pub h2_max_resets: Option<u32>,

    /// HTTP/2: frames carrying no request (SETTINGS, PING, PRIORITY, empty DATA, small WINDOW_UPDATE...) a client may send per 10 seconds before the connection ends with ENHANCE_YOUR_CALM [default: 1000]
    #[arg(long, value_name = "N")]
    pub h2_max_control: Option<u32>,

    /// Precompressed variants served beside a file to clients that accept them, in order of preference: br (FILE.br), zstd (FILE.zst), gzip (FILE.gz), comma-separated, or none [default: none]
    #[arg(long, value_name = "LIST")]
    pub precompressed: Option<String>,

    /// Page served for an error status, with that status, as CODE=/PATH (repeatable; e.g. 404=/404.html) [default: none: the built-in page]
    #[arg(long = "error-page", value_name = "CODE=PATH")]
    pub error_page: Vec<String>,

    /// Path served, with 200, for a request whose path does not exist (a single-page app's /index.html); never for refused paths [default: none]
    #[arg(long, value_name = "PATH")]
    pub fallback: Option<String>,

    /// Content-Type for files with an extension, as EXT=TYPE (repeatable; e.g. md="text/markdown; charset=utf-8"); files without an extension are application/octet-stream [default: none: the built-in table]
    #[arg(long = "mime-type", value_name = "EXT=TYPE")]
    pub mime_type: Vec<String>,

    /// CORS: origins whose scripts may read the answers, comma-separated (https://a.example), or * for any; OPTIONS preflights are answered for GET and HEAD [default: none: no CORS fields]
    #[arg(long, value_name = "ORIGINS")]
    pub cors: Option<String>,

    /// A response field set on files whose path matches GLOB, as GLOB=NAME: VALUE (repeatable; e.g. "/assets/**=Cache-Control: max-age=31536000, immutable"); replaces the file's [[headers]] rules [default: none]
    #[arg(long, value_name = "GLOB=NAME: VALUE")]
    pub header: Vec<String>,
}

/// Heading of the privilege flags in `--help`.
const PRIVILEGES: &str = "Privileges";

/// Heading of the timeout flags in `--help`, which also says how a duration is written.
const TIMEOUTS: &str = "Timeouts (DURATION: seconds, or a number with a unit: 65s, 500ms, 2m, 1h)";

impl ServeArgs {
    /// `--autoindex`/`--no-autoindex`: `None` when neither was given (the later one wins).
    pub fn autoindex(&self) -> Option<bool> {
        switch(self.autoindex, self.no_autoindex)
    }

    /// `--dotfiles`/`--no-dotfiles`: `None` when neither was given (the later one wins).
    pub fn dotfiles(&self) -> Option<bool> {
        switch(self.dotfiles, self.no_dotfiles)
    }
}

/// A switch's `--x`/`--no-x` pair; clap's `overrides_with` leaves at most one set.
fn switch(on: bool, off: bool) -> Option<bool> {
    match (on, off) {
        (true, _) => Some(true),
        (false, true) => Some(false),
        (false, false) => None,
    }
}
