//! Sending a body made of parts ([`Part`]): bytes in memory and ranges of one
//! open file, in order, as one byte stream. Memory bytes gather until the next
//! file range and leave with it in one [`Transport::send`], so each file range
//! still goes by the record layer's file path (sendfile under kTLS, in-place
//! sealing in user space). Both codecs use it: HTTP/1.1 for a whole body, HTTP/2
//! for the span of one DATA frame.
//!
//! Not here: what the parts are (the handler's `multipart/byteranges` body).

use crate::files::Found;
use crate::handler::Part;

use super::Transport;

/// Sends `head`, then bytes `offset..offset + len` of the body `parts` make
/// (their file ranges from `found`); returns the body bytes sent.
///
/// # Cancel safety
/// Not cancel-safe: a cancelled send leaves a partial body, as [`Transport::send`] does.
pub async fn send_span<T: Transport>(
    conn: &mut T,
    head: &[u8],
    found: &Found,
    parts: &[Part],
    offset: u64,
    len: u64,
) -> Result<u64, T::Error> {
    let (start, end) = (offset, offset.saturating_add(len));
    let mut pending = head.to_vec();
    let mut sent = 0;
    let mut at = 0u64;
    for part in parts {
        let (part_start, part_end) = (at, at + part.len());
        at = part_end;
        if part_end <= start {
            continue;
        }
        if part_start >= end {
            break;
        }
        let (from, to) = (start.max(part_start) - part_start, end.min(part_end) - part_start);
        match part {
            Part::Bytes(b) => {
                pending.extend_from_slice(&b[from as usize..to as usize]);
                sent += to - from;
            }
            Part::File(r) => {
                sent += conn.send(&pending, Some(found.body(r.start + from..r.start + to))).await?;
                pending.clear();
            }
        }
    }
    if !pending.is_empty() {
        conn.send(&pending, None).await?;
    }
    Ok(sent)
}
