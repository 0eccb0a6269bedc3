//! The proxy section: `[[proxy]]` blocks (top level and per `[[site]]`) into the
//! handler's [`Rule`]s: the path glob, the upstream URLs, how the upstream's Host is
//! set, how upstreams are chosen, the timeouts, and the TLS trust of `https://` upstreams
//! (the system roots, or `upstream_ca`).
//!
//! It only validates; the upstream connections are the handler's (`handler::proxy`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::tables::{FileHealthCheck, FileProxy};
use crate::handler::proxy::control::{self, Control, FieldRules};
use crate::handler::proxy::health::HealthCheck;
use crate::handler::proxy::{Balance, HostMode, Rule, Timeouts, TlsClient, Upstream};
use crate::log::vars::{Template, When};

/// Where the system's trusted roots are read from when a rule has no `upstream_ca`.
pub const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// How long a tunnel may move no byte before it is closed, by default: longer than
/// the pings WebSocket libraries send to keep a quiet connection open (every 20 s
/// for Python's `websockets`, 25 s for Socket.IO), so that only a tunnel whose
/// both ends have gone quiet is closed.
const TUNNEL_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Most idle connections kept per upstream and worker, as nginx's `keepalive` takes.
const MAX_KEEPALIVE: usize = 1024;

/// Validates a site's `[[proxy]]` blocks, in order.
pub fn proxy(blocks: &[FileProxy]) -> Result<Vec<Rule>, String> {
    blocks.iter().enumerate().map(|(i, b)| rule(b, SYSTEM_ROOTS).map_err(|e| format!("proxy {}: {e}", i + 1))).collect()
}

/// Checks that no `accel_root` of `blocks` lies beneath the site's `root` (already
/// canonical): its files are for `X-Accel-Redirect` answers only, never a client's
/// direct request (nginx's `internal` location).
pub fn accel_outside(blocks: &[FileProxy], root: &Path) -> Result<(), String> {
    for (i, b) in blocks.iter().enumerate() {
        let Some(dir) = &b.accel_root else { continue };
        let Ok(canonical) = dir.canonicalize() else { continue };
        if canonical.starts_with(root) {
            return Err(format!(
                "proxy {}: accel_root {} is beneath the root {}: clients could fetch its files directly; \
                 move it out of the root",
                i + 1,
                dir.display(),
                root.display()
            ));
        }
    }
    Ok(())
}

/// One block; `system_roots` is the PEM bundle used without `upstream_ca`.
fn rule(b: &FileProxy, system_roots: &str) -> Result<Rule, String> {
    let path = match b.path.as_deref() {
        Some(p) => crate::handler::pattern::PathPattern::new(p)?,
        None => return Err("path is missing: give a pattern such as \"/api/*\"".into()),
    };
    let urls = b.upstream.as_deref().unwrap_or_default();
    if urls.is_empty() {
        return Err("upstream is missing: give a list such as [\"http://127.0.0.1:9000\"]".into());
    }
    let upstreams = urls.iter().map(|u| Upstream::parse(u)).collect::<Result<Vec<_>, _>>()?;
    if upstreams.iter().any(|u| u.h2) && upstreams.iter().any(|u| !u.h2) {
        return Err("upstream: HTTP/2 upstreams (h2c://, h2://, unix+h2c:) and HTTP/1.1 ones cannot share a \
                    [[proxy]] block; give each kind its own block"
            .into());
    }
    let host = match b.host.as_deref() {
        None | Some("preserve") => HostMode::Preserve,
        Some("upstream") => HostMode::Upstream,
        Some(v) if crate::http::host::valid(v.as_bytes()) && !v.is_empty() => HostMode::Fixed(v.to_string()),
        Some(v) => {
            return Err(format!(
                "host {v:?}: expected \"preserve\", \"upstream\" or a host name such as \"api.internal\""
            ))
        }
    };
    let balance = match b.balance.as_deref() {
        None | Some("round-robin") => Balance::RoundRobin,
        Some("least-connections") => Balance::LeastConnections,
        Some(v) => return Err(format!("balance {v:?}: expected \"round-robin\" or \"least-connections\"")),
    };
    let timeouts = Timeouts {
        connect: duration("connect_timeout", &b.connect_timeout, Duration::from_secs(5))?,
        read: duration("read_timeout", &b.read_timeout, Duration::from_secs(60))?,
        send: duration("send_timeout", &b.send_timeout, Duration::from_secs(60))?,
        tunnel_idle: duration("tunnel_idle_timeout", &b.tunnel_idle_timeout, TUNNEL_IDLE_TIMEOUT)?,
    };
    let fail_timeout = duration("fail_timeout", &b.fail_timeout, Duration::from_secs(10))?;
    let keepalive = b.keepalive.unwrap_or(32);
    if keepalive > MAX_KEEPALIVE {
        return Err(format!("keepalive {keepalive}: expected at most {MAX_KEEPALIVE} idle connections"));
    }
    let tls = match (upstreams.iter().any(|u| u.tls), &b.upstream_ca) {
        (false, Some(_)) => return Err("upstream_ca is set but no upstream is https:// or h2://".into()),
        (false, None) => None,
        (true, ca) => Some(tls_client(ca.as_deref().unwrap_or(Path::new(system_roots)))?),
    };
    let control = control(b)?;
    if control.cache_slice.is_some() && upstreams.iter().any(|u| u.h2) {
        return Err("cache_slice needs HTTP/1.1 upstreams (http://, https://, unix:): slices are fetched with \
                    Range requests over HTTP/1.1"
            .into());
    }
    let health_check = b.health_check.as_ref().map(health_check).transpose()?;
    Ok(Rule {
        path,
        upstreams,
        cache: b.cache.unwrap_or(false),
        host,
        balance,
        timeouts,
        fail_timeout,
        keepalive,
        tls,
        control,
        health_check,
    })
}

/// Most checks in a row `fails` and `passes` take.
const MAX_RUN: u32 = 100;

/// `health_check = { path, interval, timeout, fails, passes }`: every key has a
/// default (`/`, 5s, 2s, 1, 1: nginx's and Caddy's counts); the timeout is at most
/// the interval.
fn health_check(h: &FileHealthCheck) -> Result<HealthCheck, String> {
    let path = h.path.clone().unwrap_or_else(|| "/".into());
    let origin_form = path.starts_with('/') && path.bytes().all(|b| b.is_ascii_graphic());
    if !origin_form {
        return Err(format!("health_check.path {path:?}: expected a path such as \"/healthz\" (a query may follow)"));
    }
    let interval = duration("health_check.interval", &h.interval, Duration::from_secs(5))?;
    let timeout = duration("health_check.timeout", &h.timeout, Duration::from_secs(2))?;
    if timeout > interval {
        return Err(format!("health_check.timeout ({timeout:?}) is longer than its interval ({interval:?})"));
    }
    let count = |key: &str, v: Option<u32>| match v.unwrap_or(1) {
        n @ 1..=MAX_RUN => Ok(n),
        n => Err(format!("health_check.{key} {n}: expected 1 to {MAX_RUN} checks in a row")),
    };
    Ok(HealthCheck { path, interval, timeout, fails: count("fails", h.fails)?, passes: count("passes", h.passes)? })
}

/// The keys that change what goes upstream and what comes back: `strip_prefix`,
/// `request_headers`, `response_headers`, `accel_root`.
fn control(b: &FileProxy) -> Result<Control, String> {
    let strip_prefix = b.strip_prefix.as_deref().map(control::check_prefix).transpose()?;
    let rules = |key: &str, t: &Option<toml::Table>| match t {
        Some(t) => FieldRules::parse(key, t),
        None => Ok(FieldRules::default()),
    };
    let accel_root = match &b.accel_root {
        None => None,
        Some(dir) => {
            let shown = dir.display();
            match std::fs::metadata(dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(format!("accel_root {shown} is not a directory")),
                Err(e) => {
                    return Err(format!(
                        "accel_root {shown}: {e}; give the directory X-Accel-Redirect files are served from"
                    ))
                }
            }
            let root = crate::files::Root::new(dir).map_err(|e| format!("accel_root {shown}: {e}"))?;
            Some(Arc::new(control::AccelRoot(root)))
        }
    };
    let cache_key = match &b.cache_key {
        Some(text) if text.trim().is_empty() => {
            return Err("cache_key: give a template such as \"$host$request_uri\"".into())
        }
        Some(text) => Some(Template::parse_for("cache_key", text, When::Request)?),
        None => None,
    };
    let cache_bypass = b.cache_bypass.as_ref().map(control::Bypass::parse).transpose()?.unwrap_or_default();
    let mut cache_valid = Vec::new();
    for (status, value) in b.cache_valid.iter().flatten() {
        let code = match status.as_str() {
            "any" => None,
            s => match s.parse::<u16>() {
                Ok(n) if (100..600).contains(&n) => Some(n),
                _ => return Err(format!("cache_valid: {s:?} is not a status (200, 404...) or \"any\"")),
            },
        };
        let lifetime = duration(&format!("cache_valid.{status}"), &Some(value.clone()), Duration::ZERO)?;
        cache_valid.push((code, lifetime));
    }
    let cache_slice = b.cache_slice.as_ref().map(slice_size).transpose()?;
    if !b.cache.unwrap_or(false)
        && (cache_key.is_some() || !cache_bypass.is_empty() || !cache_valid.is_empty() || cache_slice.is_some())
    {
        return Err("cache_key, cache_bypass, cache_valid and cache_slice need cache = true".into());
    }
    Ok(Control {
        strip_prefix,
        request: rules("request_headers", &b.request_headers)?,
        response: rules("response_headers", &b.response_headers)?,
        accel_root,
        cache_key,
        cache_bypass,
        cache_valid,
        cache_slice,
    })
}

/// The smallest `cache_slice`: one piece of a proxied body (64 KiB), so that a
/// slice is never shorter than what one read of the upstream brings.
const MIN_SLICE: u64 = crate::handler::proxy::PIECE as u64;
/// The largest `cache_slice`: 1 GiB (nginx's own limit is none; a slice is filled
/// whole before the next is asked for).
const MAX_SLICE: u64 = 1 << 30;

/// `cache_slice = "1m"`: the size of the slices objects are fetched and stored in.
fn slice_size(s: &super::cache::Size) -> Result<u64, String> {
    match super::cache::bytes(s) {
        Some(n) if (MIN_SLICE..=MAX_SLICE).contains(&n) => Ok(n),
        _ => {
            let shown = match s {
                super::cache::Size::Bytes(n) => n.to_string(),
                super::cache::Size::Text(t) => format!("{t:?}"),
            };
            Err(format!("cache_slice {shown}: expected a size from \"64K\" to \"1G\", such as \"1m\""))
        }
    }
}

/// A duration key: seconds (integer or decimal) or text with a unit (`500ms`, `5s`, `2m`).
fn duration(key: &str, v: &Option<toml::Value>, default: Duration) -> Result<Duration, String> {
    let parsed = match v {
        None => return Ok(default),
        Some(toml::Value::Integer(i)) => super::timeouts::parse_duration(&i.to_string()),
        Some(toml::Value::Float(f)) => super::timeouts::parse_duration(&f.to_string()),
        Some(toml::Value::String(s)) => super::timeouts::parse_duration(s),
        Some(_) => None,
    };
    parsed
        .ok_or_else(|| format!("{key}: expected seconds (5) or a number with a unit (500ms, 5s, 2m), from 1ms to 24h"))
}

/// The TLS client configuration trusting the PEM certificates of `ca`.
fn tls_client(ca: &Path) -> Result<TlsClient, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca)
        .map_err(|e| format!("upstream_ca {}: {e}; give a PEM file of trusted certificates", ca.display()))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("upstream_ca {}: {e}", ca.display()))?;
        // A bundle may hold certificates this verifier cannot use; the others still count.
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err(format!(
            "upstream_ca {}: no usable certificate; give a PEM file of trusted certificates",
            ca.display()
        ));
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS to upstreams: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut h2 = config.clone();
    h2.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsClient { ca: ca.to_path_buf(), config: Arc::new(config), h2: Arc::new(h2) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(toml_text: &str) -> FileProxy {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn rules_from_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        let cert = rcgen::generate_simple_self_signed(vec!["up.test".to_string()]).unwrap();
        std::fs::write(&ca, cert.cert.pem()).unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let ok = |text: &str| rule(&block(text), ca.to_str().unwrap());
        let r = ok(r#"path = "/api/**"
upstream = ["http://127.0.0.1:9000", "https://up.test"]"#)
        .unwrap();
        assert_eq!(r.upstreams.len(), 2);
        assert_eq!((r.upstreams[0].host.as_str(), r.upstreams[0].port, r.upstreams[0].tls), ("127.0.0.1", 9000, false));
        assert_eq!((r.upstreams[1].host.as_str(), r.upstreams[1].port, r.upstreams[1].tls), ("up.test", 443, true));
        assert_eq!(
            (r.host.clone(), r.balance, r.cache, r.keepalive),
            (HostMode::Preserve, Balance::RoundRobin, false, 32)
        );
        assert_eq!(r.timeouts.connect, Duration::from_secs(5));
        assert_eq!(r.timeouts.tunnel_idle, Duration::from_secs(300));
        assert!(r.tls.is_some() && r.path.matches("/api/v1/x") && !r.path.matches("/static/x"));
        let r = ok(r#"path = "/a/*"
upstream = ["http://[::1]:81"]
cache = true
host = "upstream"
balance = "least-connections"
connect_timeout = "250ms"
read_timeout = 2
send_timeout = 1.5
tunnel_idle_timeout = "30s"
fail_timeout = "1m"
keepalive = 0"#)
        .unwrap();
        assert_eq!((r.upstreams[0].host.as_str(), r.upstreams[0].authority.as_str()), ("::1", "[::1]:81"));
        assert_eq!((r.host, r.balance, r.cache, r.keepalive), (HostMode::Upstream, Balance::LeastConnections, true, 0));
        assert_eq!(r.timeouts.connect, Duration::from_millis(250));
        assert_eq!((r.timeouts.read, r.timeouts.send), (Duration::from_secs(2), Duration::from_millis(1500)));
        assert_eq!(r.fail_timeout, Duration::from_secs(60));
        assert_eq!(r.timeouts.tunnel_idle, Duration::from_secs(30));
        assert!(r.tls.is_none());
        assert_eq!(r.health_check, None);
        let r = ok(r#"path = "/h"
upstream = ["http://127.0.0.1:9000"]
health_check = { path = "/healthz", interval = "5s", timeout = "2s", fails = 2, passes = 3 }"#)
        .unwrap();
        let want = HealthCheck {
            path: "/healthz".into(),
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            fails: 2,
            passes: 3,
        };
        assert_eq!(r.health_check, Some(want));
        let r = ok("path = \"/h\"\nupstream = [\"http://a\"]\nhealth_check = {}").unwrap();
        let want = HealthCheck {
            path: "/".into(),
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            fails: 1,
            passes: 1,
        };
        assert_eq!(r.health_check, Some(want));
        let r = ok("path = \"/x\"\nupstream = [\"http://a.internal\"]\nhost = \"api.example\"").unwrap();
        assert_eq!(r.host, HostMode::Fixed("api.example".into()));
        assert_eq!(r.upstreams[0].port, 80);

        for (text, error) in [
            ("upstream = [\"http://a\"]", "path is missing"),
            ("path = \"/a b\"\nupstream = [\"http://a\"]", "expected a path or glob"),
            ("path = \"/a\"\nupstream = [\"http://a\"]\nhealth_check = { path = \"healthz\" }", "expected a path"),
            ("path = \"/a\"\nupstream = [\"http://a\"]\nhealth_check = { path = \"/a b\" }", "expected a path"),
            (
                "path = \"/a\"\nupstream = [\"http://a\"]\nhealth_check = { interval = \"1s\", timeout = \"2s\" }",
                "longer than its interval",
            ),
            ("path = \"/a\"\nupstream = [\"http://a\"]\nhealth_check = { fails = 0 }", "health_check.fails 0"),
            ("path = \"/a\"\nupstream = [\"http://a\"]\nhealth_check = { passes = 101 }", "health_check.passes 101"),
            (
                "path = \"/a\"\nupstream = [\"http://a\"]\nhealth_check = { interval = \"soon\" }",
                "health_check.interval",
            ),
            ("path = \"/a\"", "upstream is missing"),
            ("path = \"/a\"\nupstream = []", "upstream is missing"),
            ("path = \"/a\"\nupstream = [\"ftp://a\"]", "expected http://HOST[:PORT], https://"),
            ("path = \"/a\"\nupstream = [\"http://a/base\"]", "no path"),
            ("path = \"/a\"\nupstream = [\"http://a:99999\"]", "port"),
            ("path = \"/a\"\nupstream = [\"http://u@a\"]", "expected http://HOST[:PORT]"),
            ("path = \"/a\"\nupstream = [\"http://\"]", "expected http://HOST[:PORT]"),
            ("path = \"/a\"\nupstream = [\"http://a\"]\nhost = \"a b\"", "host \"a b\""),
            ("path = \"/a\"\nupstream = [\"http://a\"]\nbalance = \"random\"", "balance \"random\""),
            ("path = \"/a\"\nupstream = [\"http://a\"]\nread_timeout = \"soon\"", "read_timeout"),
            ("path = \"/a\"\nupstream = [\"http://a\"]\nconnect_timeout = 0", "connect_timeout"),
            ("path = \"/a\"\nupstream = [\"http://a\"]\ntunnel_idle_timeout = \"never\"", "tunnel_idle_timeout"),
            ("path = \"/a\"\nupstream = [\"http://a\"]\nkeepalive = 5000", "keepalive 5000"),
            ("path = \"/a\"\nupstream = [\"http://a\"]\nupstream_ca = \"/x.pem\"", "no upstream is https://"),
            (
                "path = \"/a\"\nupstream = [\"https://a\"]\nupstream_ca = \"/nonexistent.pem\"",
                "upstream_ca /nonexistent.pem",
            ),
            (
                &format!("path = \"/a\"\nupstream = [\"https://a\"]\nupstream_ca = {:?}", empty.to_str().unwrap()),
                "no usable certificate",
            ),
            ("path = \"/[\"\nupstream = [\"http://a\"]", "is not a glob"),
            ("path = \"/a\"\nupstream = [\"http://a\", \"h2c://b\"]", "cannot share"),
            ("path = \"/a\"\nupstream = [\"unix:relative.sock\"]", "absolute socket path"),
            ("path = \"/a\"\nupstream = [\"h2c://a\"]\nupstream_ca = \"/x.pem\"", "no upstream is https://"),
        ] {
            let e = ok(text).err().unwrap_or_else(|| panic!("{text:?} was accepted"));
            assert!(e.contains(error), "{text:?}: {e}");
        }
        assert!(toml::from_str::<FileProxy>("path = \"/a\"\nupstreams = []").is_err(), "unknown keys are refused");

        // The control keys.
        let accel = dir.path().join("protected");
        std::fs::create_dir(&accel).unwrap();
        let r = ok(&format!(
            r#"path = "/api/*"
upstream = ["http://a"]
strip_prefix = "/api/"
request_headers = {{ set = {{ X-Real-IP = "$remote_addr" }}, remove = ["Cookie"] }}
response_headers = {{ add = {{ X-Up = "$upstream_addr" }}, remove = ["X-Powered-By"] }}
accel_root = {:?}"#,
            accel.to_str().unwrap()
        ))
        .unwrap();
        assert_eq!(r.control.strip_prefix.as_deref(), Some("/api"));
        assert_eq!(
            (r.control.request.set.len(), r.control.request.remove.as_slice()),
            (1, &["Cookie".to_string()][..])
        );
        assert_eq!((r.control.response.add.len(), r.control.response.remove.len()), (1, 1));
        assert_eq!(r.control.accel_root.as_ref().map(|a| a.0.path().to_path_buf()), Some(accel.clone()));
        let plain = ok("path = \"/x\"\nupstream = [\"http://a\"]").unwrap();
        assert_eq!(plain.control, Control::default());
        for (text, error) in [
            ("strip_prefix = \"api\"", "strip_prefix \"api\""),
            ("strip_prefix = \"/a/*\"", "strip_prefix"),
            ("request_headers = { set = { X-A = \"$status\" } }", "request_headers.set.X-A: $status has no value here"),
            ("response_headers = { remove = [\"Content-Length\"] }", "the connection's own"),
            ("request_headers = { keep = [] }", "unknown key \"keep\""),
            ("accel_root = \"/nonexistent-accel\"", "accel_root /nonexistent-accel"),
            ("accel_root = \"/etc/passwd\"", "is not a directory"),
        ] {
            let text = format!("path = \"/a\"\nupstream = [\"http://a\"]\n{text}");
            let e = ok(&text).err().unwrap_or_else(|| panic!("{text:?} was accepted"));
            assert!(e.contains(error), "{text:?}: {e}");
        }
        let r = ok("path = \"/a\"\nupstream = [\"http://a\"]\ncache = true\ncache_key = \"$host$request_uri\"\n\
                    cache_bypass = { cookie = [\"s\"] }\ncache_valid = { \"200\" = \"10m\", \"404\" = 60, any = \"1s\" }")
        .unwrap();
        assert!(r.control.cache_key.is_some() && r.control.cache_bypass.cookies == ["s"]);
        assert_eq!(
            r.control.cache_valid,
            [
                (Some(200), Duration::from_secs(600)),
                (Some(404), Duration::from_secs(60)),
                (None, Duration::from_secs(1))
            ]
        );
        for (text, error) in [
            ("cache_key = \"$host\"", "need cache = true"),
            ("cache = true\ncache_key = \"$status\"", "cache_key: $status has no value here"),
            ("cache = true\ncache_key = \" \"", "cache_key: give a template"),
            ("cache = true\ncache_valid = { \"2xx\" = \"1m\" }", "\"2xx\" is not a status"),
            ("cache = true\ncache_valid = { \"200\" = \"soon\" }", "cache_valid.200"),
            ("cache = true\ncache_bypass = { param = [\"a\"] }", "cache_bypass: unknown key"),
            ("cache_slice = \"1m\"", "need cache = true"),
            ("cache = true\ncache_slice = \"1k\"", "cache_slice"),
            ("cache = true\ncache_slice = \"2G\"", "cache_slice"),
            ("cache = true\ncache_slice = \"big\"", "cache_slice"),
        ] {
            let text = format!("path = \"/a\"\nupstream = [\"http://a\"]\n{text}");
            let e = ok(&text).err().unwrap_or_else(|| panic!("{text:?} was accepted"));
            assert!(e.contains(error), "{text:?}: {e}");
        }
        for (text, want) in [("\"1m\"", 1 << 20), ("\"256K\"", 256 << 10), ("65536", 65536)] {
            let r =
                ok(&format!("path = \"/a\"\nupstream = [\"http://a\"]\ncache = true\ncache_slice = {text}")).unwrap();
            assert_eq!(r.control.cache_slice, Some(want), "{text}");
        }
        let e = ok("path = \"/a\"\nupstream = [\"h2c://a:1\"]\ncache = true\ncache_slice = \"1m\"").unwrap_err();
        assert!(e.contains("cache_slice needs HTTP/1.1 upstreams"), "{e}");
        let site_root = dir.path().canonicalize().unwrap();
        let inside = FileProxy { accel_root: Some(accel.clone()), ..block("path = \"/a\"") };
        let e = accel_outside(std::slice::from_ref(&inside), &site_root).unwrap_err();
        assert!(e.contains("beneath the root") && e.starts_with("proxy 1: "), "{e}");
        assert!(accel_outside(&[inside], &site_root.join("elsewhere")).is_ok());
        assert!(proxy(&[block("path = \"/a\"")]).unwrap_err().starts_with("proxy 1: "));
    }
}
