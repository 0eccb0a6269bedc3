//! Explaining why the kernel has no `tls` ULP: [`diagnose`] looks at the
//! running system and names the likely cause and its fix as an
//! [`Unavailable`].
//!
//! This is a start-up and troubleshooting tool, not part of the
//! per-connection path: it reads `/proc`, `/sys`, `/lib/modules` and the
//! kernel config (running `gzip` for `/proc/config.gz`), which may take
//! milliseconds and blocks. [`enable_ulp`](crate::enable_ulp) never calls
//! it; [`probe`](crate::probe) does, once, when the ULP is missing.
//!
//! It changes nothing on the system (no `modprobe`).

use core::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::sys;

/// Why the kernel cannot attach the `tls` ULP, with what to do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unavailable {
    /// The kernel has kTLS as a module (`tls.ko` found) but it is not loaded,
    /// and this process may not auto-load it (that needs `CAP_NET_ADMIN`).
    ModuleNotLoaded {
        /// Where the module file was found.
        module: String,
    },
    /// The kernel was built without `CONFIG_TLS`.
    NotBuilt {
        /// What showed it (e.g. the kernel config line).
        evidence: String,
    },
    /// The kernel config says `CONFIG_TLS=m` but no `tls.ko` is installed.
    ModuleMissing {
        /// What showed it.
        evidence: String,
    },
    /// No `tls` ULP, no module file and no kernel config to tell why
    /// (typical of containers, which do not see the host's modules).
    NotFound {
        /// What was checked.
        evidence: String,
    },
    /// A security policy (seccomp, LSM) refused `TCP_ULP`.
    Denied {
        /// The error text.
        detail: String,
    },
    /// The socket or kernel does not know `TCP_ULP` (Linux < 4.13, or not TCP).
    UnsupportedSocket {
        /// The error text.
        detail: String,
    },
    /// Something else prevented the check (e.g. no loopback TCP to probe with).
    Other {
        /// The error text.
        detail: String,
    },
}

impl Unavailable {
    /// A stable machine-readable name for the reason (for JSON output).
    pub fn kind(&self) -> &'static str {
        match self {
            Unavailable::ModuleNotLoaded { .. } => "module-not-loaded",
            Unavailable::NotBuilt { .. } => "not-built",
            Unavailable::ModuleMissing { .. } => "module-missing",
            Unavailable::NotFound { .. } => "not-found",
            Unavailable::Denied { .. } => "denied",
            Unavailable::UnsupportedSocket { .. } => "unsupported-socket",
            Unavailable::Other { .. } => "other",
        }
    }

    /// What was observed, in one sentence.
    pub fn reason(&self) -> String {
        match self {
            Unavailable::ModuleNotLoaded { module } => {
                format!("the `tls` kernel module is not loaded (found {module})")
            }
            Unavailable::NotBuilt { evidence } => {
                format!("the kernel was built without CONFIG_TLS ({evidence})")
            }
            Unavailable::ModuleMissing { evidence } => {
                format!("the kernel has CONFIG_TLS=m but the tls module is not installed ({evidence})")
            }
            Unavailable::NotFound { evidence } => {
                format!("no `tls` ULP and no tls module for this kernel ({evidence})")
            }
            Unavailable::Denied { detail } => {
                format!("attaching the tls ULP was denied ({detail})")
            }
            Unavailable::UnsupportedSocket { detail } => {
                format!("the kernel does not support TCP_ULP on this socket ({detail})")
            }
            Unavailable::Other { detail } => detail.clone(),
        }
    }

    /// What an operator should do, in one sentence.
    pub fn advice(&self) -> &'static str {
        match self {
            Unavailable::ModuleNotLoaded { .. } => {
                "run `modprobe tls` as root (list `tls` in /etc/modules-load.d/tls.conf to load it at boot)"
            }
            Unavailable::NotBuilt { .. } => {
                "boot a kernel built with CONFIG_TLS=m or =y (every mainstream distribution \
                 kernel is, e.g. Debian's or Ubuntu's); kTLS cannot be enabled on this one"
            }
            Unavailable::ModuleMissing { .. } => {
                "install the kernel modules package for the running kernel \
                 (e.g. linux-modules-extra-$(uname -r) on Ubuntu), then run `modprobe tls`"
            }
            Unavailable::NotFound { .. } => {
                "in a container, run `modprobe tls` on the host; otherwise this kernel was \
                 probably built without CONFIG_TLS: use a distribution kernel"
            }
            Unavailable::Denied { .. } => "allow setsockopt(SOL_TCP, TCP_ULP) in the seccomp/LSM policy",
            Unavailable::UnsupportedSocket { .. } => {
                "use Linux 4.13 or newer (kTLS RX needs 4.17+, TLS 1.3 5.1+) on a TCP socket"
            }
            Unavailable::Other { .. } => "see the detail above",
        }
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason(), self.advice())
    }
}

/// Explains why the `tls` ULP is missing by looking at the running system.
///
/// Reads `/proc/sys/net/ipv4/tcp_available_ulp`, `/proc/modules`,
/// `/sys/module/tls`, `/lib/modules/$(uname -r)` and the kernel config
/// (`/boot/config-*`, `/lib/modules/*/config` or `/proc/config.gz`). Never
/// fails: missing files just weaken the conclusion.
pub fn diagnose() -> Unavailable {
    decide(&Evidence::gather())
}

/// What the kernel config says about `CONFIG_TLS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConfigTls {
    BuiltIn,
    Module,
    NotSet,
    /// The config was read but has no `CONFIG_TLS` line at all (pre-4.13).
    Absent,
}

/// Facts gathered from the system; [`decide`] turns them into a verdict.
#[derive(Clone, Debug, Default)]
pub(crate) struct Evidence {
    pub release: Option<String>,
    pub available_ulp: Option<String>,
    pub module_loaded: bool,
    pub module_file: Option<PathBuf>,
    pub modules_dir: Option<PathBuf>,
    pub builtin: bool,
    /// (source file, value)
    pub config: Option<(String, ConfigTls)>,
    pub modules_disabled: bool,
}

impl Evidence {
    fn gather() -> Self {
        let release = sys::kernel_release();
        let available_ulp = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp").ok();
        let module_loaded = Path::new("/sys/module/tls").exists()
            || std::fs::read_to_string("/proc/modules")
                .map(|m| m.lines().any(|l| l.starts_with("tls ")))
                .unwrap_or(false);
        let mut ev = Evidence { release: release.clone(), available_ulp, module_loaded, ..Default::default() };
        if let Some(rel) = release.as_deref() {
            for base in ["/lib/modules", "/usr/lib/modules"] {
                let dir = Path::new(base).join(rel);
                if dir.is_dir() {
                    ev.module_file = find_module(&dir);
                    ev.builtin = std::fs::read_to_string(dir.join("modules.builtin"))
                        .map(|b| b.lines().any(|l| l.trim() == "kernel/net/tls/tls.ko"))
                        .unwrap_or(false);
                    ev.modules_dir = Some(dir);
                    break;
                }
            }
        }
        if let Some((source, text)) = read_kernel_config(release.as_deref()) {
            let (tls, modules_disabled) = parse_config(&text);
            ev.config = Some((source, tls));
            ev.modules_disabled = modules_disabled;
        }
        ev
    }
}

/// Looks for `tls.ko` (possibly compressed) in a `/lib/modules/<release>` tree.
fn find_module(dir: &Path) -> Option<PathBuf> {
    for ext in ["", ".xz", ".zst", ".gz"] {
        let p = dir.join(format!("kernel/net/tls/tls.ko{ext}"));
        if p.exists() {
            return Some(p);
        }
    }
    // Some distributions install modules elsewhere (updates/, extra/):
    // modules.dep lists every module's path relative to `dir`.
    let dep = std::fs::read_to_string(dir.join("modules.dep")).ok()?;
    dep.lines()
        .filter_map(|l| l.split(':').next())
        .find(|path| {
            let name = path.rsplit('/').next().unwrap_or(path);
            name == "tls.ko" || name.starts_with("tls.ko.")
        })
        .map(|path| dir.join(path))
}

/// Reads the running kernel's build config from the usual places.
fn read_kernel_config(release: Option<&str>) -> Option<(String, String)> {
    if let Some(rel) = release {
        for p in [
            format!("/boot/config-{rel}"),
            format!("/lib/modules/{rel}/config"),
            format!("/usr/lib/modules/{rel}/config"),
        ] {
            if let Ok(text) = std::fs::read_to_string(&p) {
                return Some((p, text));
            }
        }
    }
    if Path::new("/proc/config.gz").exists() {
        // Decompressing needs no crate: gzip is everywhere this file is.
        let out = std::process::Command::new("gzip")
            .args(["-dc", "/proc/config.gz"])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .ok()?;
        if out.status.success() {
            return Some(("/proc/config.gz".to_owned(), String::from_utf8_lossy(&out.stdout).into_owned()));
        }
    }
    None
}

/// Extracts `CONFIG_TLS` and whether module support is disabled.
pub(crate) fn parse_config(text: &str) -> (ConfigTls, bool) {
    let mut tls = ConfigTls::Absent;
    let mut modules_disabled = false;
    for line in text.lines() {
        let line = line.trim();
        match line {
            "CONFIG_TLS=y" => tls = ConfigTls::BuiltIn,
            "CONFIG_TLS=m" => tls = ConfigTls::Module,
            "# CONFIG_TLS is not set" => tls = ConfigTls::NotSet,
            "# CONFIG_MODULES is not set" => modules_disabled = true,
            _ => {}
        }
    }
    (tls, modules_disabled)
}

/// Turns gathered facts into the most likely explanation.
pub(crate) fn decide(ev: &Evidence) -> Unavailable {
    let rel = ev.release.as_deref().unwrap_or("the running kernel");
    let ulp_list = ev.available_ulp.as_deref().map(|s| s.trim().to_owned()).unwrap_or_default();
    let ulp_has_tls = ulp_list.split_whitespace().any(|u| u == "tls");
    let ulp_note = match &ev.available_ulp {
        Some(_) => format!("tcp_available_ulp is \"{ulp_list}\""),
        None => "tcp_available_ulp is unreadable".to_owned(),
    };

    if let Some((source, ConfigTls::NotSet)) = &ev.config {
        return Unavailable::NotBuilt { evidence: format!("{source} says `# CONFIG_TLS is not set`; {ulp_note}") };
    }
    if ulp_has_tls || ev.module_loaded {
        return Unavailable::Other {
            detail: format!("the tls module is loaded but attaching the tls ULP failed with ENOENT ({ulp_note})"),
        };
    }
    if let Some(module) = &ev.module_file {
        return Unavailable::ModuleNotLoaded { module: module.display().to_string() };
    }
    match &ev.config {
        Some((source, ConfigTls::Module)) => {
            return Unavailable::ModuleMissing {
                evidence: format!("{source} says CONFIG_TLS=m, but no tls.ko under /lib/modules/{rel}"),
            }
        }
        Some((source, ConfigTls::Absent)) => {
            return Unavailable::NotBuilt {
                evidence: format!("{source} has no CONFIG_TLS option (kernel older than 4.13?)"),
            }
        }
        Some((source, ConfigTls::BuiltIn)) => {
            return Unavailable::Other {
                detail: format!("{source} says CONFIG_TLS=y but the tls ULP is not registered ({ulp_note})"),
            }
        }
        _ => {}
    }
    if ev.modules_disabled {
        return Unavailable::NotBuilt {
            evidence: format!("the kernel has no module support and no built-in tls; {ulp_note}"),
        };
    }
    match &ev.modules_dir {
        Some(dir) if !ev.builtin => {
            Unavailable::NotBuilt { evidence: format!("no tls.ko in {} and {ulp_note}", dir.display()) }
        }
        _ => Unavailable::NotFound {
            evidence: format!("{ulp_note}; no /lib/modules/{rel} and no kernel config to read"),
        },
    }
}

/// `io::Error` for callers that want one: the diagnosis as text, `Unsupported` kind.
impl From<Unavailable> for io::Error {
    fn from(u: Unavailable) -> Self {
        io::Error::new(io::ErrorKind::Unsupported, u.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev() -> Evidence {
        Evidence { release: Some("6.1.0-test".into()), available_ulp: Some("mptcp\n".into()), ..Default::default() }
    }

    #[test]
    fn config_parsing() {
        assert_eq!(parse_config("CONFIG_TLS_DEVICE=y\nCONFIG_TLS=m\n").0, ConfigTls::Module);
        assert_eq!(parse_config("CONFIG_TLS=y").0, ConfigTls::BuiltIn);
        let (tls, nomod) = parse_config("# CONFIG_TLS is not set\n# CONFIG_MODULES is not set\n");
        assert_eq!(tls, ConfigTls::NotSet);
        assert!(nomod);
        assert_eq!(parse_config("CONFIG_NET=y").0, ConfigTls::Absent);
    }

    #[test]
    fn not_set_in_config_means_not_built() {
        let mut e = ev();
        e.config = Some(("/proc/config.gz".into(), ConfigTls::NotSet));
        let u = decide(&e);
        assert_eq!(u.kind(), "not-built");
        assert!(u.to_string().contains("CONFIG_TLS"), "{u}");
    }

    #[test]
    fn module_file_means_modprobe() {
        let mut e = ev();
        e.modules_dir = Some("/lib/modules/6.1.0-test".into());
        e.module_file = Some("/lib/modules/6.1.0-test/kernel/net/tls/tls.ko.xz".into());
        e.config = Some(("/boot/config-6.1.0-test".into(), ConfigTls::Module));
        let u = decide(&e);
        assert_eq!(u.kind(), "module-not-loaded");
        assert!(u.to_string().contains("modprobe tls"), "{u}");
    }

    #[test]
    fn module_config_without_file_means_missing_package() {
        let mut e = ev();
        e.modules_dir = Some("/lib/modules/6.1.0-test".into());
        e.config = Some(("/boot/config-6.1.0-test".into(), ConfigTls::Module));
        assert_eq!(decide(&e).kind(), "module-missing");
    }

    #[test]
    fn modules_dir_without_tls_means_not_built() {
        let mut e = ev();
        e.modules_dir = Some("/lib/modules/6.1.0-test".into());
        let u = decide(&e);
        assert_eq!(u.kind(), "not-built");
        assert!(u.to_string().contains("CONFIG_TLS"));
    }

    #[test]
    fn nothing_to_go_on_means_not_found() {
        let u = decide(&ev());
        assert_eq!(u.kind(), "not-found");
        assert!(u.to_string().contains("modprobe tls"));
    }

    #[test]
    fn no_module_support_means_not_built() {
        let mut e = ev();
        e.modules_disabled = true;
        assert_eq!(decide(&e).kind(), "not-built");
    }

    #[test]
    fn loaded_module_that_still_fails_is_not_blamed_on_the_module() {
        let mut e = ev();
        e.module_loaded = true;
        let u = decide(&e);
        assert_eq!(u.kind(), "other");
        assert!(u.reason().contains("loaded"), "{u}");
    }
}
