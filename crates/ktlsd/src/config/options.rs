//! The options schema: every option of `ktlsd serve` declared once.
//!
//! One declaration (doc comment = help, `#[arg]` = the flag, the field name = the TOML
//! key, its type) gives the command-line flag, the configuration file key, the merge
//! (command line over file over default, [`Options::or`]), `--help` and the generated
//! reference ([`super::reference`]). Options are values as given, not yet validated:
//! each section module of [`super`] turns its own into the validated [`super::Config`].
//! Defaults are applied there too; each option's help repeats its default.
//!
//! This module is not where values are checked (only typed: numbers, enums, lists).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::KtlsMode;
use crate::log::LogFormat;
use crate::quic::Retry;
use crate::vocab::UnknownName;

/// Declares the options: `per_site` ones are keys of the top level (the default site,
/// where the command line sets them) and of each `[[site]]`; `site_block` keys belong
/// to a `[[site]]` only; `global` ones to the top level only. Every option is an
/// `Option` (not given: `None`), so that files and the command line merge field by field.
macro_rules! schema {
    (
        site_block { $( $(#[$bm:meta])* $bf:ident : $bt:ty, )* }
        per_site { $( $(#[$sm:meta])* $sf:ident : $st:ty, )* }
        global { $( $(#[$gm:meta])* $gf:ident : $gt:ty, )* }
    ) => {
        /// The options of `ktlsd serve`: the command line's flags and the configuration file's top-level keys.
        #[derive(Debug, Default, Clone, clap::Args, Deserialize, Serialize)]
        #[serde(deny_unknown_fields)]
        pub struct Options {
            $( $(#[$gm])* #[serde(skip_serializing_if = "Option::is_none")] pub $gf: Option<$gt>, )*
            $( $(#[$sm])* #[serde(skip_serializing_if = "Option::is_none")] pub $sf: Option<$st>, )*
        }

        /// A `[[site]]` block as written: its own keys, and the per-site options.
        #[derive(Debug, Default, Clone, clap::Args, Deserialize, Serialize)]
        #[serde(deny_unknown_fields)]
        pub struct FileSite {
            $( $(#[$bm])* pub $bf: $bt, )*
            $( $(#[$sm])* #[serde(skip_serializing_if = "Option::is_none")] pub $sf: Option<$st>, )*
        }

        /// The per-site options of one site, or of the top level (the default site).
        #[derive(Debug, Default, Clone)]
        pub struct SiteOptions {
            $( pub $sf: Option<$st>, )*
        }

        /// A `[[location]]` block as written: `path`, and per-site options under their
        /// per-site names for the paths it matches (which of them apply per path is
        /// `super::location`'s to check), and `max_body_bytes`.
        #[derive(Debug, Default, Clone, clap::Args, Deserialize, Serialize)]
        #[serde(deny_unknown_fields)]
        pub struct FileLocation {
            /// The paths the block applies to: a path or glob.
            #[arg(skip)]
            pub path: String,
            /// Largest request body here, in bytes.
            #[arg(skip)]
            #[serde(skip_serializing_if = "Option::is_none")]
            pub max_body_bytes: Option<u64>,
            $( $(#[$sm])* #[serde(skip_serializing_if = "Option::is_none")] pub $sf: Option<$st>, )*
        }

        impl FileLocation {
            /// The per-site options the block sets.
            pub fn site_options(&self) -> SiteOptions {
                SiteOptions { $( $sf: self.$sf.clone(), )* }
            }
        }

        /// The keys only a `[[site]]` block has (the rest of [`FileSite`]'s are per-site options).
        #[cfg(test)]
        pub const SITE_BLOCK_KEYS: &[&str] = &[$( stringify!($bf), )*];

        impl Options {
            /// `self`'s options where given, else `under`'s.
            pub fn or(self, under: Options) -> Options {
                Options { $( $gf: self.$gf.or(under.$gf), )* $( $sf: self.$sf.or(under.$sf), )* }
            }

            /// The top level's per-site options: the default site's.
            pub fn site_options(&self) -> SiteOptions {
                SiteOptions { $( $sf: self.$sf.clone(), )* }
            }
        }

        impl FileSite {
            /// This site's per-site options, over the top level's.
            pub fn site_options(&self, top: &SiteOptions) -> SiteOptions {
                SiteOptions { $( $sf: self.$sf.clone().or_else(|| top.$sf.clone()), )* }
            }
        }
    };
}

schema! {
    site_block {
        /// The site's names: exact names and `*.example.com` wildcards.
        #[arg(skip)]
        names: Vec<String>,
        /// The site's directory.
        #[arg(skip)]
        root: PathBuf,
        /// The site's certificate chain, PEM (with `key`).
        #[arg(skip)]
        cert: Option<PathBuf>,
        /// The site's private key, PEM (with `cert`).
        #[arg(skip)]
        key: Option<PathBuf>,
        /// The site's certificate from an ACME CA instead of `cert` and `key`.
        #[arg(skip)]
        acme: Option<FileAcme>,
        /// The site's own access log file: its requests are logged there instead of in `access_log`.
        #[arg(skip)]
        access_log: Option<PathBuf>,
    }
    per_site {
        /// Answer directory requests without index.html with an HTML listing instead of 403 [default: off]
        #[arg(long, num_args = 0, default_missing_value = "true", overrides_with = "no_autoindex")]
        autoindex: bool,
        /// Answer directory requests without index.html with 403, whatever the config file says.
        #[arg(long, num_args = 0, default_missing_value = "true", overrides_with = "autoindex")]
        #[serde(skip)]
        no_autoindex: bool,
        /// Serve files and directories whose name starts with a dot [default: off]
        #[arg(long, num_args = 0, default_missing_value = "true", overrides_with = "no_dotfiles")]
        dotfiles: bool,
        /// Hide files and directories whose name starts with a dot, whatever the config file says.
        #[arg(long, num_args = 0, default_missing_value = "true", overrides_with = "dotfiles")]
        #[serde(skip)]
        no_dotfiles: bool,
        /// Strict-Transport-Security value sent on every HTTPS response, e.g. "max-age=31536000; includeSubDomains" [default: none]
        #[arg(long, value_name = "VALUE")]
        hsts: String,
        /// Precompressed variants served beside a file to clients that accept them, in order of preference: br (FILE.br), zstd (FILE.zst), gzip (FILE.gz), comma-separated, or none [default: none]
        #[arg(long, value_name = "LIST")]
        precompressed: List,
        /// Page served for an error status, with that status, as CODE=/PATH (repeatable; e.g. 404=/404.html) [default: none: the built-in page]
        #[arg(long = "error-page", value_name = "CODE=PATH")]
        #[serde(default, deserialize_with = "table", serialize_with = "table_out")]
        error_page: Vec<Entry>,
        /// Path served, with 200, for a request whose path does not exist (a single-page app's /index.html); never for refused paths [default: none]
        #[arg(long, value_name = "PATH")]
        fallback: String,
        /// Content-Type for files with an extension, as EXT=TYPE (repeatable; e.g. md="text/markdown; charset=utf-8"); files without an extension are application/octet-stream [default: none: the built-in table]
        #[arg(long = "mime-type", value_name = "EXT=TYPE")]
        #[serde(default, deserialize_with = "table", serialize_with = "table_out")]
        mime_types: Vec<Entry>,
        /// A response field set on files whose path matches GLOB, as GLOB=NAME: VALUE (repeatable; e.g. "/assets/**=Cache-Control: max-age=31536000, immutable"); replaces the file's [[headers]] rules [default: none]
        #[arg(long = "header", value_name = "GLOB=NAME: VALUE")]
        headers: Vec<HeaderRule>,
        /// CORS: origins whose scripts may read the answers, comma-separated (https://a.example), or * for any; OPTIONS preflights are answered for GET and HEAD [default: none: no CORS fields]
        #[arg(long, value_name = "ORIGINS")]
        cors: Cors,
        /// Canonical host: requests naming another host get a 301 to this one, path and query kept (per [[site]]: one of its names; not inherited by [[site]]s) [default: none]
        #[arg(long, value_name = "HOST")]
        canonical: String,
        /// Redirects: [[redirect]] blocks with path (exact or a glob), to (a path or URL; {*} is what * matched) and status (301, 302, 307, 308); first match wins; file only
        #[arg(skip)]
        redirect: Vec<super::tables::FileRedirect>,
        /// Candidates tried in order for GET and HEAD before the path itself, comma-separated; {path} is the request path, e.g. {path},{path}.html,{path}/index.html [default: none]
        #[arg(long, value_name = "LIST")]
        try_files: List,
        /// IP rules: [[access]] blocks with path (a glob) and allow / deny lists of addresses, CIDR ranges or all; the first matching rule wins, a deny answers 403; file only
        #[arg(skip)]
        access: Vec<super::tables::FileAccess>,
        /// Requests per client address: { requests = 20, per = "1s", burst = 40 }; beyond it 429 with Retry-After; file only
        #[arg(skip)]
        rate_limit: super::tables::FileRateLimit,
        /// Compress text files on the fly (text/*, JavaScript, JSON, XML, SVG, wasm...) for clients that accept it, in order of preference: zstd, br, gzip, comma-separated, or none; bodies are kept in STATE_DIR/compressed and precompressed files win [default: none]
        #[arg(long, value_name = "LIST")]
        compress: List,
        /// Smallest file compressed on the fly, in bytes [default: 1024]
        #[arg(long, value_name = "BYTES")]
        compress_min_size: u64,
        /// Largest file compressed on the fly, in bytes; larger ones go out as they are [default: 10485760]
        #[arg(long, value_name = "BYTES")]
        compress_max_size: u64,
        /// Basic auth: [[auth]] blocks, each path (a pattern such as "/private/*"), users (an htpasswd file of bcrypt or argon2 hashes) and realm; the first block whose path matches asks; file only [default: none]
        #[arg(skip)]
        auth: Vec<super::auth::FileAuth>,
        /// Client certificates (mTLS): the CAs, PEM, whose certificates clients must present (with client_auth); chosen per site by the TLS server name [default: none: no certificate is asked for]
        #[arg(long, value_name = "PEM")]
        client_ca: PathBuf,
        /// Client certificates: require (the handshake fails without a certificate of client_ca), optional (one is asked for, and checked when sent) or none [default: require when client_ca is set]
        #[arg(long, value_name = "require|optional|none", hide_possible_values = true)]
        client_auth: super::tables::ClientAuthMode,
        /// Reverse proxy: requests whose path matches a [[proxy]] block's glob go to its upstreams (first match wins; see docs/proxy.md); file only [default: none]
        #[arg(skip)]
        proxy: Vec<super::tables::FileProxy>,
        /// Per-path values: [[location]] blocks, each a path (a path or glob) and any of rate_limit, max_body_bytes, compress, compress_min_size, compress_max_size, error_page and try_files for the paths it matches; the most specific matching block sets each value (see docs/routing.md); file only [default: none]
        #[arg(skip)]
        location: Vec<FileLocation>,
    }
    global {
        /// Directory to serve [default: the current directory]
        #[arg(value_name = "ROOT")]
        root: PathBuf,
        /// Address to listen on (repeatable; IPv4 or [IPv6]:port) [default: 127.0.0.1:8443]
        #[arg(long, value_name = "ADDR")]
        listen: Vec<String>,
        /// Certificate chain, PEM [default: a self-signed certificate for localhost, generated at start]
        #[arg(long, value_name = "PEM")]
        cert: PathBuf,
        /// Private key (ECDSA, RSA or Ed25519), PEM [default: the generated certificate's key]
        #[arg(long, value_name = "PEM")]
        key: PathBuf,
        /// Worker threads, each with its own event loop and listener [default: one per CPU]
        #[arg(long, value_name = "N")]
        workers: usize,
        /// Kernel TLS: auto (use it where the kernel can), on (refuse to start without it), off [default: auto]
        #[arg(long, value_name = "MODE", hide_possible_values = true)]
        ktls: KtlsMode,
        /// TLS protocol versions, comma-separated [default: 1.2,1.3]
        #[arg(long, value_name = "LIST")]
        tls_versions: List,
        /// Cipher suites, comma-separated IANA or OpenSSL names [default: all kTLS-capable suites]
        #[arg(long, value_name = "LIST")]
        cipher_suites: List,
        /// TLS record size policy: static:SIZE (e.g. static:16k), dynamic[:lo=N,hi=N,threshold=N,timeout=1s], adaptive [default: static:16k]
        #[arg(long, value_name = "POLICY")]
        record_size: String,
        /// TCP_NOTSENT_LOWAT in bytes for accepted connections [default: unset; 16384 with --record-size adaptive]
        #[arg(long, value_name = "BYTES")]
        tcp_notsent_lowat: u32,
        /// TCP congestion control for accepted connections, e.g. cubic, bbr [default: the system's]
        #[arg(long, value_name = "NAME")]
        tcp_congestion: String,
        /// Access log destination: a file path, `-` for standard output, or `off` [default: -]
        #[arg(long, value_name = "PATH")]
        access_log: String,
        /// Time allowed for the TLS handshake [default: 10s]
        #[arg(long, value_name = "DURATION", help_heading = TIMEOUTS)]
        handshake_timeout: RawDuration,
        /// Time allowed to receive a complete request head once it has started [default: 15s]
        #[arg(long, value_name = "DURATION", help_heading = TIMEOUTS)]
        header_timeout: RawDuration,
        /// Time a keep-alive connection may stay idle between requests [default: 65s]
        #[arg(long, value_name = "DURATION", help_heading = TIMEOUTS)]
        idle_timeout: RawDuration,
        /// Time a send may make no progress before the client is dropped as a slow reader [default: 60s]
        #[arg(long, value_name = "DURATION", help_heading = TIMEOUTS)]
        send_timeout: RawDuration,
        /// Time in-flight responses may take to finish after SIGTERM/SIGINT [default: 10s]
        #[arg(long, value_name = "DURATION", help_heading = TIMEOUTS)]
        shutdown_timeout: RawDuration,
        /// Largest request head (request line plus headers) in bytes [default: 16384]
        #[arg(long, value_name = "BYTES")]
        max_header_bytes: usize,
        /// Largest request body that is read and discarded before answering 413 [default: 1048576]
        #[arg(long, value_name = "BYTES")]
        max_body_bytes: u64,
        /// Directory keeping the generated self-signed certificate and key between starts [default: /var/lib/ktlsd as root, else $XDG_STATE_HOME/ktlsd or ~/.local/state/ktlsd]
        #[arg(long, value_name = "DIR")]
        state_dir: PathBuf,
        /// Without --cert/--key, generate a new self-signed certificate in memory at every start instead of keeping one in --state-dir [default: off]
        #[arg(long, num_args = 0, default_missing_value = "true", overrides_with = "no_ephemeral_cert")]
        ephemeral_cert: bool,
        /// Keep the generated self-signed certificate in --state-dir, whatever the config file says.
        #[arg(long, num_args = 0, default_missing_value = "true", overrides_with = "ephemeral_cert")]
        #[serde(skip)]
        no_ephemeral_cert: bool,
        /// Session-ticket key file, 80 random bytes as nginx's ssl_session_ticket_key (repeatable; the first encrypts, all decrypt) [default: none: a random key per process]
        #[arg(long, value_name = "FILE")]
        ticket_keys: Vec<PathBuf>,
        /// Plain-HTTP address answering with a redirect to HTTPS and ACME HTTP-01 challenges from ROOT/.well-known/acme-challenge/ (repeatable; e.g. 0.0.0.0:80, [::]:80) [default: none]
        #[arg(long, value_name = "ADDR")]
        http_listen: Vec<String>,
        /// Source addresses or CIDR ranges of load balancers whose connections begin with a PROXY protocol header (version 1 or 2; HAProxy's send-proxy, send-proxy-v2), on the HTTPS and plain-HTTP ports: its source address is then the client's everywhere (access log, [[access]], limits, X-Forwarded-For); a connection from these ranges without a header, or from elsewhere with one, is closed (repeatable) [default: none]
        #[arg(long, value_name = "CIDR")]
        proxy_protocol_from: Vec<String>,
        /// Source addresses or CIDR ranges of HTTP proxies (load balancers, CDNs) whose X-Forwarded-For (or, without it, Forwarded) names the client: the client's address is then the right-most address of that list which is not itself trusted, for the access log, [[access]], limits and the upstream's X-Forwarded-For; never read from any other peer (repeatable) [default: none]
        #[arg(long, value_name = "CIDR")]
        trusted_proxies: Vec<String>,
        /// User to serve as once the listeners are bound and the keys read (needed when started as root) [default: none]
        #[arg(long, value_name = "NAME", help_heading = PRIVILEGES)]
        user: String,
        /// Group to serve as (with --user) [default: the user's primary group]
        #[arg(long, value_name = "NAME", help_heading = PRIVILEGES)]
        group: String,
        /// Serve as root when started as root without --user (a warning is logged) [default: off]
        #[arg(long, num_args = 0, default_missing_value = "true", help_heading = PRIVILEGES)]
        allow_root: bool,
        /// What a TLS server name or Host that no [[site]] of the config file has gets: "default" (the default site) or "refuse" (the handshake fails with an unrecognized_name alert; a request gets 421) [default: default]
        #[arg(long, value_name = "default|refuse", hide_possible_values = true)]
        unknown_sni: UnknownName,
        /// Admin listener (plain HTTP: /metrics, /status, /advisor): a loopback IP:PORT such as 127.0.0.1:9443, a Unix socket path, or off [default: off]
        #[arg(long, value_name = "ADDR")]
        admin: String,
        /// Let --admin listen on a non-loopback address (its endpoints have no authentication) [default: off]
        #[arg(long, num_args = 0, default_missing_value = "true")]
        admin_public: bool,
        /// An htpasswd file (bcrypt or argon2 hashes, as [[auth]]) whose users may act through the admin listener: POST /upstreams/drain and /upstreams/enable, the status page's buttons. Without it those actions are refused (403) and the status page is read-only [default: none]
        #[arg(long, value_name = "FILE")]
        admin_auth: PathBuf,
        /// Offer HTTP/2 in ALPN (preferred over HTTP/1.1 when the client offers both) [default: on]
        #[arg(long, value_name = "on|off", value_parser = on_off())]
        http2: bool,
        /// Access log line format: ktlsd (common log format plus rt= and tls=), combined (nginx's, with Referer and User-Agent), json (one object per line, with host and site) or custom (the access_log_custom template) [default: ktlsd]
        #[arg(long, value_name = "FORMAT", hide_possible_values = true)]
        access_log_format: LogFormat,
        /// Most connections each worker holds at once; more are accepted and closed at once (counted as connections_refused), as are connections for which the worker's descriptor budget has no room once held files are closed [default: half the worker's share of the file descriptor budget]
        #[arg(long, value_name = "N")]
        max_connections: usize,
        /// HTTP/2: streams one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS); more are refused with REFUSED_STREAM [default: 128]
        #[arg(long, value_name = "N")]
        h2_max_streams: u32,
        /// HTTP/2: largest decoded request header list in bytes, counted as RFC 9113 does (name + value + 32 per field; SETTINGS_MAX_HEADER_LIST_SIZE); a larger request gets 431 [default: 32768]
        #[arg(long, value_name = "BYTES")]
        h2_max_header_list: u32,
        /// HTTP/2: largest HPACK table the client may make the server keep (SETTINGS_HEADER_TABLE_SIZE) [default: 4096]
        #[arg(long, value_name = "BYTES")]
        h2_hpack_table: u32,
        /// HTTP/2: streams a client may cancel (or provoke a reset of) per 10 seconds before the connection ends with ENHANCE_YOUR_CALM (rapid reset) [default: 200]
        #[arg(long, value_name = "N")]
        h2_max_resets: u32,
        /// HTTP/2: frames carrying no request (SETTINGS, PING, PRIORITY, empty DATA, small WINDOW_UPDATE...) a client may send per 10 seconds before the connection ends with ENHANCE_YOUR_CALM [default: 1000]
        #[arg(long, value_name = "N")]
        h2_max_control: u32,
        /// Level of ktlsd's own messages on standard error: error, warn, info, debug or trace; the KTLSD_LOG variable (a tracing filter such as debug), when set, wins [default: info]
        #[arg(long, value_name = "LEVEL", hide_possible_values = true)]
        log_level: LogLevel,
        /// Named sites, each with its own names, root and certificate; file only
        #[arg(skip)]
        site: Vec<FileSite>,
        /// Most connections one client address holds at once, over all workers; more are accepted and closed at once (counted as connections_refused_per_ip) [default: a quarter of the server's connections (workers times max_connections), at least 16 or all of them when fewer]
        #[arg(long, value_name = "N")]
        max_connections_per_ip: u32,
        /// Most bytes of bodies compressed on the fly kept in STATE_DIR/compressed; the least recently used go first [default: 268435456]
        #[arg(long, value_name = "BYTES")]
        compress_cache_size: u64,
        /// The response cache of proxied responses (`[cache]`: dir, sizes, min_free, verify_sample); file only
        #[arg(skip)]
        cache: super::cache::FileCache,
        /// The fleet this member belongs to (`[cluster]`: etcd, name, secret_file, prefix, ticket_rotation, cache_peers, peer_listen): session-ticket keys shared through etcd, QUIC's keys derived from the fleet's secret, and the response cache sharded over the members; file only
        #[arg(skip)]
        cluster: super::cluster::FileCluster,
        /// More configuration files read after this one, as paths or globs relative to this file (e.g. ["sites/*.toml"]): each may add [[site]] blocks and set keys no other file sets; a glob matching nothing is fine, a missing plain path is an error; file only [default: none]
        #[arg(skip)]
        include: Vec<String>,
        /// Access log line template for access_log_format = custom, with nginx-style variables: $remote_addr $time_local $time_iso8601 $request $request_method $request_uri $server_protocol $status $body_bytes_sent $request_time $ttfb $http_referer $http_user_agent $host $site $ssl_protocol $ssl_cipher $record_layer $body_path $scheme $request_id $remote_user $upstream_addr $upstream_status $upstream_connect_time $upstream_header_time $upstream_response_time $upstream_cache_status ($$ for a literal $) [default: none]
        #[arg(long, value_name = "TEMPLATE")]
        access_log_custom: String,
        /// Serve HTTP/3 over QUIC on the UDP port of each listen address, and advertise it with Alt-Svc on HTTP/1.1 and HTTP/2 responses [default: off]
        #[arg(long, num_args = 0, default_missing_value = "true")]
        http3: bool,
        /// HTTP/3: request streams one connection may have open at once (QUIC's initial_max_streams_bidi) [default: 128]
        #[arg(long, value_name = "N")]
        h3_max_streams: u32,
        /// HTTP/3: when a client's address is checked with a QUIC Retry before its handshake: auto (when a worker holds over half its max_connections), always, or never [default: auto]
        #[arg(long, value_name = "auto|always|never", hide_possible_values = true)]
        quic_retry: Retry,
        /// Seconds a cached open file's size and times are trusted before they are read again, as nginx's open_file_cache_valid: 0 reads them for every request, so a file changed in place is seen at once; N saves that fstat and may serve a changed file's old length, times and ETag for up to N seconds (0 to 3600) [default: 0]
        #[arg(long, value_name = "SECONDS")]
        open_file_cache_valid: u64,
    }
}

/// `serve`'s and `check`'s arguments: the configuration file and the options over it.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file; command-line flags override its keys.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub options: Options,
}

/// The `serve` command as clap describes it (for `--help`-like introspection).
#[cfg(test)]
pub fn serve_command() -> clap::Command {
    <ServeArgs as clap::Args>::augment_args(clap::Command::new("serve"))
}

/// Heading of the privilege flags in `--help`.
const PRIVILEGES: &str = "Privileges";

/// Heading of the timeout flags in `--help`, which also says how a duration is written.
const TIMEOUTS: &str = "Timeouts (DURATION: seconds, or a number with a unit: 65s, 500ms, 2m, 1h)";

impl Options {
    /// Folds each `--no-x` switch into its `x` (clap's `overrides_with` leaves at most one
    /// of a pair set), so that merging sees one value per switch.
    pub fn fold_switches(mut self) -> Options {
        for (on, off) in [
            (&mut self.autoindex, self.no_autoindex.take()),
            (&mut self.dotfiles, self.no_dotfiles.take()),
            (&mut self.ephemeral_cert, self.no_ephemeral_cert.take()),
        ] {
            if off == Some(true) {
                *on = Some(false);
            }
        }
        self
    }
}

/// A choice in the file reads as on the command line (the `clap::ValueEnum` names); a
/// value outside it is refused naming the key and the names.
macro_rules! choice {
    ($($t:ty => $key:literal,)*) => {$(
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<$t, D::Error> {
                let s = String::deserialize(d)?;
                clap::ValueEnum::from_str(&s, false)
                    .map_err(|_| serde::de::Error::custom(format!("{} {s:?}: expected {}", $key, names::<$t>())))
            }
        }

        // Written as it is read: its `clap::ValueEnum` name.
        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                match clap::ValueEnum::to_possible_value(self) {
                    Some(v) => s.serialize_str(v.get_name()),
                    None => s.serialize_none(),
                }
            }
        }
    )*};
}

choice! {
    KtlsMode => "ktls",
    UnknownName => "unknown_sni",
    LogFormat => "access_log_format",
    LogLevel => "log_level",
    super::tables::ClientAuthMode => "client_auth",
    Retry => "quic_retry",
}

/// The least severe of ktlsd's own messages that is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    /// The level's name, as a tracing filter reads it.
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// A choice's names: `a, b or c`.
fn names<T: clap::ValueEnum>() -> String {
    let names: Vec<String> =
        T::value_variants().iter().filter_map(|v| Some(v.to_possible_value()?.get_name().to_string())).collect();
    match names.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// `--http2 on|off`: a switch written as a word, as in the file's `http2 = true`.
fn on_off() -> impl clap::builder::TypedValueParser<Value = bool> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["on", "off"]).map(|s| s == "on")
}

/// A list: comma-separated on the command line, an array in the file.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct List(pub Vec<String>);

impl std::str::FromStr for List {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<List, Self::Err> {
        Ok(List(split_list(s)))
    }
}

/// The items of a comma-separated list, trimmed, empty ones left out.
pub fn split_list(s: &str) -> Vec<String> {
    s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
}

/// A duration as given: the command line's text, or the file's value (seconds as an
/// integer or float, or text as on the command line). Checked in [`super::timeouts`],
/// whose errors name the flag or the key accordingly.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(from = "toml::Value")]
pub enum RawDuration {
    Flag(String),
    File(toml::Value),
}

impl Serialize for RawDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RawDuration::Flag(text) => s.serialize_str(text),
            RawDuration::File(value) => value.serialize(s),
        }
    }
}

impl From<toml::Value> for RawDuration {
    fn from(v: toml::Value) -> RawDuration {
        RawDuration::File(v)
    }
}

impl std::str::FromStr for RawDuration {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<RawDuration, Self::Err> {
        Ok(RawDuration::Flag(s.to_string()))
    }
}

/// One entry of a table option: the command line's `KEY=VALUE` text (split when
/// validated, so that a malformed one is a configuration error naming the flag), or a
/// key and value of the file's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Flag(String),
    Pair(String, String),
}

impl std::str::FromStr for Entry {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Entry, Self::Err> {
        Ok(Entry::Flag(s.to_string()))
    }
}

/// A table of strings in the file (`[mime_types]`, `error_page = { 404 = "/e.html" }`), as entries.
fn table<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<Entry>>, D::Error> {
    let map = BTreeMap::<String, String>::deserialize(d)?;
    Ok(Some(map.into_iter().map(|(k, v)| Entry::Pair(k, v)).collect()))
}

/// Entries written back as the file's table; a malformed flag keeps its text as the key.
fn table_out<S: serde::Serializer>(entries: &Option<Vec<Entry>>, s: S) -> Result<S::Ok, S::Error> {
    let Some(entries) = entries else { return s.serialize_none() };
    let map: BTreeMap<&str, &str> = entries
        .iter()
        .map(|e| match e {
            Entry::Flag(text) => text.split_once('=').unwrap_or((text.as_str(), "")),
            Entry::Pair(k, v) => (k.as_str(), v.as_str()),
        })
        .collect();
    map.serialize(s)
}

/// A header rule as given: the command line's `GLOB=NAME: VALUE`, or a `[[headers]]` block.
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "FileHeaderRule")]
pub enum HeaderRule {
    Flag(String),
    File(FileHeaderRule),
}

impl Serialize for HeaderRule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.as_file() {
            Ok(rule) => rule.serialize(s),
            Err(why) => Err(serde::ser::Error::custom(why)),
        }
    }
}

impl HeaderRule {
    /// The `[[headers]]` block this rule stands for: a `--header GLOB=NAME: VALUE`
    /// parsed, a block as it is.
    pub fn as_file(&self) -> Result<FileHeaderRule, String> {
        let item = match self {
            HeaderRule::File(f) => return Ok(f.clone()),
            HeaderRule::Flag(item) => item,
        };
        let parsed = item.split_once('=').and_then(|(glob, field)| Some((glob, field.split_once(':')?)));
        let Some((glob, (name, value))) = parsed else {
            return Err(format!(
                "--header {item:?}: expected GLOB=NAME: VALUE, e.g. \"/assets/**=Cache-Control: max-age=31536000\""
            ));
        };
        let set = BTreeMap::from([(name.trim().to_string(), value.trim().to_string())]);
        Ok(FileHeaderRule { path: Some(glob.to_string()), set: Some(set), ..Default::default() })
    }
}

impl From<FileHeaderRule> for HeaderRule {
    fn from(r: FileHeaderRule) -> HeaderRule {
        HeaderRule::File(r)
    }
}

impl std::str::FromStr for HeaderRule {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<HeaderRule, Self::Err> {
        Ok(HeaderRule::Flag(s.to_string()))
    }
}

/// A `[[headers]]` block as written.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileHeaderRule {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub set: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub add: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
}

/// `cors = "*"` or `cors = ["https://a.example", ...]`; comma-separated on the command line.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Cors {
    One(String),
    Many(Vec<String>),
}

impl Cors {
    pub fn into_list(self) -> Vec<String> {
        match self {
            Cors::One(s) => vec![s],
            Cors::Many(v) => v,
        }
    }
}

impl std::str::FromStr for Cors {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Cors, Self::Err> {
        Ok(Cors::Many(split_list(s)))
    }
}

/// An `acme = { ... }` table as written.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileAcme {
    pub directory: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub challenge: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub directory_ca: Option<PathBuf>,
    /// dns-01: the command run as `HOOK set|clear NAME VALUE` to publish and withdraw the TXT record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns_hook: Option<PathBuf>,
    /// dns-01: how long the hook may take, as a duration [default: 2m].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns_hook_timeout: Option<RawDuration>,
    /// dns-01: how long to wait after the hook for the record to reach the CA's resolvers [default: 0s].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns_propagation: Option<RawDuration>,
    /// External Account Binding: the CA's key id and MAC key (base64url).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eab: Option<FileEab>,
}

/// An `eab = { kid, hmac_key }` table as written; its key is never printed.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEab {
    pub kid: String,
    pub hmac_key: String,
}

impl Serialize for FileEab {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        BTreeMap::from([("kid", self.kid.as_str()), ("hmac_key", super::env::REDACTED)]).serialize(s)
    }
}
