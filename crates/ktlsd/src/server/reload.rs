//! SIGHUP: the configuration file, the certificates and keys are read anew and
//! handed to the workers; new connections take them, and connections from before
//! end after their current response (see `worker`). HTTPS listeners added to or
//! removed from `listen` are opened and closed. What only start-up can do (the
//! plain-HTTP listeners, worker threads, dropping privileges) keeps its running
//! value, with a warning. On any error the running configuration stays. Not the
//! signal itself (see `signals`).

use std::sync::Arc;

use super::acme::AcmeSites;
use super::live_listeners::ListenerSet;
use super::prepare::{prepare, Prepared};
use super::{access_log, listener, Current};
use crate::config::{Config, ServeArgs, SiteCert};
use crate::stats::sites::RELOADS;

/// What start-up did that a reload cannot redo.
pub struct Started {
    /// The listeners came from the service manager.
    pub activated: bool,
    /// The user the process switched to.
    pub user: Option<String>,
}

/// A configuration loaded by a reload, ready to hand over.
struct Reloaded {
    next: Current,
    fingerprint: String,
    origin: String,
}

/// SIGHUP: re-reads the configuration file and the certificate and key, and
/// hands the result to the workers. On any error the running configuration stays,
/// and the error (one line) is returned for the service manager.
pub fn reload(
    args: &ServeArgs,
    current: &tokio::sync::watch::Sender<Current>,
    started: &Started,
    acme: &AcmeSites,
) -> Result<(), String> {
    let old = current.borrow().clone();
    let result = load(args, &old, started, acme);
    // ACME tasks of sites the configuration now in force no longer has stop.
    let in_force = match &result {
        Ok(r) => r.next.shared.clone(),
        Err(_) => old.shared.clone(),
    };
    acme.retain(&acme_sites(&in_force.config));
    match result {
        Ok(r) => {
            RELOADS.loaded(true);
            let digest = crate::config::digest(args, &r.next.shared.config.root);
            crate::stats::sites::reload_event("reload", true, digest, None);
            hand_over(current, r, args);
            Ok(())
        }
        Err(e) => {
            RELOADS.failed();
            crate::stats::sites::reload_event("reload", false, None, Some(format!("{e:#}")));
            Err(report_failure(&e, started))
        }
    }
}

/// Reads the configuration anew, keeps what only a restart may change, opens
/// the access log and prepares what the workers serve with.
fn load(args: &ServeArgs, old: &Current, started: &Started, acme: &AcmeSites) -> anyhow::Result<Reloaded> {
    let mut config = Config::from_args(args.clone())?;
    keep_start_up_settings(&mut config, &old.shared.config, started);
    // A reload that turns compression on opens the store; one open keeps its size.
    super::prepare::open_compressed_store(&config);
    let log = open_access_log(&config, old)?;
    let site_logs = access_log::open_sites(&config, &old.site_logs)?;
    let Prepared { shared, fingerprint, origin } =
        prepare(config, Some(&old.shared), old.shared.file_options.cache_entries, Some(acme))?;
    // Last, so that nothing above can fail after a new port is bound.
    let listeners = reopen_listeners(&shared.config, old, started)?;
    Ok(Reloaded { next: Current { shared: Arc::new(shared), log, listeners, site_logs }, fingerprint, origin })
}

/// The HTTPS listeners of the new configuration: addresses still configured keep
/// their sockets, new ones are bound now, removed ones are closed by the workers
/// once the new configuration is in force. Sockets passed by the service manager
/// are its own: they stay as they are.
fn reopen_listeners(config: &Config, old: &Current, started: &Started) -> anyhow::Result<ListenerSet> {
    if started.activated {
        return Ok(old.listeners.clone());
    }
    let next = old.listeners.reopen(&config.listen, config.workers).map_err(|e| anyhow::anyhow!(e))?;
    let (before, after) = (old.listeners.bound(), next.bound());
    for addr in after.iter().filter(|a| !before.contains(a)) {
        tracing::info!("reload: listening on https://{addr}");
    }
    for addr in before.iter().filter(|a| !after.contains(a)) {
        tracing::info!("reload: no longer listening on https://{addr}");
    }
    Ok(next)
}

/// Plain-HTTP sockets, workers and privileges are set up once, at start-up: a
/// reload that changes them keeps the running values (with a warning).
fn keep_start_up_settings(config: &mut Config, running: &Config, started: &Started) {
    // Passed sockets are the service manager's: `listen` does not apply to them.
    // Otherwise HTTPS listeners follow `listen` (see `reopen_listeners`).
    if started.activated {
        config.listen = running.listen.clone();
        config.http_listen = running.http_listen.clone();
    } else {
        keep_until_restart("http_listen addresses", &mut config.http_listen, &running.http_listen, |a| {
            listener::join(a)
        });
    }
    keep_until_restart("workers", &mut config.workers, &running.workers, |n| n.to_string());
    if config.http3.is_some() != running.http3.is_some() {
        // Its UDP sockets are bound at start-up; its limits, though, apply on reload.
        tracing::warn!("reload: http3 turned on or off; this takes effect only after a restart");
        config.http3 = running.http3.clone();
    }
    if (&config.user, &config.group, config.allow_root) != (&running.user, &running.group, running.allow_root) {
        tracing::warn!(
            "reload: user, group or allow_root changed; privileges are dropped once, at start-up: this takes effect only after a restart"
        );
        config.user = running.user.clone();
        config.group = running.group.clone();
        config.allow_root = running.allow_root;
    }
}

/// The access log of the new configuration. After privileges are dropped the
/// log's directory may be out of reach: the file already open at the same path
/// stays in use.
fn open_access_log(config: &Config, old: &Current) -> anyhow::Result<Option<Arc<std::fs::File>>> {
    match access_log::open(&config.access_log) {
        Ok(log) => Ok(log),
        Err(e) if config.access_log == old.shared.config.access_log => {
            // `e` names the file and why it cannot be opened.
            tracing::warn!("reload: {e:#}; access-log lines keep going to the file already open");
            Ok(old.log.clone())
        }
        Err(e) => Err(e),
    }
}

/// Sends the new configuration to the workers and says so.
fn hand_over(current: &tokio::sync::watch::Sender<Current>, r: Reloaded, args: &ServeArgs) {
    let source = match &args.config {
        Some(p) => format!("{} and the command line", p.display()),
        None => "the command line".to_string(),
    };
    r.next.sync_health_checks();
    current.send_replace(r.next);
    tracing::info!(
        "reloaded configuration from {source}: certificate ({}) SHA-256 fingerprint {}, record size {}",
        r.origin,
        r.fingerprint,
        current.borrow().shared.config.record_policy,
    );
}

/// Logs why a reload failed, with a hint when the account the server switched
/// to cannot read a file; returns that line.
fn report_failure(e: &anyhow::Error, started: &Started) -> String {
    let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    let denied = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
    }) || chain.iter().any(|c| c.contains("Permission denied"));
    let hint = match (&started.user, denied) {
        (Some(user), true) => {
            format!(" (ktlsd now runs as user {user}: the configuration, certificate and key must be readable by it)")
        }
        _ => String::new(),
    };
    let why = format!("{}{hint}", chain.join(": "));
    tracing::error!("reload failed, still serving the previous configuration: {why} (fix it and send SIGHUP again)");
    why
}

/// The ACME sites of `config`, for [`AcmeSites::retain`].
fn acme_sites(config: &Config) -> Vec<(&crate::names::Names, &crate::config::SiteAcme)> {
    config
        .sites
        .iter()
        .filter_map(|s| match &s.cert {
            SiteCert::Acme(a) => Some((&s.names, a)),
            _ => None,
        })
        .collect()
}

/// A setting fixed at start-up (bound sockets, worker threads): when a reload
/// changes it, says so and keeps the running value.
fn keep_until_restart<T: PartialEq + Clone>(what: &str, new: &mut T, running: &T, show: impl Fn(&T) -> String) {
    if new != running {
        tracing::warn!(
            "reload: {what} changed ({} -> {}); this takes effect only after a restart; keeping {}",
            show(running),
            show(new),
            show(running)
        );
        *new = running.clone();
    }
}
