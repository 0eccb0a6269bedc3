//! A real etcd cluster on loopback (Debian's `etcd-server`, `etcdctl` from
//! `etcd-client`): three members by default, each of which a test may kill,
//! restart or ask for the leader; all killed when dropped.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::origin::free_port;
use crate::process::run_with_timeout;

/// One etcd member's ports and process (`None` while stopped).
struct Node {
    name: String,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

/// An etcd cluster.
pub struct Etcd {
    nodes: Vec<Node>,
    dir: tempfile::TempDir,
}

impl Etcd {
    /// Starts `n` members and waits until the cluster answers.
    pub fn start(n: usize) -> Etcd {
        let nodes = (0..n)
            .map(|i| Node { name: format!("e{i}"), client: free_port(), peer: free_port(), child: None })
            .collect();
        let mut etcd = Etcd { nodes, dir: tempfile::tempdir().unwrap() };
        for i in 0..n {
            etcd.start_node(i);
        }
        etcd.wait_healthy();
        etcd
    }

    /// The client URLs of every member, for `[cluster] etcd`.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|n| format!("http://127.0.0.1:{}", n.client)).collect()
    }

    /// `endpoints` as a TOML array.
    pub fn toml_endpoints(&self) -> String {
        let quoted: Vec<String> = self.endpoints().iter().map(|e| format!("\"{e}\"")).collect();
        format!("[{}]", quoted.join(", "))
    }

    fn start_node(&mut self, i: usize) {
        let cluster: Vec<String> =
            self.nodes.iter().map(|n| format!("{}=http://127.0.0.1:{}", n.name, n.peer)).collect();
        let data: PathBuf = self.dir.path().join(&self.nodes[i].name);
        let log = std::fs::File::create(self.dir.path().join(format!("{}.log", self.nodes[i].name))).unwrap();
        let n = &mut self.nodes[i];
        let client = format!("http://127.0.0.1:{}", n.client);
        let peer = format!("http://127.0.0.1:{}", n.peer);
        let child = Command::new("etcd")
            .args(["--name", &n.name, "--data-dir"])
            .arg(&data)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &cluster.join(","), "--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "ktlsd-test", "--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd is installed (scripts/test installs Debian's etcd-server)");
        n.child = Some(child);
    }

    /// Waits until every running member is healthy.
    pub fn wait_healthy(&self) {
        let t = Instant::now();
        loop {
            let running: Vec<String> = self
                .nodes
                .iter()
                .filter(|n| n.child.is_some())
                .map(|n| format!("http://127.0.0.1:{}", n.client))
                .collect();
            let up = running.iter().all(|e| {
                let port: u16 = e.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(0);
                TcpStream::connect(("127.0.0.1", port)).is_ok()
            });
            if up && self.ctl_at(&running, &["endpoint", "health"]).status.success() {
                return;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "etcd did not become healthy: {}", self.logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `etcdctl ARGS` against the running members.
    pub fn ctl(&self, args: &[&str]) -> std::process::Output {
        self.ctl_at(&self.endpoints(), args)
    }

    fn ctl_at(&self, endpoints: &[String], args: &[&str]) -> std::process::Output {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3").arg(format!("--endpoints={}", endpoints.join(","))).args(args);
        run_with_timeout(&mut cmd, None, Duration::from_secs(30))
    }

    /// `etcdctl put KEY` with `value` (bytes as given).
    pub fn put(&self, key: &str, value: &[u8]) {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3").arg(format!("--endpoints={}", self.endpoints().join(","))).args(["put", key]);
        let out = run_with_timeout(&mut cmd, Some(value), Duration::from_secs(30));
        assert!(out.status.success(), "etcdctl put: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// The value at `key`, if any.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        let out = self.ctl(&["get", key, "--print-value-only"]);
        assert!(out.status.success(), "etcdctl get: {}", String::from_utf8_lossy(&out.stderr));
        let mut v = out.stdout;
        (!v.is_empty()).then(|| {
            if v.last() == Some(&b'\n') {
                v.pop();
            }
            v
        })
    }

    /// The index of the current leader.
    pub fn leader(&self) -> usize {
        let t = Instant::now();
        loop {
            for (i, n) in self.nodes.iter().enumerate().filter(|(_, n)| n.child.is_some()) {
                let out =
                    self.ctl_at(&[format!("http://127.0.0.1:{}", n.client)], &["endpoint", "status", "-w", "json"]);
                let text = String::from_utf8_lossy(&out.stdout);
                let status: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                let (leader, me) = (&status[0]["Status"]["leader"], &status[0]["Status"]["header"]["member_id"]);
                if !leader.is_null() && leader == me {
                    return i;
                }
            }
            assert!(t.elapsed() < Duration::from_secs(20), "no etcd leader: {}", self.logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills member `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills every member.
    pub fn kill_all(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }

    /// Starts again every member that is not running (their data kept) and waits for health.
    pub fn restart_all(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].child.is_none() {
                self.start_node(i);
            }
        }
        self.wait_healthy();
    }

    /// The members' logs, for a failure message.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let log = std::fs::read_to_string(self.dir.path().join(format!("{}.log", n.name))).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                format!("{}: {}", n.name, tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill_all();
    }
}
