//! Tests of the merge: command line over file over default, across sections.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::options::{self, Options};
use super::timeouts::parse_duration;
use super::tls::ADAPTIVE_NOTSENT_LOWAT;
use super::*;
use clap::FromArgMatches;

/// A temporary directory holding `dirs` and a `ktlsd.toml` with `toml`; the
/// directory lives as long as the returned guard.
fn config_file(dirs: &[&str], toml: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    for d in dirs {
        std::fs::create_dir_all(dir.path().join(d)).unwrap();
    }
    let cfg = dir.path().join("ktlsd.toml");
    std::fs::write(&cfg, toml).unwrap();
    (dir, cfg)
}

fn serve_args(argv: &[&str]) -> ServeArgs {
    let argv = ["serve"].iter().chain(argv);
    let matches = options::serve_command().try_get_matches_from(argv).unwrap();
    ServeArgs::from_arg_matches(&matches).unwrap()
}

#[test]
fn switches_merge_with_the_command_line_winning() {
    for (argv, file, want) in [
        (&[][..], None, false),
        (&[][..], Some(true), true),
        (&[][..], Some(false), false),
        (&["--autoindex"][..], None, true),
        (&["--autoindex"][..], Some(false), true),
        (&["--no-autoindex"][..], Some(true), false),
        (&["--no-autoindex"][..], None, false),
        (&["--autoindex", "--no-autoindex"][..], Some(true), false),
        (&["--no-autoindex", "--autoindex"][..], Some(false), true),
    ] {
        let args = serve_args(argv);
        assert_eq!(args.options.fold_switches().autoindex.or(file).unwrap_or(false), want, "{argv:?} over {file:?}");
        // The same flags spelled for dotfiles behave the same.
        let dot: Vec<String> = argv.iter().map(|a| a.replace("autoindex", "dotfiles")).collect();
        let dot: Vec<&str> = dot.iter().map(String::as_str).collect();
        assert_eq!(
            serve_args(&dot).options.fold_switches().dotfiles.or(file).unwrap_or(false),
            want,
            "{dot:?} over {file:?}"
        );
    }
}

#[test]
fn switches_from_file_are_overridden_by_no_flags() {
    let (_dir, cfg) = config_file(&[], "autoindex = true\ndotfiles = true\n");
    let path = cfg.to_str().unwrap();
    let c = Config::from_args(serve_args(&["--config", path])).unwrap();
    assert!(c.autoindex && c.dotfiles);
    let c = Config::from_args(serve_args(&["--config", path, "--no-autoindex", "--no-dotfiles"])).unwrap();
    assert!(!c.autoindex && !c.dotfiles);
}

/// Relative paths in the file resolve against the file's directory; on the command
/// line they stay relative, i.e. against the working directory.
#[test]
fn relative_paths_resolve_against_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("conf");
    std::fs::create_dir_all(conf.join("www")).unwrap();
    let cfg = conf.join("ktlsd.toml");
    std::fs::write(
        &cfg,
        concat!(
            "root = \"www\"\n",
            "cert = \"tls/cert.pem\"\nkey = \"tls/key.pem\"\n",
            "access_log = \"logs/access.log\"\n",
            "state_dir = \"state\"\n",
            "ticket_keys = [\"t/a.key\", \"/abs/b.key\"]\n",
        ),
    )
    .unwrap();
    let f = load(&cfg).unwrap();
    assert_eq!(f.root, Some(conf.join("www")));
    assert_eq!(f.cert, Some(conf.join("tls/cert.pem")));
    assert_eq!(f.key, Some(conf.join("tls/key.pem")));
    assert_eq!(f.access_log, Some(conf.join("logs/access.log").to_string_lossy().into_owned()));
    assert_eq!(f.state_dir, Some(conf.join("state")));
    assert_eq!(f.ticket_keys, Some(vec![conf.join("t/a.key"), PathBuf::from("/abs/b.key")]));

    let mut f = Options { access_log: Some("-".into()), ..Default::default() };
    resolve_paths(&mut f, &conf);
    assert_eq!(f.access_log.as_deref(), Some("-"));
    let mut f = Options { access_log: Some("off".into()), state_dir: Some("/var/x".into()), ..Default::default() };
    resolve_paths(&mut f, &conf);
    assert_eq!((f.access_log.as_deref(), f.state_dir), (Some("off"), Some(PathBuf::from("/var/x"))));

    // The command line's relative paths are the working directory's.
    let cfg_s = cfg.to_str().unwrap();
    let c = Config::from_args(serve_args(&[
        "--config",
        cfg_s,
        "--access-log",
        "cli.log",
        "--state-dir",
        "st",
        "--ticket-keys",
        "k1",
        "--ticket-keys",
        "k2",
    ]))
    .unwrap();
    assert_eq!(c.access_log, AccessLogTarget::File(PathBuf::from("cli.log")));
    assert_eq!(c.state_dir, Some(PathBuf::from("st")));
    assert_eq!(c.ticket_keys, [PathBuf::from("k1"), PathBuf::from("k2")]);
    let c = Config::from_args(serve_args(&["--config", cfg_s, "--ephemeral-cert"])).unwrap();
    assert_eq!(c.access_log, AccessLogTarget::File(conf.join("logs/access.log")));
    assert_eq!(c.state_dir, Some(conf.join("state")));
    assert!(c.ephemeral_cert);
    assert_eq!(c.root, conf.join("www").canonicalize().unwrap());
}

/// `[default: X]` in each flag's help is what the configuration really defaults to.
#[test]
fn help_states_the_real_defaults() {
    let serve = options::serve_command();
    let default_of = |id: &str| -> String {
        let arg = serve.get_arguments().find(|a| a.get_id() == id).unwrap_or_else(|| panic!("no {id}"));
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        let start = help.find("[default: ").unwrap_or_else(|| panic!("{id}: no default in {help:?}")) + 10;
        help[start..help.len() - 1].to_string()
    };
    let c = Config::from_args(ServeArgs::default()).unwrap();
    for (id, got) in [
        ("handshake_timeout", c.timeouts.handshake),
        ("header_timeout", c.timeouts.header),
        ("idle_timeout", c.timeouts.idle),
        ("send_timeout", c.timeouts.send),
        ("shutdown_timeout", c.timeouts.shutdown),
    ] {
        assert_eq!(parse_duration(&default_of(id)), Some(got), "{id}");
    }
    assert_eq!(default_of("max_header_bytes"), c.limits.max_header_bytes.to_string());
    assert_eq!(default_of("max_body_bytes"), c.limits.max_body_bytes.to_string());
    assert_eq!(default_of("listen").parse::<SocketAddr>().ok(), Some(c.listen[0]));
    assert_eq!(c.ktls, KtlsMode::Auto);
    assert_eq!(default_of("ktls"), "auto");
    assert_eq!(c.tls_versions, [TlsVersion::Tls12, TlsVersion::Tls13]);
    assert_eq!(default_of("tls_versions"), "1.2,1.3");
    assert_eq!(default_of("record_size").parse::<RecordPolicy>().ok(), Some(c.record_policy));
    assert_eq!(c.tcp.notsent_lowat, None);
    assert!(default_of("tcp_notsent_lowat").contains(&ADAPTIVE_NOTSENT_LOWAT.to_string()));
    assert!(!c.autoindex && !c.dotfiles);
    assert_eq!((default_of("autoindex").as_str(), default_of("dotfiles").as_str()), ("off", "off"));
    assert_eq!(c.access_log, AccessLogTarget::Stdout);
    assert_eq!(default_of("access_log"), "-");
    assert!(!c.ephemeral_cert && c.ticket_keys.is_empty());
    assert_eq!(default_of("ephemeral_cert"), "off");
    assert!(default_of("state_dir").contains("/var/lib/ktlsd"));
    assert!(c.http_listen.is_empty() && c.hsts.is_none());
    assert_eq!((default_of("http_listen").as_str(), default_of("hsts").as_str()), ("none", "none"));
    assert_eq!((c.user.as_deref(), c.group.as_deref(), c.allow_root), (None, None, false));
    assert_eq!((default_of("user").as_str(), default_of("allow_root").as_str()), ("none", "off"));
    assert_eq!((c.unknown_sni, default_of("unknown_sni").as_str()), (UnknownName::Default, "default"));
    assert!(c.sites.is_empty());
}

#[test]
fn content_options_are_per_site_over_the_top_level() {
    use crate::handler::request::Coding;
    let (_dir, cfg) = config_file(
        &["www", "a", "b"],
        concat!(
            "root = \"www\"\nprecompressed = [\"gzip\"]\nfallback = \"/index.html\"\n",
            "[mime_types]\nmd = \"text/markdown\"\n",
            "[[site]]\nnames = [\"a.test\"]\nroot = \"a\"\n",
            "[[site]]\nnames = [\"b.test\"]\nroot = \"b\"\nprecompressed = [\"br\", \"none\", \"br\"]\nerror_page = { 404 = \"/e.html\" }\n",
        ),
    );
    let c = Config::from_args(serve_args(&["--config", cfg.to_str().unwrap()])).unwrap();
    assert_eq!(c.content.precompressed, [Coding::Gzip]);
    assert_eq!(c.content.fallback.as_deref(), Some("/index.html"));
    let (a, b) = (&c.sites[0].content, &c.sites[1].content);
    assert_eq!(a, &c.content, "a site without the keys takes the top level's");
    assert_eq!(b.precompressed, [Coding::Br], "its own list, `none` skipped, once each");
    assert_eq!(b.locations.site().error_pages, [(404, "/e.html".to_string())]);
    assert_eq!((b.fallback.as_deref(), b.mime_types.len()), (Some("/index.html"), 1));
    // The command line sets the top level.
    let c = Config::from_args(serve_args(&["--config", cfg.to_str().unwrap(), "--precompressed", "zstd,br"])).unwrap();
    assert_eq!(c.content.precompressed, [Coding::Zstd, Coding::Br]);
    assert_eq!(c.sites[0].content.precompressed, [Coding::Zstd, Coding::Br]);
    assert_eq!(c.sites[1].content.precompressed, [Coding::Br]);
}

#[test]
fn header_rules_and_cors_are_per_site() {
    use crate::handler::rules::{Cors, PathMatch};
    let (_dir, cfg) = config_file(
        &["www", "a", "b"],
        concat!(
            "root = \"www\"\ncors = \"*\"\n",
            "[[headers]]\nextensions = [\"CSS\"]\nexpires = \"1h\"\n",
            "[[site]]\nnames = [\"a.test\"]\nroot = \"a\"\n",
            "[[site]]\nnames = [\"b.test\"]\nroot = \"b\"\ncors = [\"https://B.example\"]\n",
            "[[site.headers]]\npath = \"/x/**\"\nset = { \"X-A\" = \"1\" }\n",
        ),
    );
    let c = Config::from_args(serve_args(&["--config", cfg.to_str().unwrap()])).unwrap();
    assert_eq!(c.content.cors, Some(Cors::Any));
    assert_eq!(c.content.headers[0].paths, PathMatch::Extensions(vec!["css".into()]));
    assert_eq!(c.content.headers[0].expires, Some(std::time::Duration::from_secs(3600)));
    let (a, b) = (&c.sites[0].content, &c.sites[1].content);
    assert_eq!(a, &c.content, "a site without the keys takes the top level's");
    assert_eq!(b.cors, Some(Cors::Origins(vec!["https://b.example".into()])));
    assert_eq!(b.headers.len(), 1, "a site's list replaces the top level's");
    assert_eq!(
        (&b.headers[0].paths, &b.headers[0].set[..]),
        (
            &PathMatch::Pattern(crate::handler::pattern::PathPattern::new("/x/**").unwrap()),
            &[("X-A".to_string(), "1".to_string())][..]
        )
    );
    // The command line sets the top level.
    let c = Config::from_args(serve_args(&[
        "--config",
        cfg.to_str().unwrap(),
        "--header",
        "*.js=Cache-Control: no-cache",
        "--cors",
        "https://c.example",
    ]))
    .unwrap();
    assert_eq!(c.content.headers[0].set, [("Cache-Control".to_string(), "no-cache".to_string())]);
    assert_eq!(c.sites[0].content.cors, Some(Cors::Origins(vec!["https://c.example".into()])));
    assert_eq!(
        c.sites[1].content.headers[0].paths,
        PathMatch::Pattern(crate::handler::pattern::PathPattern::new("/x/**").unwrap())
    );
}

#[test]
fn admin_addresses() {
    // (flags, Ok(address) or Err(part of the message))
    type Want = Result<Option<&'static str>, &'static str>;
    let table: [(&[&str], Want); 9] = [
        (&[], Ok(None)),
        (&["--admin", "off"], Ok(None)),
        (&["--admin", "127.0.0.1:9443"], Ok(Some("127.0.0.1:9443"))),
        (&["--admin", "[::1]:9443"], Ok(Some("[::1]:9443"))),
        (&["--admin", "/run/ktlsd/admin.sock"], Ok(Some("/run/ktlsd/admin.sock"))),
        (&["--admin", "0.0.0.0:9443"], Err("not a loopback address")),
        (&["--admin", "0.0.0.0:9443", "--admin-public"], Ok(Some("0.0.0.0:9443"))),
        (&["--admin", "localhost:9443"], Err("neither IP:PORT")),
        (&["--admin", "127.0.0.1:8443", "--listen", "127.0.0.1:8443"], Err("also a listen")),
    ];
    for (flags, want) in table {
        let mut args = vec!["--ephemeral-cert"];
        args.extend_from_slice(flags);
        match (Config::from_args(serve_args(&args)), want) {
            (Ok(c), Ok(w)) => assert_eq!(c.admin.map(|a| a.to_string()).as_deref(), w, "{flags:?}"),
            (Err(e), Err(w)) => {
                assert!(e.to_string().contains(w), "{flags:?}: {e}");
                assert!(!e.to_string().contains('\n'));
            }
            (got, w) => panic!("{flags:?}: got {got:?}, want {w:?}"),
        }
    }
}

#[test]
fn choices_read_as_on_the_command_line() {
    for (toml, want) in [
        ("ktls = \"off\"", Ok(())),
        ("unknown_sni = \"refuse\"\naccess_log_format = \"json\"\nhttp2 = false", Ok(())),
        ("ktls = \"bogus\"", Err("ktls \"bogus\": expected auto, on or off")),
        ("unknown_sni = \"maybe\"", Err("unknown_sni \"maybe\": expected default or refuse")),
        ("access_log_format = \"xml\"", Err("access_log_format \"xml\": expected ktlsd, combined, json or custom")),
        ("bogus = 1", Err("unknown field `bogus`")),
    ] {
        match (toml::from_str::<Options>(toml), want) {
            (Ok(_), Ok(())) => {}
            (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{toml}: {e}"),
            (Ok(_), Err(w)) => panic!("{toml}: accepted, want {w:?}"),
            (Err(e), Ok(())) => panic!("{toml}: {e}"),
        }
    }
}

#[test]
fn log_level_from_the_command_line_over_the_file() {
    use options::LogLevel;
    let (_dir, cfg) = config_file(&[], "log_level = \"warn\"\n");
    let cfg = cfg.to_str().unwrap();
    for (argv, want) in [
        (&[][..], LogLevel::Info),
        (&["--log-level", "debug"][..], LogLevel::Debug),
        (&["--config", cfg][..], LogLevel::Warn),
        (&["--config", cfg, "--log-level", "trace"][..], LogLevel::Trace),
        (&["--config", "/nonexistent.toml"][..], LogLevel::Info),
    ] {
        assert_eq!(log_level(&serve_args(argv)), want, "{argv:?}");
    }
    assert!(options::serve_command().try_get_matches_from(["serve", "--log-level", "loud"]).is_err());
}
