//! The kernel's kTLS counters, `/proc/net/tls_stat`.
//!
//! The file exists (per network namespace) once the `tls` module is loaded
//! and lists one counter per line, `Name<whitespace>value` — e.g.
//! `TlsCurrTxSw`, `TlsTxSw`, `TlsDecryptError`, `TlsRxRekeyOk`. [`TlsStat`]
//! keeps them in file order and looks them up by name, so new counters in
//! newer kernels appear without code changes.
//! It reads and parses only; what the counters mean for a server is the
//! caller's business.

use std::io;
use std::path::Path;

/// A snapshot of `/proc/net/tls_stat`, in file order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsStat {
    entries: Vec<(String, u64)>,
}

impl TlsStat {
    /// Where the kernel publishes the counters.
    pub const PATH: &'static str = "/proc/net/tls_stat";

    /// Reads [`TlsStat::PATH`].
    ///
    /// A missing file yields a `NotFound` error explaining that the `tls`
    /// module is not loaded (or the kernel lacks `CONFIG_TLS`).
    pub fn read() -> io::Result<Self> {
        Self::read_from(Path::new(Self::PATH))
    }

    /// Reads and parses a file in the `tls_stat` format.
    pub fn read_from(path: &Path) -> io::Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "{} does not exist: the `tls` kernel module is not loaded \
                         (run `modprobe tls`) or the kernel was built without CONFIG_TLS",
                        path.display()
                    ),
                )
            } else {
                io::Error::new(e.kind(), format!("cannot read {}: {e}", path.display()))
            }
        })?;
        Self::parse(&text)
    }

    /// Parses `Name value` lines; blank lines are skipped, anything else
    /// malformed is an `InvalidData` error naming the line.
    pub fn parse(text: &str) -> io::Result<Self> {
        let mut entries = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let mut fields = line.split_whitespace();
            let Some(name) = fields.next() else { continue };
            let value =
                fields.next().and_then(|v| v.parse::<u64>().ok()).filter(|_| fields.next().is_none()).ok_or_else(
                    || {
                        io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("tls_stat line {}: expected `Name value`, got {line:?}", i + 1),
                        )
                    },
                )?;
            entries.push((name.to_owned(), value));
        }
        Ok(TlsStat { entries })
    }

    /// The value of a counter, e.g. `get("TlsTxSw")`.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.entries.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }

    /// All counters in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.entries.iter().map(|(n, v)| (n.as_str(), *v))
    }

    /// Number of counters.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if there are no counters.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "TlsCurrTxSw                     \t3\n\
TlsCurrRxSw                     \t2\n\
TlsCurrTxDevice                 \t0\n\
TlsTxSw                         \t17\n\
TlsDecryptError                 \t1\n\
TlsRxRekeyOk                    \t18446744073709551615\n\
\n";

    #[test]
    fn parses_sample() {
        let s = TlsStat::parse(SAMPLE).unwrap();
        assert_eq!(s.len(), 6);
        assert_eq!(s.get("TlsCurrTxSw"), Some(3));
        assert_eq!(s.get("TlsTxSw"), Some(17));
        assert_eq!(s.get("TlsRxRekeyOk"), Some(u64::MAX));
        assert_eq!(s.get("Nope"), None);
        let names: Vec<_> = s.iter().map(|(n, _)| n).collect();
        assert_eq!(names[0], "TlsCurrTxSw");
        assert_eq!(names[5], "TlsRxRekeyOk");
    }

    #[test]
    fn rejects_garbage() {
        assert!(TlsStat::parse("TlsTxSw\n").is_err());
        assert!(TlsStat::parse("TlsTxSw x\n").is_err());
        assert!(TlsStat::parse("TlsTxSw 1 2\n").is_err());
        assert!(TlsStat::parse("").unwrap().is_empty());
    }

    #[test]
    fn missing_file_explains() {
        let e = TlsStat::read_from(Path::new("/nonexistent/tls_stat")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("modprobe tls"));
    }
}
