//! ktlsd: a static-content HTTPS server built around Linux kernel TLS.
//!
//! The data's way through the modules: [`config`] -> [`server`] (listeners, workers)
//! -> [`tls`] (handshake, then the kernel or userspace record layer) -> [`http`]
//! -> [`files`]; [`net`], [`log`], [`stats`] and [`state_file`] are leaf helpers any layer may use,
//! and [`vocab`] and [`names`] the leaf words (record layer, HTTP version, method,
//! site names) they all speak. [`sys`] holds every system call behind safe functions:
//! the crate's only `unsafe` code.
//!
//! The library is the server itself: `src/main.rs` only calls [`main`]. Nothing here is
//! a public API but [`main`], and [`fuzzing`], the thin entry points the fuzz targets of
//! `fuzz/` call into the parsers of untrusted bytes.

#![deny(unsafe_code)]

mod acme;
mod cli;
mod config;
mod doctor;
mod fds;
mod files;
#[doc(hidden)]
pub mod fuzzing;
mod handler;
mod http;
mod log;
mod names;
mod net;
mod quic;
mod server;
mod state_file;
mod stats;
#[allow(unsafe_code)] // the crate's one module of `unsafe` code
mod sys;
mod tls;
mod vocab;

use std::process::ExitCode;

use clap::Parser;

/// The `ktlsd` command: parses the command line, runs the subcommand, and reports a
/// failure on one line of standard error.
pub fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let level = match &cli.command {
        cli::Command::Serve(args) | cli::Command::Check(args) | cli::Command::Config(args) => config::log_level(args),
        _ => config::options::LogLevel::default(),
    };
    init_tracing(level.name());
    let result = match cli.command {
        cli::Command::Serve(args) => server::run(args).map(|()| ExitCode::SUCCESS),
        cli::Command::Check(args) => server::check(args).map(|()| ExitCode::SUCCESS),
        cli::Command::Config(args) => config::print_effective(args).map(|()| ExitCode::SUCCESS),
        cli::Command::Generate { what } => cli::generate(what).map(|()| ExitCode::SUCCESS),
        cli::Command::Doctor { json, config } => doctor::run(json, config.as_deref()),
        cli::Command::Status { admin, json } => server::admin::print_status(&admin, json).map(|()| ExitCode::SUCCESS),
        cli::Command::Drain { admin, undo } => server::admin::drain(&admin, undo).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // One line naming what was wrong.
            let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            eprintln!("ktlsd: error: {}", chain.join(": "));
            ExitCode::FAILURE
        }
    }
}

/// Logging to standard error at `level` (`--log-level`), or as the KTLSD_LOG variable says when set.
/// rustls's own records are kept to errors unless KTLSD_LOG asks for them (`rustls=debug`):
/// it warns about what clients send (an IP address as SNI, as wrk and some bots do), and a
/// line per such handshake would let any client fill the log.
fn init_tracing(level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_env("KTLSD_LOG").unwrap_or_else(|_| EnvFilter::new(format!("{level},rustls=error")));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
