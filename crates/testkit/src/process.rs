//! Child processes for the tests: output captured line by line with waiting
//! ([`LineLog`]), commands run with a deadline ([`run_with_timeout`]) and the
//! outcome of a process that exited on its own ([`Exited`]). Nothing here knows
//! what the process is.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

    /// The lines so far.
    pub fn lines(&self) -> Vec<String> {
        self.state.lock().unwrap().0.clone()
    }

    /// Everything so far, one `\n` after each line.
    pub fn text(&self) -> String {
        let st = self.state.lock().unwrap();
        let mut s = st.0.join("\n");
        s.push('\n');
        s
    }
}

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

/// Resident memory of process `pid` (`VmRSS` of `/proc/PID/status`), in KiB.
pub fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("VmRSS in kB")
}
