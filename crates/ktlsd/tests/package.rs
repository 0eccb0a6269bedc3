//! The Debian package end to end: `dist/deb/build` packages the binary under test;
//! `dpkg-deb --info`/`-c` show its metadata and files; `dpkg -x` unpacks it into a
//! temporary directory, where the unpacked binary names its commit, checks the example
//! configuration (with a site added in /etc/ktlsd/sites/), prints it with `ktlsd config`,
//! and the units, man pages, completions and maintainer scripts are each checked by
//! their own tool. `dpkg -i` is not run: it would change the machine the tests run on.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

fn top() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The package, built once for all the tests here, and its unpacked tree.
struct Built {
    deb: PathBuf,
    tree: PathBuf,
    _dir: tempfile::TempDir,
}

fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temporary directory");
        let out = run(
            Command::new(top().join("dist/deb/build"))
                .args(["--compress", "gzip", "--binary", BIN, "--out"])
                .arg(dir.path()),
            Duration::from_secs(300),
        );
        let deb = PathBuf::from(out.stdout.lines().last().unwrap_or_default());
        assert!(deb.is_file(), "no package: {out:?}");
        let tree = dir.path().join("tree");
        run(Command::new("dpkg").arg("-x").arg(&deb).arg(&tree), Duration::from_secs(60));
        Built { deb, tree, _dir: dir }
    })
}

/// Runs `cmd` to its end; it must succeed.
fn run(cmd: &mut Command, timeout: Duration) -> Exited {
    let out = Exited::from(run_with_timeout(cmd, None, timeout));
    assert!(out.status.success(), "{cmd:?}: {out:?}");
    out
}

#[test]
fn the_package_names_itself_and_holds_its_files() {
    let b = built();
    let info = run(Command::new("dpkg-deb").arg("--info").arg(&b.deb), Duration::from_secs(30)).stdout;
    for line in [
        "Package: ktlsd",
        &format!("Version: {}", env!("CARGO_PKG_VERSION")),
        "Depends: libc6, passwd",
        "conffiles",
        "postinst",
        "postrm",
        "prerm",
    ] {
        assert!(info.contains(line), "no {line:?} in\n{info}");
    }
    let arch = run(Command::new("dpkg").arg("--print-architecture"), Duration::from_secs(10)).stdout;
    assert!(info.contains(&format!("Architecture: {}", arch.trim())), "{info}");

    let list = run(Command::new("dpkg-deb").arg("-c").arg(&b.deb), Duration::from_secs(30)).stdout;
    for file in [
        "./usr/bin/ktlsd",
        "./lib/systemd/system/ktlsd.service",
        "./lib/systemd/system/ktlsd.socket",
        "./etc/ktlsd/ktlsd.toml",
        "./etc/ktlsd/sites/",
        "./usr/share/man/man1/ktlsd.1.gz",
        "./usr/share/man/man1/ktlsd-serve.1.gz",
        "./usr/share/man/man1/ktlsd-config.1.gz",
        "./usr/share/bash-completion/completions/ktlsd",
        "./usr/share/zsh/vendor-completions/_ktlsd",
        "./usr/share/fish/vendor_completions.d/ktlsd.fish",
        "./usr/share/doc/ktlsd/copyright",
        "./usr/share/doc/ktlsd/examples/site.toml",
    ] {
        let line = list.lines().find(|l| l.ends_with(&format!(" {file}")));
        let line = line.unwrap_or_else(|| panic!("no {file} in\n{list}"));
        assert!(line.contains(" root/root "), "{line}");
    }
    assert!(!list.contains("ktlsd-generate"), "the hidden subcommand has a man page:\n{list}");
    let conffiles = run(Command::new("dpkg-deb").arg("-I").arg(&b.deb).arg("conffiles"), Duration::from_secs(30));
    assert_eq!(conffiles.stdout.trim(), "/etc/ktlsd/ktlsd.toml");
}

#[test]
fn the_unpacked_binary_names_its_commit_and_checks_the_example_configuration() {
    let b = built();
    let bin = b.tree.join("usr/bin/ktlsd");
    let version = run(Command::new(&bin).arg("--version"), Duration::from_secs(10)).stdout;
    let head = Command::new("git").args(["rev-parse", "--short=10", "HEAD"]).current_dir(top()).output();
    let commit = match head {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => "unknown".to_string(),
    };
    assert_eq!(version.trim(), format!("ktlsd {} (commit {commit})", env!("CARGO_PKG_VERSION")));

    // The packaged configuration, with a site in sites/ as an operator adds one, and the
    // example site made to point at directories that exist.
    let etc = b.tree.join("etc/ktlsd");
    let work = tempfile::tempdir().expect("temporary directory");
    std::fs::create_dir_all(etc.join("sites/www")).expect("mkdir");
    std::fs::write(etc.join("sites/a.toml"), "[[site]]\nnames = [\"a.test\"]\nroot = \"www\"\n").expect("write");
    let example = std::fs::read_to_string(b.tree.join("usr/share/doc/ktlsd/examples/site.toml")).expect("example");
    let example = example.replace("/srv/www.example.com", &work.path().display().to_string());
    std::fs::write(etc.join("sites/example.toml"), example).expect("write");
    let args = |cmd: &str| {
        let mut c = Command::new(&bin);
        c.arg(cmd)
            .arg("--config")
            .arg(etc.join("ktlsd.toml"))
            .arg(work.path())
            .args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--state-dir"])
            .arg(work.path().join("state"))
            .args(allow_root_args());
        c
    };
    let check = run(&mut args("check"), Duration::from_secs(30));
    assert!(check.stderr.contains("configuration OK") || check.stdout.contains("configuration OK"), "{check:?}");
    let config = run(&mut args("config"), Duration::from_secs(30)).stdout;
    for want in ["names = [\"a.test\"]", "names = [\"www.example.com\", \"example.com\"]", "listen = [\"127.0.0.1:0\"]"]
    {
        assert!(config.contains(want), "no {want:?} in\n{config}");
    }
    assert!(config.contains(&format!("root = \"{}\"", etc.join("sites/www").display())), "{config}");
}

#[test]
fn the_packaged_units_verify_and_run_as_the_ktlsd_user() {
    let b = built();
    let units = b.tree.join("lib/systemd/system");
    let service = std::fs::read_to_string(units.join("ktlsd.service")).expect("service");
    for line in [
        "User=ktlsd",
        "ExecStart=/usr/bin/ktlsd serve --config /etc/ktlsd/ktlsd.toml",
        "StateDirectory=ktlsd",
        "LogsDirectory=ktlsd",
        "AmbientCapabilities=CAP_NET_BIND_SERVICE",
        "Type=notify",
    ] {
        assert!(service.contains(line), "ktlsd.service lacks {line:?}");
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::write(dir.path().join("ktlsd.service"), service.replace("/usr/bin/ktlsd", BIN)).expect("write");
    std::fs::copy(units.join("ktlsd.socket"), dir.path().join("ktlsd.socket")).expect("copy");
    let out = run(
        Command::new("systemd-analyze")
            .args(["verify", "--man=no", "./ktlsd.socket", "./ktlsd.service"])
            .current_dir(dir.path()),
        Duration::from_secs(60),
    );
    assert!(out.stderr.trim().is_empty() && out.stdout.trim().is_empty(), "{out:?}");

    // The maintainer scripts are valid sh and create the user the unit names.
    for script in ["postinst", "prerm", "postrm"] {
        let text = run(Command::new("dpkg-deb").arg("-I").arg(&b.deb).arg(script), Duration::from_secs(30)).stdout;
        let path = dir.path().join(script);
        std::fs::write(&path, &text).expect("write");
        run(Command::new("sh").arg("-n").arg(&path), Duration::from_secs(10));
        if script == "postinst" {
            assert!(text.contains("useradd --system") && text.contains(" ktlsd\n"), "{text}");
        }
    }
}

#[test]
fn the_man_pages_render_and_the_completions_load() {
    let b = built();
    let page = b.tree.join("usr/share/man/man1/ktlsd-serve.1.gz");
    let out = run(
        Command::new("man").arg("-l").arg(&page).env("MANWIDTH", "100").env("MAN_KEEP_FORMATTING", ""),
        Duration::from_secs(30),
    );
    for want in ["ktlsd-serve", "--http-listen", "--config"] {
        assert!(out.stdout.contains(want), "no {want:?} in the rendered page:\n{}", out.stdout);
    }
    let top = b.tree.join("usr/share/man/man1/ktlsd.1.gz");
    let top = run(Command::new("man").arg("-l").arg(top), Duration::from_secs(30)).stdout;
    // Words as read: lines joined and justification's spaces collapsed (man may still hyphenate long words).
    let words = top.split_whitespace().collect::<Vec<_>>().join(" ");
    for want in ["ktlsd-config(1)", "include = [\"sites/*.toml\"]", "dns_hook", "hmac_key", "_acme-challenge.NAME"] {
        assert!(words.contains(want), "no {want:?} in ktlsd(1):\n{top}");
    }

    // bash loads its completion and completes a subcommand and a flag.
    let bash = b.tree.join("usr/share/bash-completion/completions/ktlsd");
    let script = format!(
        "source {}\nCOMP_WORDS=(ktlsd se); COMP_CWORD=1; _ktlsd ktlsd se ktlsd; echo \"${{COMPREPLY[@]}}\"\n\
         COMP_WORDS=(ktlsd serve --http-l); COMP_CWORD=2; _ktlsd ktlsd --http-l serve; echo \"${{COMPREPLY[@]}}\"\n",
        bash.display()
    );
    let out = run(Command::new("bash").arg("-c").arg(script), Duration::from_secs(30));
    assert!(out.stdout.contains("serve") && out.stdout.contains("--http-listen"), "{out:?}");
    let zsh = std::fs::read_to_string(b.tree.join("usr/share/zsh/vendor-completions/_ktlsd")).expect("zsh");
    assert!(zsh.starts_with("#compdef ktlsd") && zsh.contains("--http-listen"), "{zsh:.300}");
    let fish = std::fs::read_to_string(b.tree.join("usr/share/fish/vendor_completions.d/ktlsd.fish")).expect("fish");
    assert!(fish.contains("complete -c ktlsd") && fish.contains("http-listen"), "{fish:.300}");
}
