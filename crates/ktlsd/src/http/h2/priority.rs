//! Response ordering by RFC 9218 priorities: the `priority` field value (urgency
//! 0-7, incremental flag), and the choice of which ready stream sends the next DATA
//! frame. Lower urgency goes first; within an urgency, non-incremental streams are
//! served one at a time in stream order, then incremental streams take turns frame
//! by frame (round robin).
//!
//! Not here: flow control or frame sizes (the caller offers only streams that may
//! send).

/// A stream's RFC 9218 priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Priority {
    /// 0 (most urgent) to 7.
    pub urgency: u8,
    pub incremental: bool,
}

impl Default for Priority {
    /// RFC 9218 section 4: urgency 3, not incremental.
    fn default() -> Priority {
        Priority { urgency: 3, incremental: false }
    }
}

impl Priority {
    /// Parses a `priority` field value (a Structured Fields dictionary, RFC 8941).
    /// Unknown keys, parameters and out-of-range values are ignored, as RFC 9218
    /// section 4 requires; so is anything unparsable. Absent members take their
    /// defaults (a PRIORITY_UPDATE restates the whole field).
    pub fn parse(value: &[u8]) -> Priority {
        let mut p = Priority::default();
        let Ok(text) = std::str::from_utf8(value) else { return p };
        for member in text.split(',') {
            // Parameters after ';' do not change the member's value.
            let member = member.split(';').next().unwrap_or("").trim();
            let (key, val) = match member.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (member, None),
            };
            match (key, val) {
                ("u", Some(v)) => {
                    if let Ok(u @ 0..=7) = v.parse::<u8>() {
                        p.urgency = u;
                    }
                }
                ("i", None | Some("?1")) => p.incremental = true,
                ("i", Some("?0")) => p.incremental = false,
                _ => {}
            }
        }
        p
    }
}

/// Picks the stream that sends next among `ready` (stream id, priority), given the
/// last stream served (`last`), so incremental streams of one urgency rotate.
pub fn pick(ready: impl Iterator<Item = (u32, Priority)> + Clone, last: u32) -> Option<u32> {
    let urgency = ready.clone().map(|(_, p)| p.urgency).min()?;
    let level = ready.filter(move |(_, p)| p.urgency == urgency);
    if let Some(first) = level.clone().filter(|(_, p)| !p.incremental).map(|(id, _)| id).min() {
        return Some(first);
    }
    // Round robin: the next id after `last`, wrapping to the lowest.
    let ids = level.map(|(id, _)| id);
    ids.clone().filter(|&id| id > last).min().or_else(|| ids.min())
}
