//! Response ordering by RFC 9218 priorities (the `priority` field value,
//! `http::fields::Priority`): the choice of which ready stream sends the next DATA
//! frame. Lower urgency goes first; within an urgency, non-incremental streams are
//! served one at a time in stream order, then incremental streams take turns frame
//! by frame (round robin).
//!
//! Not here: flow control or frame sizes (the caller offers only streams that may
//! send).

pub use crate::http::fields::Priority;

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
