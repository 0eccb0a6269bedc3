//! The access log's file: opened at start-up and on reload, checked by `ktlsd
//! check` without being created, and reopened at the same path on SIGUSR1 after
//! log rotation. Not the log lines or their buffering (see `crate::log`).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, Context};

use super::Current;
use crate::config::AccessLogTarget;

/// Opens where access-log lines go: the file for appending (created if need
/// be), or a duplicate of standard output; `None` when logging is off.
pub fn open(dest: &AccessLogTarget) -> anyhow::Result<Option<Arc<File>>> {
    Ok(match dest {
        AccessLogTarget::Off => None,
        AccessLogTarget::Stdout => Some(Arc::new(dup_stdout()?)),
        AccessLogTarget::File(p) => Some(Arc::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("cannot open access log {}", p.display()))?,
        )),
    })
}

/// What `check` can say about the access log without creating it: an existing
/// file must open for appending, a new one needs its directory.
pub fn check(dest: &AccessLogTarget) -> anyhow::Result<()> {
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
    let AccessLogTarget::File(path) = &now.shared.config.access_log else {
        tracing::info!("SIGUSR1: the access log is not a file; nothing to reopen");
        return;
    };
    match open(&now.shared.config.access_log) {
        Ok(log) => {
            current.send_replace(Current { shared: now.shared.clone(), log, listeners: now.listeners.clone() });
            tracing::info!("reopened access log {}", path.display());
        }
        Err(e) => tracing::error!(
            "cannot reopen access log {}: {}; lines keep going to the previous file",
            path.display(),
            e.root_cause()
        ),
    }
}

fn dup_stdout() -> anyhow::Result<File> {
    use std::os::fd::AsFd;
    let owned = std::io::stdout().as_fd().try_clone_to_owned().context("cannot duplicate standard output")?;
    Ok(File::from(owned))
}
