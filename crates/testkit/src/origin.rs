//! The HTTP/1.1 origin of the proxy tests: `origin.py` (its paths and misbehaviour
//! are listed there), run by `/usr/bin/python3` as a child process that logs every
//! request it reads. The script is built into this crate and written out at start,
//! so a test finds it wherever it runs (the kTLS VMs included).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// `bin` (one worker, debug log) with `config` and `args`, serving `index.txt`
/// ("static file") besides what `config` proxies.
pub fn ktlsd(bin: &str, config: &str, args: &[&str]) -> crate::Server {
    crate::Server::builder(bin)
        .workers(Some(1))
        .file("index.txt", "static file")
        .config(config)
        .arg("--log-level")
        .arg("debug")
        .args(args)
        .start()
}

/// A TCP port free on 127.0.0.1 now.
pub fn free_port() -> u16 {
    crate::pebble::free_port(false)
}

/// A running `origin.py`, named `name` (what `/api/name` answers); killed when dropped.
pub struct Origin {
    pub port: u16,
    log: PathBuf,
    child: Child,
    /// The port, or `unix:PATH`, as `origin.py` takes it.
    listen: String,
    name: String,
    _dir: tempfile::TempDir,
}

/// `origin.py` on `listen` (a port or `unix:PATH`), once it says it listens.
fn spawn(script: &std::path::Path, listen: &str, name: &str, log: &std::path::Path) -> Option<Child> {
    let mut child = Command::new("/usr/bin/python3")
        .arg(script)
        .args([listen, name])
        .arg(log)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("/usr/bin/python3 runs the origin");
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    if line.trim() == "ready" {
        return Some(child);
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

impl Origin {
    pub fn start(name: &str) -> Origin {
        Origin::launch(name, false)
    }

    /// As [`Origin::start`], listening on a Unix socket in its own directory
    /// ([`Origin::unix_url`]).
    pub fn start_unix(name: &str) -> Origin {
        Origin::launch(name, true)
    }

    fn launch(name: &str, unix: bool) -> Origin {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("requests.log");
        std::fs::write(&log, "").unwrap();
        let script = dir.path().join("origin.py");
        std::fs::write(&script, include_str!("origin.py")).unwrap();
        for _ in 0..5 {
            let port = if unix { 0 } else { free_port() };
            let listen = match unix {
                true => format!("unix:{}", dir.path().join("origin.sock").display()),
                false => port.to_string(),
            };
            if let Some(child) = spawn(&script, &listen, name, &log) {
                return Origin { port, listen, log, child, name: name.to_string(), _dir: dir };
            }
        }
        panic!("the Python origin did not start");
    }

    /// Starts it again on its port after [`Origin::stop`] (its log kept).
    pub fn restart(&mut self) {
        self.stop();
        let script = self._dir.path().join("origin.py");
        for _ in 0..50 {
            if let Some(child) = spawn(&script, &self.listen, &self.name, &self.log) {
                self.child = child;
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("the Python origin did not start again on port {}", self.port);
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `unix:/PATH` of an origin started by [`Origin::start_unix`].
    pub fn unix_url(&self) -> String {
        format!("unix:{}", self._dir.path().join("origin.sock").display())
    }

    /// How many requests for exactly `target` it has read.
    pub fn count(&self, target: &str) -> usize {
        self.requests().iter().filter(|l| l.split(' ').nth(1) == Some(target)).count()
    }

    /// Stops it: the port then refuses connections.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The requests it has read ("METHOD TARGET PEER-PORT").
    pub fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log).unwrap().lines().map(str::to_string).collect()
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
