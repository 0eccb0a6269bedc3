//! Configuration: the TOML file and the command line merged into one validated [`Config`].
//!
//! Everything a running server needs is checked here, before any socket is opened,
//! so that a mistake stops start-up with one line naming the file or value.
//! Every command-line flag has a config key of the same name (dashes become underscores).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::body::RecordPolicy;
use crate::cli::ServeArgs;

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

/// TLS protocol versions that may be negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersion {
    Tls12,
    Tls13,
}

/// Where access-log lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLog {
    Stdout,
    File(PathBuf),
    Off,
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
    pub access_log: AccessLog,
    pub timeouts: Timeouts,
    pub limits: Limits,
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
    handshake_timeout: Option<f64>,
    header_timeout: Option<f64>,
    idle_timeout: Option<f64>,
    send_timeout: Option<f64>,
    shutdown_timeout: Option<f64>,
    max_header_bytes: Option<usize>,
    max_body_bytes: Option<u64>,
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
        for p in [&mut file.root, &mut file.cert, &mut file.key].into_iter().flatten() {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        Ok(file)
    }
}

const DEFAULT_LISTEN: &str = "127.0.0.1:8443";
/// TCP_NOTSENT_LOWAT applied with the adaptive record policy unless one is configured.
const ADAPTIVE_NOTSENT_LOWAT: u32 = 16 * 1024;

impl Config {
    /// Merges the config file (if any) under the command line and validates the result.
    pub fn from_args(args: ServeArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };

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
                    return err(format!(
                        "listen address {s:?} is not IP:PORT (e.g. 127.0.0.1:8443 or [::1]:8443)"
                    ))
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
            None | Some("-") => AccessLog::Stdout,
            Some("off") => AccessLog::Off,
            Some(p) => AccessLog::File(PathBuf::from(p)),
        };

        let secs = |name: &str, v: Option<f64>, default: f64| -> Result<Duration, ConfigError> {
            let v = v.unwrap_or(default);
            if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
                return err(format!("{name} {v}: expected seconds between 0 and 86400"));
            }
            Ok(Duration::from_secs_f64(v))
        };
        let timeouts = Timeouts {
            handshake: secs("handshake_timeout", args.handshake_timeout.or(file.handshake_timeout), 10.0)?,
            header: secs("header_timeout", args.header_timeout.or(file.header_timeout), 15.0)?,
            idle: secs("idle_timeout", args.idle_timeout.or(file.idle_timeout), 65.0)?,
            send: secs("send_timeout", args.send_timeout.or(file.send_timeout), 60.0)?,
            shutdown: secs("shutdown_timeout", args.shutdown_timeout.or(file.shutdown_timeout), 10.0)?,
        };

        let max_header_bytes = args.max_header_bytes.or(file.max_header_bytes).unwrap_or(16 * 1024);
        if !(1024..=1024 * 1024).contains(&max_header_bytes) {
            return err(format!("max_header_bytes {max_header_bytes}: expected 1024 to 1048576"));
        }
        let limits = Limits {
            max_header_bytes,
            max_body_bytes: args.max_body_bytes.or(file.max_body_bytes).unwrap_or(1024 * 1024),
        };

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
            autoindex: args.autoindex || file.autoindex.unwrap_or(false),
            dotfiles: args.dotfiles || file.dotfiles.unwrap_or(false),
            access_log,
            timeouts,
            limits,
        })
    }
}

fn split_list(s: &str) -> Vec<String> {
    s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
}
