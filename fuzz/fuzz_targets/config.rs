//! The configuration file (`config/`): a TOML text parsed, its `${VAR}`s replaced, and
//! validated into the server's configuration as `ktlsd check` does, with includes not
//! read and every path taken as a file of that name in a scratch directory (which holds
//! `www/`, `users`, an htpasswd file, and nothing else), so that no file elsewhere is
//! read. A mistake must be an error naming it, never a panic.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

/// The scratch directory, made once per process under `$TMPDIR`.
fn sandbox() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ktlsd-fuzz-config-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("www")).expect("scratch directory");
        std::fs::write(dir.join("users"), "alice:$2y$04$xv3tiIRfQ2/K60COWsW03eSiLkHaf8h7g8msiH5r7gkzEJBAdn73e\n")
            .expect("htpasswd file");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let vars = |name: &str| match name {
        "PORT" => Some("8443".to_string()),
        "ROOT" => Some("www".to_string()),
        "EMPTY" => Some(String::new()),
        _ => None,
    };
    if let Err(e) = ktlsd::fuzzing::config_text(sandbox(), text, &vars) {
        assert!(!e.is_empty());
    }
});
