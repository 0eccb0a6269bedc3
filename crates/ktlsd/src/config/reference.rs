//! The configuration reference, `docs/configuration.md`, generated from the schema:
//! clap's own description of `serve`'s arguments (flag, value, help, default) and the
//! keys serde reads (the TOML keys, top level and `[[site]]`).
//!
//! A test compares the file with what this module generates and says how to
//! regenerate it. Nothing here is used by the running server.

use std::fmt::Write;

use serde::Deserialize;

use super::options::{FileSite, Options, SITE_BLOCK_KEYS};

/// The reference's path, from the crate's directory.
pub const PATH: &str = "../../docs/configuration.md";

/// The keys serde reads for `T`, in declaration order: the field list a derived
/// `Deserialize` hands to its deserializer.
fn keys<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for Probe<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(serde::de::Error::custom("only structs are probed"))
        }
        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(serde::de::Error::custom("probed"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

/// `docs/configuration.md` as the schema describes it.
pub fn generate() -> String {
    let serve = super::options::serve_command();
    let (top, site) = (keys::<Options>(), keys::<FileSite>());
    let mut out = String::from(
        "# ktlsd configuration reference\n\n\
         <!-- Generated from the options schema (crates/ktlsd/src/config/options.rs); do not edit. \
         Regenerate: KTLSD_BLESS=1 cargo test -p ktlsd --lib config_reference -->\n\n\
         Every option of `ktlsd serve` (and `ktlsd check`) is a command-line flag and a key of the TOML \
         file given with `--config`. The command line wins over the file, the file over the default. \
         Relative paths in the file are relative to the file's directory. A switch's `--no-` form is \
         its key set to `false`. Options marked *site* may also be set in each `[[site]]` block, \
         where they override the top level's for that site.\n\n\
         | Flag | TOML key | Default | Description |\n|---|---|---|---|\n",
    );
    for arg in serve.get_arguments() {
        let id = arg.get_id().as_str();
        if id == "help" {
            continue;
        }
        let value = arg.get_value_names().and_then(|v| v.first()).map(|v| v.to_string());
        let takes_value = arg.get_num_args().is_none_or(|n| n.takes_values());
        let flag = match (arg.get_long(), &value) {
            (Some(long), Some(v)) if takes_value => format!("`--{long} <{v}>`"),
            (Some(long), _) => format!("`--{long}`"),
            (None, Some(v)) => format!("`[{v}]`"),
            (None, None) => format!("`{id}`"),
        };
        let key = match id.strip_prefix("no_") {
            Some(on) if top.contains(&on) => format!("`{on} = false`"),
            _ if top.contains(&id) => format!("`{id}`"),
            _ => "(command line only)".to_string(),
        };
        let scope = if site.contains(&id) && !SITE_BLOCK_KEYS.contains(&id) { " *site*" } else { "" };
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        let (text, default) = match help.rfind(" [default: ") {
            Some(i) if help.ends_with(']') => (&help[..i], &help[i + 11..help.len() - 1]),
            _ => (help.as_str(), ""),
        };
        let cell = |s: &str| s.replace('|', "\\|");
        let _ = writeln!(out, "| {flag} | {key}{scope} | {} | {} |", cell(default), cell(text));
    }
    out.push_str(
        "\n## In the file\n\n\
         Lists are arrays (`tls_versions = [\"1.3\"]`); `mime_types` and `error_page` are tables \
         (`[mime_types]` `md = \"text/markdown\"`, `error_page = { 404 = \"/404.html\" }`); `headers` is \
         an array of tables, `[[headers]]` with `path` (a glob) or `extensions`, and `set`, `add` \
         (tables of fields) and `expires` (a duration); `cors` is `\"*\"` or an array of origins; a \
         duration is seconds (a number) or a string such as `\"500ms\"`.\n",
    );
    for key in top.iter().filter(|k| !serve.get_arguments().any(|a| a.get_id() == **k)) {
        let _ = match *key {
            "auth" => writeln!(
                out,
                "\nFile only: `auth`, `[[auth]]` blocks (top level and `[[site.auth]]`) with `path` \
                 (`\"/private/*\"`), `users` (an htpasswd file) and `realm`: see \
                 [access-control.md](access-control.md)."
            ),
            _ => writeln!(out, "\nFile only: `{key}`, below."),
        };
    }
    out.push_str("\n### `[[site]]`\n\nA named site: its own names, root and certificate. Keys:\n\n");
    for key in SITE_BLOCK_KEYS {
        let what = match *key {
            "names" => "exact names and `*.example.com` wildcards the site answers (required)",
            "root" => "the site's directory (required)",
            "cert" | "key" => {
                "certificate chain and private key, PEM, both or neither; neither (nor `acme`): self-signed"
            }
            _ => {
                "`{ directory = \"https://...\", email, challenge = \"tls-alpn-01\", \"http-01\" or \"dns-01\", \
                  directory_ca, dns_hook, dns_hook_timeout, dns_propagation, eab = { kid, hmac_key } }`: a certificate \
                  from an ACME CA (dns-01: `dns_hook` is run as `HOOK set|clear _acme-challenge.NAME VALUE`, within \
                  `dns_hook_timeout`, default 2m, then `dns_propagation`, default 0s, is waited; it allows \
                  `*.example.com` names; `eab`: the CA's External Account Binding key id and base64url MAC key)"
            }
        };
        let _ = writeln!(out, "- `{key}`: {what}");
    }
    out.push_str("\nand every option marked *site* above.\n");
    out.push_str(
        "\n### `[cache]`\n\nThe response cache of proxied responses ([cache.md](cache.md)). Keys:\n\n\
         - `dir`: the directory of its entries (required; created owner-only at start when missing)\n\
         - `max_size`: bytes of entries above which the least recently used are evicted, as a number or \
         `\"10G\"`, `\"512M\"` (default `\"1G\"`)\n\
         - `max_object_size`: the largest body stored (default `\"64M\"`, at most `max_size` / 8)\n\
         - `min_free`: free space kept on the cache's file system, evicting the least recently used entries, as \
         bytes or a percentage of it, `\"5%\"` (default 0: evict only when a write finds the disk full)\n\
         - `verify_sample`: the share of hits, 0 to 1, whose body is read back and checked against its checksum \
         (default 0.01; the first hit of each entry after start is always checked)\n",
    );
    out.push_str(
        "\n### `[cluster]`\n\nThe fleet this member belongs to ([fleet.md](fleet.md)). Keys:\n\n\
         - `etcd`: the endpoints of the fleet's etcd, `http://HOST:PORT` (required)\n\
         - `name`: this member's name (default: the host name)\n\
         - `secret_file`: the same 32 or more random bytes on every member (required); records in etcd are sealed \
         with a key derived from it, and so are QUIC's stateless-reset and Retry token keys\n\
         - `prefix`: the prefix of every key the fleet keeps in etcd (default `\"/ktlsd\"`)\n\
         - `ticket_rotation`: how often one member replaces the shared session-ticket key; the last 4 keys open \
         tickets (default `\"12h\"`, at least `\"1s\"`)\n\
         - `cache_peers`: `true` shares the members' response caches: each cache key has one owner among the \
         members, and a miss elsewhere is fetched from it, so the origin sees one request per object for the \
         fleet (default `false`; needs `peer_listen`)\n\
         - `peer_listen`: `\"IP:PORT\"`, the private address this member answers the other members' cache \
         fetches on (plain HTTP/1.1, each request authenticated with a key derived from `secret_file`; nothing \
         else is served there)\n",
    );
    out.push_str(
        "\n### `include` and `${VAR}`\n\n\
         `include = [\"sites/*.toml\"]`: more files, read after this one, as paths or globs relative to it (their \
         own paths relative to themselves; a glob's matches in name order, dot-files left out). A glob that \
         matches nothing adds nothing; a plain path that is missing is an error, and so is an include loop. \
         `[[site]]` blocks add up; any other key may be set in one file only (a second is an error naming both \
         files). In every string value of every file, `${VAR}` is the environment's `VAR` (unset: an error naming \
         it and the key) and `$${` is a literal `${`. `ktlsd config` prints the result.\n",
    );
    out.push_str(
        "\n### `[[proxy]]`\n\nA reverse-proxy rule, at the top level or in a `[[site]]`; the first whose \
         `path` matches forwards the request ([docs/proxy.md](proxy.md)). Keys: `path` (a glob, required), \
         `upstream` (`http://`, `https://`, `h2c://`, `h2://` URLs or `unix:/PATH`, `unix+h2c:/PATH`, required), `cache` (false), `host` (`\"preserve\"`, \
         `\"upstream\"` or a host), `balance` (`\"round-robin\"` or `\"least-connections\"`), \
         `connect_timeout` (5s), `read_timeout` (60s), `send_timeout` (60s), `tunnel_idle_timeout` (5m: a \
         WebSocket that moves no byte either way for that long is closed), `fail_timeout` (10s), \
         `keepalive` (32), `upstream_ca` (a PEM file; default: the system roots), `strip_prefix` (a path \
         such as `\"/api\"`, taken off before the request goes upstream), `request_headers` and \
         `response_headers` (`{ set = { NAME = \"VALUE\" }, add = { ... }, remove = [\"NAME\"] }`, values \
         with the access log's `$variables`), `accel_root` (the directory `X-Accel-Redirect` files are served \
         from, outside the root), `health_check` (`{ path = \"/healthz\", interval = \"5s\", timeout = \"2s\", \
         fails = 2, passes = 2 }`: active checks of each upstream; defaults `/`, 5s, 2s, 1, 1); with `cache = true`, `cache_key` (a template of `$variables`), \
         `cache_bypass` (`{ cookie = [...], header = [...], query = [...] }`), `cache_valid` \
         (`{ \"200\" = \"10m\", any = \"1m\" }`) and `cache_slice` (`\"1m\"`, 64K to 1G: every GET is \
         fetched and stored in slices of that size, nginx's `slice`) ([docs/cache.md](cache.md)).\n",
    );
    out
}

#[cfg(test)]
mod tests {
    /// `docs/configuration.md` is what the schema generates.
    #[test]
    fn config_reference() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(super::PATH);
        let want = super::generate();
        if std::env::var_os("KTLSD_BLESS").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let got = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            got == want,
            "{} is out of date with the options schema; regenerate it with\n  \
             KTLSD_BLESS=1 cargo test -p ktlsd --lib config_reference",
            path.display()
        );
    }
}
