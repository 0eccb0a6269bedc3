//! Configuration composition with the real binary: `include = ["sites/*.toml"]` adds the
//! sites of each file (paths relative to it), and a reload reads a file added since;
//! `${VAR}` comes from the server's environment; a key set in two files, an unset
//! variable or a missing include stops start-up with one line naming them; `ktlsd config`
//! prints the effective configuration, secrets redacted, and `check` reads it back.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// curl for `https://NAME:PORT/PATH` (SNI and Host NAME) at 127.0.0.1; returns (status, body).
fn get(port: u16, name: &str, path: &str) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sk", "--max-time", "15", "-w", "\n%{http_code}", "--resolve", &format!("{name}:{port}:127.0.0.1")]);
    cmd.arg(format!("https://{name}:{port}{path}"));
    let out = run_with_timeout(&mut cmd, None, Duration::from_secs(20));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// Writes `text` to `dir/rel`, creating parent directories.
fn put(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

/// A site file for `name` whose root, `www-NAME` beside the file, holds f.txt = "site NAME".
fn site(dir: &Path, rel: &str, name: &str) {
    put(dir, rel, &format!("[[site]]\nnames = [\"{name}.test\"]\nroot = \"www-{name}\"\n"));
    let file_dir = dir.join(rel);
    put(file_dir.parent().expect("parent"), &format!("www-{name}/f.txt"), &format!("site {name}"));
}

#[test]
fn included_sites_are_served_and_a_reload_reads_a_new_file() {
    let b = Server::builder(BIN).file("f.txt", "default");
    site(b.dir(), "sites/a.toml", "a");
    // Not .toml: not included.
    site(b.dir(), "sites/c.toml.off", "c");
    let srv = b.config("include = [\"sites/*.toml\"]\n").start();
    let port = srv.port();
    assert_eq!(get(port, "a.test", "/f.txt"), (200, "site a".into()));
    assert_eq!(get(port, "c.test", "/f.txt"), (200, "default".into()), "c.test is not a site");

    site(srv.dir(), "sites/b.toml", "b");
    srv.signal(libc::SIGHUP);
    assert!(srv.wait_stderr("reloaded configuration", Duration::from_secs(20)).is_some(), "{}", srv.stderr());
    assert_eq!(get(port, "b.test", "/f.txt"), (200, "site b".into()), "{}", srv.stderr());
    assert_eq!(get(port, "a.test", "/f.txt"), (200, "site a".into()));
}

#[test]
fn variables_come_from_the_environment() {
    let b = Server::builder(BIN).file("f.txt", "default");
    put(b.dir(), "env-root/f.txt", "from the environment");
    // `$${` is a literal `${`.
    let text = "[[site]]\nnames = [\"env.test\"]\nroot = \"${SITE_ROOT}\"\nhsts = \"max-age=60; x=$${HOME}\"\n";
    let root = b.dir().join("env-root").display().to_string();
    let srv = b.config(text).env("SITE_ROOT", &root).start();
    let port = srv.port();
    let resolve = format!("env.test:{port}:127.0.0.1");
    let r = fetch(&format!("https://env.test:{port}/f.txt"), &["-sk", "--resolve", &resolve]);
    assert_eq!((r.status, r.body_str().as_str()), (200, "from the environment"));
    assert_eq!(r.header("strict-transport-security"), Some("max-age=60; x=${HOME}"));

    // Unset: start-up stops naming the variable, the key and the file.
    let b = Server::builder(BIN).config(text);
    b.run_to_exit().assert_startup_error(&["ktlsd.toml", "site[0].root", "environment variable SITE_ROOT is not set"]);
}

#[test]
fn composition_mistakes_stop_start_up_naming_the_files() {
    for (files, needles) in [
        (
            vec![
                ("ktlsd.toml", "include = [\"more.toml\"]\nhsts = \"max-age=1\"\n"),
                ("more.toml", "hsts = \"max-age=2\"\n"),
            ],
            vec!["config key hsts is set in both", "ktlsd.toml", "more.toml"],
        ),
        (vec![("ktlsd.toml", "include = [\"absent.toml\"]\n")], vec!["include \"absent.toml\"", "absent.toml"]),
        (
            vec![("ktlsd.toml", "include = [\"loop.toml\"]\n"), ("loop.toml", "include = [\"ktlsd.toml\"]\n")],
            vec!["include loop", "loop.toml includes"],
        ),
        (
            vec![("ktlsd.toml", "include = [\"more.toml\"]\n"), ("more.toml", "hsts = 5\n")],
            vec!["more.toml: line 1, column 8", "expected a string"],
        ),
    ] {
        let b = Server::builder(BIN);
        for (name, text) in &files[1..] {
            put(b.dir(), name, text);
        }
        b.config(files[0].1).run_to_exit().assert_startup_error(&needles);
    }
    // A glob that matches nothing adds nothing.
    let srv = Server::builder(BIN).file("f.txt", "x").config("include = [\"none.d/*.toml\"]\n").start();
    assert_eq!(get(srv.port(), "localhost", "/f.txt"), (200, "x".into()));
}

#[test]
fn ktlsd_config_prints_the_effective_configuration() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let d = dir.path();
    site(d, "sites/a.toml", "a");
    put(
        d,
        "ktlsd.toml",
        "include = [\"sites/*.toml\"]\nstate_dir = \"state\"\nidle_timeout = \"${IDLE}\"\nlisten = [\"127.0.0.1:0\"]\n",
    );
    let config = |extra: &[&str]| {
        let mut cmd = Command::new(BIN);
        cmd.args(["config", "--config"]).arg(d.join("ktlsd.toml")).arg(d).args(extra).env("IDLE", "30s");
        Exited::from(run_with_timeout(&mut cmd, None, Duration::from_secs(30)))
    };
    let out = config(&["--workers", "3"]);
    assert!(out.status.success(), "{out:?}");
    for want in [
        "workers = 3\n".to_string(),
        "idle_timeout = \"30s\"\n".to_string(),
        format!("state_dir = \"{}\"\n", d.join("state").display()),
        format!("root = \"{}\"\n", d.join("sites/www-a").display()),
        "names = [\"a.test\"]\n".to_string(),
    ] {
        assert!(out.stdout.contains(&want), "no {want:?} in\n{}", out.stdout);
    }
    assert!(!out.stdout.contains("include"), "{}", out.stdout);

    // What it prints is a configuration file: checked on its own, it is the same.
    put(d, "printed.toml", &out.stdout);
    let mut check = Command::new(BIN);
    check.args(["check", "--config"]).arg(d.join("printed.toml")).args(allow_root_args());
    let checked = Exited::from(run_with_timeout(&mut check, None, Duration::from_secs(30)));
    assert!(checked.status.success(), "{checked:?}");

    // Secrets are not printed; a configuration that does not validate prints nothing.
    put(
        d,
        "sites/b.toml",
        "[[site]]\nnames = [\"b.test\"]\nroot = \"www-a\"\n\
         acme = { directory = \"https://ca.test/dir\", eab = { kid = \"k1\", hmac_key = \"c2VjcmV0LWtleQ\" } }\n",
    );
    let out = config(&[]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        out.stdout.contains("hmac_key = \"<redacted>\"") && !out.stdout.contains("c2VjcmV0LWtleQ"),
        "{}",
        out.stdout
    );
    put(d, "sites/b.toml", "[[site]]\nnames = [\"a.test\"]\nroot = \"www-a\"\n");
    let out = config(&[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stdout.is_empty() && out.stderr.contains("name a.test is also in site 1"), "{out:?}");
}
