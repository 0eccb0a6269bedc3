//! nghttpd (nghttp2's HTTP/2 server) as an HTTP/2 origin for the proxy tests:
//! prior knowledge without TLS (`h2c://`), or over TLS with ALPN `h2` (`h2://`)
//! with a certificate of the test's; its document root a temporary directory the
//! test fills. Its verbose log (every frame it reads and writes) is kept, so a test
//! can count the requests it read.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running nghttpd; killed when dropped.
pub struct Nghttpd {
    pub port: u16,
    /// Its document root.
    pub root: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl Nghttpd {
    /// nghttpd without TLS (prior-knowledge HTTP/2) serving `files` (path, contents).
    pub fn h2c(files: &[(&str, &[u8])], extra: &[&str]) -> Nghttpd {
        Nghttpd::launch(files, None, extra)
    }

    /// nghttpd over TLS (ALPN `h2`) with `cert` and `key` (PEM files).
    pub fn h2(files: &[(&str, &[u8])], cert: &Path, key: &Path, extra: &[&str]) -> Nghttpd {
        Nghttpd::launch(files, Some((cert, key)), extra)
    }

    fn launch(files: &[(&str, &[u8])], tls: Option<(&Path, &Path)>, extra: &[&str]) -> Nghttpd {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("htdocs");
        for (path, body) in files {
            let p = root.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, body).unwrap();
        }
        std::fs::create_dir_all(&root).unwrap();
        let port = crate::origin::free_port();
        let mut args: Vec<String> = vec!["-v".into(), "-a".into(), "127.0.0.1".into(), "-d".into()];
        args.push(root.display().to_string());
        args.extend(extra.iter().map(|s| s.to_string()));
        match tls {
            None => args.extend(["--no-tls".to_string(), port.to_string()]),
            Some((cert, key)) => args.extend([port.to_string(), key.display().to_string(), cert.display().to_string()]),
        }
        let log = dir.path().join("nghttpd.log");
        let mut n = Nghttpd { port, root, args, log, child: None, _dir: dir };
        n.restart();
        n
    }

    /// Starts it (again) on its port, once it accepts connections.
    pub fn restart(&mut self) {
        self.stop();
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = Command::new("nghttpd")
            .args(&self.args)
            .stdout(Stdio::from(out))
            .stderr(Stdio::null())
            .spawn()
            .expect("nghttpd runs (Debian's nghttp2-server)");
        self.child = Some(child);
        let t = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(t.elapsed() < Duration::from_secs(10), "nghttpd did not listen on {}", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops it: the port then refuses connections.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// How many requests for `path` it has read.
    pub fn count(&self, path: &str) -> usize {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let want = format!(":path: {path}");
        log.lines().filter(|l| l.contains("recv (stream_id=") && l.trim_end().ends_with(&want)).count()
    }

    /// Its log so far (every frame), for a failing assertion.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Nghttpd {
    fn drop(&mut self) {
        self.stop();
    }
}
