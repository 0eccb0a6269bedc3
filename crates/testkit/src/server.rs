//! The server under test: `ktlsd serve` (the real binary) over a temporary
//! directory, started on an ephemeral port and waited for until its ready line
//! ([`ServerBuilder`], [`Server`]), and what it leaves behind once stopped
//! ([`Stopped`]). The binary is the caller's: a test passes
//! `env!("CARGO_BIN_EXE_ktlsd")`, and [`ServerBuilder::bin_from_env`] lets
//! `KTLSD_BIN` override it (the VM suite runs a host-built binary). Clients are
//! elsewhere ([`crate::curl`], [`crate::tls`]).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::process::{run_with_timeout, Exited, LineLog};

/// The server binary named by `KTLSD_BIN` when it is set (the VM suite runs a
/// host-built release binary), else `default` (the one cargo built).
pub fn bin_from_env(default: impl Into<PathBuf>) -> PathBuf {
    match std::env::var_os("KTLSD_BIN") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => default.into(),
    }
}

/// How long a server may take to print its `serving` line (generous: the machine
/// may be busy compiling).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server may take to exit after SIGTERM.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound for any client command.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

/// Builds a `ktlsd serve` command line over a temporary directory:
/// `DIR/root` is the served ROOT, `DIR/access.log` the access log.
pub struct ServerBuilder {
    bin: PathBuf,
    dir: tempfile::TempDir,
    root: PathBuf,
    args: Vec<OsString>,
    pass_root: bool,
    listen: Vec<String>,
    workers: Option<usize>,
    access_log: bool,
    state_dir: bool,
    allow_root: bool,
    env: Vec<(OsString, OsString)>,
    wrapper: Vec<OsString>,
}

/// Whether the tests run as root (then the server refuses to start without
/// `--user` or `--allow-root`).
pub fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the process's effective user.
    std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

/// `--allow-root` when the tests run as root, for commands run without [`ServerBuilder`].
pub fn allow_root_args() -> &'static [&'static str] {
    if running_as_root() {
        &["--allow-root"]
    } else {
        &[]
    }
}

impl ServerBuilder {
    /// `ktlsd serve` run from `bin` (tests pass `env!("CARGO_BIN_EXE_ktlsd")`).
    pub fn new(bin: impl Into<PathBuf>) -> Self {
        let dir = tempfile::Builder::new().prefix("ktlsd-test-").tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir(&root).expect("create root");
        ServerBuilder {
            bin: bin.into(),
            dir,
            root,
            args: Vec::new(),
            pass_root: true,
            listen: vec!["127.0.0.1:0".into()],
            workers: Some(1),
            access_log: true,
            state_dir: true,
            allow_root: true,
            env: Vec::new(),
            wrapper: Vec::new(),
        }
    }

    /// The directory that will be served.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The temporary directory holding ROOT (and anything else a test needs outside it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `text` as `ktlsd.toml` in the test's directory; returns its path.
    pub fn write_config(&self, text: &str) -> PathBuf {
        let p = self.dir().join("ktlsd.toml");
        std::fs::write(&p, text).expect("write ktlsd.toml");
        p
    }

    /// [`Self::write_config`], and `--config` naming the file.
    pub fn config(self, text: &str) -> Self {
        let p = self.write_config(text);
        self.arg("--config").arg(p)
    }

    /// Writes `contents` to `rel` under ROOT, creating parent directories.
    pub fn file(self, rel: &str, contents: impl AsRef<[u8]>) -> Self {
        write_file(&self.root.join(rel), contents.as_ref());
        self
    }

    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.args.push(a.as_ref().to_owned());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Replaces the `--listen` addresses (empty: pass no `--listen`).
    pub fn listen(mut self, addrs: &[&str]) -> Self {
        self.listen = addrs.iter().map(|s| s.to_string()).collect();
        self
    }

    /// `None`: pass no `--workers`.
    pub fn workers(mut self, n: Option<usize>) -> Self {
        self.workers = n;
        self
    }

    /// Runs `bin` instead of the binary given to [`ServerBuilder::new`].
    pub fn bin(mut self, bin: impl Into<PathBuf>) -> Self {
        self.bin = bin.into();
        self
    }

    /// Runs the binary named by `KTLSD_BIN`, if set (see [`bin_from_env`]).
    pub fn bin_from_env(self) -> Self {
        let bin = bin_from_env(&self.bin);
        self.bin(bin)
    }

    /// Do not pass ROOT on the command line (e.g. it comes from a config file).
    pub fn no_root_arg(mut self) -> Self {
        self.pass_root = false;
        self
    }

    /// Do not pass `--access-log` (it then goes to standard output, discarded).
    pub fn no_access_log(mut self) -> Self {
        self.access_log = false;
        self
    }

    /// Do not pass `--state-dir` (the test passes its own, or `--ephemeral-cert`).
    pub fn no_state_dir(mut self) -> Self {
        self.state_dir = false;
        self
    }

    /// `DIR/state`, the `--state-dir` passed by default so that no test writes the real one.
    pub fn state_dir_path(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Do not pass `--allow-root` (passed by default when the tests run as root).
    pub fn no_allow_root(mut self) -> Self {
        self.allow_root = false;
        self
    }

    /// Sets an environment variable for the server.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env.push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Runs the server under `wrapper` (a program and its arguments, e.g.
    /// `systemd-socket-activate -l ADDR`), which is given the binary and its argv.
    pub fn wrapper<I, S>(mut self, wrapper: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.wrapper = wrapper.into_iter().map(|a| a.as_ref().to_owned()).collect();
        self
    }

    fn access_log_path(&self) -> PathBuf {
        self.dir.path().join("access.log")
    }

    /// The full command line, for display and for `command()`.
    pub fn argv(&self) -> Vec<OsString> {
        let mut v: Vec<OsString> = vec!["serve".into()];
        if self.pass_root {
            v.push(self.root.clone().into());
        }
        for l in &self.listen {
            v.push("--listen".into());
            v.push(l.into());
        }
        if let Some(n) = self.workers {
            v.push("--workers".into());
            v.push(n.to_string().into());
        }
        if self.access_log {
            v.push("--access-log".into());
            v.push(self.access_log_path().into());
        }
        if self.state_dir {
            v.push("--state-dir".into());
            v.push(self.state_dir_path().into());
        }
        if self.allow_root && running_as_root() {
            v.push("--allow-root".into());
        }
        v.extend(self.args.iter().cloned());
        v
    }

    fn command(&self) -> Command {
        let mut c = match self.wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        c.args(self.argv());
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c.env_remove("KTLSD_LOG");
        c.current_dir(self.dir.path());
        c
    }

    /// Starts the server and waits until it is serving.
    pub fn start(self) -> Server {
        self.try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts the server; `Err` describes why it did not get to serving.
    pub fn try_start(self) -> Result<Server, String> {
        let mut cmd = self.command();
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| format!("cannot run {}: {e}", self.bin.display()))?;
        let (stderr, reader) = LineLog::spawn(child.stderr.take().unwrap());
        let (stdout, _) = LineLog::spawn(child.stdout.take().unwrap());
        // The server announces itself with one JSON line, the first on stdout.
        let Some(ready) = stdout.wait_map(START_TIMEOUT, |lines| lines.first().and_then(|l| Ready::parse(l))) else {
            let _ = child.kill();
            let status = child.wait();
            let _ = reader.join();
            return Err(format!(
                "ktlsd did not start ({:?}); argv {:?}; stdout:\n{}stderr:\n{}",
                status,
                self.argv(),
                stdout.text(),
                stderr.text()
            ));
        };
        assert!(!ready.https.is_empty(), "a ready line without HTTPS addresses: {ready:?}");
        // The human start-up lines go to stderr just before the ready line; two
        // pipes keep no order between them, so wait for the last of them too:
        // tests read the start-up log right after `start`.
        stderr.wait_for(START_TIMEOUT, |l| l.contains(" serving "));
        Ok(Server {
            child: Some(child),
            reader: Some(reader),
            stderr,
            stdout,
            addrs: ready.https,
            http_addrs: ready.http,
            ready_pid: ready.pid,
            ready_tls: ready.tls,
            access_log: self.access_log_path(),
            root: self.root,
            dir: Some(self.dir),
        })
    }

    /// Runs the command line expecting it to exit by itself (a start-up error).
    pub fn run_to_exit(self) -> Exited {
        let mut cmd = self.command();
        let out = run_with_timeout(&mut cmd, None, Duration::from_secs(30));
        Exited::from(out)
    }
}

/// The line `ktlsd serve` prints on stdout once it listens:
/// `{"ready":{"https":[ADDR...],"http":[ADDR...],"pid":N,"tls":"ktls"|"userspace"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    pub https: Vec<SocketAddr>,
    pub http: Vec<SocketAddr>,
    pub pid: u32,
    pub tls: String,
}

impl Ready {
    /// The ready line's contents; `None` for any other line.
    pub fn parse(line: &str) -> Option<Ready> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        let r = v.get("ready")?;
        let addrs = |key: &str| -> Option<Vec<SocketAddr>> {
            r.get(key)?.as_array()?.iter().map(|a| a.as_str()?.parse().ok()).collect()
        };
        Some(Ready {
            https: addrs("https")?,
            http: addrs("http")?,
            pid: u32::try_from(r.get("pid")?.as_u64()?).ok()?,
            tls: r.get("tls")?.as_str()?.to_string(),
        })
    }
}

/// A running `ktlsd serve`. Killed on drop; `stop()` stops it with SIGTERM.
pub struct Server {
    child: Option<Child>,
    reader: Option<JoinHandle<()>>,
    stderr: Arc<LineLog>,
    stdout: Arc<LineLog>,
    addrs: Vec<SocketAddr>,
    http_addrs: Vec<SocketAddr>,
    ready_pid: u32,
    ready_tls: String,
    access_log: PathBuf,
    root: PathBuf,
    dir: Option<tempfile::TempDir>,
}

/// A server after SIGTERM: its exit status, full stderr and final counters.
#[derive(Debug)]
pub struct Stopped {
    pub status: ExitStatus,
    pub stderr: String,
    pub stats: HashMap<String, u64>,
    /// Time from SIGTERM to exit.
    pub took: Duration,
    /// The access log's lines once the server had exited.
    pub access_log: Vec<String>,
    /// The server's temporary directory, kept until this is dropped.
    pub dir: Option<tempfile::TempDir>,
}

impl Stopped {
    /// A counter from the `stopped:` line; panics when it is missing.
    pub fn stat(&self, name: &str) -> u64 {
        *self
            .stats
            .get(name)
            .unwrap_or_else(|| panic!("no counter {name:?} in the stopped line; stderr:\n{}", self.stderr))
    }

    pub fn assert_clean_exit(&self) {
        assert!(self.status.success(), "ktlsd exited with {:?}; stderr:\n{}", self.status, self.stderr);
    }
}

/// Parses `stopped: a=1 b=2 ...` into a map.
pub fn parse_stats(stderr: &str) -> HashMap<String, u64> {
    let Some(line) = stderr.lines().rev().find(|l| l.contains("stopped: ")) else {
        return HashMap::new();
    };
    let rest = line.split("stopped: ").nth(1).unwrap_or("");
    rest.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| v.parse().ok().map(|v| (k.to_string(), v)))
        .collect()
}

impl Server {
    /// A `ktlsd serve` of `bin` with default options over an empty ROOT.
    pub fn builder(bin: impl Into<PathBuf>) -> ServerBuilder {
        ServerBuilder::new(bin)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addrs[0]
    }

    /// The plain-HTTP (port 80) addresses from the ready line.
    pub fn http_addrs(&self) -> &[SocketAddr] {
        &self.http_addrs
    }

    /// The pid and record layer (`ktls` or `userspace`) the ready line announced.
    pub fn ready_pid(&self) -> u32 {
        self.ready_pid
    }

    pub fn ready_tls(&self) -> &str {
        &self.ready_tls
    }

    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    pub fn port(&self) -> u16 {
        self.addrs[0].port()
    }

    /// `https://HOST:PORT{path}` for the first listening address.
    pub fn url(&self, path: &str) -> String {
        url_for(self.addr(), path)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn dir(&self) -> &Path {
        self.dir.as_ref().expect("server directory").path()
    }

    /// Writes `contents` to `rel` under ROOT (the server reads files per request).
    pub fn write(&self, rel: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let p = self.root.join(rel);
        write_file(&p, contents.as_ref());
        p
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(rc, 0, "kill({sig}) failed: {}", io::Error::last_os_error());
    }

    /// Everything the server has printed on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.text()
    }

    /// Lines the server has printed on stdout so far: the ready line, then the
    /// access log when it goes to stdout.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout.lines()
    }

    /// Waits for a stdout line containing `needle`.
    pub fn wait_stdout(&self, needle: &str, timeout: Duration) -> Option<String> {
        self.stdout.wait_for(timeout, |l| l.contains(needle))
    }

    /// Waits for a stderr line containing `needle`.
    pub fn wait_stderr(&self, needle: &str, timeout: Duration) -> Option<String> {
        self.stderr.wait_for(timeout, |l| l.contains(needle))
    }

    pub fn access_log_path(&self) -> &Path {
        &self.access_log
    }

    /// Current access log lines.
    pub fn access_log(&self) -> Vec<String> {
        std::fs::read_to_string(&self.access_log).unwrap_or_default().lines().map(String::from).collect()
    }

    /// Polls the access log (flushed every 200 ms) until it has at least `n` lines.
    pub fn wait_access_log(&self, n: usize, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let lines = self.access_log();
            if lines.len() >= n || Instant::now() >= deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Sends SIGTERM (if `signal`), then waits for the exit.
    fn finish(&mut self, signal: bool, timeout: Duration) -> Stopped {
        let started = Instant::now();
        if signal {
            self.signal(libc::SIGTERM);
        }
        let child = self.child.as_mut().expect("running");
        let status = loop {
            if let Some(s) = child.try_wait().expect("try_wait") {
                break s;
            }
            if started.elapsed() > timeout {
                let _ = child.kill();
                let _ = child.wait();
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                panic!("ktlsd did not exit within {timeout:?} of SIGTERM; stderr:\n{}", self.stderr.text());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = started.elapsed();
        self.child = None;
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let stderr = self.stderr.text();
        let access_log = self.access_log();
        Stopped { status, stats: parse_stats(&stderr), stderr, took, access_log, dir: self.dir.take() }
    }

    /// SIGTERM, then wait (bounded) for the exit.
    pub fn stop(mut self) -> Stopped {
        self.finish(true, STOP_TIMEOUT)
    }

    /// Waits for an exit already under way (after `signal`).
    pub fn wait_exit(mut self, timeout: Duration) -> Stopped {
        self.finish(false, timeout)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

pub fn url_for(addr: SocketAddr, path: &str) -> String {
    match addr {
        SocketAddr::V4(a) => format!("https://{}:{}{path}", a.ip(), a.port()),
        SocketAddr::V6(a) => format!("https://[{}]:{}{path}", a.ip(), a.port()),
    }
}

pub fn write_file(path: &Path, contents: &[u8]) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("create parent dirs");
    }
    std::fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Sets a file's modification time to `secs` after the epoch.
pub fn set_mtime(path: &Path, secs: u64) {
    let f = std::fs::File::options().write(true).open(path).expect("open for set_modified");
    f.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(secs)).expect("set_modified");
}

/// Waits until a plain TCP connect to `addr` is refused; false if it kept being accepted.
pub fn wait_connect_refused(addr: SocketAddr, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return true,
            _ => {}
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
