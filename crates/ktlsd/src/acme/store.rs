//! The ACME state directory: the account's credentials and one certificate file per
//! site, each written readable by the owner only (0600, directory 0700) and replaced
//! atomically, so a crash leaves the old file or the new one. Not the protocol.
//!
//! Layout: `account.<CA directory URL>.json` per CA (the directory URL and the account's
//! credentials, key included; the URL's characters other than letters, digits, `.` and `-`
//! made `_`) and `<first name>.pem` (key, then chain) per site (`*.` made `_.`). An
//! `account.json` of earlier versions is still read for its CA.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::cert::Issued;

/// The account file: credentials belong to one ACME server, so the directory URL is
/// kept with them.
#[derive(Serialize, Deserialize)]
pub struct StoredAccount {
    pub directory: String,
    pub credentials: instant_acme::AccountCredentials,
}

/// The one account file of earlier versions, whatever its CA.
const LEGACY_ACCOUNT_FILE: &str = "account.json";

/// The account file of the CA at `directory`.
pub fn account_path(dir: &Path, directory: &str) -> PathBuf {
    let url = directory.strip_prefix("https://").unwrap_or(directory);
    let safe: String =
        url.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect();
    dir.join(format!("account.{safe}.json"))
}

/// The file of the site named `names` (checked DNS names, so a safe file name; a
/// wildcard's `*` becomes `_`, which no DNS name of a site holds).
pub fn site_path(dir: &Path, names: &[String]) -> PathBuf {
    let first = names.first().map_or("site", String::as_str);
    dir.join(format!("{}.pem", first.replace('*', "_")))
}

/// The stored account for `directory`; `Ok(None)` when there is none (the caller then
/// creates one).
pub fn load_account(dir: &Path, directory: &str) -> std::io::Result<Option<StoredAccount>> {
    let path = account_path(dir, directory);
    match std::fs::read(&path) {
        Ok(bytes) => return parse_account(&path, &bytes, directory),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        Err(_) => {}
    }
    let legacy = dir.join(LEGACY_ACCOUNT_FILE);
    match std::fs::read(&legacy) {
        Ok(bytes) => parse_account(&legacy, &bytes, directory),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn parse_account(path: &Path, bytes: &[u8], directory: &str) -> std::io::Result<Option<StoredAccount>> {
    let stored: StoredAccount = serde_json::from_slice(bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not an account file: {e}")))?;
    if stored.directory != directory {
        tracing::info!(
            "{}: the account belongs to {}, not {directory}; a new account is registered",
            path.display(),
            stored.directory
        );
        return Ok(None);
    }
    Ok(Some(stored))
}

pub fn save_account(dir: &Path, account: &StoredAccount) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(account).map_err(std::io::Error::other)?;
    crate::state_file::write_private(dir, &account_path(dir, &account.directory), &json)
}

/// Why a stored certificate is not used.
#[derive(Debug, PartialEq, Eq)]
pub enum Unusable {
    Missing,
    Damaged(String),
    Expired,
    OtherNames(Vec<String>),
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unusable::Missing => f.write_str("no certificate stored yet"),
            Unusable::Damaged(why) => write!(f, "damaged: {why}"),
            Unusable::Expired => f.write_str("the certificate has expired"),
            Unusable::OtherNames(names) => write!(f, "the certificate is for other names ({})", names.join(", ")),
        }
    }
}

/// The stored certificate of the site `names`, if it covers exactly those names
/// (`sorted`, the same sorted) and is valid `now`.
pub fn load_site(
    dir: &Path,
    names: &[String],
    sorted: &[String],
    now: std::time::SystemTime,
) -> Result<Issued, Unusable> {
    let pem = match std::fs::read_to_string(site_path(dir, names)) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Unusable::Missing),
        Err(e) => return Err(Unusable::Damaged(e.to_string())),
    };
    let issued = Issued::from_pem(pem).map_err(Unusable::Damaged)?;
    let have = issued.names();
    if have != sorted {
        return Err(Unusable::OtherNames(have));
    }
    if !issued.valid_at(now) {
        return Err(Unusable::Expired);
    }
    Ok(issued)
}

pub fn save_site(dir: &Path, names: &[String], issued: &Issued) -> std::io::Result<PathBuf> {
    let path = site_path(dir, names);
    crate::state_file::write_private(dir, &path, issued.pem().as_bytes())?;
    Ok(path)
}
