//! A Python upstream of a test's own (`/usr/bin/python3 SCRIPT`) that binds a port
//! of its choosing and says so on its first line, `listening PORT`: the WebSocket
//! upstreams of the tunnel tests. Its later output lines are kept for the test to
//! look at; it is killed when dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running script upstream.
pub struct ScriptUpstream {
    pub port: u16,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl ScriptUpstream {
    /// Starts `script`; panics with what it printed when it does not say `listening PORT`.
    pub fn start(script: &str) -> ScriptUpstream {
        let mut child = Command::new("/usr/bin/python3")
            .arg(script)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("/usr/bin/python3 runs the upstream script");
        let mut out = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut first = String::new();
        let _ = out.read_line(&mut first);
        let port = first.trim().strip_prefix("listening ").and_then(|p| p.parse().ok());
        let Some(port) = port else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{script} did not start: {first:?} (python3-websockets installed?)");
        };
        let lines = Arc::new(Mutex::new(Vec::new()));
        let keep = lines.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                keep.lock().unwrap().push(line);
            }
        });
        ScriptUpstream { port, child, lines }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The lines it printed after the first.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits until it printed a line starting with `prefix`, and returns it.
    pub fn wait_line(&self, prefix: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(l) = self.lines.lock().unwrap().iter().find(|l| l.starts_with(prefix)) {
                return Some(l.clone());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for ScriptUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
