//! The access-log section: the line format (`access_log_format`) and the
//! `custom` format's template (`access_log_custom`), checked together. Where the
//! lines go (`access_log`) is read with the other paths; the lines themselves
//! are `crate::log`'s.

use std::sync::Arc;

use super::options::Options;
use super::{err, ConfigError};
use crate::log::{LogFormat, Template};

/// The format and, for `custom`, its parsed template.
pub fn access_log_format(o: &Options) -> Result<(LogFormat, Option<Arc<Template>>), ConfigError> {
    let format = o.access_log_format.unwrap_or_default();
    match (format, o.access_log_custom.as_deref()) {
        (LogFormat::Custom, Some(text)) => match Template::parse(text) {
            Ok(t) => Ok((format, Some(Arc::new(t)))),
            Err(e) => err(e),
        },
        (LogFormat::Custom, None) => err(
            "access_log_format = \"custom\" needs access_log_custom, the line template (e.g. '$remote_addr \"$request\" $status $body_bytes_sent $host')",
        ),
        (_, Some(_)) => err(
            "access_log_custom is set but access_log_format is not \"custom\": set access_log_format = \"custom\" to use it",
        ),
        (_, None) => Ok((format, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_and_template_table() {
        // (format, template, Ok(has a template) or the error's words)
        type Row<'a> = (Option<LogFormat>, Option<&'a str>, Result<bool, &'a str>);
        let table: &[Row] = &[
            (None, None, Ok(false)),
            (Some(LogFormat::Json), None, Ok(false)),
            (Some(LogFormat::Custom), Some("$remote_addr $status $host"), Ok(true)),
            (Some(LogFormat::Custom), None, Err("needs access_log_custom")),
            (Some(LogFormat::Custom), Some("$bogus"), Err("unknown variable $bogus")),
            (None, Some("$status"), Err("is not \"custom\"")),
        ];
        for (format, template, want) in table {
            let o = Options {
                access_log_format: *format,
                access_log_custom: template.map(str::to_string),
                ..Default::default()
            };
            match (access_log_format(&o), want) {
                (Ok((_, t)), Ok(has)) => assert_eq!(t.is_some(), *has, "{format:?} {template:?}"),
                (Err(e), Err(words)) => assert!(e.to_string().contains(words), "{format:?} {template:?}: {e}"),
                (got, _) => panic!("{format:?} {template:?}: {got:?}"),
            }
        }
    }
}
