//! The userspace TLS record layer (`tls/userspace/record.rs`) opening what a peer sends
//! after the handshake, then what the layer does with each record's type
//! (`kernel_tls::Alert` and the post-handshake handshake messages). Records are sealed
//! by an independent implementation of RFC 8446 section 5.2 and RFC 5246 section
//! 6.2.3.3 / RFC 7905 (TLS 1.3 inner plaintexts with any type and padding, TLS 1.2
//! AES-GCM with its explicit nonce, ChaCha20-Poly1305), then optionally corrupted, cut
//! or interleaved with raw bytes. The properties:
//! - an intact record sealed with the next sequence number opens to its type and plaintext,
//!   or to the refusal RFC 8446 names (no content type: unexpected_message; over
//!   2^14 bytes: record_overflow);
//! - a record with a flipped bit never opens (bad_record_mac or another refusal);
//! - the layer's own sealing opens back to what was sealed;
//! - a refused record ends the connection: nothing after it is read.
#![no_main]

use arbitrary::Arbitrary;
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, CHACHA20_POLY1305};
use kernel_tls::{Alert, PostHandshake, TlsVersion};
use ktlsd::fuzzing::{record_len, Cipher, Records};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    /// A record sealed by the peer: outer (TLS 1.2) or inner (TLS 1.3) type, the
    /// plaintext (repeated up to `len` bytes), TLS 1.3 zero padding, and a bit to flip.
    Sealed { typ: u8, plaintext: Vec<u8>, len: Option<u16>, padding: u16, flip: Option<u16> },
    /// A record of the layer's own sealing (of the types it seals: change_cipher_spec,
    /// alert, handshake, application_data, picked by `typ % 4`), opened by its own opener.
    Own { typ: u8, plaintext: Vec<u8> },
    /// Bytes that are not a sealed record.
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Input {
    tls13: bool,
    chacha: bool,
    key: [u8; 32],
    iv: [u8; 12],
    seq: u16,
    ops: Vec<Op>,
}

/// The peer's side: RFC 8446 section 5.2 / RFC 5246 section 6.2.3.3 sealing.
struct Peer {
    key: LessSafeKey,
    iv: [u8; 12],
    seq: u64,
    tls13: bool,
    gcm: bool,
}

impl Peer {
    fn seal(&mut self, typ: u8, inner: &[u8]) -> Vec<u8> {
        let seq = self.seq;
        self.seq += 1;
        let mut nonce = self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
            *n ^= s;
        }
        let explicit = !self.tls13 && self.gcm;
        let wire_len = inner.len() + 16 + if explicit { 8 } else { 0 };
        let outer_type = if self.tls13 { 23 } else { typ };
        let header = [outer_type, 3, 3, (wire_len >> 8) as u8, wire_len as u8];
        let aad: Vec<u8> = if self.tls13 {
            header.to_vec()
        } else {
            [&seq.to_be_bytes()[..], &[typ, 3, 3], &(inner.len() as u16).to_be_bytes()].concat()
        };
        let mut body = inner.to_vec();
        let tag = self
            .key
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(&aad[..]), &mut body)
            .expect("seal");
        let mut rec = header.to_vec();
        if explicit {
            rec.extend_from_slice(&nonce[4..]);
        }
        rec.extend_from_slice(&body);
        rec.extend_from_slice(tag.as_ref());
        rec
    }
}

/// What the layer should make of an intact record the peer sealed.
fn expected(tls13: bool, typ: u8, plaintext: &[u8], padding: usize) -> Result<(u8, Vec<u8>), &'static str> {
    let wire = plaintext.len() + 16 + if tls13 { 1 + padding } else { 0 };
    if wire > 16_384 + if tls13 { 256 } else { 2048 } {
        return Err("RecordOverflow");
    }
    if tls13 {
        // The inner type is the last non-zero byte of plaintext, type, padding.
        let mut inner = plaintext.to_vec();
        inner.push(typ);
        inner.extend(std::iter::repeat_n(0, padding));
        match inner.iter().rposition(|&b| b != 0) {
            None => Err("UnexpectedMessage"),
            Some(at) if at > 16_384 => Err("RecordOverflow"),
            Some(at) => Ok((inner[at], inner[..at].to_vec())),
        }
    } else if plaintext.len() > 16_384 {
        Err("RecordOverflow")
    } else if ![20, 21, 22, 23].contains(&typ) {
        Err("UnexpectedMessage")
    } else {
        Ok((typ, plaintext.to_vec()))
    }
}

fuzz_target!(|input: Input| {
    let (alg, cipher) =
        if input.chacha { (&CHACHA20_POLY1305, Cipher::Chacha20Poly1305) } else { (&AES_256_GCM, Cipher::Aes256Gcm) };
    let seq = u64::from(input.seq);
    let Some(mut rx) = Records::new(input.tls13, cipher, input.key, input.iv, seq) else { return };
    let Some(mut own) = Records::new(input.tls13, cipher, input.key, input.iv, seq) else { return };
    let key = LessSafeKey::new(UnboundKey::new(alg, &input.key).expect("key"));
    let mut peer = Peer { key, iv: input.iv, seq, tls13: input.tls13, gcm: !input.chacha };
    let version = if input.tls13 { TlsVersion::Tls13 } else { TlsVersion::Tls12 };
    let mut handshake = PostHandshake::default();
    let mut in_sync = true;
    for op in input.ops.iter().take(32) {
        let (mut rec, want) = match op {
            Op::Sealed { typ, plaintext, len, padding, flip } => {
                let plaintext: Vec<u8> = match len {
                    Some(n) if !plaintext.is_empty() => {
                        plaintext.iter().copied().cycle().take(usize::from(*n) % 20_000 + 1).collect()
                    }
                    _ => plaintext.clone(),
                };
                let padding = usize::from(*padding % 512);
                let inner = if input.tls13 {
                    [&plaintext[..], &[*typ], &vec![0; padding][..]].concat()
                } else {
                    plaintext.clone()
                };
                let mut rec = peer.seal(*typ, &inner);
                let flipped = flip.map(|f| usize::from(f) % (rec.len() * 8));
                if let Some(bit) = flipped {
                    rec[bit / 8] ^= 1 << (bit % 8);
                }
                let want = match flipped {
                    Some(_) => None,
                    None if in_sync => Some(expected(input.tls13, *typ, &plaintext, padding)),
                    None => None,
                };
                (rec, want)
            }
            Op::Own { typ, plaintext } => {
                let typ = &(20 + typ % 4);
                let plaintext = &plaintext[..plaintext.len().min(16_384)];
                let mut rec = own.seal(*typ, plaintext);
                let mut opener = Records::new(input.tls13, cipher, input.key, input.iv, own.seq() - 1).expect("key");
                let opened = opener.open(&mut rec);
                let Ok((t, r)) = &opened else { panic!("own record refused: {opened:?}") };
                assert_eq!((*t, &rec[r.clone()]), (*typ, plaintext), "own record");
                continue;
            }
            Op::Raw(bytes) => (bytes.clone(), None),
        };
        // The record layer's reading: header first, then the whole record.
        let len = match record_len(&rec, input.tls13) {
            None => return,
            Some(Err(alert)) => {
                if let Some(Ok(_)) = want {
                    panic!("an intact record refused at its header: {alert}");
                }
                return;
            }
            Some(Ok(len)) => len,
        };
        if rec.len() < len {
            return;
        }
        let rec = &mut rec[..len];
        let opened = rx.open(rec);
        match (&opened, &want) {
            (Ok((t, r)), Some(Ok((wt, wp)))) => assert_eq!((*t, &rec[r.clone()]), (*wt, &wp[..])),
            (Err(alert), Some(Err(w))) => assert_eq!(alert, w),
            (_, Some(w)) => panic!("opened {opened:?}, expected {w:?}"),
            (Ok(_), None) if matches!(op, Op::Sealed { flip: Some(_), .. }) => {
                panic!("a corrupted record opened: {:02x?}", &rec[..rec.len().min(16)])
            }
            _ => {}
        }
        let Ok((typ, range)) = opened else { return };
        in_sync &= matches!(op, Op::Sealed { .. });
        let plain = &rec[range];
        match typ {
            21 => match Alert::parse(plain) {
                Ok(alert) => {
                    if alert.is_fatal(version) {
                        return;
                    }
                }
                Err(_) => return,
            },
            22 => {
                if handshake.push(version, plain).is_err() {
                    return;
                }
            }
            23 => {
                if handshake.in_message() {
                    return;
                }
            }
            _ => return,
        }
    }
});
