//! Password files in Apache's htpasswd format (`user:hash`, one a line), limited
//! to the hashes that resist offline guessing: bcrypt (`$2y$`, `$2b$`, `$2a$`, as
//! `htpasswd -B` writes) and argon2 (`$argon2id$`, `$argon2i$`). Plaintext,
//! MD5-crypt (`$apr1$`, `$1$`), SHA-1 (`{SHA}`), SHA-crypt and DES crypt are
//! refused when the file is read, naming the line.
//!
//! Verification compares in constant time (the `bcrypt` and `argon2` crates'
//! own comparisons), and a name the file lacks still costs one verification, so
//! the time of an answer does not tell which names exist. Passwords that were
//! verified are remembered (a bounded set of salted SHA-256 digests of the
//! credentials), so a browser's repeated requests cost one hash each, not one
//! per request. This module does not answer requests (see [`super::auth`]).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Mutex;

use argon2::PasswordVerifier;

/// Highest bcrypt cost accepted: each step doubles the work of every verification.
const MAX_BCRYPT_COST: u32 = 14;
/// Most argon2 memory accepted, in KiB (each verification allocates it).
const MAX_ARGON2_KIB: u32 = 256 * 1024;
/// Most argon2 lanes accepted (the parallelism `p`; `htpasswd` tools write 1 to 4).
const MAX_ARGON2_LANES: u32 = 255;
/// Most argon2 passes accepted.
const MAX_ARGON2_PASSES: u32 = 16;
/// Credentials remembered as verified; the set starts afresh when full.
const VERIFIED_CAPACITY: usize = 1024;

/// A password hash of a supported kind, checked when read.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Hash {
    Bcrypt(String),
    Argon2(String),
}

impl Hash {
    /// Whether `password` matches, in constant time for a given hash.
    fn verify(&self, password: &[u8]) -> bool {
        match self {
            Hash::Bcrypt(h) => bcrypt::verify(password, h).unwrap_or(false),
            Hash::Argon2(h) => argon2::PasswordHash::new(h)
                .map(|parsed| argon2::Argon2::default().verify_password(password, &parsed).is_ok())
                .unwrap_or(false),
        }
    }
}

/// The users of one htpasswd file.
#[derive(Debug)]
pub struct Users {
    users: HashMap<String, Hash>,
    /// Verified against for names the file lacks (a user's hash: the same cost).
    dummy: Hash,
    /// Salted digests of credentials verified since the file was read.
    verified: Mutex<HashSet<[u8; 32]>>,
    salt: [u8; 16],
}

impl PartialEq for Users {
    fn eq(&self, other: &Users) -> bool {
        self.users == other.users
    }
}

impl Eq for Users {}

impl Users {
    /// Reads and checks the file at `path`; the error names the file and the line.
    pub fn load(path: &Path) -> Result<Users, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the htpasswd file {}: {e}", path.display()))?;
        Users::parse(&text).map_err(|e| format!("htpasswd file {}: {e}", path.display()))
    }

    /// Parses the text of an htpasswd file: `user:hash` lines, blank lines and `#` comments.
    pub fn parse(text: &str) -> Result<Users, String> {
        let mut users = HashMap::new();
        let mut first = None;
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.trim_end_matches('\r').trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((user, hash)) = line.split_once(':') else {
                return Err(format!("line {n}: expected user:hash"));
            };
            if user.is_empty() {
                return Err(format!("line {n}: the user name is empty"));
            }
            // Apache's files may carry further fields after the hash.
            let hash = hash.split(':').next().unwrap_or("");
            let hash = parse_hash(hash).map_err(|why| format!("line {n} (user {user}): {why}"))?;
            first.get_or_insert_with(|| hash.clone());
            if users.insert(user.to_string(), hash).is_some() {
                return Err(format!("line {n}: user {user} is listed twice"));
            }
        }
        let Some(dummy) = first else { return Err("no users (expected user:hash lines)".into()) };
        let mut salt = [0u8; 16];
        aws_lc_rs::rand::fill(&mut salt).map_err(|_| "the system's random generator failed".to_string())?;
        Ok(Users { users, dummy, verified: Mutex::new(HashSet::new()), salt })
    }

    /// Whether `user` with `password` is in the file. A name it lacks costs one
    /// verification against another user's hash, whose answer is ignored.
    pub fn check(&self, user: &str, password: &[u8]) -> bool {
        let digest = self.digest(user, password);
        let remembered = self.verified.lock().map(|set| set.contains(&digest)).unwrap_or(false);
        if remembered {
            return true;
        }
        let ok = match self.users.get(user) {
            Some(hash) => hash.verify(password),
            None => {
                let _ = self.dummy.verify(password);
                false
            }
        };
        if ok {
            if let Ok(mut set) = self.verified.lock() {
                if set.len() >= VERIFIED_CAPACITY {
                    set.clear();
                }
                set.insert(digest);
            }
        }
        ok
    }

    /// SHA-256 of the salt, the user's length, the user and the password.
    fn digest(&self, user: &str, password: &[u8]) -> [u8; 32] {
        let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
        ctx.update(&self.salt);
        ctx.update(&(user.len() as u64).to_be_bytes());
        ctx.update(user.as_bytes());
        ctx.update(password);
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        out
    }
}

/// A hash of a supported kind, or why the kind is refused.
fn parse_hash(hash: &str) -> Result<Hash, String> {
    const ADVICE: &str = "use bcrypt (htpasswd -B) or argon2id";
    if hash.starts_with("$2y$") || hash.starts_with("$2b$") || hash.starts_with("$2a$") {
        let parts: bcrypt::HashParts = hash.parse().map_err(|e| format!("malformed bcrypt hash: {e}"))?;
        if parts.get_cost() > MAX_BCRYPT_COST {
            return Err(format!(
                "bcrypt cost {} is over {MAX_BCRYPT_COST}: every request would take seconds",
                parts.get_cost()
            ));
        }
        return Ok(Hash::Bcrypt(hash.to_string()));
    }
    if hash.starts_with("$argon2id$") || hash.starts_with("$argon2i$") {
        let parsed = argon2::PasswordHash::new(hash).map_err(|e| format!("malformed argon2 hash: {e}"))?;
        // Bounded before the argon2 crate reads them: its own check multiplies p by 8
        // unchecked, which overflows for a p past 2^29.
        let [m, t, p] = ["m", "t", "p"].map(|name| parsed.params.get_decimal(name).unwrap_or(0));
        if m > MAX_ARGON2_KIB || t > MAX_ARGON2_PASSES || p > MAX_ARGON2_LANES {
            return Err(format!(
                "argon2 parameters m={m} t={t} p={p} are over m={MAX_ARGON2_KIB} t={MAX_ARGON2_PASSES} p={MAX_ARGON2_LANES}"
            ));
        }
        argon2::Params::try_from(&parsed).map_err(|e| format!("argon2 parameters: {e}"))?;
        return Ok(Hash::Argon2(hash.to_string()));
    }
    let kind = if hash.starts_with("$apr1$") || hash.starts_with("$1$") {
        "an MD5-crypt hash"
    } else if hash.starts_with("{SHA}") {
        "a SHA-1 hash"
    } else if hash.starts_with("$5$") || hash.starts_with("$6$") {
        "a SHA-crypt hash"
    } else if hash.starts_with("$argon2d$") {
        "an argon2d hash"
    } else if hash.starts_with('$') {
        "a hash of an unknown kind"
    } else {
        "plaintext or a DES crypt hash"
    };
    Err(format!("{kind} is refused; {ADVICE}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `htpasswd -nbB -C 4 alice secret`.
    const ALICE: &str = "alice:$2y$04$xv3tiIRfQ2/K60COWsW03eSiLkHaf8h7g8msiH5r7gkzEJBAdn73e";

    fn argon2_line(user: &str, password: &str) -> String {
        use argon2::password_hash::{PasswordHasher, SaltString};
        let salt = SaltString::encode_b64(b"0123456789abcdef").expect("salt");
        let params = argon2::Params::new(8, 1, 1, None).expect("params");
        let a = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        format!("{user}:{}", a.hash_password(password.as_bytes(), &salt).expect("hash"))
    }

    #[test]
    fn refused_kinds_name_their_line() {
        for (text, want) in [
            ("bob:$apr1$abc$def", "line 1 (user bob): an MD5-crypt hash is refused"),
            ("# c\n\nbob:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=", "line 3 (user bob): a SHA-1 hash is refused"),
            ("bob:secret", "line 1 (user bob): plaintext or a DES crypt hash is refused"),
            ("bob:$6$salt$hash", "line 1 (user bob): a SHA-crypt hash is refused"),
            ("bob:$1$salt$hash", "MD5-crypt"),
            ("bob:$argon2d$v=19$m=8,t=1,p=1$c2FsdHNhbHQ$aGFzaA", "argon2d"),
            ("bob:$2y$04$short", "malformed bcrypt hash"),
            ("bob:$2y$31$xv3tiIRfQ2/K60COWsW03eSiLkHaf8h7g8msiH5r7gkzEJBAdn73e", "bcrypt cost 31 is over 14"),
            ("bob:$argon2id$v=19$m=8,t=1,p=1$!!$!!", "malformed argon2 hash"),
            // A p past 2^29 overflowed the argon2 crate's own check (found by the htpasswd fuzz target).
            (
                "bob:$argon2id$v=19$m=8,t=1,p=1888888888$MDEyMzQ1Njc4OWFiY2RlZg$Cw5m1cTq7O6nYJxL0FBJbg",
                "p=1888888888 are over",
            ),
            ("bob:$argon2id$v=19$m=8,t=17,p=1$MDEyMzQ1Njc4OWFiY2RlZg$Cw5m1cTq7O6nYJxL0FBJbg", "t=17 p=1 are over"),
            ("nocolon", "line 1: expected user:hash"),
            (":$2y$04$x", "line 1: the user name is empty"),
            ("", "no users"),
            (&format!("{ALICE}\n{ALICE}"), "line 2: user alice is listed twice"),
        ] {
            let e = Users::parse(text).expect_err(text);
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn verifies_bcrypt_and_argon2() {
        let file = format!("# users\r\n{ALICE}\r\n{}\n", argon2_line("carol", "pässword"));
        let users = Users::parse(&file).expect("parses");
        for (user, password, want) in [
            ("alice", "secret", true),
            ("alice", "secret", true), // remembered
            ("alice", "Secret", false),
            ("alice", "", false),
            ("carol", "pässword", true),
            ("carol", "secret", false),
            ("mallory", "secret", false), // unknown: verified against a dummy, refused
            ("Alice", "secret", false),
        ] {
            assert_eq!(users.check(user, password.as_bytes()), want, "{user}:{password}");
        }
    }

    #[test]
    fn remembered_set_is_bounded() {
        let users = Users::parse(ALICE).expect("parses");
        for i in 0..VERIFIED_CAPACITY + 10 {
            let d = users.digest("x", i.to_string().as_bytes());
            let mut set = users.verified.lock().expect("lock");
            if set.len() >= VERIFIED_CAPACITY {
                set.clear();
            }
            set.insert(d);
        }
        assert!(users.verified.lock().expect("lock").len() <= VERIFIED_CAPACITY);
        assert!(users.check("alice", b"secret"));
    }
}
