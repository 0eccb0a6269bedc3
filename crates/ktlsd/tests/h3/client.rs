//! What the HTTP/3 tests (`h3`, `cache_slice`) share: `client.py` (Python
//! `aioquic`, beside this file) run against a server, and its answers read.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use testkit::*;

/// Runs the aioquic client against `srv` (SNI `sni`); returns its JSON output.
pub fn client(srv: &Server, sni: &str, args: &[&str]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h3/client.py");
    let out = run_with_timeout(
        std::process::Command::new("/usr/bin/python3")
            .arg(&script)
            .args([&srv.addr().ip().to_string(), &srv.port().to_string(), "--sni", sni])
            .args(args),
        None,
        Duration::from_secs(120),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "aioquic client failed: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("client output {text:?}: {e}"))
}

/// Sends `requests` (JSON objects as `client.py` takes them) at once on one connection.
pub fn requests(srv: &Server, sni: &str, requests: &Value) -> Value {
    client(srv, sni, &["requests", &requests.to_string()])
}

/// The value of the field `name` (lower case) of one of `client.py`'s responses.
pub fn header<'a>(r: &'a Value, name: &str) -> Option<&'a str> {
    r["headers"].as_array()?.iter().find(|h| h[0] == name).and_then(|h| h[1].as_str())
}
