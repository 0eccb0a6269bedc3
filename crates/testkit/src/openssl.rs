//! The `openssl` command line: `s_client` connections and certificates made by
//! `openssl req`, for tests that want an independent TLS implementation.

use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::process::run_with_timeout;

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
