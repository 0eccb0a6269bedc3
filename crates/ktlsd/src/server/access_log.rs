//! The access log's file and the sites' own ones: opened at start-up and on
//! reload, checked by `ktlsd check` without being created, and reopened at the
//! same paths on SIGUSR1 after log rotation. Not the log lines or their
//! buffering (see `crate::log`).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, Context};

use super::Current;
use crate::config::{AccessLogTarget, Config};
use crate::log::SiteLog;

/// Opens where access-log lines go: the file for appending (created if need
/// be), or a duplicate of standard output; `None` when logging is off.
pub fn open(dest: &AccessLogTarget) -> anyhow::Result<Option<Arc<File>>> {
    Ok(match dest {
        AccessLogTarget::Off => None,
        AccessLogTarget::Stdout => Some(Arc::new(dup_stdout()?)),
        AccessLogTarget::File(p) => Some(Arc::new(open_append(p)?)),
    })
}

/// Opens each `[[site]]`'s own access log for appending (created if need be).
/// After privileges are dropped a log's directory may be out of reach: a file
/// already open at the same path (`running`) stays in use, with a warning.
pub fn open_sites(config: &Config, running: &[SiteLog]) -> anyhow::Result<Vec<SiteLog>> {
    let mut out = Vec::new();
    for site in &config.sites {
        let Some(path) = &site.access_log else { continue };
        let label = site.names.label().into_owned();
        let file = match open_append(path) {
            Ok(f) => Arc::new(f),
            Err(e) => match running.iter().find(|l| &l.path == path) {
                Some(l) => {
                    tracing::warn!("{e:#}; site {label}'s access-log lines keep going to the file already open");
                    l.file.clone()
                }
                None => return Err(e),
            },
        };
        out.push(SiteLog { label, path: path.clone(), file });
    }
    Ok(out)
}

fn open_append(p: &Path) -> anyhow::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
        .with_context(|| format!("cannot open access log {}", p.display()))
}

/// What `check` can say about the access logs without creating them: an
/// existing file must open for appending, a new one needs its directory.
pub fn check_all(config: &Config) -> anyhow::Result<()> {
    check(&config.access_log)?;
    for site in &config.sites {
        if let Some(p) = &site.access_log {
            check(&AccessLogTarget::File(p.clone()))?;
        }
    }
    Ok(())
}

fn check(dest: &AccessLogTarget) -> anyhow::Result<()> {
    let AccessLogTarget::File(p) = dest else { return Ok(()) };
    if p.exists() {
        std::fs::OpenOptions::new()
            .append(true)
            .open(p)
            .with_context(|| format!("cannot open access log {}", p.display()))?;
        return Ok(());
    }
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(anyhow!("cannot create access log {}: {} is not a directory", p.display(), dir.display()));
    }
    Ok(())
}

/// SIGUSR1: opens the access log file anew at its configured path (after it was
/// renamed by log rotation). Each worker writes out the lines it holds to the
/// old file before it switches.
pub fn reopen(current: &tokio::sync::watch::Sender<Current>) {
    let now = current.borrow().clone();
    let mut next = now.clone();
    match &now.shared.config.access_log {
        AccessLogTarget::File(path) => match open(&now.shared.config.access_log) {
            Ok(log) => {
                next.log = log;
                tracing::info!("reopened access log {}", path.display());
            }
            Err(e) => tracing::error!(
                "cannot reopen access log {}: {}; lines keep going to the previous file",
                path.display(),
                e.root_cause()
            ),
        },
        _ if now.site_logs.is_empty() => {
            tracing::info!("SIGUSR1: the access log is not a file; nothing to reopen");
            return;
        }
        _ => {}
    }
    for site in next.site_logs.iter_mut() {
        match open_append(&site.path) {
            Ok(f) => {
                site.file = Arc::new(f);
                tracing::info!("reopened site {}'s access log {}", site.label, site.path.display());
            }
            Err(e) => {
                tracing::error!("cannot reopen {e:#}; site {}'s lines keep going to the previous file", site.label)
            }
        }
    }
    current.send_replace(next);
}

fn dup_stdout() -> anyhow::Result<File> {
    use std::os::fd::AsFd;
    let owned = std::io::stdout().as_fd().try_clone_to_owned().context("cannot duplicate standard output")?;
    Ok(File::from(owned))
}
