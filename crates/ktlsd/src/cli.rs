//! Command-line interface: `ktlsd serve`, `ktlsd check`, `ktlsd config`, `ktlsd doctor`,
//! `ktlsd status`, and the packager's hidden `ktlsd generate` (man pages, shell completions).
//!
//! The options of `serve`, `check` and `config` are declared in [`crate::config::options`],
//! once for the command line and the configuration file; this module only names the
//! subcommands and renders the command line's own documentation.

use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser, Subcommand};

pub use crate::config::ServeArgs;

#[derive(Debug, Parser)]
#[command(
    name = "ktlsd",
    version = VERSION,
    about = "A static-content HTTPS server built around Linux kernel TLS (kTLS).",
    long_about = "ktlsd serves a directory over HTTPS. The TLS handshake runs in user space \
                  (rustls); the record layer then moves into the kernel when it supports kTLS, \
                  and file bodies leave with sendfile(). Without kTLS the same server runs a \
                  userspace record layer.\n\nStart with `ktlsd serve` (serves the current \
                  directory on https://127.0.0.1:8443) and `ktlsd doctor` (what the kernel offers).",
    after_long_help = CONFIGURATION
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once at start-up
pub enum Command {
    /// Serve a directory over HTTPS.
    Serve(ServeArgs),
    /// Validate everything `serve` would (configuration, certificate and key, ROOT, ports) without serving.
    Check(ServeArgs),
    /// Print the effective configuration as TOML: the file with its includes and ${VAR}s resolved, the flags over it.
    ///
    /// Secrets (ACME EAB keys) are shown as "<redacted>". The output is a configuration
    /// file `serve --config` reads the same way (relative paths are made absolute).
    Config(ServeArgs),
    /// Report what this machine's kernel offers for kernel TLS, and what to do about gaps.
    ///
    /// Exits 0 when kernel TLS is usable here, 1 when it is not.
    Doctor {
        /// Print one JSON object instead of the human report.
        #[arg(long)]
        json: bool,
        /// Also look at this configuration's fleet (`[cluster]`): the secret file, the
        /// store, the shared ticket record and the saved copy.
        #[arg(long, value_name = "FILE")]
        config: Option<std::path::PathBuf>,
    },
    /// Print the status of a running server, read from its admin listener (`serve --admin`).
    Status {
        /// The server's admin address: IP:PORT or a Unix socket path.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9443")]
        admin: String,
        /// Print the status page's document (/status.json, documented in docs/operations.md) as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Take this member out of its load balancer's rotation: the admin listener's /healthz
    /// answers 503 from now on, while every connection and request is still served.
    ///
    /// A balancer that checks /healthz (HAProxy `option httpchk GET /healthz`) stops
    /// sending new connections; stop or upgrade the member once they have ended.
    /// `--undo`, or a restart, puts it back.
    Drain {
        /// The server's admin address: IP:PORT or a Unix socket path.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9443")]
        admin: String,
        /// Put the member back: /healthz answers 200 again.
        #[arg(long)]
        undo: bool,
    },
    /// Write the man pages or a shell completion script (for packagers).
    #[command(hide = true)]
    Generate {
        #[command(subcommand)]
        what: Generate,
    },
}

/// The configuration file in brief, for `--help` and the man page (each key: docs/configuration.md).
const CONFIGURATION: &str = "\
Configuration file (--config FILE, /etc/ktlsd/ktlsd.toml in the package): TOML whose keys are the flags' names \
(dashes become underscores); the command line wins over it.

  include = [\"sites/*.toml\"]  reads more files, relative to the including one (a glob matching nothing is \
fine, a missing plain path is an error); their [[site]] blocks add up, and any other key may be set in one \
file only.
  ${VAR} in a string is the environment's VAR (unset: an error naming it); $${ is a literal ${.
  [[site]] acme = { directory, email, challenge = \"tls-alpn-01\" | \"http-01\" | \"dns-01\", dns_hook, \
dns_hook_timeout, dns_propagation, directory_ca, eab = { kid, hmac_key } }: dns-01 runs HOOK set|clear \
_acme-challenge.NAME VALUE and allows *.example.com names; eab binds the account for CAs that require it. \
Sites of one CA share one account.

`ktlsd config` prints the effective configuration; `ktlsd check` validates it.";

/// What `ktlsd generate` writes.
#[derive(Debug, Subcommand)]
pub enum Generate {
    /// Write ktlsd.1 and one page per subcommand (ktlsd-serve.1, ...) into DIR.
    Man {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Print the completion script of SHELL on standard output.
    Completions {
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
}

/// `ktlsd --version`: the package version and the commit it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("KTLSD_COMMIT"), ")");

/// Runs `ktlsd generate`.
pub fn generate(what: Generate) -> anyhow::Result<()> {
    match what {
        Generate::Man { dir } => man_pages(&dir),
        Generate::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "ktlsd", &mut std::io::stdout());
            Ok(())
        }
    }
}

fn man_pages(dir: &Path) -> anyhow::Result<()> {
    use anyhow::Context;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    clap_mangen::generate_to(Cli::command(), dir)
        .with_context(|| format!("cannot write man pages into {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn man_pages_and_completions_cover_the_subcommands() {
        let dir = tempfile::tempdir().expect("temporary directory");
        man_pages(dir.path()).expect("man pages");
        for page in ["ktlsd.1", "ktlsd-serve.1", "ktlsd-check.1", "ktlsd-config.1", "ktlsd-doctor.1"] {
            let text = std::fs::read_to_string(dir.path().join(page)).expect(page);
            assert!(text.starts_with(".ie") || text.contains(".TH"), "{page}: {text:.200}");
        }
        assert!(!dir.path().join("ktlsd-generate.1").exists(), "the hidden subcommand has a page");
        let serve = std::fs::read_to_string(dir.path().join("ktlsd-serve.1")).expect("serve page");
        assert!(
            serve.contains("http\\-listen") || serve.contains("http\\-\\-listen") || serve.contains("http-listen"),
            "{serve}"
        );
        for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "ktlsd", &mut out);
            let text = String::from_utf8(out).expect("UTF-8");
            assert!(text.contains("tls-versions"), "{shell}: no serve flag");
        }
    }
}
