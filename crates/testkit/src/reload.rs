//! Reloading a running server from a test: SIGHUP, then its outcome line.

use std::time::{Duration, Instant};

use crate::server::Server;

/// Sends SIGHUP and waits for the `n`-th reload outcome line (success or
/// failure) on the server's stderr; returns that line.
pub fn reload(srv: &Server, n: usize) -> String {
    srv.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let lines: Vec<String> = srv
            .stderr()
            .lines()
            .filter(|l| l.contains("reloaded configuration") || l.contains("reload failed"))
            .map(String::from)
            .collect();
        if lines.len() >= n {
            return lines[n - 1].clone();
        }
        assert!(Instant::now() < deadline, "no reload line after SIGHUP #{n}; stderr:\n{}", srv.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
}
