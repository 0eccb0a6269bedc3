//! HAProxy (Debian's `haproxy`) as the load balancer in front of ktlsd: started in
//! the foreground on a configuration the test writes, killed when dropped.

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::origin::free_port;

/// A running HAProxy; `ports` are its frontends' ports, in the order configured.
pub struct Haproxy {
    child: Child,
    pub ports: Vec<u16>,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    /// In `mode` (tcp, or http with `option forwardfor`), one frontend per
    /// `(server options, backend address)`; each listens on its own port.
    pub fn start_in(mode: &str, routes: &[(&str, SocketAddr)]) -> Haproxy {
        let mut cfg = String::new();
        let forwardfor = if mode == "http" { "  option forwardfor\n" } else { "" };
        let mut ports = Vec::new();
        for (i, (send, backend)) in routes.iter().enumerate() {
            let port = free_port();
            cfg += &format!(
                "frontend f{i}\n  bind 127.0.0.1:{port}\n  default_backend b{i}\nbackend b{i}\n{forwardfor}  server s {backend} {send}\n"
            );
            ports.push(port);
        }
        Haproxy::start(mode, &cfg, ports)
    }

    /// In `mode`, with `sections` (frontends and backends) after the defaults;
    /// waits until each of `ports` (the frontends') accepts connections.
    pub fn start(mode: &str, sections: &str, ports: Vec<u16>) -> Haproxy {
        let dir = tempfile::tempdir().unwrap();
        let cfg = format!(
            "defaults\n  mode {mode}\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n  timeout check 2s\n{sections}"
        );
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, cfg).unwrap();
        let child = Command::new("haproxy")
            .args(["-db", "-f"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("haproxy is installed (scripts/test installs Debian's haproxy)");
        let t = Instant::now();
        for port in &ports {
            while TcpStream::connect(("127.0.0.1", *port)).is_err() {
                assert!(t.elapsed() < Duration::from_secs(10), "haproxy did not listen on {port}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Haproxy { child, ports, _dir: dir }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
