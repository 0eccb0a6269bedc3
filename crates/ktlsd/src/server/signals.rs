//! The signals the main thread waits on once the server runs: SIGTERM/SIGINT
//! stop it, SIGHUP reloads, SIGUSR1 reopens the access log. Not the handling of
//! each (see `reload` and `access_log`): this only turns signals into [`Event`]s.

use anyhow::Context;
use tokio::signal::unix::Signal;

/// What the main thread does on a signal.
pub enum Event {
    /// SIGTERM, SIGINT.
    Stop,
    /// SIGHUP.
    Reload,
    /// SIGUSR1.
    Reopen,
}

/// The signals ktlsd acts on, and those commonly sent that must not kill it
/// (SIGUSR2, SIGWINCH: ignored, logged the first time). SIGPIPE stays ignored
/// as the Rust runtime set it up: writes to a closed socket fail with EPIPE.
/// All are caught from before the first connection is accepted.
pub struct Signals {
    rt: tokio::runtime::Runtime,
    term: Signal,
    int: Signal,
    hup: Signal,
    usr1: Signal,
    usr2: Signal,
    winch: Signal,
    logged_usr2: bool,
    logged_winch: bool,
}

impl Signals {
    pub fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let rt = crate::sys::event_loop()?;
        let all = rt.block_on(async {
            Ok::<_, std::io::Error>([
                signal(SignalKind::terminate())?,
                signal(SignalKind::interrupt())?,
                signal(SignalKind::hangup())?,
                signal(SignalKind::user_defined1())?,
                signal(SignalKind::user_defined2())?,
                signal(SignalKind::window_change())?,
            ])
        });
        let [term, int, hup, usr1, usr2, winch] = all.context("cannot install signal handlers")?;
        Ok(Signals { rt, term, int, hup, usr1, usr2, winch, logged_usr2: false, logged_winch: false })
    }

    /// Blocks until a signal that calls for an action arrives.
    pub fn next(&mut self) -> Event {
        loop {
            let got = self.rt.block_on(async {
                tokio::select! {
                    _ = self.term.recv() => Some(Event::Stop),
                    _ = self.int.recv() => Some(Event::Stop),
                    _ = self.hup.recv() => Some(Event::Reload),
                    _ = self.usr1.recv() => Some(Event::Reopen),
                    _ = self.usr2.recv() => {
                        if !std::mem::replace(&mut self.logged_usr2, true) {
                            tracing::info!("SIGUSR2 ignored (ktlsd has no action for it; this is logged once)");
                        }
                        None
                    }
                    _ = self.winch.recv() => {
                        if !std::mem::replace(&mut self.logged_winch, true) {
                            tracing::info!("SIGWINCH ignored (ktlsd has no action for it; this is logged once)");
                        }
                        None
                    }
                }
            });
            if let Some(e) = got {
                return e;
            }
        }
    }
}
