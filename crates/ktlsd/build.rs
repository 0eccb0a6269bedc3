//! Build script: names the commit the binary is built from, for `ktlsd --version`.
//!
//! `KTLSD_COMMIT` is `git rev-parse --short HEAD` of the source tree, or `unknown`
//! when it is not a git checkout (a source tarball) or git is missing. It does nothing else.

use std::process::Command;

fn main() {
    let git = |args: &[&str]| {
        let out = Command::new("git").args(args).output().ok().filter(|o| o.status.success())?;
        let text = String::from_utf8(out.stdout).ok()?;
        Some(text.trim().to_string()).filter(|t| !t.is_empty())
    };
    let commit = git(&["rev-parse", "--short=10", "HEAD"]).unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=KTLSD_COMMIT={commit}");
    // A new commit moves HEAD (or the branch it names): build again to name it.
    for file in ["HEAD", "logs/HEAD"] {
        if let Some(path) = git(&["rev-parse", "--git-path", file]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
