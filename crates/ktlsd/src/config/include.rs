//! Reading the configuration file and the files it includes (`include = ["sites/*.toml"]`,
//! as nginx's `include` and Caddy's `import`) into one set of [`Options`].
//!
//! Each file is parsed, its `${VAR}`s replaced ([`super::env`]), its relative paths made
//! relative to its own directory, then its includes read in order (a glob's matches sorted
//! by name). `[[site]]` blocks add up; any other top-level key may be set by one file only,
//! and a second one is an error naming both files. An include loop is an error naming the
//! chain; a glob that matches nothing adds nothing; a plain path that does not exist is an
//! error. This module does not validate values: [`super::Config`] does, over the merged result.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use super::options::Options;
use super::{err, ConfigError};

/// Reads `path` and everything it includes; `lookup` gives `${VAR}`s their values.
pub fn load(path: &Path, lookup: &dyn Fn(&str) -> Option<String>) -> Result<Options, ConfigError> {
    let mut reading = Reading { chain: Vec::new(), owner: BTreeMap::new(), lookup, merged: Options::default() };
    reading.file(path)?;
    Ok(reading.merged)
}

struct Reading<'a> {
    /// The files being read, outermost first, canonical: an include loop shows here.
    chain: Vec<PathBuf>,
    /// Which file set each top-level key (but `site` and `include`).
    owner: BTreeMap<String, PathBuf>,
    lookup: &'a dyn Fn(&str) -> Option<String>,
    merged: Options,
}

impl Reading<'_> {
    fn file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => return err(format!("cannot read config file {}: {e}", path.display())),
        };
        let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        if self.chain.contains(&canonical) {
            let chain: Vec<String> = self.chain.iter().chain([&canonical]).map(|p| p.display().to_string()).collect();
            return err(format!(
                "config file include loop: {}; remove one of these includes",
                chain.join(" includes ")
            ));
        }
        let table = table(path, &text, self.lookup)?;
        // Each file has its own includes; sites add up.
        for key in table.keys().filter(|k| *k != "site" && *k != "include") {
            if let Some(first) = self.owner.insert(key.clone(), path.to_path_buf()) {
                return err(format!(
                    "config key {key} is set in both {} and {}; set it in one file",
                    first.display(),
                    path.display()
                ));
            }
        }
        let mut file = options(path, &text, table)?;
        let base = path.parent().unwrap_or(Path::new("."));
        super::resolve_paths(&mut file, base);
        let includes = file.include.take().unwrap_or_default();
        let sites = file.site.take();
        if let Some(sites) = sites {
            self.merged.site.get_or_insert_with(Vec::new).extend(sites);
        }
        self.merged = std::mem::take(&mut self.merged).or(file);
        self.chain.push(canonical);
        for pattern in &includes {
            for included in expand(base, pattern).map_err(|why| {
                ConfigError::new(format!("config file {}: include {pattern:?}: {why}", path.display()))
            })? {
                self.file(&included)?;
            }
        }
        self.chain.pop();
        Ok(())
    }
}

/// The TOML text of the file at `path`, parsed, its `${VAR}`s replaced through `lookup`.
pub(crate) fn table(
    path: &Path,
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<toml::Table, ConfigError> {
    let mut table: toml::Table = toml::from_str(text).map_err(|e| syntax_error(path, text, &e))?;
    super::env::substitute_table(&mut table, lookup)
        .map_err(|why| ConfigError::new(format!("config file {}: {why}", path.display())))?;
    Ok(table)
}

/// The options `table` (from [`table`] over `text`, the file at `path`) sets; paths and
/// includes as written.
pub(crate) fn options(path: &Path, text: &str, table: toml::Table) -> Result<Options, ConfigError> {
    match Options::deserialize(toml::Value::Table(table)) {
        Ok(file) => Ok(file),
        // The raw text again, for the error's line and column when it has them.
        Err(e) => match toml::from_str::<Options>(text) {
            Err(with_span) if with_span.span().is_some() => Err(syntax_error(path, text, &with_span)),
            _ => err(format!("config file {}: {}", path.display(), e.message().trim().replace('\n', " "))),
        },
    }
}

/// One line: the file, where, then what (toml's own rendering spans several lines).
fn syntax_error(path: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
    let at = e.span().map(|s| {
        let before = &text[..s.start.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        format!(" line {line}, column {col}:")
    });
    ConfigError::new(format!(
        "config file {}:{} {}",
        path.display(),
        at.unwrap_or_default(),
        e.message().trim().replace('\n', " ")
    ))
}

fn is_glob(s: &str) -> bool {
    s.contains(['*', '?', '[', '{'])
}

/// The files `pattern` (relative to `base`) names: itself when it has no glob characters
/// (it must exist), else its matches sorted by name, each component matched on its own
/// (`*` does not cross `/`; names starting with a dot only when the pattern's does).
fn expand(base: &Path, pattern: &str) -> Result<Vec<PathBuf>, String> {
    let full = base.join(pattern);
    if !is_glob(pattern) {
        return match std::fs::metadata(&full) {
            Ok(m) if m.is_file() => Ok(vec![full]),
            Ok(_) => Err(format!("{} is not a file", full.display())),
            Err(e) => Err(format!("{}: {e}", full.display())),
        };
    }
    let mut found = vec![PathBuf::new()];
    for component in full.components() {
        let name = match component {
            Component::Normal(name) => name.to_string_lossy(),
            other => {
                found.iter_mut().for_each(|p| p.push(other));
                continue;
            }
        };
        if !is_glob(&name) {
            found.iter_mut().for_each(|p| p.push(&*name));
            continue;
        }
        let glob = globset::GlobBuilder::new(&name)
            .literal_separator(true)
            .build()
            .map_err(|e| format!("not a glob: {e}"))?
            .compile_matcher();
        let mut next = Vec::new();
        for dir in &found {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| glob.is_match(n) && (!n.starts_with('.') || name.starts_with('.')))
                .collect();
            names.sort();
            next.extend(names.into_iter().map(|n| dir.join(n)));
        }
        found = next;
    }
    Ok(found.into_iter().filter(|p| p.is_file()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temporary directory");
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, text).expect("write");
        }
        dir
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn includes() {
        let site = |n: &str| format!("[[site]]\nnames = [\"{n}.test\"]\nroot = \"www/{n}\"\n");
        // The files (name, text) and the sites' first names read, or an error's words.
        type Case<'a> = (Vec<(&'a str, String)>, Result<Vec<&'a str>, &'a str>);
        let table: Vec<Case> = vec![
            // Sites add up in order: the including file's, then each match by name.
            (
                vec![
                    ("main.toml", format!("include = [\"sites/*.toml\"]\n{}", site("m"))),
                    ("sites/b.toml", site("b")),
                    ("sites/a.toml", format!("workers = 2\n{}", site("a"))),
                    ("sites/.hidden.toml", site("h")),
                    ("sites/c.toml.disabled", site("c")),
                ],
                Ok(vec!["m.test", "a.test", "b.test"]),
            ),
            (vec![("main.toml", "include = [\"none/*.toml\"]\n".into())], Ok(vec![])),
            (vec![("main.toml", "include = [\"missing.toml\"]\n".into())], Err("include \"missing.toml\": ")),
            (
                vec![("main.toml", "include = [\"a.toml\"]\nworkers = 1\n".into()), ("a.toml", "workers = 2\n".into())],
                Err("config key workers is set in both "),
            ),
            (
                vec![
                    ("main.toml", "include = [\"a.toml\"]\n".into()),
                    ("a.toml", "include = [\"main.toml\"]\n".into()),
                ],
                Err("include loop: "),
            ),
            (
                vec![("main.toml", "include = [\"a.toml\"]\n".into()), ("a.toml", "bogus = 1\n".into())],
                Err("a.toml: line 1, column 1: unknown field `bogus`"),
            ),
            (
                vec![("main.toml", "include = [\"a.toml\"]\n".into()), ("a.toml", "workers = [\n".into())],
                Err("a.toml: line 1, column 12: unclosed array"),
            ),
            (vec![("main.toml", "include = [\"[z\"]\n".into())], Err("not a glob")),
        ];
        for (files, want) in table {
            let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
            let dir = tree(&files);
            let got = load(&dir.path().join("main.toml"), &no_env);
            match (got, want) {
                (Ok(o), Ok(names)) => {
                    let got: Vec<String> = o.site.unwrap_or_default().iter().map(|s| s.names[0].clone()).collect();
                    assert_eq!(got, names, "{files:?}");
                }
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{files:?}: {e}"),
                (got, w) => panic!("{files:?}: got {got:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn paths_are_relative_to_their_own_file_and_variables_are_replaced() {
        let dir = tree(&[
            ("main.toml", "include = [\"conf.d/*.toml\"]\nroot = \"${WWW}\"\n"),
            (
                "conf.d/a.toml",
                "[[site]]\nnames = [\"a.test\"]\nroot = \"a\"\ncert = \"${WWW}/c.pem\"\nkey = \"k.pem\"\n",
            ),
        ]);
        let env = |n: &str| (n == "WWW").then(|| "www".to_string());
        let o = load(&dir.path().join("main.toml"), &env).expect("loads");
        assert_eq!(o.root, Some(dir.path().join("www")));
        let site = &o.site.as_ref().expect("sites")[0];
        assert_eq!(site.root, dir.path().join("conf.d/a"));
        assert_eq!(site.cert, Some(dir.path().join("conf.d/www/c.pem")));
        assert_eq!(site.key, Some(dir.path().join("conf.d/k.pem")));
        let e = load(&dir.path().join("main.toml"), &no_env).expect_err("unset");
        assert!(e.to_string().contains("main.toml: root: environment variable WWW is not set"), "{e}");
    }
}
