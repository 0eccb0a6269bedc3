//! `${VAR}` in the configuration file's string values, replaced by the environment's value
//! before the values are read (as in Caddy's and docker-compose's files); `$${` writes a
//! literal `${`. An unset variable is an error naming it and the key. Also the one
//! placeholder that stands for a secret in printed configuration ([`REDACTED`]).
//!
//! Not a shell: no defaults (`${VAR:-x}`), no `$VAR` without braces, nothing in keys, numbers or
//! booleans.

/// What `ktlsd config` prints in place of a secret.
pub const REDACTED: &str = "<redacted>";

/// Replaces `${VAR}` in every string of `table` (in arrays and nested tables too) with
/// `lookup(VAR)`. Errors name the key (dotted) and the variable.
pub fn substitute_table(table: &mut toml::Table, lookup: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
    for (key, value) in table.iter_mut() {
        substitute_value(value, key, lookup)?;
    }
    Ok(())
}

fn substitute_value(value: &mut toml::Value, at: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
    match value {
        toml::Value::String(s) if s.contains('$') => {
            *s = substitute(s, lookup).map_err(|why| format!("{at}: {why}"))?;
        }
        toml::Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                substitute_value(item, &format!("{at}[{i}]"), lookup)?;
            }
        }
        toml::Value::Table(t) => {
            for (key, item) in t.iter_mut() {
                substitute_value(item, &format!("{at}.{key}"), lookup)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The environment's value of `name`, for [`substitute_table`].
pub fn from_environment(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// `text` with each `${NAME}` replaced and each `$${` made `${`.
pub fn substitute(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("${") {
            let Some(end) = tail.find('}') else {
                return Err(format!("\"${{\" without its closing \"}}\" in {text:?} (write $${{ for a literal ${{)"));
            };
            let name = &tail[..end];
            if !is_name(name) {
                return Err(format!(
                    "${{{name}}}: expected an environment variable name (letters, digits and _, not starting with a digit)"
                ));
            }
            match lookup(name) {
                Some(value) => out.push_str(&value),
                None => return Err(format!("environment variable {name} is not set (or is not UTF-8)")),
            }
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOME_DIR" => Some("/srv/www".into()),
            "EMPTY" => Some(String::new()),
            "DOLLAR" => Some("${HOME_DIR}".into()),
            _ => None,
        }
    }

    #[test]
    fn substitution() {
        for (text, want) in [
            ("plain", Ok("plain")),
            ("${HOME_DIR}/site", Ok("/srv/www/site")),
            ("a${EMPTY}b${HOME_DIR}", Ok("ab/srv/www")),
            ("$${HOME_DIR}", Ok("${HOME_DIR}")),
            ("$$${HOME_DIR}", Ok("$${HOME_DIR}")),
            ("cost $5, $HOME_DIR", Ok("cost $5, $HOME_DIR")),
            ("${DOLLAR}", Ok("${HOME_DIR}")), // values are not substituted again
            ("trailing $", Ok("trailing $")),
            ("${UNSET_ONE}", Err("environment variable UNSET_ONE is not set")),
            ("${HOME_DIR", Err("without its closing")),
            ("${}", Err("expected an environment variable name")),
            ("${1X}", Err("expected an environment variable name")),
            ("${A-B}", Err("expected an environment variable name")),
        ] {
            match (substitute(text, &env), want) {
                (Ok(got), Ok(w)) => assert_eq!(got, w, "{text}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{text}: {e}"),
                (got, w) => panic!("{text}: got {got:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn every_string_of_the_table_and_errors_name_the_key() {
        let mut table: toml::Table = toml::from_str(
            "root = \"${HOME_DIR}\"\nworkers = 2\nlisten = [\"a\", \"${HOME_DIR}\"]\n[[site]]\nroot = \"${HOME_DIR}/b\"\n",
        )
        .expect("TOML");
        substitute_table(&mut table, &env).expect("substituted");
        assert_eq!(table["root"].as_str(), Some("/srv/www"));
        assert_eq!(table["listen"][1].as_str(), Some("/srv/www"));
        assert_eq!(table["site"][0]["root"].as_str(), Some("/srv/www/b"));
        assert_eq!(table["workers"].as_integer(), Some(2));

        let mut table: toml::Table = toml::from_str("[[site]]\nacme = { email = \"${NOPE}\" }\n").expect("TOML");
        let e = substitute_table(&mut table, &env).expect_err("unset");
        assert!(e.starts_with("site[0].acme.email: environment variable NOPE is not set"), "{e}");
    }
}
