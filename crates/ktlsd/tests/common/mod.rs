//! Shared harness for the integration tests: the real `ktlsd` binary on a real
//! socket, driven by real clients (`curl`, `openssl s_client`) and by an in-process
//! rustls client for byte-exact requests.
//!
//! Every test starts its own server on an ephemeral port (`127.0.0.1:0`) with a
//! temporary ROOT, so tests can run in parallel.

#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// The server binary named by `KTLSD_BIN` when it is set (the VM suite runs a
/// host-built release binary), else [`BIN`].
pub fn bin_from_env() -> PathBuf {
    match std::env::var_os("KTLSD_BIN") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(BIN),
    }
}

/// How long a server may take to print its `serving` line (generous: the machine
/// may be busy compiling).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server may take to exit after SIGTERM.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound for any client command.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------
// Captured output of a child process, line by line, with waiting.
// ---------------------------------------------------------------------------

/// The lines read so far from a pipe (a thread reads it to its end), with waiting.
#[derive(Default)]
pub struct LineLog {
    state: Mutex<(Vec<String>, bool)>,
    cv: Condvar,
}

impl LineLog {
    /// Starts reading `reader`; the handle finishes at its end.
    pub fn spawn(reader: impl Read + Send + 'static) -> (Arc<LineLog>, JoinHandle<()>) {
        let log = Arc::new(LineLog::default());
        let l = log.clone();
        let handle = std::thread::spawn(move || {
            let mut r = BufReader::new(reader);
            let mut line = Vec::new();
            loop {
                line.clear();
                match r.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let s = String::from_utf8_lossy(&line).trim_end_matches(['\r', '\n']).to_string();
                        let mut st = l.state.lock().unwrap();
                        st.0.push(s);
                        l.cv.notify_all();
                    }
                }
            }
            let mut st = l.state.lock().unwrap();
            st.1 = true;
            l.cv.notify_all();
        });
        (log, handle)
    }

    /// Waits until `check` of all lines so far gives `Some`; `None` on timeout or
    /// end of stream.
    pub fn wait_map<T>(&self, timeout: Duration, check: impl Fn(&[String]) -> Option<T>) -> Option<T> {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock().unwrap();
        loop {
            if let Some(t) = check(&st.0) {
                return Some(t);
            }
            if st.1 {
                return None;
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            st = self.cv.wait_timeout(st, deadline - now).unwrap().0;
        }
    }

    /// Waits for a line satisfying `pred`; `None` on timeout or end of stream.
    pub fn wait_for(&self, timeout: Duration, pred: impl Fn(&str) -> bool) -> Option<String> {
        self.wait_map(timeout, |lines| lines.iter().find(|l| pred(l)).cloned())
    }

    /// Waits until `pred` holds for all the lines so far; false on timeout or end of stream.
    pub fn wait_until(&self, timeout: Duration, pred: impl Fn(&[String]) -> bool) -> bool {
        self.wait_map(timeout, |lines| pred(lines).then_some(())).is_some()
    }

    /// Everything so far, one `\n` after each line.
    pub fn text(&self) -> String {
        let st = self.state.lock().unwrap();
        let mut s = st.0.join("\n");
        s.push('\n');
        s
    }
}

// ---------------------------------------------------------------------------
// The server under test.
// ---------------------------------------------------------------------------

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

impl Default for ServerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerBuilder {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new().prefix("ktlsd-test-").tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir(&root).expect("create root");
        ServerBuilder {
            bin: PathBuf::from(BIN),
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

    /// Runs `bin` instead of [`BIN`].
    pub fn bin(mut self, bin: impl Into<PathBuf>) -> Self {
        self.bin = bin.into();
        self
    }

    /// Runs the binary named by `KTLSD_BIN`, if set (see [`bin_from_env`]).
    pub fn bin_from_env(self) -> Self {
        self.bin(bin_from_env())
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

/// A process that exited on its own.
#[derive(Debug)]
pub struct Exited {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Exited {
    fn from(o: Output) -> Self {
        Exited {
            status: o.status,
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl Exited {
    /// Asserts a start-up error: exit status 1 and exactly one `ktlsd: error:` line,
    /// the last one on stderr, containing every needle. Returns that line.
    pub fn assert_startup_error(&self, needles: &[&str]) -> String {
        assert_eq!(self.status.code(), Some(1), "expected exit status 1; stderr:\n{}", self.stderr);
        let errors: Vec<&str> = self.stderr.lines().filter(|l| l.starts_with("ktlsd: error: ")).collect();
        assert_eq!(errors.len(), 1, "expected one `ktlsd: error:` line; stderr:\n{}", self.stderr);
        let last = self.stderr.lines().last().unwrap_or("");
        assert_eq!(last, errors[0], "the error line must be the last line; stderr:\n{}", self.stderr);
        assert!(
            !self.stderr.contains("listening on") && !self.stdout.contains("{\"ready\""),
            "a failed start-up must not report listening; stdout:\n{}stderr:\n{}",
            self.stdout,
            self.stderr
        );
        for n in needles {
            assert!(errors[0].contains(n), "error line {:?} does not mention {n:?}", errors[0]);
        }
        errors[0].to_string()
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
    /// Starts a server with default options over an empty ROOT.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::new()
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
        self.stdout.state.lock().unwrap().0.clone()
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

// ---------------------------------------------------------------------------
// Processes with a deadline.
// ---------------------------------------------------------------------------

/// Runs `cmd` with `stdin` fed to it (then closed), killing it after `timeout`
/// (which panics with what it had printed).
pub fn run_with_timeout(cmd: &mut Command, stdin: Option<&[u8]>, timeout: Duration) -> Output {
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let writer = stdin.map(|bytes| {
        let mut pipe = child.stdin.take().unwrap();
        let bytes = bytes.to_vec();
        std::thread::spawn(move || {
            let _ = pipe.write_all(&bytes);
        })
    });
    let mut out_pipe = child.stdout.take().unwrap();
    let mut err_pipe = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out_pipe.read_to_end(&mut v);
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err_pipe.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let out = out_t.join().unwrap();
            let err = err_t.join().unwrap();
            panic!(
                "{cmd:?} did not finish within {timeout:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&err)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if let Some(w) = writer {
        let _ = w.join();
    }
    Output { status, stdout: out_t.join().unwrap(), stderr: err_t.join().unwrap() }
}

// ---------------------------------------------------------------------------
// curl.
// ---------------------------------------------------------------------------

/// Runs `curl -sS -k --max-time 60 ARGS...`.
pub fn curl<S: AsRef<OsStr>>(args: &[S]) -> Output {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-k", "--max-time", "60"]);
    cmd.args(args);
    run_with_timeout(&mut cmd, None, CLIENT_TIMEOUT)
}

/// One HTTP response as curl reported it.
#[derive(Debug, Clone)]
pub struct Response {
    /// `HTTP/1.1` or `HTTP/1.0`.
    pub version: String,
    pub status: u16,
    /// Header names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// curl's stderr (verbose output when `-v` was passed).
    pub stderr: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    pub fn header_count(&self, name: &str) -> usize {
        let name = name.to_ascii_lowercase();
        self.headers.iter().filter(|(n, _)| *n == name).count()
    }

    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Parses a response head (`HTTP/1.1 200 OK\r\nName: value\r\n...`).
pub fn parse_head(head: &str) -> (String, u16, Vec<(String, String)>) {
    let mut lines = head.split("\r\n").filter(|l| !l.is_empty());
    let status_line = lines.next().unwrap_or_else(|| panic!("empty response head: {head:?}"));
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("").to_string();
    let status: u16 =
        parts.next().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers = lines
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap_or_else(|| panic!("bad header line {l:?} in {head:?}"));
            (n.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    (version, status, headers)
}

/// GETs (or whatever `extra` asks for) one URL with curl; the body is captured byte for byte.
pub fn fetch(url: &str, extra: &[&str]) -> Response {
    let tmp = tempfile::NamedTempFile::new().expect("temp body file");
    let mut args: Vec<OsString> = vec!["-D".into(), "-".into(), "-o".into(), tmp.path().into()];
    args.extend(extra.iter().map(OsString::from));
    args.push(url.into());
    let out = curl(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "curl {url} {extra:?} failed ({:?}):\n{stderr}", out.status);
    let head = String::from_utf8_lossy(&out.stdout).into_owned();
    // The last response head (there is only one unless curl followed something).
    let last = head.rfind("HTTP/").map(|i| &head[i..]).unwrap_or(&head);
    let (version, status, headers) = parse_head(last);
    let body = std::fs::read(tmp.path()).unwrap_or_default();
    Response { version, status, headers, body, stderr }
}

// ---------------------------------------------------------------------------
// Hashes and test data.
// ---------------------------------------------------------------------------

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Compares bodies by length and SHA-256 (never dumps megabytes into a panic).
#[track_caller]
pub fn assert_body(what: &str, got: &[u8], want: &[u8]) {
    if got != want {
        let first_diff = got.iter().zip(want).position(|(a, b)| a != b);
        panic!(
            "{what}: body differs: got {} bytes sha256 {}, want {} bytes sha256 {} (first difference at {:?})",
            got.len(),
            sha256(got),
            want.len(),
            sha256(want),
            first_diff
        );
    }
}

/// SHA-256 of a file: `sha256sum` when it is installed (fast even for 100 MiB),
/// otherwise in-process.
pub fn sha256_file(path: &Path) -> String {
    if let Ok(out) = Command::new("sha256sum").arg(path).stderr(Stdio::null()).output() {
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout);
            let digest = text.split_whitespace().next().unwrap_or("").to_string();
            if digest.len() == 64 {
                return digest;
            }
        }
    }
    sha256_file_in_process(path)
}

pub fn sha256_file_in_process(path: &Path) -> String {
    let mut f = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    hex(&h.finalize())
}

/// Deterministic pseudo-random bytes (xorshift64*), different for each `seed`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Writes a large file quickly: 1 MiB pseudo-random blocks, each stamped with its
/// index so that no two blocks are alike. Returns the file's SHA-256.
pub fn write_big_file(path: &Path, len: u64) -> String {
    let block = pattern(1 << 20, 0xB16);
    let mut f = std::fs::File::create(path).expect("create big file");
    let mut chunk = block.clone();
    let mut written = 0u64;
    let mut i = 0u64;
    while written < len {
        chunk[..8].copy_from_slice(&i.to_le_bytes());
        chunk[block.len() - 8..].copy_from_slice(&(!i).to_le_bytes());
        let n = (len - written).min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n]).expect("write big file");
        written += n as u64;
        i += 1;
    }
    sha256_file(path)
}

// ---------------------------------------------------------------------------
// The in-process rustls client, for exact bytes on the wire.
// ---------------------------------------------------------------------------

mod no_verify {
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::WebPkiSupportedAlgorithms;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};

    /// Accepts any certificate (the tests check the server's HTTP, not its PKI);
    /// the handshake signatures are still verified against it.
    #[derive(Debug)]
    pub struct NoVerify(pub WebPkiSupportedAlgorithms);

    impl ServerCertVerifier for NoVerify {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.supported_schemes()
        }
    }
}

/// A client configuration that trusts any certificate, for the given versions.
pub fn client_config(versions: &[&'static rustls::SupportedProtocolVersion]) -> Arc<rustls::ClientConfig> {
    client_config_with(versions, None)
}

/// [`client_config`], offering only `suite` when given.
pub fn client_config_with(
    versions: &[&'static rustls::SupportedProtocolVersion],
    suite: Option<rustls::SupportedCipherSuite>,
) -> Arc<rustls::ClientConfig> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    if let Some(s) = suite {
        provider.cipher_suites = vec![s];
    }
    let algs = provider.signature_verification_algorithms;
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)
        .expect("client protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(no_verify::NoVerify(algs)))
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

/// How a connection ended, seen from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closing {
    /// The server sent close_notify (a clean end).
    CloseNotify,
    /// TCP FIN without close_notify (the server cut the connection).
    Eof,
    /// TCP RST.
    Reset,
    /// Nothing within the read timeout: still open.
    TimedOut,
    /// Anything else (TLS alert, ...).
    Other(String),
}

fn closing_of(e: &io::Error) -> Closing {
    match e.kind() {
        io::ErrorKind::UnexpectedEof => Closing::Eof,
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::BrokenPipe => Closing::Reset,
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Closing::TimedOut,
        _ => Closing::Other(e.to_string()),
    }
}

/// One response read off the wire.
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub version: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length").map(|v| v.parse().expect("numeric Content-Length"))
    }

    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Parses one response off the front of `buf` once it is complete: the response
/// and the bytes it took; `None` while incomplete. `head`: the answer to a HEAD.
pub fn parse_response(buf: &[u8], head: bool) -> Option<(RawResponse, usize)> {
    let end = find(buf, b"\r\n\r\n")? + 4;
    let head_text = String::from_utf8_lossy(&buf[..end]);
    let (version, status, headers) = parse_head(&head_text);
    let mut resp = RawResponse { version, status, headers, body: Vec::new() };
    let len = if head || status == 304 || status == 204 || (100..200).contains(&status) {
        0
    } else {
        resp.content_length().unwrap_or_else(|| panic!("response without Content-Length: {head_text}")) as usize
    };
    if buf.len() < end + len {
        return None;
    }
    resp.body = buf[end..end + len].to_vec();
    Some((resp, end + len))
}

/// A TLS connection to the server over a std `TcpStream`, speaking raw bytes.
pub struct TlsClient {
    pub tls: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
    /// Plaintext received but not yet consumed by `read_response`.
    pending: Vec<u8>,
}

impl TlsClient {
    /// Connects with TLS 1.2 and 1.3 enabled, and completes the handshake.
    pub fn connect(addr: SocketAddr) -> TlsClient {
        Self::connect_with(addr, client_config(&[&rustls::version::TLS13, &rustls::version::TLS12]))
            .unwrap_or_else(|e| panic!("TLS connect to {addr}: {e}"))
    }

    pub fn connect_with(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>) -> io::Result<TlsClient> {
        let sock = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
        sock.set_read_timeout(Some(Duration::from_secs(30)))?;
        sock.set_write_timeout(Some(Duration::from_secs(30)))?;
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let conn = rustls::ClientConnection::new(cfg, name).map_err(io::Error::other)?;
        let mut tls = rustls::StreamOwned::new(conn, sock);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock)?;
        }
        Ok(TlsClient { tls, pending: Vec::new() })
    }

    pub fn set_read_timeout(&self, t: Duration) {
        self.tls.sock.set_read_timeout(Some(t)).expect("set_read_timeout");
    }

    /// Shrinks the socket's receive buffer (before much data arrives).
    pub fn set_recv_buffer(&self, bytes: usize) {
        socket2::SockRef::from(&self.tls.sock).set_recv_buffer_size(bytes).expect("SO_RCVBUF");
    }

    /// Writes `bytes` as application data, in one TLS write, and flushes.
    pub fn send(&mut self, bytes: &[u8]) {
        self.try_send(bytes).unwrap_or_else(|e| panic!("send: {e}"));
    }

    pub fn try_send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.tls.write_all(bytes)?;
        self.tls.flush()
    }

    /// Reads more plaintext into the pending buffer; `Ok(0)` on close_notify.
    fn fill(&mut self) -> io::Result<usize> {
        let mut buf = [0u8; 64 * 1024];
        let n = self.tls.read(&mut buf)?;
        self.pending.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    /// Waits up to `timeout` for more plaintext: `Ok(Some(n))` read (0: close_notify),
    /// `Ok(None)` nothing yet, `Err` the connection ended otherwise. Restores a 30 s
    /// read timeout afterwards.
    pub fn poll_read(&mut self, timeout: Duration) -> io::Result<Option<usize>> {
        self.set_read_timeout(timeout);
        let r = self.fill();
        self.set_read_timeout(Duration::from_secs(30));
        match r {
            Ok(n) => Ok(Some(n)),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads one response to a GET (or to a HEAD when `head` is true).
    pub fn try_read_response(&mut self, head: bool) -> io::Result<RawResponse> {
        loop {
            if let Some((resp, used)) = parse_response(&self.pending, head) {
                self.pending.drain(..used);
                return Ok(resp);
            }
            if self.fill()? == 0 {
                let why = match find(&self.pending, b"\r\n\r\n") {
                    None => format!(
                        "closed before a complete response head; got {:?}",
                        String::from_utf8_lossy(&self.pending)
                    ),
                    Some(i) => format!(
                        "closed after {} body bytes; head {:?}",
                        self.pending.len() - (i + 4),
                        String::from_utf8_lossy(&self.pending[..i])
                    ),
                };
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, why));
            }
        }
    }

    pub fn read_response(&mut self) -> RawResponse {
        self.try_read_response(false).unwrap_or_else(|e| panic!("reading a response: {e}"))
    }

    pub fn read_head_response(&mut self) -> RawResponse {
        self.try_read_response(true).unwrap_or_else(|e| panic!("reading a HEAD response: {e}"))
    }

    /// Sends a GET for `path` and reads its response.
    pub fn get(&mut self, path: &str) -> RawResponse {
        self.send(get_request(path).as_bytes());
        self.read_response()
    }

    /// Reads exactly `n` body bytes (or fewer if the connection ends), returning them.
    pub fn read_exact_bytes(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.pending.len() < n {
            if self.fill()? == 0 {
                break;
            }
        }
        let take = n.min(self.pending.len());
        Ok(self.pending.drain(..take).collect())
    }

    /// Reads until the connection ends (or the read timeout passes); returns the
    /// bytes received (including any pending) and how it ended.
    pub fn read_until_close(&mut self) -> (Vec<u8>, Closing) {
        let mut data = std::mem::take(&mut self.pending);
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match self.tls.read(&mut buf) {
                Ok(0) => return (data, Closing::CloseNotify),
                Ok(n) => data.extend_from_slice(&buf[..n]),
                Err(e) => return (data, closing_of(&e)),
            }
        }
    }

    /// Plaintext already received and not consumed.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    pub fn take_pending(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.pending)
    }
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

pub fn get_request(path: &str) -> String {
    get_request_with(path, "")
}

/// A GET for `path` with `headers` (each ending in CRLF) after `Host`.
pub fn get_request_with(path: &str, headers: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n")
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

// ---------------------------------------------------------------------------
// openssl.
// ---------------------------------------------------------------------------

/// Runs `openssl ARGS...` (bounded in time).
pub fn openssl<S: AsRef<OsStr>>(args: &[S], stdin: Option<&[u8]>) -> Output {
    let mut cmd = Command::new("openssl");
    cmd.args(args);
    run_with_timeout(&mut cmd, stdin, Duration::from_secs(60))
}

/// `openssl s_client -connect ADDR ARGS...` sending `request` and waiting for the server to close.
pub fn s_client(addr: SocketAddr, args: &[&str], request: &str) -> (bool, String, String) {
    let out = s_client_output(addr, args, request.as_bytes(), Duration::from_secs(60));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`s_client`]'s raw output (byte-exact with `-quiet`), with a time limit.
pub fn s_client_output(addr: SocketAddr, args: &[&str], request: &[u8], timeout: Duration) -> Output {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-connect", &addr.to_string(), "-servername", "localhost", "-ign_eof"]);
    cmd.args(args);
    run_with_timeout(&mut cmd, Some(request), timeout)
}

/// A self-signed certificate and key made by `openssl req` in `dir`.
/// `kind`: "rsa" (2048-bit) or "ec" (P-256). Returns (cert, key).
pub fn make_cert(dir: &Path, name: &str, kind: &str) -> (PathBuf, PathBuf) {
    let cert = dir.join(format!("{name}.crt"));
    let key = dir.join(format!("{name}.key"));
    let newkey = match kind {
        "rsa" => "rsa:2048".to_string(),
        "ec" => "ec".to_string(),
        other => panic!("unknown key kind {other}"),
    };
    let mut args: Vec<OsString> = vec!["req".into(), "-x509".into(), "-newkey".into(), newkey.into()];
    if kind == "ec" {
        args.extend(["-pkeyopt".into(), "ec_paramgen_curve:P-256".into()]);
    }
    args.extend([
        "-nodes".into(),
        "-keyout".into(),
        key.clone().into(),
        "-out".into(),
        cert.clone().into(),
        "-days".into(),
        "2".into(),
        "-subj".into(),
        "/CN=localhost".into(),
        "-addext".into(),
        "subjectAltName=DNS:localhost,IP:127.0.0.1".into(),
    ]);
    let out = openssl(&args, None);
    assert!(out.status.success(), "openssl req failed: {}", String::from_utf8_lossy(&out.stderr));
    (cert, key)
}

// ---------------------------------------------------------------------------
// Raw handshake bytes.
// ---------------------------------------------------------------------------

/// The ClientHello (its records, as they go on the wire) the rustls client
/// sends first with `cfg`.
pub fn client_hello(cfg: Arc<rustls::ClientConfig>) -> Vec<u8> {
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut conn = rustls::ClientConnection::new(cfg, name).expect("rustls client");
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).expect("write_tls to a Vec");
    }
    out
}

/// Reads a raw socket until the peer closes (true; a reset counts as closed) or
/// `limit` passes without data (false). Returns what arrived.
pub fn read_raw_until_closed(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    s.set_read_timeout(Some(limit)).expect("set_read_timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return (got, true),
            Err(_) => return (got, false),
        }
    }
}

/// The TLS records in `bytes`: (content type, body). Stops at an incomplete record.
pub fn tls_records(bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 5 <= bytes.len() {
        let len = u16::from_be_bytes([bytes[at + 3], bytes[at + 4]]) as usize;
        if at + 5 + len > bytes.len() {
            break;
        }
        out.push((bytes[at], bytes[at + 5..at + 5 + len].to_vec()));
        at += 5 + len;
    }
    out
}

// ---------------------------------------------------------------------------
// Records forged with the connection's own keys, for protocol-violation tests.
// ---------------------------------------------------------------------------

/// One direction's record protection, taken from a finished rustls handshake.
struct RecordKeys {
    key: aws_lc_rs::aead::LessSafeKey,
    iv: [u8; 12],
    seq: u64,
}

impl RecordKeys {
    fn new((seq, secrets): (u64, rustls::ConnectionTrafficSecrets)) -> RecordKeys {
        use aws_lc_rs::aead::{UnboundKey, AES_128_GCM, AES_256_GCM, CHACHA20_POLY1305};
        use rustls::ConnectionTrafficSecrets as S;
        let (alg, key, iv) = match &secrets {
            S::Aes128Gcm { key, iv } => (&AES_128_GCM, key, iv),
            S::Aes256Gcm { key, iv } => (&AES_256_GCM, key, iv),
            S::Chacha20Poly1305 { key, iv } => (&CHACHA20_POLY1305, key, iv),
            _ => panic!("traffic secrets for a cipher this harness does not know"),
        };
        let key = aws_lc_rs::aead::LessSafeKey::new(UnboundKey::new(alg, key.as_ref()).expect("AEAD key"));
        RecordKeys { key, iv: iv.as_ref().try_into().expect("12-byte IV"), seq }
    }

    /// The per-record nonce (IV XOR sequence number), then the sequence moves on.
    fn next_nonce(&mut self) -> [u8; 12] {
        let mut n = self.iv;
        for (b, s) in n[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        self.seq += 1;
        n
    }
}

/// The server's side of a connection a [`ForgingClient`] saw end.
#[derive(Debug)]
pub struct ServerEnd {
    /// Every record the server sent, decrypted: (content type, plaintext).
    pub records: Vec<(u8, Vec<u8>)>,
    /// How the TCP connection ended.
    pub how: Closing,
    /// From the call to the end.
    pub elapsed: Duration,
}

impl ServerEnd {
    /// The alerts among the records: (level, description).
    pub fn alerts(&self) -> Vec<(u8, u8)> {
        self.records.iter().filter(|(t, p)| *t == 21 && p.len() == 2).map(|(_, p)| (p[0], p[1])).collect()
    }

    /// Application data the server sent.
    pub fn data(&self) -> Vec<u8> {
        self.records.iter().filter(|(t, _)| *t == 23).flat_map(|(_, p)| p.iter().copied()).collect()
    }
}

/// A client that completes a real rustls handshake and then takes the record
/// layer over with the connection's extracted keys: it protects any record a
/// test asks for, well-formed or not, and decrypts what the server answers.
pub struct ForgingClient {
    pub sock: TcpStream,
    pub tls13: bool,
    /// TLS 1.2 AES-GCM records carry an 8-byte explicit nonce (ChaCha20 does not).
    explicit_nonce: bool,
    tx: RecordKeys,
    rx: RecordKeys,
    inbuf: Vec<u8>,
}

impl ForgingClient {
    /// Connects to `addr` with one protocol version and, when given, one suite.
    pub fn connect(
        addr: SocketAddr,
        version: &'static rustls::SupportedProtocolVersion,
        suite: Option<rustls::SupportedCipherSuite>,
    ) -> ForgingClient {
        let mut cfg = (*client_config_with(&[version], suite)).clone();
        cfg.enable_secret_extraction = true;
        // No ticket to store: the server's NewSessionTicket records are read by `read_records`.
        cfg.resumption = rustls::client::Resumption::disabled();
        let mut sock = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect");
        sock.set_nodelay(true).expect("nodelay");
        sock.set_read_timeout(Some(Duration::from_secs(30))).expect("read timeout");
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(cfg), name).expect("client connection");
        while conn.is_handshaking() {
            conn.complete_io(&mut sock).expect("handshake");
        }
        while conn.wants_write() {
            conn.write_tls(&mut sock).expect("client Finished");
        }
        let tls13 = conn.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3);
        let chacha = matches!(
            conn.negotiated_cipher_suite().map(|s| s.suite()),
            Some(rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256)
                | Some(rustls::CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256)
        );
        let secrets = conn.dangerous_extract_secrets().expect("extract secrets");
        ForgingClient {
            sock,
            tls13,
            explicit_nonce: !tls13 && !chacha,
            tx: RecordKeys::new(secrets.tx),
            rx: RecordKeys::new(secrets.rx),
            inbuf: Vec::new(),
        }
    }

    /// One protected record of content type `typ` carrying `plaintext`. In TLS 1.3
    /// the type goes inside (followed by `pad` zero bytes) and the header says
    /// application_data.
    pub fn seal(&mut self, typ: u8, plaintext: &[u8], pad: usize) -> Vec<u8> {
        if self.tls13 {
            let mut inner = plaintext.to_vec();
            inner.push(typ);
            inner.resize(inner.len() + pad, 0);
            self.seal_raw(23, &inner)
        } else {
            self.seal_raw(typ, plaintext)
        }
    }

    /// One record with header type `typ` whose protected content is exactly
    /// `inner` (in TLS 1.3: content type and padding included by the caller).
    pub fn seal_raw(&mut self, typ: u8, inner: &[u8]) -> Vec<u8> {
        use aws_lc_rs::aead::{Aad, Nonce};
        let seq = self.tx.seq;
        let nonce = self.tx.next_nonce();
        let explicit = if self.explicit_nonce { 8 } else { 0 };
        let wire_len = explicit + inner.len() + 16;
        let header = [typ, 3, 3, (wire_len >> 8) as u8, wire_len as u8];
        let aad: Vec<u8> = if self.tls13 {
            header.to_vec()
        } else {
            let mut a = seq.to_be_bytes().to_vec();
            a.extend_from_slice(&[typ, 3, 3, (inner.len() >> 8) as u8, inner.len() as u8]);
            a
        };
        let mut body = inner.to_vec();
        let tag = self
            .tx
            .key
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut body)
            .expect("seal");
        let mut rec = header.to_vec();
        if explicit > 0 {
            rec.extend_from_slice(&nonce[4..]);
        }
        rec.extend_from_slice(&body);
        rec.extend_from_slice(tag.as_ref());
        rec
    }

    /// Writes raw bytes to the socket.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).expect("write to the server");
    }

    /// Sends `data` as one application-data record.
    pub fn send_data(&mut self, data: &[u8]) {
        let rec = self.seal(23, data, 0);
        self.send_raw(&rec);
    }

    /// Decrypts one complete record off the front of the input buffer.
    fn open_one(&mut self) -> Option<(u8, Vec<u8>)> {
        use aws_lc_rs::aead::{Aad, Nonce};
        if self.inbuf.len() < 5 {
            return None;
        }
        let len = u16::from_be_bytes([self.inbuf[3], self.inbuf[4]]) as usize;
        if self.inbuf.len() < 5 + len {
            return None;
        }
        let rec: Vec<u8> = self.inbuf.drain(..5 + len).collect();
        let typ = rec[0];
        let seq = self.rx.seq;
        let mut nonce = self.rx.next_nonce();
        let mut body = rec[5..].to_vec();
        let aad = if self.tls13 {
            rec[..5].to_vec()
        } else {
            if self.explicit_nonce {
                nonce[4..].copy_from_slice(&body[..8]);
                body.drain(..8);
            }
            let plain_len = body.len() - 16;
            let mut a = seq.to_be_bytes().to_vec();
            a.extend_from_slice(&[typ, 3, 3, (plain_len >> 8) as u8, plain_len as u8]);
            a
        };
        let plain = self
            .rx
            .key
            .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut body)
            .unwrap_or_else(|e| panic!("a record from the server does not decrypt ({e:?}); header {:?}", &rec[..5]))
            .to_vec();
        if self.tls13 {
            let end = plain.iter().rposition(|&b| b != 0).expect("TLS 1.3 record without a content type");
            Some((plain[end], plain[..end].to_vec()))
        } else {
            Some((typ, plain))
        }
    }

    /// Reads and decrypts records until the server ends the connection or
    /// `limit` passes (then `how` is `TimedOut`).
    pub fn read_until_end(&mut self, limit: Duration) -> ServerEnd {
        let start = Instant::now();
        let mut records = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let how = loop {
            while let Some(r) = self.open_one() {
                records.push(r);
            }
            let left = limit.saturating_sub(start.elapsed());
            if left.is_zero() {
                break Closing::TimedOut;
            }
            self.sock.set_read_timeout(Some(left)).expect("read timeout");
            match self.sock.read(&mut buf) {
                Ok(0) => break Closing::Eof,
                Ok(n) => self.inbuf.extend_from_slice(&buf[..n]),
                Err(e) => break closing_of(&e),
            }
        };
        ServerEnd { records, how, elapsed: start.elapsed() }
    }

    /// Sends a GET and reads records until a whole response has arrived.
    pub fn get(&mut self, path: &str) -> RawResponse {
        self.send_data(get_request(path).as_bytes());
        let mut plain = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        self.sock.set_read_timeout(Some(Duration::from_secs(30))).expect("read timeout");
        loop {
            while let Some((typ, p)) = self.open_one() {
                if typ == 23 {
                    plain.extend_from_slice(&p);
                }
            }
            if let Some((r, _)) = parse_response(&plain, false) {
                return r;
            }
            let n = self.sock.read(&mut buf).expect("reading a response");
            assert!(n > 0, "the server closed before a complete response to GET {path}");
            self.inbuf.extend_from_slice(&buf[..n]);
        }
    }
}

/// Alert descriptions the bad-record table expects (RFC 8446 §6.2).
pub mod alert {
    pub const UNEXPECTED_MESSAGE: u8 = 10;
    pub const BAD_RECORD_MAC: u8 = 20;
    pub const RECORD_OVERFLOW: u8 = 22;
    pub const ILLEGAL_PARAMETER: u8 = 47;
    pub const DECODE_ERROR: u8 = 50;
}

/// Which protocol versions a [`BadRecord`] applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Versions {
    Both,
    Tls13,
    Tls12,
}

/// A record that breaks the protocol after the handshake, and the fatal alert
/// each record layer answers it with.
pub struct BadRecord {
    pub name: &'static str,
    pub versions: Versions,
    /// The bytes to send, protected with the connection's keys where they need to be.
    pub forge: fn(&mut ForgingClient) -> Vec<u8>,
    /// The alert of the userspace record layer: the one the RFCs prescribe
    /// (RFC 8446 §5, §5.2, §5.4, §6; RFC 5246 §6); always sent.
    pub userspace: u8,
    /// The alert of the kernel record layer; `None`: none is sent. After a
    /// record fails authentication every send fails while the socket's pending
    /// error (EBADMSG) is set; ktlsd reads it (`SO_ERROR`, which clears it) and
    /// then sends the alert.
    pub kernel: Option<u8>,
}

/// The bad records both record-layer suites send, one per way of breaking the
/// protocol after the handshake.
pub fn bad_records() -> Vec<BadRecord> {
    use alert::*;
    vec![
        BadRecord {
            name: "tag does not authenticate",
            versions: Versions::Both,
            forge: |c| {
                let mut r = c.seal(23, get_request("/").as_bytes(), 0);
                let last = r.len() - 1;
                r[last] ^= 1;
                r
            },
            userspace: BAD_RECORD_MAC,
            kernel: Some(BAD_RECORD_MAC),
        },
        BadRecord {
            name: "record shorter than its tag",
            versions: Versions::Both,
            // Followed by more bytes, as from a peer that goes on sending: a
            // kernel reads a TLS 1.2 AES-GCM record's explicit nonce (8 bytes)
            // before it judges the length, and would wait for them.
            forge: |_| {
                let mut r = vec![23, 3, 3, 0, 5, 1, 2, 3, 4, 5];
                r.extend_from_slice(&[23, 3, 3, 0, 32, 0, 0, 0]);
                r
            },
            userspace: BAD_RECORD_MAC,
            kernel: Some(BAD_RECORD_MAC),
        },
        BadRecord {
            name: "plaintext over 2^14 bytes",
            versions: Versions::Both,
            forge: |c| c.seal(23, &[b'a'; 16 * 1024 + 1], 0),
            userspace: RECORD_OVERFLOW,
            kernel: Some(RECORD_OVERFLOW),
        },
        BadRecord {
            name: "header announces more than any record may carry",
            versions: Versions::Both,
            forge: |_| {
                let mut r = vec![23, 3, 3, 0x48, 0x01];
                r.extend_from_slice(&[0u8; 64]);
                r
            },
            userspace: RECORD_OVERFLOW,
            kernel: Some(RECORD_OVERFLOW),
        },
        BadRecord {
            name: "KeyUpdate with request_update 2",
            versions: Versions::Tls13,
            forge: |c| c.seal(22, &[24, 0, 0, 1, 2], 0),
            userspace: ILLEGAL_PARAMETER,
            kernel: Some(ILLEGAL_PARAMETER),
        },
        BadRecord {
            name: "KeyUpdate with a two-byte body",
            versions: Versions::Tls13,
            forge: |c| c.seal(22, &[24, 0, 0, 2, 0, 0], 0),
            userspace: DECODE_ERROR,
            kernel: Some(DECODE_ERROR),
        },
        BadRecord {
            name: "KeyUpdate not last in its record",
            versions: Versions::Tls13,
            forge: |c| c.seal(22, &[24, 0, 0, 1, 0, 24, 0, 0, 1, 0], 0),
            userspace: UNEXPECTED_MESSAGE,
            kernel: Some(UNEXPECTED_MESSAGE),
        },
        BadRecord {
            name: "KeyUpdate on TLS 1.2",
            versions: Versions::Tls12,
            forge: |c| c.seal(22, &[24, 0, 0, 1, 0], 0),
            userspace: UNEXPECTED_MESSAGE,
            kernel: Some(UNEXPECTED_MESSAGE),
        },
        BadRecord {
            name: "ChangeCipherSpec after Finished",
            versions: Versions::Tls13,
            forge: |c| c.seal(20, &[1], 0),
            userspace: UNEXPECTED_MESSAGE,
            kernel: Some(UNEXPECTED_MESSAGE),
        },
        BadRecord {
            name: "ChangeCipherSpec after Finished",
            versions: Versions::Tls12,
            forge: |c| c.seal(20, &[1], 0),
            userspace: UNEXPECTED_MESSAGE,
            kernel: Some(UNEXPECTED_MESSAGE),
        },
        BadRecord {
            name: "empty alert",
            versions: Versions::Both,
            forge: |c| c.seal(21, &[], 0),
            // RFC 8446 §5.4, as nginx answers.
            userspace: UNEXPECTED_MESSAGE,
            kernel: Some(UNEXPECTED_MESSAGE),
        },
        BadRecord {
            name: "inner plaintext without a content type",
            versions: Versions::Tls13,
            forge: |c| c.seal_raw(23, &[0, 0, 0]),
            // RFC 8446 §5.4: unexpected_message. The kernel reports it as a
            // record that failed authentication.
            userspace: UNEXPECTED_MESSAGE,
            kernel: Some(BAD_RECORD_MAC),
        },
        BadRecord {
            name: "content type 0",
            versions: Versions::Tls12,
            forge: |c| c.seal_raw(0, b"x"),
            // RFC 5246 §6: an unknown record type is unexpected_message. The
            // kernel refuses the record before it could deliver its type.
            userspace: UNEXPECTED_MESSAGE,
            kernel: Some(BAD_RECORD_MAC),
        },
    ]
}

// ---------------------------------------------------------------------------
// The admin listener.
// ---------------------------------------------------------------------------

/// `GET target` on the admin Unix socket `sock`: the status and the body.
pub fn admin_get(sock: &Path, target: &str) -> (u16, String) {
    let mut s = std::os::unix::net::UnixStream::connect(sock)
        .unwrap_or_else(|e| panic!("admin socket {}: {e}", sock.display()));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {target} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no response head in {reply:?}"));
    let (_, status, _) = parse_head(head);
    (status, body.to_string())
}

/// `/metrics` from the admin socket, parsed by Python's `prometheus_client`
/// (the reference parser): every sample as `name{label="v",...}` (labels
/// sorted) to its value.
pub fn scrape(sock: &Path) -> HashMap<String, f64> {
    let (status, text) = admin_get(sock, "/metrics");
    assert_eq!(status, 200, "{text}");
    const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        labels = ",".join('%s="%s"' % (k, v) for k, v in sorted(s.labels.items()))
        out[s.name + ("{" + labels + "}" if labels else "")] = s.value
print(json.dumps(out))
"#;
    // This machine may put another python3 first in PATH; the packaged parser is the system one's.
    let out = run_with_timeout(
        Command::new("/usr/bin/python3").args(["-c", PARSE]),
        Some(text.as_bytes()),
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "the Prometheus parser refused /metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_f64().unwrap())).collect()
}
