//! `ktlsd config`: the effective configuration printed as TOML, as `nginx -T` and
//! `caddy adapt` do: the file with its includes merged and `${VAR}`s replaced, the
//! command line's flags over it, relative paths made absolute, secrets redacted.
//!
//! It prints what was given, not defaults (each option's default is in its help and in
//! docs/configuration.md); it is not a second validator: [`super::Config`] is.

use super::options::{Options, ServeArgs};
use super::{load, resolve_paths, Config, ConfigError};

/// Validates the configuration as `serve` would, then prints it (ROOT as the canonical
/// path validation found).
pub fn print_effective(args: ServeArgs) -> anyhow::Result<()> {
    let config = Config::from_args(args.clone())?;
    print!("{}", effective(&args, &config.root)?);
    Ok(())
}

/// A short digest of the effective configuration (16 hex digits of its XXH3-64):
/// the same configuration gives the same digest, in any process. `None` when it
/// cannot be printed.
pub fn digest(args: &ServeArgs, root: &std::path::Path) -> Option<String> {
    let text = effective(args, root).ok()?;
    Some(format!("{:016x}", xxhash_rust::xxh3::xxh3_64(text.as_bytes())))
}

fn effective(args: &ServeArgs, root: &std::path::Path) -> Result<String, ConfigError> {
    let file = match &args.config {
        Some(path) => load(path)?,
        None => Options::default(),
    };
    let mut flags = args.options.clone().fold_switches();
    let cwd = std::env::current_dir().map_err(|e| ConfigError::new(format!("current directory: {e}")))?;
    resolve_paths(&mut flags, &cwd);
    let mut merged = flags.or(file);
    merged.root = Some(root.to_path_buf());
    toml::to_string(&merged).map_err(|e| ConfigError::new(format!("cannot print the configuration: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        args: ServeArgs,
    }

    #[test]
    fn prints_what_serve_reads_with_flags_over_the_file_and_secrets_redacted() {
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::create_dir(dir.path().join("www")).expect("mkdir");
        let cfg = dir.path().join("k.toml");
        std::fs::write(
            &cfg,
            "root = \"www\"\nworkers = 2\nidle_timeout = \"30s\"\nerror_page = { 404 = \"/404.html\" }\n\
             [[site]]\nnames = [\"a.test\"]\nroot = \"www\"\n\
             acme = { directory = \"https://ca.test/dir\", eab = { kid = \"kid-1\", hmac_key = \"c2VjcmV0\" } }\n",
        )
        .expect("write");
        let argv = ["x", "--config", cfg.to_str().expect("UTF-8"), "--workers", "3", "--no-autoindex"];
        let args = Args::parse_from(argv).args;
        let root = dir.path().join("www");
        let text = effective(&args, &root).expect("prints");
        assert!(text.contains("workers = 3\n"), "{text}");
        assert!(text.contains("autoindex = false\n"), "{text}");
        assert!(text.contains("idle_timeout = \"30s\"\n"), "{text}");
        assert!(text.contains(&format!("root = {:?}", dir.path().join("www").display().to_string())), "{text}");
        assert!(text.contains("hmac_key = \"<redacted>\""), "{text}");
        assert!(!text.contains("c2VjcmV0"), "{text}");
        // Read back, it is the same configuration.
        let again: Options = toml::from_str(&text).expect("reads back");
        assert_eq!(again.workers, Some(3));
        assert_eq!(again.site.map(|s| s[0].names.clone()), Some(vec!["a.test".to_string()]));
        assert_eq!(again.error_page.map(|e| e.len()), Some(1));
    }
}
