//! Configuration: the TOML file and the command line merged into one validated [`Config`].
//!
//! Everything a running server needs is checked here, before any socket is opened,
//! so that a mistake stops start-up with one line naming the file or value.
//! Every command-line flag has a config key of the same name (dashes become underscores);
//! a switch's `--no-` form is the same key set to false.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::cli::ServeArgs;
use crate::tls::config::Http2;
use crate::tls::sizing::RecordPolicy;
use crate::vocab::{TlsVersion, UnknownName};

/// Why the configuration was refused. Each message names the offending value.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl ConfigError {
    pub fn new(msg: impl Into<String>) -> Self {
        ConfigError(msg.into())
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// Whether connections use the kernel's TLS record layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KtlsMode {
    /// Probe the kernel; use kTLS for every suite it supports, userspace otherwise.
    Auto,
    /// Refuse to start unless the kernel offers kTLS.
    On,
    /// Userspace record layer only.
    Off,
}

/// Where access-log lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogTarget {
    Stdout,
    File(PathBuf),
    Off,
}

/// Where the admin listener (metrics, status, advisor) listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for AdminAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminAddr::Tcp(a) => write!(f, "{a}"),
            AdminAddr::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

impl AdminAddr {
    /// `IP:PORT`, or a Unix socket path (anything with a `/`).
    pub fn parse(v: &str) -> Result<AdminAddr, ConfigError> {
        if v.contains('/') {
            return Ok(AdminAddr::Unix(PathBuf::from(v)));
        }
        v.parse().map(AdminAddr::Tcp).map_err(|_| {
            ConfigError::new(format!(
                "admin {v:?} is neither IP:PORT (e.g. 127.0.0.1:9443) nor a Unix socket path (with a `/`, e.g. /run/ktlsd/admin.sock)"
            ))
        })
    }
}

#[derive(Debug, Clone)]
pub struct Timeouts {
    pub handshake: Duration,
    pub header: Duration,
    pub idle: Duration,
    pub send: Duration,
    pub shutdown: Duration,
}

#[derive(Debug, Clone)]
pub struct Limits {
    pub max_header_bytes: usize,
    pub max_body_bytes: u64,
}

/// TCP options applied to every accepted connection.
#[derive(Debug, Clone, Default)]
pub struct TcpOptions {
    pub notsent_lowat: Option<u32>,
    pub congestion: Option<String>,
}

/// The validated configuration of one `ktlsd serve`.
#[derive(Debug, Clone)]
pub struct Config {
    /// Canonical path of the served directory.
    pub root: PathBuf,
    pub listen: Vec<SocketAddr>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub workers: usize,
    pub ktls: KtlsMode,
    pub tls_versions: Vec<TlsVersion>,
    /// Cipher suite names as given (validated against the provider in `tls`).
    pub cipher_suites: Option<Vec<String>>,
    pub record_policy: RecordPolicy,
    pub tcp: TcpOptions,
    pub autoindex: bool,
    pub dotfiles: bool,
    pub access_log: AccessLogTarget,
    pub timeouts: Timeouts,
    pub limits: Limits,
    /// Where the generated self-signed certificate is kept; `None` when no default applies
    /// (no HOME) and none was given.
    pub state_dir: Option<PathBuf>,
    /// Generate the self-signed certificate in memory only, never stored.
    pub ephemeral_cert: bool,
    /// Session-ticket key files; the first encrypts. Empty: a random key per process.
    pub ticket_keys: Vec<PathBuf>,
    /// Plain-HTTP listeners (redirect to HTTPS, ACME HTTP-01); empty: none.
    pub http_listen: Vec<SocketAddr>,
    /// The Strict-Transport-Security value for HTTPS responses.
    pub hsts: Option<String>,
    /// Account to switch to after binding; resolved and checked in `server::privileges`.
    pub user: Option<String>,
    pub group: Option<String>,
    pub allow_root: bool,
    /// The `[[site]]` blocks of the config file; the top-level keys form the default site.
    pub sites: Vec<SiteConfig>,
    pub unknown_sni: UnknownName,
    /// The admin listener; `None`: off.
    pub admin: Option<AdminAddr>,
    /// Whether ALPN offers HTTP/2.
    pub http2: Http2,
    pub access_log_format: crate::log::LogFormat,
    /// Most connections per worker; `None`: as many as the file descriptor budget allows.
    pub max_connections: Option<std::num::NonZeroUsize>,
    /// HTTP/2 settings and flood limits.
    pub h2_limits: crate::http::h2::Limits,
    /// The default site's content-delivery options (each `[[site]]` has its own).
    pub content: crate::handler::Content,
}

/// Where a site's certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SiteCert {
    /// `cert` and `key` files.
    Files { cert: PathBuf, key: PathBuf },
    /// Neither: a self-signed certificate for the site's names, made at start-up.
    SelfSigned,
    /// From an ACME CA; a self-signed placeholder until the first is issued.
    Acme(SiteAcme),
}

/// A site's `acme = { ... }` table, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteAcme {
    pub directory: String,
    pub email: Option<String>,
    pub challenge: crate::acme::Challenge,
    pub directory_ca: Option<PathBuf>,
}

/// An `acme = { ... }` table as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileAcme {
    directory: String,
    email: Option<String>,
    challenge: Option<String>,
    directory_ca: Option<PathBuf>,
}

/// One validated `[[site]]`.
#[derive(Debug, Clone)]
pub struct SiteConfig {
    /// Exact names and `*.example.com` wildcards, validated.
    pub names: crate::names::Names,
    /// Canonical path of the site's directory.
    pub root: PathBuf,
    pub cert: SiteCert,
    /// Per site; when absent, the top-level value.
    pub hsts: Option<String>,
    pub autoindex: bool,
    pub dotfiles: bool,
    /// Per site; what a site leaves out is the top level's.
    pub content: crate::handler::Content,
}

/// A `[[site]]` block as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSite {
    names: Vec<String>,
    root: PathBuf,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    hsts: Option<String>,
    autoindex: Option<bool>,
    dotfiles: Option<bool>,
    acme: Option<FileAcme>,
    precompressed: Option<Vec<String>>,
    error_page: Option<std::collections::BTreeMap<String, String>>,
    fallback: Option<String>,
    mime_types: Option<std::collections::BTreeMap<String, String>>,
    headers: Option<Vec<FileHeaderRule>>,
    cors: Option<FileCors>,
}

/// The content-delivery keys, at the top level (the default site) and in each `[[site]]`.
#[derive(Debug, Default, Clone)]
struct FileContent {
    precompressed: Option<Vec<String>>,
    error_page: Option<std::collections::BTreeMap<String, String>>,
    fallback: Option<String>,
    mime_types: Option<std::collections::BTreeMap<String, String>>,
    headers: Option<Vec<FileHeaderRule>>,
    cors: Option<FileCors>,
}

/// A `[[headers]]` block as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileHeaderRule {
    path: Option<String>,
    extensions: Option<Vec<String>>,
    set: Option<std::collections::BTreeMap<String, String>>,
    add: Option<std::collections::BTreeMap<String, String>>,
    expires: Option<String>,
}

/// `cors = "*"` or `cors = ["https://a.example", ...]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum FileCors {
    One(String),
    Many(Vec<String>),
}

impl FileCors {
    fn into_list(self) -> Vec<String> {
        match self {
            FileCors::One(s) => vec![s],
            FileCors::Many(v) => v,
        }
    }
}

impl FileContent {
    /// `over`'s keys where given, else `self`'s.
    fn under(&self, over: FileContent) -> FileContent {
        FileContent {
            precompressed: over.precompressed.or_else(|| self.precompressed.clone()),
            error_page: over.error_page.or_else(|| self.error_page.clone()),
            fallback: over.fallback.or_else(|| self.fallback.clone()),
            mime_types: over.mime_types.or_else(|| self.mime_types.clone()),
            headers: over.headers.or_else(|| self.headers.clone()),
            cors: over.cors.or_else(|| self.cors.clone()),
        }
    }

    /// Validates the keys into a site's options; errors start with `which`.
    fn build(self, which: &str) -> Result<crate::handler::Content, ConfigError> {
        use crate::handler::request::Coding;
        let e = |msg: String| ConfigError::new(format!("{which}{msg}"));
        let mut precompressed = Vec::new();
        for name in self.precompressed.unwrap_or_default() {
            if name.trim() == "none" {
                continue;
            }
            let Some(c) = Coding::from_token(name.trim()) else {
                return Err(e(format!("precompressed {name:?}: expected br, zstd, gzip or none")));
            };
            if !precompressed.contains(&c) {
                precompressed.push(c);
            }
        }
        let mut error_pages = Vec::new();
        for (code, path) in self.error_page.unwrap_or_default() {
            let status = match code.trim().parse::<u16>() {
                Ok(s) if (400..600).contains(&s) => s,
                _ => return Err(e(format!("error_page {code:?}: expected a status code from 400 to 599"))),
            };
            error_pages.push((status, local_path(&path).map_err(|m| e(format!("error_page {code}: {m}")))?));
        }
        let fallback = match self.fallback {
            Some(p) => Some(local_path(&p).map_err(|m| e(format!("fallback: {m}")))?),
            None => None,
        };
        let mut mime_types = Vec::new();
        for (ext, t) in self.mime_types.unwrap_or_default() {
            let ext_ok = !ext.is_empty() && ext.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_+".contains(&b));
            if !ext_ok {
                return Err(e(format!("mime_types {ext:?}: expected an extension without the dot, e.g. md")));
            }
            let (essence, _) = t.split_once(';').unwrap_or((&t, ""));
            let essence_ok = essence.trim().split_once('/').is_some_and(|(a, b)| is_token(a) && is_token(b));
            if !essence_ok || !t.bytes().all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic()) {
                return Err(e(format!(
                    "mime_types {ext}: {t:?} is not a media type such as \"text/markdown; charset=utf-8\""
                )));
            }
            mime_types.push((ext.to_ascii_lowercase(), t.trim().to_string()));
        }
        let mut headers = Vec::new();
        for (i, r) in self.headers.unwrap_or_default().into_iter().enumerate() {
            use crate::handler::rules::{parse_duration, HeaderRule, PathMatch};
            let which_rule = format!("headers {}: ", i + 1);
            let paths = match (r.path, r.extensions) {
                (Some(p), None) if !p.is_empty() && !p.contains('\0') => {
                    PathMatch::Glob(crate::handler::rules::Glob::new(&p).map_err(|why| e(format!("{which_rule}{why}")))?)
                }
                (None, Some(exts)) if !exts.is_empty() => {
                    if let Some(bad) = exts.iter().find(|x| x.is_empty() || !x.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_+".contains(&b))) {
                        return Err(e(format!("{which_rule}extension {bad:?}: expected one without the dot, e.g. css")));
                    }
                    PathMatch::Extensions(exts.iter().map(|x| x.to_ascii_lowercase()).collect())
                }
                _ => return Err(e(format!("{which_rule}give path (a glob such as \"/assets/**\") or extensions (a list such as [\"css\", \"js\"]), one of them"))),
            };
            let expires = match r.expires {
                Some(d) => Some(parse_duration(&d).map_err(|m| e(format!("{which_rule}expires: {m}")))?),
                None => None,
            };
            let set = r.set.unwrap_or_default().into_iter().collect();
            let add = r.add.unwrap_or_default().into_iter().collect();
            headers.push(HeaderRule::new(paths, set, add, expires).map_err(|m| e(format!("{which_rule}{m}")))?);
        }
        let cors = match self.cors {
            Some(c) => Some(crate::handler::rules::Cors::parse(&c.into_list()).map_err(e)?),
            None => None,
        };
        Ok(crate::handler::Content { precompressed, error_pages, fallback, mime_types, headers, cors })
    }
}

/// An HTTP token (RFC 9110 section 5.6.2): a header name, a media type's parts.
fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A path beneath ROOT as a request would name it: absolute, no query, no `..`.
fn local_path(p: &str) -> Result<String, String> {
    let ok = p.starts_with('/')
        && !p.contains(['?', '#'])
        && !p.split('/').any(|s| s == "..")
        && p.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(p.to_string())
    } else {
        Err(format!(
            "{p:?} is not a path beneath the root such as /404.html (absolute, printable, no `..`, `?` or `#`)"
        ))
    }
}

/// The configuration file: the same keys as the command-line flags.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    root: Option<PathBuf>,
    listen: Option<Vec<String>>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    workers: Option<usize>,
    ktls: Option<String>,
    tls_versions: Option<Vec<String>>,
    cipher_suites: Option<Vec<String>>,
    record_size: Option<String>,
    tcp_notsent_lowat: Option<u32>,
    tcp_congestion: Option<String>,
    autoindex: Option<bool>,
    dotfiles: Option<bool>,
    access_log: Option<String>,
    handshake_timeout: Option<toml::Value>,
    header_timeout: Option<toml::Value>,
    idle_timeout: Option<toml::Value>,
    send_timeout: Option<toml::Value>,
    shutdown_timeout: Option<toml::Value>,
    max_header_bytes: Option<usize>,
    max_body_bytes: Option<u64>,
    state_dir: Option<PathBuf>,
    ephemeral_cert: Option<bool>,
    ticket_keys: Option<Vec<PathBuf>>,
    http_listen: Option<Vec<String>>,
    hsts: Option<String>,
    user: Option<String>,
    group: Option<String>,
    allow_root: Option<bool>,
    unknown_sni: Option<String>,
    site: Option<Vec<FileSite>>,
    admin: Option<String>,
    admin_public: Option<bool>,
    http2: Option<bool>,
    access_log_format: Option<String>,
    max_connections: Option<usize>,
    h2_max_streams: Option<u32>,
    h2_max_header_list: Option<u32>,
    h2_hpack_table: Option<u32>,
    h2_max_resets: Option<u32>,
    h2_max_control: Option<u32>,
    precompressed: Option<Vec<String>>,
    error_page: Option<std::collections::BTreeMap<String, String>>,
    fallback: Option<String>,
    mime_types: Option<std::collections::BTreeMap<String, String>>,
    headers: Option<Vec<FileHeaderRule>>,
    cors: Option<FileCors>,
}

impl FileConfig {
    fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => return err(format!("cannot read config file {}: {e}", path.display())),
        };
        let mut file: FileConfig = match toml::from_str(&text) {
            Ok(f) => f,
            Err(e) => {
                // One line: where, then what (toml's own rendering spans several lines).
                let at = e.span().map(|s| {
                    let before = &text[..s.start.min(text.len())];
                    let line = before.matches('\n').count() + 1;
                    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                    format!(" line {line}, column {col}:")
                });
                return err(format!(
                    "config file {}:{} {}",
                    path.display(),
                    at.unwrap_or_default(),
                    e.message().trim().replace('\n', " ")
                ));
            }
        };
        // Relative paths in the file are relative to the file, as in nginx.
        let base = path.parent().unwrap_or(Path::new("."));
        file.resolve_paths(base);
        Ok(file)
    }
}

impl FileConfig {
    /// Every path in the file is relative to the file's directory `base`, as in nginx;
    /// `-` and `off` for the access log are not paths.
    fn resolve_paths(&mut self, base: &Path) {
        let rel = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        for p in [&mut self.root, &mut self.cert, &mut self.key, &mut self.state_dir].into_iter().flatten() {
            rel(p);
        }
        for p in self.ticket_keys.iter_mut().flatten() {
            rel(p);
        }
        for site in self.site.iter_mut().flatten() {
            for p in [&mut site.cert, &mut site.key].into_iter().flatten() {
                rel(p);
            }
            rel(&mut site.root);
            if let Some(p) = site.acme.as_mut().and_then(|a| a.directory_ca.as_mut()) {
                rel(p);
            }
        }
        if let Some(log) = &mut self.access_log {
            if log != "-" && log != "off" && Path::new(log.as_str()).is_relative() {
                *log = base.join(log.as_str()).to_string_lossy().into_owned();
            }
        }
        if let Some(admin) = &mut self.admin {
            if admin.contains('/') && Path::new(admin.as_str()).is_relative() {
                *admin = base.join(admin.as_str()).to_string_lossy().into_owned();
            }
        }
    }
}

/// The default state directory: `/var/lib/ktlsd` for root when it exists or `/var/lib` is
/// there to create it in, else `$XDG_STATE_HOME/ktlsd` (when absolute, per the XDG base
/// directory spec), else `$HOME/.local/state/ktlsd`; `None` without any of them.
fn default_state_dir(
    is_root: bool,
    var_lib_usable: bool,
    xdg_state_home: Option<&str>,
    home: Option<&str>,
) -> Option<PathBuf> {
    if is_root && var_lib_usable {
        return Some(PathBuf::from("/var/lib/ktlsd"));
    }
    if let Some(x) = xdg_state_home.filter(|x| Path::new(x).is_absolute()) {
        return Some(Path::new(x).join("ktlsd"));
    }
    home.filter(|h| !h.is_empty()).map(|h| Path::new(h).join(".local/state/ktlsd"))
}

/// [`default_state_dir`] for this process.
fn default_state_dir_here() -> Option<PathBuf> {
    let is_root = crate::sys::effective_uid() == 0;
    let var_lib_usable = is_root && (Path::new("/var/lib/ktlsd").is_dir() || Path::new("/var/lib").is_dir());
    let xdg = std::env::var("XDG_STATE_HOME").ok();
    let home = std::env::var("HOME").ok();
    default_state_dir(is_root, var_lib_usable, xdg.as_deref(), home.as_deref())
}

const DEFAULT_LISTEN: &str = "127.0.0.1:8443";
// The timeouts' defaults; `--help` repeats them (a test in this module checks it does).
const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(15);
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(65);
const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// TCP_NOTSENT_LOWAT applied with the adaptive record policy unless one is configured.
const ADAPTIVE_NOTSENT_LOWAT: u32 = 16 * 1024;

impl Config {
    /// Merges the config file (if any) under the command line and validates the result.
    pub fn from_args(args: ServeArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };

        let autoindex = args.autoindex().or(file.autoindex).unwrap_or(false);
        let dotfiles = args.dotfiles().or(file.dotfiles).unwrap_or(false);

        let root = args.root.or(file.root).unwrap_or_else(|| PathBuf::from("."));
        let root = match root.canonicalize() {
            Ok(r) if r.is_dir() => r,
            Ok(_) => return err(format!("root {} is not a directory", root.display())),
            Err(e) => return err(format!("root {}: {e}", root.display())),
        };

        let listen_strs = if !args.listen.is_empty() {
            args.listen
        } else {
            file.listen.unwrap_or_else(|| vec![DEFAULT_LISTEN.to_string()])
        };
        if listen_strs.is_empty() {
            return err("listen: at least one address is required");
        }
        let mut listen = Vec::new();
        for s in &listen_strs {
            match s.parse::<SocketAddr>() {
                Ok(a) => listen.push(a),
                Err(_) => {
                    return err(format!("listen address {s:?} is not IP:PORT (e.g. 127.0.0.1:8443 or [::1]:8443)"))
                }
            }
        }

        let cert = args.cert.or(file.cert);
        let key = args.key.or(file.key);
        match (&cert, &key) {
            (Some(_), None) => return err("--cert was given without --key"),
            (None, Some(_)) => return err("--key was given without --cert"),
            _ => {}
        }

        let workers = match args.workers.or(file.workers) {
            Some(0) => return err("workers must be at least 1"),
            Some(n) if n > 1024 => return err(format!("workers {n} is more than 1024")),
            Some(n) => n,
            None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        };

        let ktls = match args.ktls.or(file.ktls).as_deref() {
            None | Some("auto") => KtlsMode::Auto,
            Some("on") => KtlsMode::On,
            Some("off") => KtlsMode::Off,
            Some(other) => return err(format!("ktls {other:?}: expected auto, on or off")),
        };

        let versions: Vec<String> = match (args.tls_versions, file.tls_versions) {
            (Some(s), _) => split_list(&s),
            (None, Some(v)) => v,
            (None, None) => vec!["1.2".into(), "1.3".into()],
        };
        let mut tls_versions = Vec::new();
        for v in &versions {
            let parsed = match v.trim().to_ascii_lowercase().trim_start_matches("tls").trim_start_matches('v') {
                "1.2" | "12" => TlsVersion::Tls12,
                "1.3" | "13" => TlsVersion::Tls13,
                _ => return err(format!("tls_versions: {v:?} is not 1.2 or 1.3")),
            };
            if !tls_versions.contains(&parsed) {
                tls_versions.push(parsed);
            }
        }
        if tls_versions.is_empty() {
            return err("tls_versions: at least one of 1.2, 1.3 is required");
        }

        let cipher_suites = match (args.cipher_suites, file.cipher_suites) {
            (Some(s), _) => Some(split_list(&s)),
            (None, v) => v,
        };

        let record_policy = match args.record_size.or(file.record_size) {
            Some(s) => match s.parse::<RecordPolicy>() {
                Ok(p) => p,
                Err(e) => return err(format!("record_size {s:?}: {e}")),
            },
            None => RecordPolicy::default(),
        };

        // Adaptive records are sized from the window at the moment they are written;
        // a small unsent queue keeps that moment close to when they leave.
        let adaptive_lowat = matches!(record_policy, RecordPolicy::Adaptive).then_some(ADAPTIVE_NOTSENT_LOWAT);
        let tcp = TcpOptions {
            notsent_lowat: args.tcp_notsent_lowat.or(file.tcp_notsent_lowat).or(adaptive_lowat),
            congestion: args.tcp_congestion.or(file.tcp_congestion),
        };
        if tcp.notsent_lowat == Some(0) {
            return err("tcp_notsent_lowat must be greater than 0");
        }

        let access_log = match args.access_log.or(file.access_log).as_deref() {
            None | Some("-") => AccessLogTarget::Stdout,
            Some("off") => AccessLogTarget::Off,
            Some(p) => AccessLogTarget::File(PathBuf::from(p)),
        };

        let file_path = args.config.as_deref();
        let t = |flag: &str, cli: Option<String>, file: Option<toml::Value>, default: Duration| {
            timeout(flag, cli.as_deref(), file.as_ref(), file_path, default)
        };
        let timeouts = Timeouts {
            handshake: t(
                "handshake_timeout",
                args.handshake_timeout,
                file.handshake_timeout,
                DEFAULT_HANDSHAKE_TIMEOUT,
            )?,
            header: t("header_timeout", args.header_timeout, file.header_timeout, DEFAULT_HEADER_TIMEOUT)?,
            idle: t("idle_timeout", args.idle_timeout, file.idle_timeout, DEFAULT_IDLE_TIMEOUT)?,
            send: t("send_timeout", args.send_timeout, file.send_timeout, DEFAULT_SEND_TIMEOUT)?,
            shutdown: t("shutdown_timeout", args.shutdown_timeout, file.shutdown_timeout, DEFAULT_SHUTDOWN_TIMEOUT)?,
        };

        let max_header_bytes = args.max_header_bytes.or(file.max_header_bytes).unwrap_or(16 * 1024);
        if !(1024..=1024 * 1024).contains(&max_header_bytes) {
            return err(format!("max_header_bytes {max_header_bytes}: expected 1024 to 1048576"));
        }
        let limits = Limits {
            max_header_bytes,
            max_body_bytes: args.max_body_bytes.or(file.max_body_bytes).unwrap_or(1024 * 1024),
        };

        // `ServeArgs::ephemeral_cert()` cannot be called on the partly moved `args`; clap's
        // `overrides_with` leaves at most one of the pair set.
        let cli_ephemeral = match (args.ephemeral_cert, args.no_ephemeral_cert) {
            (true, _) => Some(true),
            (false, true) => Some(false),
            (false, false) => None,
        };
        let ephemeral_cert = cli_ephemeral.or(file.ephemeral_cert).unwrap_or(false);
        let state_dir = args.state_dir.or(file.state_dir).or_else(default_state_dir_here);
        let ticket_keys =
            if !args.ticket_keys.is_empty() { args.ticket_keys } else { file.ticket_keys.unwrap_or_default() };
        let http_strs =
            if !args.http_listen.is_empty() { args.http_listen } else { file.http_listen.unwrap_or_default() };
        let mut http_listen = Vec::new();
        for s in &http_strs {
            let Ok(a) = s.parse::<SocketAddr>() else {
                return err(format!("http_listen address {s:?} is not IP:PORT (e.g. 0.0.0.0:80 or [::]:80)"));
            };
            if a.port() != 0 && listen.contains(&a) {
                return err(format!(
                    "http_listen address {a} is also a listen (HTTPS) address; give each its own port"
                ));
            }
            http_listen.push(a);
        }
        let hsts = match args.hsts.or(file.hsts) {
            Some(v) => Some(validate_hsts(&v)?),
            None => None,
        };
        let user = args.user.or(file.user);
        let group = args.group.or(file.group);
        if group.is_some() && user.is_none() {
            return err("group was given without user (set --user too)");
        }
        for (key, name) in [("user", &user), ("group", &group)] {
            if name.as_deref().is_some_and(|n| n.is_empty() || n.contains('\0')) {
                return err(format!("{key} {name:?} is not a valid name"));
            }
        }
        let allow_root = args.allow_root || file.allow_root.unwrap_or(false);
        let unknown_sni = match args.unknown_sni.or(file.unknown_sni).as_deref() {
            None | Some("default") => UnknownName::Default,
            Some("refuse") => UnknownName::Refuse,
            Some(other) => return err(format!("unknown_sni {other:?}: expected default or refuse")),
        };
        // The command line's content options over the file's top level.
        let mut top = FileContent {
            precompressed: file.precompressed,
            error_page: file.error_page,
            fallback: file.fallback,
            mime_types: file.mime_types,
            headers: file.headers,
            cors: file.cors,
        };
        if !args.mime_type.is_empty() {
            let mut types = std::collections::BTreeMap::new();
            for item in &args.mime_type {
                let Some((ext, t)) = item.split_once('=') else {
                    return err(format!("--mime-type {item:?}: expected EXT=TYPE, e.g. md=text/markdown"));
                };
                types.insert(ext.to_string(), t.to_string());
            }
            top.mime_types = Some(types);
        }
        if let Some(list) = &args.precompressed {
            top.precompressed = Some(split_list(list));
        }
        if !args.error_page.is_empty() {
            let mut pages = std::collections::BTreeMap::new();
            for item in &args.error_page {
                let Some((code, path)) = item.split_once('=') else {
                    return err(format!("--error-page {item:?}: expected CODE=PATH, e.g. 404=/404.html"));
                };
                pages.insert(code.to_string(), path.to_string());
            }
            top.error_page = Some(pages);
        }
        if let Some(p) = &args.fallback {
            top.fallback = Some(p.clone());
        }
        if let Some(list) = &args.cors {
            top.cors = Some(FileCors::Many(split_list(list)));
        }
        if !args.header.is_empty() {
            let mut rules = Vec::new();
            for item in &args.header {
                let parsed = item.split_once('=').and_then(|(glob, field)| Some((glob, field.split_once(':')?)));
                let Some((glob, (name, value))) = parsed else {
                    return err(format!("--header {item:?}: expected GLOB=NAME: VALUE, e.g. \"/assets/**=Cache-Control: max-age=31536000\""));
                };
                let set = std::collections::BTreeMap::from([(name.trim().to_string(), value.trim().to_string())]);
                rules.push(FileHeaderRule {
                    path: Some(glob.to_string()),
                    extensions: None,
                    set: Some(set),
                    add: None,
                    expires: None,
                });
            }
            top.headers = Some(rules);
        }
        let content = top.clone().build("")?;
        let sites = sites(file.site.unwrap_or_default(), hsts.as_deref(), autoindex, dotfiles, &top)?;
        for site in &sites {
            let SiteCert::Acme(acme) = &site.cert else { continue };
            let which = site.names.dns_names().join(", ");
            if acme.challenge == crate::acme::Challenge::Http01 && http_listen.is_empty() {
                return err(format!(
                    "site {which}: ACME http-01 needs a plain-HTTP listener: set http_listen (e.g. [\"0.0.0.0:80\"])"
                ));
            }
            if state_dir.is_none() {
                return err(format!(
                    "site {which}: ACME needs a state directory for the account and certificates: set state_dir"
                ));
            }
        }
        let admin_public = args.admin_public || file.admin_public.unwrap_or(false);
        let admin = match args.admin.or(file.admin).as_deref() {
            None | Some("off") => None,
            Some(v) => Some(AdminAddr::parse(v)?),
        };
        match &admin {
            Some(AdminAddr::Tcp(a)) if !a.ip().is_loopback() && !admin_public => {
                return err(format!(
                    "admin address {a} is not a loopback address: metrics and status would be public; use 127.0.0.1:PORT, [::1]:PORT or a Unix socket, or set admin_public = true"
                ));
            }
            Some(AdminAddr::Tcp(a)) if listen.contains(a) || http_listen.contains(a) => {
                return err(format!("admin address {a} is also a listen or http_listen address; give it its own port"));
            }
            _ => {}
        }
        // clap accepts only on/off for the flag.
        let http2 = match (args.http2.as_deref(), file.http2) {
            (Some("off"), _) | (None, Some(false)) => Http2::Off,
            _ => Http2::On,
        };
        let access_log_format = match args.access_log_format.or(file.access_log_format) {
            Some(f) => f.parse().map_err(ConfigError::new)?,
            None => crate::log::LogFormat::default(),
        };
        let max_connections = match args.max_connections.or(file.max_connections) {
            Some(n) => Some(std::num::NonZeroUsize::new(n).ok_or_else(|| {
                ConfigError::new("max_connections must be at least 1 (leave it out for the file descriptor budget)")
            })?),
            None => None,
        };
        let h2_limits = h2_limits([
            args.h2_max_streams.or(file.h2_max_streams),
            args.h2_max_header_list.or(file.h2_max_header_list),
            args.h2_hpack_table.or(file.h2_hpack_table),
            args.h2_max_resets.or(file.h2_max_resets),
            args.h2_max_control.or(file.h2_max_control),
        ])?;

        Ok(Config {
            root,
            listen,
            cert,
            key,
            workers,
            ktls,
            tls_versions,
            cipher_suites,
            record_policy,
            tcp,
            autoindex,
            dotfiles,
            access_log,
            timeouts,
            limits,
            state_dir,
            ephemeral_cert,
            ticket_keys,
            http_listen,
            hsts,
            user,
            group,
            allow_root,
            sites,
            unknown_sni,
            admin,
            http2,
            access_log_format,
            max_connections,
            h2_limits,
            content,
        })
    }
}

/// The HTTP/2 limits from their keys (in the order of [`H2_LIMITS`]), each checked
/// against its range; a key not given keeps the codec's default.
fn h2_limits(values: [Option<u32>; 5]) -> Result<crate::http::h2::Limits, ConfigError> {
    let mut limits = crate::http::h2::Limits::default();
    for ((key, range, set), value) in H2_LIMITS.iter().zip(values) {
        let Some(v) = value else { continue };
        if !range.contains(&v) {
            return err(format!("{key} {v}: expected {} to {}", range.start(), range.end()));
        }
        set(&mut limits, v);
    }
    // The encoded field block may not be smaller than the decoded list it carries
    // (HPACK can only shrink it so far), or a request within the list limit could
    // end the connection.
    limits.max_header_block = limits.max_header_block.max(2 * limits.max_header_list_size as usize);
    Ok(limits)
}

/// How one HTTP/2 limit is applied.
type SetLimit = fn(&mut crate::http::h2::Limits, u32);

/// The HTTP/2 limit keys, their allowed ranges and where each goes. At least one
/// stream; header lists from 1 KiB (no browser request fits less) to 1 MiB (the
/// HTTP/1.1 head limit's ceiling); the HPACK table up to 64 KiB; rates at least
/// 1 per window.
const H2_LIMITS: [(&str, std::ops::RangeInclusive<u32>, SetLimit); 5] = [
    ("h2_max_streams", 1..=10_000, |l, v| l.max_concurrent_streams = v),
    ("h2_max_header_list", 1024..=1024 * 1024, |l, v| l.max_header_list_size = v),
    ("h2_hpack_table", 0..=64 * 1024, |l, v| l.header_table_size = v),
    ("h2_max_resets", 1..=1_000_000, |l, v| l.max_resets = v),
    ("h2_max_control", 1..=1_000_000, |l, v| l.max_control = v),
];

/// A site's `acme` table: a URL directory, a challenge type, exact names only
/// (a CA validates wildcards by DNS-01, which ktlsd does not answer).
fn site_acme(which: &str, names: &crate::names::Names, a: FileAcme) -> Result<SiteAcme, ConfigError> {
    use crate::acme::Challenge;
    if names.dns_names().len() != names.exact().len() {
        return err(format!(
            "{which}: ACME cannot validate wildcard names by http-01 or tls-alpn-01: list exact names"
        ));
    }
    if !a.directory.starts_with("https://") {
        return err(format!("{which}: acme directory {:?}: expected an https:// URL (e.g. https://acme-v02.api.letsencrypt.org/directory)", a.directory));
    }
    let challenge = match a.challenge.as_deref() {
        None | Some("tls-alpn-01") => Challenge::TlsAlpn01,
        Some("http-01") => Challenge::Http01,
        Some(other) => return err(format!("{which}: acme challenge {other:?}: expected tls-alpn-01 or http-01")),
    };
    if let Some(ca) = &a.directory_ca {
        if !ca.is_file() {
            return err(format!("{which}: acme directory_ca {}: no such file", ca.display()));
        }
    }
    Ok(SiteAcme { directory: a.directory, email: a.email, challenge, directory_ca: a.directory_ca })
}

/// Validates the `[[site]]` blocks: names well formed and each in one site only,
/// roots directories, `cert` and `key` together. Options a site leaves out are
/// the top-level ones.
fn sites(
    file: Vec<FileSite>,
    hsts: Option<&str>,
    autoindex: bool,
    dotfiles: bool,
    content: &FileContent,
) -> Result<Vec<SiteConfig>, ConfigError> {
    let mut out: Vec<SiteConfig> = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for (i, s) in file.into_iter().enumerate() {
        let which = format!("site {} ({})", i + 1, s.names.first().map(String::as_str).unwrap_or("no names"));
        let names = crate::names::Names::parse(&s.names).map_err(|e| ConfigError::new(format!("{which}: {e}")))?;
        for n in names.dns_names() {
            if let Some(other) = seen.insert(n.clone(), which.clone()) {
                return err(format!("{which}: name {n} is also in {other}; each name belongs to one site"));
            }
        }
        let root = match s.root.canonicalize() {
            Ok(r) if r.is_dir() => r,
            Ok(_) => return err(format!("{which}: root {} is not a directory", s.root.display())),
            Err(e) => return err(format!("{which}: root {}: {e}", s.root.display())),
        };
        let cert = match (s.cert, s.key) {
            (Some(_), _) | (_, Some(_)) if s.acme.is_some() => {
                return err(format!("{which}: give either cert and key or acme, not both"))
            }
            (None, None) if s.acme.is_some() => SiteCert::Acme(site_acme(&which, &names, s.acme.unwrap_or_default())?),
            (Some(cert), Some(key)) => SiteCert::Files { cert, key },
            (None, None) => SiteCert::SelfSigned,
            (Some(_), None) => return err(format!("{which}: cert was given without key")),
            (None, Some(_)) => return err(format!("{which}: key was given without cert")),
        };
        let hsts = match s.hsts {
            Some(v) => Some(validate_hsts(&v).map_err(|e| ConfigError::new(format!("{which}: {e}")))?),
            None => hsts.map(String::from),
        };
        let site_content = content
            .under(FileContent {
                precompressed: s.precompressed,
                error_page: s.error_page,
                fallback: s.fallback,
                mime_types: s.mime_types,
                headers: s.headers,
                cors: s.cors,
            })
            .build(&format!("{which}: "))?;
        out.push(SiteConfig {
            content: site_content,
            names,
            root,
            cert,
            hsts,
            autoindex: s.autoindex.unwrap_or(autoindex),
            dotfiles: s.dotfiles.unwrap_or(dotfiles),
        });
    }
    Ok(out)
}

/// A Strict-Transport-Security value: `max-age=SECONDS` first (RFC 6797 section 6.1),
/// then any directives, in characters a header value may hold.
fn validate_hsts(v: &str) -> Result<String, ConfigError> {
    let v = v.trim();
    let age = v.get(..8).filter(|p| p.eq_ignore_ascii_case("max-age=")).map(|_| &v[8..]);
    let digits = age.map_or(0, |a| a.bytes().take_while(u8::is_ascii_digit).count());
    let rest_ok = age.is_some_and(|a| a[digits..].is_empty() || a[digits..].trim_start().starts_with(';'));
    if digits == 0 || !rest_ok {
        return err(format!(
            "hsts {v:?}: expected max-age=SECONDS first, e.g. \"max-age=31536000; includeSubDomains\""
        ));
    }
    if !v.bytes().all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic()) {
        return err(format!("hsts {v:?}: only printable ASCII may appear in a header value"));
    }
    Ok(v.to_string())
}

fn split_list(s: &str) -> Vec<String> {
    s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
}

/// How a duration may be written, for error messages.
const DURATION_FORMS: &str = "expected seconds (65) or a number with a unit (65s, 500ms, 2m, 1h), from 1ms to 24h";

/// One timeout: the command line's string over the file's value (an integer or float of
/// seconds, or a string as on the command line) over `default`. An error names the flag or,
/// for a file value, the key and the file.
fn timeout(
    key: &str,
    cli: Option<&str>,
    file: Option<&toml::Value>,
    file_path: Option<&Path>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    if let Some(s) = cli {
        return parse_duration(s)
            .ok_or_else(|| ConfigError::new(format!("--{} {s:?}: {DURATION_FORMS}", key.replace('_', "-"))));
    }
    let (parsed, shown) = match file {
        None => return Ok(default),
        Some(toml::Value::Integer(i)) => (secs_duration(*i as f64), i.to_string()),
        Some(toml::Value::Float(f)) => (secs_duration(*f), f.to_string()),
        Some(toml::Value::String(s)) => (parse_duration(s), format!("{s:?}")),
        Some(other) => (None, format!("of type {}", other.type_str())),
    };
    parsed.ok_or_else(|| {
        let file = file_path.map(|p| format!("config file {}: ", p.display())).unwrap_or_default();
        ConfigError::new(format!("{file}{key} {shown}: {DURATION_FORMS}"))
    })
}

/// Parses `65` or `1.5` (seconds), `65s`, `500ms`, `2m`, `1h`; `None` if malformed or out of range.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, unit) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    // Plain decimals only: f64's parser also takes "inf", "NaN", "1e3", "+5" and "-1".
    if !num.bytes().any(|b| b.is_ascii_digit()) || !num.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    secs_duration(num.parse::<f64>().ok()? * unit)
}

/// Seconds to a timeout, if between 1 ms and 24 h.
fn secs_duration(secs: f64) -> Option<Duration> {
    // The lower bound is a hair under 1 ms so that "1ms" (1 * 0.001) is not lost to rounding.
    (secs.is_finite() && (0.000_999_9..=86_400.0).contains(&secs)).then(|| Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::{CommandFactory, Parser};

    #[test]
    fn durations_parse() {
        let ms = Duration::from_millis;
        for (text, want) in [
            ("65", Some(ms(65_000))),
            ("65s", Some(ms(65_000))),
            ("500ms", Some(ms(500))),
            ("2m", Some(ms(120_000))),
            ("1h", Some(ms(3_600_000))),
            ("24h", Some(ms(86_400_000))),
            ("1.5", Some(ms(1_500))),
            ("0.25s", Some(ms(250))),
            ("1ms", Some(ms(1))),
            (" 10s ", Some(ms(10_000))),
            ("0", None),
            ("0s", None),
            ("0.5ms", None),
            ("25h", None),
            ("86401", None),
            ("-1", None),
            ("+5", None),
            ("1e3", None),
            ("NaN", None),
            ("inf", None),
            ("", None),
            ("s", None),
            ("ms", None),
            (".", None),
            ("1.2.3", None),
            ("10 s", None),
            ("10sec", None),
            ("5d", None),
            ("1m30s", None),
        ] {
            assert_eq!(parse_duration(text), want, "{text:?}");
        }
    }

    #[test]
    fn timeouts_from_cli_file_and_default() {
        let def = Duration::from_secs(7);
        let path = Path::new("/etc/ktlsd.toml");
        let v = |s: &str| -> toml::Value { toml::from_str::<toml::Table>(&format!("v = {s}")).unwrap()["v"].clone() };
        for (cli, file, want) in [
            (None, None, Ok(def)),
            (Some("2s"), Some(v("30")), Ok(Duration::from_secs(2))),
            (None, Some(v("30")), Ok(Duration::from_secs(30))),
            (None, Some(v("2.5")), Ok(Duration::from_millis(2_500))),
            (None, Some(v("\"500ms\"")), Ok(Duration::from_millis(500))),
            (None, Some(v("\"2m\"")), Ok(Duration::from_secs(120))),
            (Some("abc"), None, Err("--idle-timeout \"abc\": expected seconds (65) or a number with a unit")),
            (Some("abc"), Some(v("30")), Err("--idle-timeout \"abc\"")),
            (None, Some(v("\"soon\"")), Err("config file /etc/ktlsd.toml: idle_timeout \"soon\": expected seconds")),
            (None, Some(v("0")), Err("config file /etc/ktlsd.toml: idle_timeout 0: expected")),
            (None, Some(v("-3")), Err("idle_timeout -3: expected")),
            (None, Some(v("true")), Err("idle_timeout of type boolean: expected")),
            (None, Some(v("[1]")), Err("idle_timeout of type array: expected")),
        ] {
            let got = timeout("idle_timeout", cli, file.as_ref(), Some(path), def);
            match (got, want) {
                (Ok(d), Ok(w)) => assert_eq!(d, w, "{cli:?} {file:?}"),
                (Err(e), Err(w)) => {
                    let e = e.to_string();
                    assert!(e.contains(w), "{cli:?} {file:?}: {e}");
                    assert!(e.contains("500ms, 2m, 1h"), "accepted forms not named: {e}");
                }
                (got, want) => panic!("{cli:?} {file:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// A temporary directory holding `dirs` and a `ktlsd.toml` with `toml`; the
    /// directory lives as long as the returned guard.
    fn config_file(dirs: &[&str], toml: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        for d in dirs {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let cfg = dir.path().join("ktlsd.toml");
        std::fs::write(&cfg, toml).unwrap();
        (dir, cfg)
    }

    fn serve_args(argv: &[&str]) -> ServeArgs {
        let argv = ["ktlsd", "serve"].iter().chain(argv);
        match Cli::try_parse_from(argv) {
            Ok(Cli { command: Command::Serve(a) }) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn switches_merge_with_the_command_line_winning() {
        for (argv, file, want) in [
            (&[][..], None, false),
            (&[][..], Some(true), true),
            (&[][..], Some(false), false),
            (&["--autoindex"][..], None, true),
            (&["--autoindex"][..], Some(false), true),
            (&["--no-autoindex"][..], Some(true), false),
            (&["--no-autoindex"][..], None, false),
            (&["--autoindex", "--no-autoindex"][..], Some(true), false),
            (&["--no-autoindex", "--autoindex"][..], Some(false), true),
        ] {
            let args = serve_args(argv);
            assert_eq!(args.autoindex().or(file).unwrap_or(false), want, "{argv:?} over {file:?}");
            // The same flags spelled for dotfiles behave the same.
            let dot: Vec<String> = argv.iter().map(|a| a.replace("autoindex", "dotfiles")).collect();
            let dot: Vec<&str> = dot.iter().map(String::as_str).collect();
            assert_eq!(serve_args(&dot).dotfiles().or(file).unwrap_or(false), want, "{dot:?} over {file:?}");
        }
    }

    #[test]
    fn switches_from_file_are_overridden_by_no_flags() {
        let (_dir, cfg) = config_file(&[], "autoindex = true\ndotfiles = true\n");
        let path = cfg.to_str().unwrap();
        let c = Config::from_args(serve_args(&["--config", path])).unwrap();
        assert!(c.autoindex && c.dotfiles);
        let c = Config::from_args(serve_args(&["--config", path, "--no-autoindex", "--no-dotfiles"])).unwrap();
        assert!(!c.autoindex && !c.dotfiles);
    }

    /// Relative paths in the file resolve against the file's directory; on the command
    /// line they stay relative, i.e. against the working directory.
    #[test]
    fn relative_paths_resolve_against_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("conf");
        std::fs::create_dir_all(conf.join("www")).unwrap();
        let cfg = conf.join("ktlsd.toml");
        std::fs::write(
            &cfg,
            concat!(
                "root = \"www\"\n",
                "cert = \"tls/cert.pem\"\nkey = \"tls/key.pem\"\n",
                "access_log = \"logs/access.log\"\n",
                "state_dir = \"state\"\n",
                "ticket_keys = [\"t/a.key\", \"/abs/b.key\"]\n",
            ),
        )
        .unwrap();
        let f = FileConfig::load(&cfg).unwrap();
        assert_eq!(f.root, Some(conf.join("www")));
        assert_eq!(f.cert, Some(conf.join("tls/cert.pem")));
        assert_eq!(f.key, Some(conf.join("tls/key.pem")));
        assert_eq!(f.access_log, Some(conf.join("logs/access.log").to_string_lossy().into_owned()));
        assert_eq!(f.state_dir, Some(conf.join("state")));
        assert_eq!(f.ticket_keys, Some(vec![conf.join("t/a.key"), PathBuf::from("/abs/b.key")]));

        let mut f = FileConfig { access_log: Some("-".into()), ..Default::default() };
        f.resolve_paths(&conf);
        assert_eq!(f.access_log.as_deref(), Some("-"));
        let mut f =
            FileConfig { access_log: Some("off".into()), state_dir: Some("/var/x".into()), ..Default::default() };
        f.resolve_paths(&conf);
        assert_eq!((f.access_log.as_deref(), f.state_dir), (Some("off"), Some(PathBuf::from("/var/x"))));

        // The command line's relative paths are the working directory's.
        let cfg_s = cfg.to_str().unwrap();
        let c = Config::from_args(serve_args(&[
            "--config",
            cfg_s,
            "--access-log",
            "cli.log",
            "--state-dir",
            "st",
            "--ticket-keys",
            "k1",
            "--ticket-keys",
            "k2",
        ]))
        .unwrap();
        assert_eq!(c.access_log, AccessLogTarget::File(PathBuf::from("cli.log")));
        assert_eq!(c.state_dir, Some(PathBuf::from("st")));
        assert_eq!(c.ticket_keys, [PathBuf::from("k1"), PathBuf::from("k2")]);
        let c = Config::from_args(serve_args(&["--config", cfg_s, "--ephemeral-cert"])).unwrap();
        assert_eq!(c.access_log, AccessLogTarget::File(conf.join("logs/access.log")));
        assert_eq!(c.state_dir, Some(conf.join("state")));
        assert!(c.ephemeral_cert);
        assert_eq!(c.root, conf.join("www").canonicalize().unwrap());
    }

    #[test]
    fn default_state_dir_choice() {
        let p = |s: &str| Some(PathBuf::from(s));
        for (root, var_lib, xdg, home, want) in [
            (true, true, Some("/x"), Some("/root"), p("/var/lib/ktlsd")),
            (true, false, None, Some("/root"), p("/root/.local/state/ktlsd")),
            (false, true, Some("/run/u/state"), Some("/home/u"), p("/run/u/state/ktlsd")),
            (false, false, None, Some("/home/u"), p("/home/u/.local/state/ktlsd")),
            // XDG says a relative XDG_STATE_HOME is to be ignored.
            (false, false, Some("rel"), Some("/home/u"), p("/home/u/.local/state/ktlsd")),
            (false, false, Some(""), Some("/home/u"), p("/home/u/.local/state/ktlsd")),
            (false, false, None, Some(""), None),
            (false, false, None, None, None),
        ] {
            assert_eq!(default_state_dir(root, var_lib, xdg, home), want, "{root} {var_lib} {xdg:?} {home:?}");
        }
    }

    #[test]
    fn hsts_values() {
        for (v, ok) in [
            ("max-age=31536000; includeSubDomains", true),
            ("max-age=0", true),
            ("MAX-AGE=63072000; includeSubDomains; preload", true),
            (" max-age=1 ", true),
            ("max-age=1 ;preload", true),
            ("includeSubDomains; max-age=1", false),
            ("max-age=", false),
            ("max-age=abc", false),
            ("max-age=1x", false),
            ("max-age=\"1\"", false),
            ("max-age=1; a\r\nSet-Cookie: x", false),
            ("", false),
        ] {
            let got = validate_hsts(v);
            assert_eq!(got.is_ok(), ok, "{v:?}: {got:?}");
            if let Err(e) = got {
                assert!(e.to_string().starts_with("hsts "), "{e}");
            }
        }
    }

    /// `[default: X]` in each flag's help is what the configuration really defaults to.
    #[test]
    fn help_states_the_real_defaults() {
        let cmd = Cli::command();
        let serve = cmd.find_subcommand("serve").unwrap();
        let default_of = |id: &str| -> String {
            let arg = serve.get_arguments().find(|a| a.get_id() == id).unwrap_or_else(|| panic!("no {id}"));
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            let start = help.find("[default: ").unwrap_or_else(|| panic!("{id}: no default in {help:?}")) + 10;
            help[start..help.len() - 1].to_string()
        };
        let c = Config::from_args(ServeArgs::default()).unwrap();
        for (id, got) in [
            ("handshake_timeout", c.timeouts.handshake),
            ("header_timeout", c.timeouts.header),
            ("idle_timeout", c.timeouts.idle),
            ("send_timeout", c.timeouts.send),
            ("shutdown_timeout", c.timeouts.shutdown),
        ] {
            assert_eq!(parse_duration(&default_of(id)), Some(got), "{id}");
        }
        assert_eq!(default_of("max_header_bytes"), c.limits.max_header_bytes.to_string());
        assert_eq!(default_of("max_body_bytes"), c.limits.max_body_bytes.to_string());
        assert_eq!(default_of("listen").parse::<SocketAddr>().ok(), Some(c.listen[0]));
        assert_eq!(c.ktls, KtlsMode::Auto);
        assert_eq!(default_of("ktls"), "auto");
        assert_eq!(c.tls_versions, [TlsVersion::Tls12, TlsVersion::Tls13]);
        assert_eq!(default_of("tls_versions"), "1.2,1.3");
        assert_eq!(default_of("record_size").parse::<RecordPolicy>().ok(), Some(c.record_policy));
        assert_eq!(c.tcp.notsent_lowat, None);
        assert!(default_of("tcp_notsent_lowat").contains(&ADAPTIVE_NOTSENT_LOWAT.to_string()));
        assert!(!c.autoindex && !c.dotfiles);
        assert_eq!((default_of("autoindex").as_str(), default_of("dotfiles").as_str()), ("off", "off"));
        assert_eq!(c.access_log, AccessLogTarget::Stdout);
        assert_eq!(default_of("access_log"), "-");
        assert!(!c.ephemeral_cert && c.ticket_keys.is_empty());
        assert_eq!(default_of("ephemeral_cert"), "off");
        assert!(default_of("state_dir").contains("/var/lib/ktlsd"));
        assert!(c.http_listen.is_empty() && c.hsts.is_none());
        assert_eq!((default_of("http_listen").as_str(), default_of("hsts").as_str()), ("none", "none"));
        assert_eq!((c.user.as_deref(), c.group.as_deref(), c.allow_root), (None, None, false));
        assert_eq!((default_of("user").as_str(), default_of("allow_root").as_str()), ("none", "off"));
        assert_eq!((c.unknown_sni, default_of("unknown_sni").as_str()), (UnknownName::Default, "default"));
        assert!(c.sites.is_empty());
    }

    #[test]
    fn content_options_are_per_site_over_the_top_level() {
        use crate::handler::request::Coding;
        let (_dir, cfg) = config_file(
            &["www", "a", "b"],
            concat!(
                "root = \"www\"\nprecompressed = [\"gzip\"]\nfallback = \"/index.html\"\n",
                "[mime_types]\nmd = \"text/markdown\"\n",
                "[[site]]\nnames = [\"a.test\"]\nroot = \"a\"\n",
                "[[site]]\nnames = [\"b.test\"]\nroot = \"b\"\nprecompressed = [\"br\", \"none\", \"br\"]\nerror_page = { 404 = \"/e.html\" }\n",
            ),
        );
        let c = Config::from_args(serve_args(&["--config", cfg.to_str().unwrap()])).unwrap();
        assert_eq!(c.content.precompressed, [Coding::Gzip]);
        assert_eq!(c.content.fallback.as_deref(), Some("/index.html"));
        let (a, b) = (&c.sites[0].content, &c.sites[1].content);
        assert_eq!(a, &c.content, "a site without the keys takes the top level's");
        assert_eq!(b.precompressed, [Coding::Br], "its own list, `none` skipped, once each");
        assert_eq!(b.error_pages, [(404, "/e.html".to_string())]);
        assert_eq!((b.fallback.as_deref(), b.mime_types.len()), (Some("/index.html"), 1));
        // The command line sets the top level.
        let c =
            Config::from_args(serve_args(&["--config", cfg.to_str().unwrap(), "--precompressed", "zstd,br"])).unwrap();
        assert_eq!(c.content.precompressed, [Coding::Zstd, Coding::Br]);
        assert_eq!(c.sites[0].content.precompressed, [Coding::Zstd, Coding::Br]);
        assert_eq!(c.sites[1].content.precompressed, [Coding::Br]);
    }

    #[test]
    fn header_rules_and_cors_are_per_site() {
        use crate::handler::rules::{Cors, PathMatch};
        let (_dir, cfg) = config_file(
            &["www", "a", "b"],
            concat!(
                "root = \"www\"\ncors = \"*\"\n",
                "[[headers]]\nextensions = [\"CSS\"]\nexpires = \"1h\"\n",
                "[[site]]\nnames = [\"a.test\"]\nroot = \"a\"\n",
                "[[site]]\nnames = [\"b.test\"]\nroot = \"b\"\ncors = [\"https://B.example\"]\n",
                "[[site.headers]]\npath = \"/x/**\"\nset = { \"X-A\" = \"1\" }\n",
            ),
        );
        let c = Config::from_args(serve_args(&["--config", cfg.to_str().unwrap()])).unwrap();
        assert_eq!(c.content.cors, Some(Cors::Any));
        assert_eq!(c.content.headers[0].paths, PathMatch::Extensions(vec!["css".into()]));
        assert_eq!(c.content.headers[0].expires, Some(std::time::Duration::from_secs(3600)));
        let (a, b) = (&c.sites[0].content, &c.sites[1].content);
        assert_eq!(a, &c.content, "a site without the keys takes the top level's");
        assert_eq!(b.cors, Some(Cors::Origins(vec!["https://b.example".into()])));
        assert_eq!(b.headers.len(), 1, "a site's list replaces the top level's");
        assert_eq!(
            (&b.headers[0].paths, &b.headers[0].set[..]),
            (
                &PathMatch::Glob(crate::handler::rules::Glob::new("/x/**").unwrap()),
                &[("X-A".to_string(), "1".to_string())][..]
            )
        );
        // The command line sets the top level.
        let c = Config::from_args(serve_args(&[
            "--config",
            cfg.to_str().unwrap(),
            "--header",
            "*.js=Cache-Control: no-cache",
            "--cors",
            "https://c.example",
        ]))
        .unwrap();
        assert_eq!(c.content.headers[0].set, [("Cache-Control".to_string(), "no-cache".to_string())]);
        assert_eq!(c.sites[0].content.cors, Some(Cors::Origins(vec!["https://c.example".into()])));
        assert_eq!(
            c.sites[1].content.headers[0].paths,
            PathMatch::Glob(crate::handler::rules::Glob::new("/x/**").unwrap())
        );
    }

    #[test]
    fn admin_addresses() {
        // (flags, Ok(address) or Err(part of the message))
        type Want = Result<Option<&'static str>, &'static str>;
        let table: [(&[&str], Want); 9] = [
            (&[], Ok(None)),
            (&["--admin", "off"], Ok(None)),
            (&["--admin", "127.0.0.1:9443"], Ok(Some("127.0.0.1:9443"))),
            (&["--admin", "[::1]:9443"], Ok(Some("[::1]:9443"))),
            (&["--admin", "/run/ktlsd/admin.sock"], Ok(Some("/run/ktlsd/admin.sock"))),
            (&["--admin", "0.0.0.0:9443"], Err("not a loopback address")),
            (&["--admin", "0.0.0.0:9443", "--admin-public"], Ok(Some("0.0.0.0:9443"))),
            (&["--admin", "localhost:9443"], Err("neither IP:PORT")),
            (&["--admin", "127.0.0.1:8443", "--listen", "127.0.0.1:8443"], Err("also a listen")),
        ];
        for (flags, want) in table {
            let mut args = vec!["--ephemeral-cert"];
            args.extend_from_slice(flags);
            match (Config::from_args(serve_args(&args)), want) {
                (Ok(c), Ok(w)) => assert_eq!(c.admin.map(|a| a.to_string()).as_deref(), w, "{flags:?}"),
                (Err(e), Err(w)) => {
                    assert!(e.to_string().contains(w), "{flags:?}: {e}");
                    assert!(!e.to_string().contains('\n'));
                }
                (got, w) => panic!("{flags:?}: got {got:?}, want {w:?}"),
            }
        }
    }
}
