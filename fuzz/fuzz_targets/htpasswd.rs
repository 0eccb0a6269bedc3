//! htpasswd files (`handler/htpasswd.rs`) and `Authorization: Basic` values
//! (`handler/auth.rs`). The input is the file's text, then optionally a NUL and an
//! Authorization value. Besides never panicking:
//! - the credentials ktlsd reads from a Basic value are those a standard base64
//!   decoder (the `base64` crate, padding required) reads: same user, same password,
//!   refused alike;
//! - credentials encoded by that decoder's encoder are read back as they were.
//! Passwords are not verified here: a hash's cost is the file's choice, bounded by the
//! parser (bcrypt cost 14, argon2 256 MiB), and one verification would take seconds.
#![no_main]

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use ktlsd::fuzzing::{basic_credentials, htpasswd};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (file, authorization) = text.split_once('\0').map_or((text, None), |(f, a)| (f, Some(a)));
    let _ = htpasswd(file);
    let Some(value) = authorization else { return };
    let ours = basic_credentials(value);
    let engine = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(DecodePaddingMode::RequireCanonical),
    );
    let theirs = value.trim().split_once(' ').filter(|(scheme, _)| scheme.eq_ignore_ascii_case("basic")).and_then(
        |(_, token)| {
            let decoded = engine.decode(token.trim()).ok()?;
            let colon = decoded.iter().position(|&b| b == b':')?;
            Some((String::from_utf8(decoded[..colon].to_vec()).ok()?, decoded[colon + 1..].to_vec()))
        },
    );
    assert_eq!(ours, theirs, "{value:?}");
    // The file's first line as credentials, encoded, read back.
    let (user, password) = file.split_once(':').unwrap_or((file, ""));
    if !user.contains(':') {
        let token = engine.encode(format!("{user}:{password}"));
        let got = basic_credentials(&format!("Basic {token}"));
        assert_eq!(got, Some((user.to_string(), password.as_bytes().to_vec())));
    }
});
