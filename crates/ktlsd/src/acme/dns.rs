//! dns-01 (RFC 8555 section 8.4) through the operator's hook command, as certbot's
//! `--manual-auth-hook`/`--manual-cleanup-hook` and acme.sh's DNS API scripts do: ktlsd
//! runs `HOOK set _acme-challenge.NAME VALUE` to publish the TXT record, waits for it to
//! exit (bounded by a timeout), then `HOOK clear _acme-challenge.NAME VALUE` once the
//! order is done. The hook owns the DNS provider's API and its credentials; ktlsd does
//! not speak DNS itself: after the hook it waits the configured propagation delay.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How the TXT records are published.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DnsHook {
    /// The executable, run with `set|clear NAME VALUE`.
    pub command: PathBuf,
    /// Longest a run may take before it is killed and counted a failure.
    pub timeout: Duration,
    /// Waited after every record is set, before the CA is asked to look.
    pub propagation: Duration,
}

/// The TXT record name for a certificate name (`*.example.com` is validated at `example.com`).
pub fn record_name(name: &str) -> String {
    format!("_acme-challenge.{}", name.strip_prefix("*.").unwrap_or(name))
}

/// How often a running hook is checked for its exit.
const POLL: Duration = Duration::from_millis(50);

impl DnsHook {
    /// Runs `HOOK set NAME VALUE` and waits for it to exit, on the runtime's blocking pool.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a run already started goes on to its end or its timeout, and when it
    /// sets the record after the future was dropped, the record stays (the [`Record`] guard
    /// that clears it exists only once `set` has returned).
    pub async fn set(&self, name: &str, value: &str) -> Result<Record, String> {
        let (hook, record, txt) = (self.clone(), name.to_string(), value.to_string());
        match tokio::task::spawn_blocking(move || hook.run("set", &record, &txt)).await {
            Ok(result) => result?,
            Err(e) => return Err(format!("{} set {name}: {e}", self.command.display())),
        }
        Ok(Record { hook: self.clone(), name: name.to_string(), value: value.to_string() })
    }

    /// Runs `HOOK ACTION NAME VALUE` to its end, killed after the timeout. Blocks.
    fn run(&self, action: &str, name: &str, value: &str) -> Result<(), String> {
        let what = format!("{} {action} {name}", self.command.display());
        let mut child = Command::new(&self.command)
            .args([action, name, value])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("cannot run the dns_hook {} ({e}): give an executable file", self.command.display())
            })?;
        let deadline = Instant::now() + self.timeout;
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => return Err(format!("{what} failed ({status}); see its messages above")),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
                Ok(None) => {
                    // Reaped so it leaves no zombie; an error here means it is gone already.
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("{what}: still running after {:?}; killed", self.timeout));
                }
                Err(e) => return Err(format!("{what}: {e}")),
            }
        }
    }
}

/// A TXT record set by the hook; dropping it (order done, failed or cancelled) clears it
/// on a thread of its own, so that no event loop waits for the hook.
pub struct Record {
    hook: DnsHook,
    name: String,
    value: String,
}

impl Drop for Record {
    fn drop(&mut self) {
        let (hook, name, value) = (self.hook.clone(), self.name.clone(), std::mem::take(&mut self.value));
        let clear = move || {
            if let Err(why) = hook.run("clear", &name, &value) {
                tracing::warn!("ACME dns-01: {why}; remove the TXT record by hand");
            }
        };
        if let Err(e) = std::thread::Builder::new().name("ktlsd-dns-hook".into()).spawn(clear) {
            tracing::warn!("ACME dns-01: cannot start the clear hook for {}: {e}", self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn hook(dir: &std::path::Path, body: &str, timeout: Duration) -> DnsHook {
        let path = dir.join("hook");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write hook");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        DnsHook { command: path, timeout, propagation: Duration::ZERO }
    }

    #[test]
    fn record_names() {
        assert_eq!(record_name("example.com"), "_acme-challenge.example.com");
        assert_eq!(record_name("*.example.com"), "_acme-challenge.example.com");
        assert_eq!(record_name("a.b.example.com"), "_acme-challenge.a.b.example.com");
    }

    #[tokio::test]
    async fn set_then_clear_and_failures_say_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("log");
        let h = hook(dir.path(), &format!("echo \"$1 $2 $3\" >> {}", log.display()), Duration::from_secs(10));
        let record = h.set("_acme-challenge.a.test", "v1").await.expect("set");
        assert_eq!(std::fs::read_to_string(&log).expect("log"), "set _acme-challenge.a.test v1\n");
        drop(record);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&log).expect("log").lines().count() < 2 && Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
        assert_eq!(
            std::fs::read_to_string(&log).expect("log"),
            "set _acme-challenge.a.test v1\nclear _acme-challenge.a.test v1\n"
        );

        for (body, timeout, want) in [
            ("exit 3", Duration::from_secs(10), "failed (exit status: 3)"),
            ("sleep 5", Duration::from_millis(200), "still running after 200ms; killed"),
        ] {
            let started = Instant::now();
            let e = hook(dir.path(), body, timeout).set("n", "v").await.err().expect("fails");
            assert!(e.contains(want), "{body}: {e}");
            assert!(started.elapsed() < Duration::from_secs(4), "{body}: waited {:?}", started.elapsed());
        }
        let missing =
            DnsHook { command: dir.path().join("nope"), timeout: Duration::from_secs(1), propagation: Duration::ZERO };
        let e = missing.set("n", "v").await.err().expect("fails");
        assert!(e.contains("cannot run the dns_hook"), "{e}");
    }
}
