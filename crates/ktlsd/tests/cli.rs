//! The command line and the configuration file: `--help`, `--version`, `doctor`,
//! every start-up mistake (one `ktlsd: error:` line naming the file or value,
//! exit status 1), and the config file merged under the command line.

use std::process::Command;
use std::time::Duration;

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

fn ktlsd(args: &[&str]) -> Exited {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env_remove("KTLSD_LOG");
    Exited::from(run_with_timeout(&mut cmd, None, Duration::from_secs(30)))
}

// ---------------------------------------------------------------------------
// --help, --version, doctor.
// ---------------------------------------------------------------------------

#[test]
fn help_exits_zero() {
    let out = ktlsd(&["--help"]);
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.contains("Usage: ktlsd"), "{}", out.stdout);
    assert!(out.stdout.contains("serve") && out.stdout.contains("doctor"), "{}", out.stdout);
    assert!(out.stdout.contains("kTLS"), "{}", out.stdout);
}

#[test]
fn serve_help_lists_every_flag() {
    let out = ktlsd(&["serve", "--help"]);
    assert!(out.status.success(), "{out:?}");
    for flag in [
        "--config",
        "--listen",
        "--cert",
        "--key",
        "--workers",
        "--ktls",
        "--tls-versions",
        "--cipher-suites",
        "--record-size",
        "--tcp-notsent-lowat",
        "--tcp-congestion",
        "--autoindex",
        "--no-autoindex",
        "--dotfiles",
        "--no-dotfiles",
        "--access-log",
        "--handshake-timeout",
        "--header-timeout",
        "--idle-timeout",
        "--send-timeout",
        "--shutdown-timeout",
        "--max-header-bytes",
        "--max-body-bytes",
        "--user",
        "--group",
        "--allow-root",
        "[ROOT]",
    ] {
        assert!(out.stdout.contains(flag), "serve --help does not mention {flag}:\n{}", out.stdout);
    }
}

/// Every option with a default says it in `serve --help`.
#[test]
fn serve_help_shows_every_default() {
    let out = ktlsd(&["serve", "--help"]);
    assert!(out.status.success(), "{out:?}");
    for (flag, default) in [
        ("[ROOT]", "the current directory"),
        ("--listen", "127.0.0.1:8443"),
        ("--cert", "a self-signed certificate for localhost"),
        ("--key", "the generated certificate's key"),
        ("--workers", "one per CPU"),
        ("--ktls", "auto"),
        ("--tls-versions", "1.2,1.3"),
        ("--cipher-suites", "all kTLS-capable suites"),
        ("--record-size", "static:16k"),
        ("--tcp-notsent-lowat", "unset; 16384 with --record-size adaptive"),
        ("--tcp-congestion", "the system's"),
        ("--autoindex", "off"),
        ("--dotfiles", "off"),
        ("--access-log", "-"),
        ("--handshake-timeout", "10s"),
        ("--header-timeout", "15s"),
        ("--idle-timeout", "65s"),
        ("--send-timeout", "60s"),
        ("--shutdown-timeout", "10s"),
        ("--max-header-bytes", "16384"),
        ("--max-body-bytes", "1048576"),
        ("--user", "none"),
        ("--group", "the user's primary group"),
        ("--allow-root", "off"),
        ("--http2", "on"),
        ("--h2-max-streams", "128"),
        ("--h2-max-header-list", "32768"),
        ("--h2-hpack-table", "4096"),
        ("--h2-max-resets", "200"),
        ("--h2-max-control", "1000"),
    ] {
        // The flag's entry: its line, and the help lines clap may put under it.
        let is_flag = |l: &str| l.trim_start().strip_prefix(flag).is_some_and(|r| r.is_empty() || r.starts_with(' '));
        let mut lines = out.stdout.lines().skip_while(|l| !is_flag(l));
        let first = lines.next().unwrap_or_else(|| panic!("serve --help has no line for {flag}:\n{}", out.stdout));
        let rest = lines.take_while(|l| !l.trim_start().starts_with('-') && !l.trim().is_empty());
        let entry: String = std::iter::once(first).chain(rest).collect::<Vec<_>>().join(" ");
        assert!(entry.contains(&format!("[default: {default}")), "{flag} without its default {default:?}: {entry}");
    }
    // How a DURATION is written is said once, above the timeouts.
    assert!(out.stdout.contains("65s, 500ms, 2m, 1h"), "{}", out.stdout);
}

#[test]
fn version_exits_zero_and_names_the_commit() {
    let out = ktlsd(&["--version"]);
    assert!(out.status.success(), "{out:?}");
    let head =
        Command::new("git").args(["rev-parse", "--short=10", "HEAD"]).current_dir(env!("CARGO_MANIFEST_DIR")).output();
    let commit = match head {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => "unknown".to_string(),
    };
    assert_eq!(out.stdout.trim(), format!("ktlsd {} (commit {commit})", env!("CARGO_PKG_VERSION")));
}

#[test]
fn no_subcommand_or_unknown_flag_is_a_usage_error() {
    let out = ktlsd(&[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("Usage"), "{}", out.stderr);
    let out = ktlsd(&["serve", "--bogus-flag"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("--bogus-flag"), "{}", out.stderr);
}

/// `doctor --json`'s report; its exit status is checked against the report's verdict.
fn doctor_json() -> serde_json::Value {
    let out = ktlsd(&["doctor", "--json"]);
    let v: serde_json::Value =
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("doctor --json is not JSON ({e}):\n{out:?}"));
    let usable = v["ktls"]["usable"].as_bool().unwrap_or_else(|| panic!("no ktls.usable verdict:\n{v}"));
    assert_eq!(out.status.code(), Some(if usable { 0 } else { 1 }), "usable={usable}: {out:?}");
    v
}

#[test]
fn doctor_reports() {
    let v = doctor_json();
    assert!(v.is_object());
    assert!(v["kernel"].is_string(), "{v}");
    let usable = v["ktls"]["usable"].as_bool().unwrap();
    let out = ktlsd(&["doctor"]);
    assert!(!out.stdout.trim().is_empty());
    assert_eq!(out.status.code(), Some(if usable { 0 } else { 1 }), "usable={usable}: {out:?}");
}

/// Scripts can test `ktlsd doctor`'s exit status: 1 when kTLS is unusable here, 0 when usable.
#[test]
fn doctor_exit_status_is_the_verdict() {
    for args in [&["doctor", "--json"][..], &["doctor"][..]] {
        let out = ktlsd(args);
        // The verdict of the same run, so the assertion holds on any kernel.
        let json = ktlsd(&["doctor", "--json"]).stdout;
        let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}:\n{json}"));
        let usable = v["ktls"]["usable"].as_bool().unwrap_or_else(|| panic!("no verdict:\n{v}"));
        let want = if usable { 0 } else { 1 };
        assert_eq!(out.status.code(), Some(want), "{args:?} with kTLS usable={usable}: {out:?}");
        // Not an error: the report is the output, with nothing on stderr.
        assert!(!out.stderr.contains("error"), "{}", out.stderr);
        if !usable {
            assert!(out.stdout.contains("usable"), "{}", out.stdout);
        }
    }
}

// ---------------------------------------------------------------------------
// kTLS modes.
// ---------------------------------------------------------------------------

#[test]
fn ktls_on_requires_kernel_tls() {
    let usable = doctor_json()["ktls"]["usable"].as_bool().unwrap();
    let b = Server::builder(BIN).file("a.txt", b"a").arg("--ktls").arg("on");
    if usable {
        // Where the kernel offers kTLS, `on` starts and connections use it.
        let srv = b.start();
        let r = fetch(&srv.url("/a.txt"), &[]);
        assert_eq!(r.body, b"a");
        let log = srv.wait_access_log(1, Duration::from_secs(10));
        assert!(log[0].ends_with(" tls=ktls"), "{log:?}");
    } else {
        b.run_to_exit().assert_startup_error(&["kernel TLS unavailable"]);
    }
}

#[test]
fn ktls_auto_falls_back_to_userspace_when_unavailable() {
    let usable = doctor_json()["ktls"]["usable"].as_bool().unwrap();
    let srv = Server::builder(BIN).file("a.txt", b"a").arg("--ktls").arg("auto").start();
    assert_eq!(fetch(&srv.url("/a.txt"), &[]).body, b"a");
    let log = srv.wait_access_log(1, Duration::from_secs(10));
    let st = srv.stop();
    st.assert_clean_exit();
    if !usable {
        assert!(st.stderr.contains("kernel TLS: unavailable"), "{}", st.stderr);
        assert!(log[0].ends_with(" tls=userspace"), "{log:?}");
        assert_eq!((st.stat("userspace"), st.stat("ktls")), (1, 0));
    }
}

#[test]
fn ktls_off_uses_userspace() {
    let srv = Server::builder(BIN).file("a.txt", b"a").arg("--ktls").arg("off").start();
    assert!(srv.stderr().contains("kernel TLS: off"), "{}", srv.stderr());
    assert_eq!(fetch(&srv.url("/a.txt"), &[]).body, b"a");
    let st = srv.stop();
    assert_eq!((st.stat("userspace"), st.stat("ktls")), (1, 0));
}

/// A value outside a choice is a usage error naming the flag and the accepted values;
/// in the file, a configuration error naming the line.
#[test]
fn ktls_bogus_is_refused() {
    for (flag, value, accepted) in [
        ("--ktls", "bogus", "auto, on, off"),
        ("--unknown-sni", "maybe", "default, refuse"),
        ("--access-log-format", "xml", "ktlsd, combined, json"),
        ("--http2", "yes", "on, off"),
    ] {
        let out = ktlsd(&["check", flag, value]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        for needle in [flag, value, accepted] {
            assert!(out.stderr.contains(needle), "{flag} {value}: no {needle:?} in {}", out.stderr);
        }
    }
    let b = Server::builder(BIN);
    std::fs::write(b.dir().join("bad.toml"), "ktls = \"bogus\"\n").unwrap();
    let cfg = b.dir().join("bad.toml");
    b.arg("--config").arg(&cfg).run_to_exit().assert_startup_error(&["bad.toml", "line 1", "bogus", "auto"]);
}

// ---------------------------------------------------------------------------
// Certificates and keys.
// ---------------------------------------------------------------------------

/// One `#[test]` per spoiled certificate or key, named by its variant: a good
/// ECDSA pair is made, then `$which` (`cert` or `key`) is replaced by the path
/// `$spoil(dir, cert, key)` returns; the one error line must name that path
/// and every needle.
macro_rules! refused_pair {
    ($($name:ident: $which:ident <- $spoil:expr => [$($needle:expr),*];)+) => {$(
        #[test]
        fn $name() {
            let b = Server::builder(BIN);
            let (cert, key) = make_cert(b.dir(), "k", "ec");
            let spoil: fn(&Path, &Path, &Path) -> PathBuf = $spoil;
            let bad = spoil(b.dir(), &cert, &key);
            let (cert, key) = match stringify!($which) {
                "cert" => (bad.clone(), key),
                _ => (cert, bad.clone()),
            };
            let shown = bad.to_str().unwrap().to_string();
            let exited = b.arg("--cert").arg(&cert).arg("--key").arg(&key).run_to_exit();
            exited.assert_startup_error(&[$($needle,)* &shown]);
        }
    )+};
}

/// Certificates and keys refused at start-up.
mod refused_pair {
    use std::path::{Path, PathBuf};

    use super::*;

    /// `text` written to `name` in `dir`.
    fn written(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        write_file(&p, text.as_bytes());
        p
    }

    refused_pair! {
        missing_cert: cert <- |dir, _, _| dir.join("nope.crt") => ["certificate"];
        missing_key: key <- |dir, _, _| dir.join("nope.key") => ["key"];
        garbage_key: key <- |dir, _, _| written(dir, "garbage.key", "this is not a key\n") => ["key"];
        key_is_a_directory: key <- |dir, _, _| {
            let p = dir.join("keydir");
            std::fs::create_dir(&p).unwrap();
            p
        } => ["key"];
        garbage_cert: cert <- |dir, _, _| {
            written(dir, "garbage.crt", "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n")
        } => ["certificate"];
        // The key file given as the certificate: no CERTIFICATE block.
        cert_holding_only_a_key: cert <- |_, _, key| key.to_path_buf() => ["certificate"];
        key_of_another_cert: key <- |dir, _, _| make_cert(dir, "two", "ec").1 => ["does not match"];
        rsa_key_with_ecdsa_cert: key <- |dir, _, _| make_cert(dir, "rsa", "rsa").1 => [];
    }
}

#[test]
fn cert_without_key_and_key_without_cert() {
    let b = Server::builder(BIN);
    let (cert, key) = make_cert(b.dir(), "k", "ec");
    b.arg("--cert").arg(&cert).run_to_exit().assert_startup_error(&["--cert", "--key"]);
    Server::builder(BIN).arg("--key").arg(&key).run_to_exit().assert_startup_error(&["--key", "--cert"]);
}

// ---------------------------------------------------------------------------
// Addresses, ROOT, values.
// ---------------------------------------------------------------------------

#[test]
fn port_in_use() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = holder.local_addr().unwrap().to_string();
    Server::builder(BIN).listen(&[&addr]).run_to_exit().assert_startup_error(&[&addr, "address already in use"]);
    drop(holder);
}

#[test]
fn bad_listen_address() {
    Server::builder(BIN).listen(&["localhost:https"]).run_to_exit().assert_startup_error(&["\"localhost:https\""]);
    Server::builder(BIN).listen(&["127.0.0.1"]).run_to_exit().assert_startup_error(&["\"127.0.0.1\""]);
}

#[test]
fn listen_on_foreign_address() {
    // 192.0.2.1 (TEST-NET-1) is not an address of this machine: bind fails.
    Server::builder(BIN).listen(&["192.0.2.1:0"]).run_to_exit().assert_startup_error(&["192.0.2.1"]);
}

#[test]
fn root_not_a_directory() {
    let b = Server::builder(BIN).file("file.txt", b"x").no_root_arg();
    let file = b.root().join("file.txt");
    let f = file.to_str().unwrap().to_string();
    b.arg(&file).run_to_exit().assert_startup_error(&[&f, "not a directory"]);
}

#[test]
fn root_missing() {
    let b = Server::builder(BIN).no_root_arg();
    let missing = b.dir().join("no-such-root");
    let m = missing.to_str().unwrap().to_string();
    b.arg(&missing).run_to_exit().assert_startup_error(&[&m]);
}

/// One `#[test]` per refused command line, named by its variant: the
/// arguments after the harness's own, and what the one error line must name.
macro_rules! refused {
    ($($name:ident: [$($arg:expr),+] => [$($needle:expr),+];)+) => {$(
        #[test]
        fn $name() {
            Server::builder(BIN).args([$($arg),+]).run_to_exit().assert_startup_error(&[$($needle),+]);
        }
    )+};
}

/// Values the command line refuses at start-up.
mod refused {
    use super::*;

    refused! {
        record_size_static_zero: ["--record-size", "static:0"] => ["\"static:0\""];
        record_size_static_17k: ["--record-size", "static:17k"] => ["\"static:17k\""];
        record_size_static_16385: ["--record-size", "static:16385"] => ["\"static:16385\""];
        record_size_lo_above_hi: ["--record-size", "dynamic:lo=5000,hi=4000"] => ["\"dynamic:lo=5000,hi=4000\"", "lo"];
        record_size_bogus: ["--record-size", "bogus"] => ["\"bogus\""];
        record_size_static_without_size: ["--record-size", "static"] => ["\"static\""];
        record_size_static_abc: ["--record-size", "static:abc"] => ["\"static:abc\""];
        record_size_adaptive_with_size: ["--record-size", "adaptive:5"] => ["\"adaptive:5\""];
        record_size_threshold_zero: ["--record-size", "dynamic:threshold=0"] => ["\"dynamic:threshold=0\""];
        record_size_unknown_key: ["--record-size", "dynamic:color=red"] => ["\"dynamic:color=red\"", "color"];
        tls_version_1_1: ["--tls-versions", "1.1"] => ["\"1.1\""];
        tls_versions_empty: ["--tls-versions", ""] => ["tls_versions"];
        cipher_suite_rc4: ["--cipher-suites", "TLS_AES_128_GCM_SHA256,RC4-MD5"] => ["\"RC4-MD5\""];
        suites_and_versions_leaving_nothing:
            ["--cipher-suites", "TLS_AES_128_GCM_SHA256", "--tls-versions", "1.2"] => ["cipher_suites", "tls_versions"];
        idle_timeout_zero: ["--idle-timeout", "0"] => ["--idle-timeout", "\"0\""];
        send_timeout_negative: ["--send-timeout=-1"] => ["--send-timeout", "\"-1\""];
        header_timeout_nan: ["--header-timeout", "NaN"] => ["--header-timeout", "NaN"];
        max_header_bytes_10: ["--max-header-bytes", "10"] => ["max_header_bytes", "10"];
        tcp_notsent_lowat_zero: ["--tcp-notsent-lowat", "0"] => ["tcp_notsent_lowat"];
        tcp_congestion_unknown: ["--tcp-congestion", "no-such-cc"] => ["\"no-such-cc\""];
    }

    #[test]
    fn workers_zero() {
        Server::builder(BIN).workers(Some(0)).run_to_exit().assert_startup_error(&["workers"]);
    }
}

#[test]
fn good_record_sizes_start() {
    for (policy, shown) in [
        ("static:16k", "static:16384"),
        ("static:1", "static:1"),
        ("dynamic", "dynamic:lo=1369,hi=4229,threshold=40,timeout=1000ms"),
        ("dynamic:lo=1k,hi=8k,threshold=10,timeout=250ms", "dynamic:lo=1024,hi=8192,threshold=10,timeout=250ms"),
        ("adaptive", "adaptive"),
    ] {
        let srv = Server::builder(BIN).args(["--record-size", policy]).start();
        assert!(srv.stderr().contains(&format!("record size {shown}")), "{policy}:\n{}", srv.stderr());
    }
}

#[test]
fn good_tcp_options_start() {
    let srv = Server::builder(BIN)
        .file("a.txt", b"a")
        .args(["--tcp-notsent-lowat", "16384", "--tcp-congestion", "cubic"])
        .start();
    assert_eq!(fetch(&srv.url("/a.txt"), &[]).body, b"a");
}

#[test]
fn access_log_in_missing_directory() {
    let b = Server::builder(BIN).no_access_log();
    let path = b.dir().join("no/such/dir/access.log");
    let p = path.to_str().unwrap().to_string();
    b.arg("--access-log").arg(&path).run_to_exit().assert_startup_error(&["access log", &p]);
}

// ---------------------------------------------------------------------------
// The configuration file.
// ---------------------------------------------------------------------------

/// One `#[test]` per refused configuration file, named by its variant: the
/// file's text, and what the one error line must name besides the file.
macro_rules! refused_config {
    ($($name:ident: $text:expr => [$($needle:expr),*];)+) => {$(
        #[test]
        fn $name() {
            let b = Server::builder(BIN);
            let cfg = b.write_config($text);
            let c = cfg.to_str().unwrap().to_string();
            b.arg("--config").arg(&cfg).run_to_exit().assert_startup_error(&[&c, $($needle),*]);
        }
    )+};
}

/// Configuration files refused at start-up.
mod refused_config {
    use super::*;

    refused_config! {
        unknown_key: "listen = [\"127.0.0.1:0\"]\ncolour = \"blue\"\n" => ["colour"];
        not_toml: "listen = [127.0.0.1:0\n" => [];
        wrong_type: "workers = \"two\"\n" => ["\"two\""];
    }
}

#[test]
fn config_missing_file() {
    let b = Server::builder(BIN);
    let cfg = b.dir().join("absent.toml");
    let c = cfg.to_str().unwrap().to_string();
    b.arg("--config").arg(&cfg).run_to_exit().assert_startup_error(&[&c]);
}

#[test]
fn config_bad_value_is_named() {
    let b = Server::builder(BIN);
    let cfg = b.write_config("record_size = \"static:0\"\n");
    b.arg("--config").arg(&cfg).run_to_exit().assert_startup_error(&["\"static:0\""]);
}

#[test]
fn config_sets_listen_and_root() {
    let b = Server::builder(BIN).no_root_arg().listen(&[]).file("a.txt", b"from-root");
    std::fs::create_dir(b.dir().join("site")).unwrap();
    std::fs::write(b.dir().join("site/a.txt"), b"from-site").unwrap();
    // Relative root: relative to the config file's directory.
    let cfg = b.write_config("listen = [\"[::1]:0\"]\nroot = \"site\"\n");
    let srv = b.arg("--config").arg(&cfg).start();
    assert!(srv.addr().is_ipv6(), "config listen not used: {:?}", srv.addrs());
    let r = fetch(&srv.url("/a.txt"), &["-g"]);
    assert_eq!(r.body, b"from-site");
}

#[test]
fn cli_overrides_config() {
    let b = Server::builder(BIN).file("a.txt", b"from-root");
    std::fs::create_dir(b.dir().join("site")).unwrap();
    std::fs::write(b.dir().join("site/a.txt"), b"from-site").unwrap();
    let cfg = b.write_config(
        "listen = [\"[::1]:0\"]\nroot = \"site\"\ntls_versions = [\"1.2\"]\nrecord_size = \"static:2k\"\n",
    );
    // ROOT and --listen on the command line (the builder passes them), and
    // --record-size; tls_versions stays from the file.
    let srv = b.arg("--config").arg(&cfg).args(["--record-size", "static:8k"]).start();
    assert!(srv.addr().is_ipv4(), "--listen did not override: {:?}", srv.addrs());
    assert_eq!(srv.addrs().len(), 1);
    assert!(srv.stderr().contains("record size static:8192"), "{}", srv.stderr());
    let r = fetch(&srv.url("/a.txt"), &[]);
    assert_eq!(r.body, b"from-root");
    assert!(
        !curl(&["--tlsv1.3".to_string(), srv.url("/a.txt")]).status.success(),
        "tls_versions from the file ignored"
    );
    let r = fetch(&srv.url("/a.txt"), &["--tls-max", "1.2"]);
    assert_eq!(r.body, b"from-root");
}

#[test]
fn config_accepts_every_key() {
    let b = Server::builder(BIN).no_root_arg().listen(&[]).workers(None).no_access_log().file("a.txt", b"a");
    let (cert, key) = make_cert(b.dir(), "c", "ec");
    let log = b.dir().join("from-config.log");
    let text = format!(
        r#"
root = "root"
listen = ["127.0.0.1:0"]
cert = "{cert}"
key = "{key}"
workers = 2
ktls = "auto"
tls_versions = ["1.2", "1.3"]
cipher_suites = ["TLS_AES_128_GCM_SHA256", "ECDHE-ECDSA-AES128-GCM-SHA256"]
record_size = "dynamic"
tcp_notsent_lowat = 131072
tcp_congestion = "cubic"
autoindex = true
dotfiles = true
access_log = "{log}"
handshake_timeout = 5
header_timeout = 5
idle_timeout = 30
send_timeout = 30
shutdown_timeout = 5
max_header_bytes = 8192
max_body_bytes = 4096
"#,
        cert = cert.display(),
        key = key.display(),
        log = log.display()
    );
    let cfg = b.write_config(&text);
    std::fs::write(b.root().join(".dot"), b"dotted").unwrap();
    std::fs::create_dir(b.root().join("d")).unwrap();
    std::fs::write(b.root().join("d/x.txt"), b"x").unwrap();
    let srv = b.arg("--config").arg(&cfg).start();
    let line = srv.wait_stderr(" serving ", Duration::from_secs(1)).unwrap();
    assert!(
        line.contains("with 2 workers") && line.contains("(loaded)") && line.contains("record size dynamic"),
        "{line}"
    );
    assert_eq!(fetch(&srv.url("/.dot"), &[]).body, b"dotted", "dotfiles from the config");
    assert!(fetch(&srv.url("/d/"), &[]).body_str().contains("x.txt"), "autoindex from the config");
    let r = fetch(&srv.url("/a.txt"), &["-v", "--tlsv1.3"]);
    assert!(r.stderr.contains("TLS_AES_128_GCM_SHA256"), "{}", r.stderr);
    let req = format!("GET /a.txt HTTP/1.1\r\nHost: x\r\nX: {}\r\n\r\n", "y".repeat(9000));
    let mut c = TlsClient::connect(srv.addr());
    c.send(req.as_bytes());
    assert_eq!(c.read_response().status, 431, "max_header_bytes from the config");
    let st = srv.stop();
    st.assert_clean_exit();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert_eq!(logged.lines().count(), 4, "access_log from the config: {logged}");
}

#[test]
fn default_workers_is_one_per_cpu() {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let srv = Server::builder(BIN).workers(None).start();
    let want = if cpus == 1 { "with 1 worker,".to_string() } else { format!("with {cpus} workers,") };
    assert!(srv.stderr().contains(&want), "expected {want:?}:\n{}", srv.stderr());
}

#[test]
fn config_empty_listen_list() {
    let b = Server::builder(BIN).listen(&[]);
    let cfg = b.write_config("listen = []\n");
    b.arg("--config").arg(&cfg).run_to_exit().assert_startup_error(&["listen"]);
}

#[test]
fn listen_twice_on_the_same_address() {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap().to_string();
    drop(probe);
    Server::builder(BIN).listen(&[&addr, &addr]).run_to_exit().assert_startup_error(&[&addr, "twice"]);
}

// ---------------------------------------------------------------------------
// Durations and switches.
// ---------------------------------------------------------------------------

#[test]
fn idle_timeout_with_a_unit_applies() {
    let srv =
        Server::builder(BIN).file("a.txt", b"a").args(["--idle-timeout", "2s", "--header-timeout", "1500ms"]).start();
    let mut c = TlsClient::connect(srv.addr());
    assert_eq!(c.get("/a.txt").body, b"a");
    let t = std::time::Instant::now();
    let (rest, how) = c.read_until_close();
    let took = t.elapsed();
    assert!(rest.is_empty());
    assert!(matches!(how, Closing::CloseNotify | Closing::Eof), "{how:?} after {took:?}");
    assert!(took >= Duration::from_millis(1800), "2s idle timeout closed after {took:?}");
    assert!(took < Duration::from_secs(6), "2s idle timeout took {took:?}");
}

#[test]
fn config_timeouts_take_units_and_bad_ones_are_named() {
    let b = Server::builder(BIN).file("a.txt", b"a");
    let cfg = b.write_config(
        "handshake_timeout = 5\nheader_timeout = 2.5\nidle_timeout = \"2m\"\nsend_timeout = \"500ms\"\nshutdown_timeout = \"1h\"\n",
    );
    let srv = b.arg("--config").arg(&cfg).start();
    assert_eq!(fetch(&srv.url("/a.txt"), &[]).body, b"a");
    srv.stop().assert_clean_exit();

    for bad in ["\"soon\"", "\"5d\"", "0", "-1", "true"] {
        let b = Server::builder(BIN);
        let cfg = b.write_config(&format!("idle_timeout = {bad}\n"));
        let c = cfg.to_str().unwrap().to_string();
        b.arg("--config").arg(&cfg).run_to_exit().assert_startup_error(&[&c, "idle_timeout", "65s, 500ms, 2m, 1h"]);
    }
    Server::builder(BIN)
        .args(["--idle-timeout", "soon"])
        .run_to_exit()
        .assert_startup_error(&["--idle-timeout \"soon\"", "65s, 500ms, 2m, 1h"]);
}

#[test]
fn no_autoindex_overrides_the_config_file() {
    let setup = || {
        let b = Server::builder(BIN);
        std::fs::create_dir(b.root().join("d")).unwrap();
        std::fs::write(b.root().join("d/x.txt"), b"x").unwrap();
        std::fs::write(b.root().join(".dot"), b"dotted").unwrap();
        let cfg = b.write_config("autoindex = true\ndotfiles = true\n");
        b.arg("--config").arg(cfg)
    };
    let srv = setup().start();
    assert!(fetch(&srv.url("/d/"), &[]).body_str().contains("x.txt"), "autoindex from the file");
    assert_eq!(fetch(&srv.url("/.dot"), &[]).body, b"dotted", "dotfiles from the file");
    drop(srv);

    let srv = setup().args(["--no-autoindex", "--no-dotfiles"]).start();
    let r = fetch(&srv.url("/d/"), &[]);
    assert_eq!(r.status, 403, "--no-autoindex did not win over the file: {}", r.body_str());
    assert_eq!(fetch(&srv.url("/.dot"), &[]).status, 404, "--no-dotfiles did not win over the file");
}
