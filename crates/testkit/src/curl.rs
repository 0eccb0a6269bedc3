//! HTTP clients outside the process: `curl` (whole responses, bodies byte for
//! byte) and the admin listener's Unix socket (plain HTTP/1.1, and `/metrics`
//! parsed by the reference Prometheus parser). The in-process TLS clients are in
//! [`crate::tls`].

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::process::run_with_timeout;
use crate::server::CLIENT_TIMEOUT;

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

/// `curl -sk` for `url`: its status and body; status 0 when curl failed.
pub fn status_and_body(url: &str) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sk", "--max-time", "10", "-w", "\n%{http_code}", url]);
    let out = run_with_timeout(&mut cmd, None, CLIENT_TIMEOUT);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.trim().parse().unwrap_or(0), body.to_string())
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
