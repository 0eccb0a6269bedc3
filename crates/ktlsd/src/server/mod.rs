//! The server: validated configuration in, listening workers out; reload on
//! SIGHUP, access-log reopening on SIGUSR1, and an orderly stop on SIGTERM/SIGINT.
//!
//! Like nginx, a fixed set of workers (one per CPU by default) each runs its own
//! single-threaded event loop over its own `SO_REUSEPORT` listeners; nothing is
//! handed between threads on the data path.
//!
//! Start-up ([`run`], in `startup`) goes through these stages, in order:
//!
//! 1. load the configuration and resolve the account to switch to (`privileges`);
//! 2. catch signals (`signals`) and raise the file-descriptor budget (`fd_budget`);
//! 3. prepare what workers serve with (`prepare`): certificates and keys read,
//!    TLS configuration built, ROOT opened, kTLS chosen, TCP options checked,
//!    per-protocol settings built, all into one [`Shared`];
//! 4. open the access log (`access_log`);
//! 5. bind the listeners, or take those the service manager passed (`listener`,
//!    `systemd`), and the admin socket (`admin`);
//! 6. drop privileges (`privileges`);
//! 7. announce ready: the log lines and the JSON ready line on stdout;
//! 8. spawn the workers (`worker`), the admin and plain-HTTP (`plain`) listeners,
//!    tell the service manager and let ACME (`acme`) begin;
//! 9. wait for signals: SIGHUP reloads (`reload`: stage 3 again, listeners
//!    opened and closed (`live_listeners`), and a new [`Current`], which retires
//!    the connections opened before it), SIGUSR1 reopens the access log;
//! 10. stop: no new connections, in-flight responses finish, threads joined.
//!
//! `ktlsd check` ([`check`]) runs stages 1 and 3 and checks the access log,
//! the files the `--user` account must read, and the ports (those of a running
//! ktlsd are its own) without serving. Not here: TLS (`crate::tls`), HTTP (`crate::http`),
//! what a request is answered with (`crate::handler`).

mod access_log;
mod acme;
pub(crate) mod admin;
pub(crate) mod cluster;
pub(crate) mod congestion;
mod fd_budget;
mod listener;
mod live_listeners;
mod per_ip;
mod plain;
mod prepare;
mod privileges;
pub(crate) mod proxy_protocol;
mod reload;
mod signals;
mod startup;
mod systemd;
mod worker;

use std::fs::File;
use std::sync::Arc;

use rustls::ServerConfig;

use crate::acme::Challenges;
use crate::config::Config;
use crate::files::{self, Root};
use crate::handler::sites::NamedSite;
use crate::handler::{Site, Sites};
use crate::http::{h1, h2};
use crate::tls::SessionSettings;

pub use fd_budget::FdBudget;
pub use startup::{check, run};

/// What every worker reads and nobody writes. A reload builds a new one; each
/// connection holds the `Arc` it started with, so in-flight connections finish
/// on the configuration they began with.
pub struct Shared {
    pub config: Config,
    pub root: Root,
    pub file_options: files::Options,
    pub tls: Arc<ServerConfig>,
    /// The configurations of sites that ask for client certificates, by server name.
    pub client_auth: crate::tls::client_auth::ClientAuthConfigs,
    /// The kernel's kTLS abilities, when kTLS is to be used.
    pub ktls: Option<Arc<crate::tls::kernel::Support>>,
    /// The `[[site]]`s, opened; the fields above serve as the default site.
    pub sites: Vec<NamedSite>,
    /// ACME http-01 answers the port-80 listener serves (the same across reloads).
    pub challenges: Arc<Challenges>,
    /// How HTTP/1.1 connections are served (limits, timeouts), from `config`.
    pub h1: h1::Settings,
    /// How HTTP/2 connections are served (limits, timeouts), from `config`.
    pub h2: h2::Settings,
    /// How established sessions send (record sizes, send timeout), from `config`.
    pub session: SessionSettings,
    /// The response cache (`[cache]`), opened once the process runs as its own user;
    /// a reload with the same `[cache]` keeps it.
    pub cache: Option<Arc<crate::handler::cache::Cache>>,
    /// The certificates presented, for their expiry metric.
    pub certificates: prepare::Certificates,
    /// HTTP/3 over QUIC, when `config` turns it on.
    pub http3: Option<Http3>,
    /// This member of a fleet (`[cluster]`), the same across reloads.
    pub cluster: Option<Arc<cluster::Member>>,
}

/// What HTTP/3 connections are served with, from `config`.
pub struct Http3 {
    /// The QUIC side of the TLS configuration above (same resolver, suites and tickets).
    pub quic: Arc<quinn::ServerConfig>,
    /// The endpoint keys (stateless reset, Retry tokens), the same in every worker.
    pub keys: crate::quic::Keys,
    pub settings: crate::quic::Settings,
    pub h3: crate::http::h3::Settings,
}

impl Shared {
    /// The sites a connection chooses from, by Host, for each request.
    pub fn sites(&self) -> Sites<'_> {
        let default = Site::new(&self.root, self.file_options, self.config.hsts.as_deref(), &self.config.content);
        let default_client_auth = self.config.client_auth.is_some();
        Sites {
            named: &self.sites,
            default,
            unknown: self.config.unknown_sni,
            default_client_auth,
            cache: self.cache.as_ref(),
            trusted_proxies: &self.config.trusted_proxies,
        }
    }
}

impl Current {
    /// Starts, keeps or stops the upstreams' active health checks to match this
    /// configuration (start-up and each reload).
    pub fn sync_health_checks(&self) {
        let shared = &self.shared;
        let contents = std::iter::once(&shared.config.content).chain(shared.sites.iter().map(|s| &s.content));
        let rules: Vec<_> = contents.flat_map(|c| c.locations.rules().proxy.iter().cloned()).collect();
        crate::handler::proxy::health::sync(rules.iter().map(|r| &**r));
    }
}

/// What the workers serve with now: sent to every worker on reload and on
/// access-log reopening.
#[derive(Clone)]
pub struct Current {
    pub shared: Arc<Shared>,
    /// Where access-log lines go; `None` when logging is off.
    pub log: Option<Arc<File>>,
    /// The HTTPS listeners in force (a reload opens and closes them).
    pub listeners: live_listeners::ListenerSet,
    /// The sites' own access logs.
    pub site_logs: Vec<crate::log::SiteLog>,
}
