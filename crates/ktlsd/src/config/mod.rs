//! Configuration: the TOML file and the command line merged into one validated [`Config`].
//!
//! Everything a running server needs is checked here, before any socket is opened,
//! so that a mistake stops start-up with one line naming the file or value.
//! Every command-line flag has a config key of the same name (dashes become underscores);
//! a switch's `--no-` form is the same key set to false. The reference of every option
//! is `docs/configuration.md`, generated from the schema ([`reference`]).
//!
//! The parts: [`options`] declares every option once (flag, key, type, help, default
//! in the help); the command line's [`options::Options`] are merged over the file's
//! (`Options::or`), and each section module validates its own options into its part
//! of [`Config`]: [`listen`], [`tls`], [`timeouts`], [`privileges`], [`admin`], [`h2`], [`h3`],
//! [`content`], [`routing`], [`compress`], [`sites`] and [`cache`]. This module is not where the server applies them.
//!
//! # How to add an option
//!
//! 1. Declare it once in [`options`]: a doc comment (the help, ending in
//!    `[default: ...]`), `#[arg(long, value_name = "...")]`, and a field whose name is
//!    the TOML key and whose type is what is written (an enum deriving `clap::ValueEnum`
//!    and `Deserialize` for a choice; a `bool` switch takes `num_args = 0,
//!    default_missing_value = "true"`). Put it under `per_site` when a `[[site]]` may
//!    set it too, under `global` otherwise; a file-only section (`[[proxy]]`, `[cache]`)
//!    is a `global` field with `#[arg(skip)]` and a type of its own.
//! 2. Validate it in its section module (or a new one), from the merged `Options` into
//!    a field of [`Config`] (or [`SiteConfig`] for a per-site option), with a table
//!    test there.
//! 3. Regenerate the reference: `KTLSD_BLESS=1 cargo test -p ktlsd --lib config_reference`.

pub mod access_log;
pub mod admin;
pub mod auth;
pub mod cache;
pub mod cluster;
pub mod compress;
pub mod content;
mod effective;
pub mod env;
pub mod h2;
pub mod h3;
pub(crate) mod include;
pub mod listen;
pub mod location;
pub mod open_files;
pub mod options;
pub mod privileges;
pub mod proxy;
#[cfg(test)]
mod reference;
pub mod routing;
pub mod sites;
pub mod tables;
pub mod timeouts;
pub mod tls;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use self::admin::AdminAddr;
pub use self::effective::digest;
pub use self::effective::print_effective;
pub use self::options::ServeArgs;
pub use self::sites::{SiteAcme, SiteCert, SiteConfig};
pub use self::timeouts::{Limits, Timeouts};
pub use self::tls::TcpOptions;
use crate::tls::sizing::RecordPolicy;
use crate::vocab::{TlsVersion, UnknownName};
use options::{Options, SiteOptions};

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum KtlsMode {
    /// Probe the kernel; use kTLS for every suite it supports, userspace otherwise.
    #[default]
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
    /// Who may act through the admin listener (`admin_auth`); `None`: nobody.
    pub admin_auth: Option<admin::AdminAuth>,
    /// Whether ALPN offers HTTP/2.
    pub http2: bool,
    pub access_log_format: crate::log::LogFormat,
    /// The template of the `custom` access-log format.
    pub access_log_custom: Option<std::sync::Arc<crate::log::Template>>,
    /// Most connections per worker; `None`: as many as the file descriptor budget allows.
    pub max_connections: Option<std::num::NonZeroUsize>,
    /// HTTP/2 settings and flood limits.
    pub h2_limits: crate::http::h2::Limits,
    /// The default site's content-delivery options (each `[[site]]` has its own).
    pub content: crate::handler::Content,
    /// Load balancers whose connections begin with a PROXY protocol header.
    pub proxy_protocol_from: Vec<ipnet::IpNet>,
    /// HTTP proxies whose forwarding fields name the client.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Most connections one client address holds at once over all workers; `None`: no limit.
    pub max_connections_per_ip: Option<std::num::NonZeroU32>,
    /// Most bytes the store of bodies compressed on the fly keeps.
    pub compress_cache_size: u64,
    /// The response cache (`[cache]`); `None`: no cache.
    pub cache: Option<crate::handler::cache::Settings>,
    /// The fleet this member belongs to (`[cluster]`); `None`: on its own.
    pub cluster: Option<cluster::Cluster>,
    /// The default site's client-certificate policy; `None`: none asked for.
    pub client_auth: Option<tls::ClientAuth>,
    /// How long a cached open file's metadata is trusted (0: read for every request).
    pub open_file_cache_valid: std::time::Duration,
    /// HTTP/3 over QUIC and its limits; `None`: off.
    pub http3: Option<h3::Http3>,
    /// What the configuration means that its author may not expect (a pattern whose
    /// meaning changed), for `ktlsd check` and the start-up log; never a refusal.
    pub warnings: Vec<String>,
}

/// Reads the configuration file and the files it includes ([`include`]), `${VAR}`s replaced
/// from the environment ([`env`]): its keys are [`Options`]' names. Relative paths in a file
/// are relative to that file, as in nginx.
fn load(path: &Path) -> Result<Options, ConfigError> {
    include::load(path, &env::from_environment)
}

/// Every path in the file is relative to the file's directory `base`, as in nginx;
/// `-` and `off` for the access log are not paths.
pub(crate) fn resolve_paths(file: &mut Options, base: &Path) {
    for p in file_paths(file) {
        if p.is_relative() {
            *p = base.join(&*p);
        }
    }
    if let Some(log) = &mut file.access_log {
        if log != "-" && log != "off" && Path::new(log.as_str()).is_relative() {
            *log = base.join(log.as_str()).to_string_lossy().into_owned();
        }
    }
    if let Some(admin) = &mut file.admin {
        if admin.contains('/') && Path::new(admin.as_str()).is_relative() {
            *admin = base.join(admin.as_str()).to_string_lossy().into_owned();
        }
    }
}

/// Every file or directory path a configuration file gives (the access log and the admin
/// socket, which may be words, aside).
pub(crate) fn file_paths(file: &mut Options) -> Vec<&mut PathBuf> {
    let mut paths: Vec<&mut PathBuf> = Vec::new();
    paths.extend([&mut file.root, &mut file.cert, &mut file.key, &mut file.state_dir].into_iter().flatten());
    paths.extend(file.ticket_keys.iter_mut().flatten());
    paths.extend(file.auth.iter_mut().flatten().map(|a| &mut a.users));
    paths.extend(file.client_ca.as_mut());
    paths.extend(file.admin_auth.as_mut());
    for site in file.site.iter_mut().flatten() {
        paths.extend([&mut site.cert, &mut site.key, &mut site.access_log].into_iter().flatten());
        paths.push(&mut site.root);
        paths.extend(site.auth.iter_mut().flatten().map(|a| &mut a.users));
        paths.extend(site.client_ca.as_mut());
        if let Some(acme) = site.acme.as_mut() {
            paths.extend([&mut acme.directory_ca, &mut acme.dns_hook].into_iter().flatten());
        }
        for b in site.proxy.iter_mut().flatten() {
            paths.extend([&mut b.upstream_ca, &mut b.accel_root].into_iter().flatten());
        }
    }
    for b in file.proxy.iter_mut().flatten() {
        paths.extend([&mut b.upstream_ca, &mut b.accel_root].into_iter().flatten());
    }
    paths.extend(file.cache.as_mut().and_then(|c| c.dir.as_mut()));
    paths.extend(file.cluster.as_mut().and_then(|c| c.secret_file.as_mut()));
    paths
}

/// The log level, known before the rest is validated (logging starts first): the command
/// line's over the file's. A file that cannot be read here is reported by [`Config::from_args`].
pub fn log_level(args: &ServeArgs) -> options::LogLevel {
    let file = args.config.as_deref().and_then(|p| load(p).ok()).and_then(|f| f.log_level);
    args.options.log_level.or(file).unwrap_or_default()
}

impl Config {
    /// Merges the config file (if any) under the command line and validates the result.
    pub fn from_args(args: ServeArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => load(path)?,
            None => Options::default(),
        };
        Config::from_options(args.options.fold_switches().or(file), args.config.as_deref())
    }

    /// Validates merged options; `file_path` is the configuration file's, for messages.
    pub(crate) fn from_options(o: Options, file_path: Option<&Path>) -> Result<Self, ConfigError> {
        let root = o.root.clone().unwrap_or_else(|| PathBuf::from("."));
        let root = match root.canonicalize() {
            Ok(r) if r.is_dir() => r,
            Ok(_) => return err(format!("root {} is not a directory", root.display())),
            Err(e) => return err(format!("root {}: {e}", root.display())),
        };
        let listen = listen::listen(&o)?;
        let http_listen = listen::http_listen(&o, &listen)?;
        let tls = tls::tls(&o)?;
        let cluster = cluster::cluster(o.cluster.as_ref(), !tls.ticket_keys.is_empty())?;
        let timeouts = timeouts::timeouts(&o, file_path)?;
        let limits = timeouts::limits(&o)?;
        let privileges = privileges::privileges(&o)?;
        let hsts = o.hsts.as_deref().map(sites::validate_hsts).transpose()?;
        let top = o.site_options();
        let canonical = routing::canonical(top.canonical.as_deref(), None, "")?;
        let content = content::content(&top, "", canonical, location::locations(&top, "")?)?;
        proxy::accel_outside(top.proxy.as_deref().unwrap_or_default(), &root).map_err(ConfigError::new)?;
        let mut warnings = location::dialect_notes(&top, "");
        for (i, s) in o.site.iter().flatten().enumerate() {
            // A site's own keys: what it inherits is noted once, at the top level.
            let which = format!("{}: ", sites::label(i, s));
            warnings.extend(location::dialect_notes(&s.site_options(&SiteOptions::default()), &which));
        }
        let sites = sites::sites(o.site.clone().unwrap_or_default(), &top)?;
        sites::check_acme(&sites, &http_listen, privileges.state_dir.as_deref())?;
        let admin = admin::admin(&o, &listen, &http_listen)?;
        let (access_log_format, access_log_custom) = access_log::access_log_format(&o)?;
        let access_log = match o.access_log.as_deref() {
            None | Some("-") => AccessLogTarget::Stdout,
            Some("off") => AccessLogTarget::Off,
            Some(p) => AccessLogTarget::File(PathBuf::from(p)),
        };

        Ok(Config {
            root,
            listen,
            cert: tls.cert,
            key: tls.key,
            workers: listen::workers(&o)?,
            ktls: o.ktls.unwrap_or_default(),
            tls_versions: tls.versions,
            cipher_suites: tls.cipher_suites,
            record_policy: tls.record_policy,
            tcp: tls.tcp,
            autoindex: o.autoindex.unwrap_or(false),
            dotfiles: o.dotfiles.unwrap_or(false),
            access_log,
            timeouts,
            limits,
            state_dir: privileges.state_dir,
            ephemeral_cert: privileges.ephemeral_cert,
            ticket_keys: tls.ticket_keys,
            http_listen,
            hsts,
            user: privileges.user,
            group: privileges.group,
            allow_root: privileges.allow_root,
            sites,
            unknown_sni: o.unknown_sni.unwrap_or_default(),
            admin_auth: admin::admin_auth(&o)?,
            admin,
            http2: o.http2.unwrap_or(true),
            access_log_format,
            access_log_custom,
            max_connections: timeouts::max_connections(&o)?,
            h2_limits: h2::h2_limits(&o)?,
            content,
            proxy_protocol_from: listen::proxy_protocol_from(&o)?,
            trusted_proxies: listen::trusted_proxies(&o)?,
            max_connections_per_ip: routing::max_connections_per_ip(&o)?,
            compress_cache_size: compress::cache_size(&o)?,
            cache: cache::cache(o.cache.as_ref())?,
            cluster,
            client_auth: tls::client_auth(&top, "")?,
            http3: h3::http3(&o)?,
            open_file_cache_valid: open_files::cache_valid(&o)?,
            warnings,
        })
    }
}
