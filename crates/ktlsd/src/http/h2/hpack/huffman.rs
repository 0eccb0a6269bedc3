//! Decoding HPACK's Huffman code (RFC 7541 section 5.2 and appendix B) with tables
//! built at compile time: the next eight bits of the string index a table that
//! yields the symbol and its length for every code of at most eight bits (every
//! lowercase letter, digit and the usual punctuation of paths and host names); a
//! longer code is found by comparing its first bits with the first code of each
//! length, which works because the code is canonical (codes of one length are
//! consecutive integers, assigned in symbol order, shorter lengths first).
//!
//! Not here: encoding (our responses send raw strings), or string framing.

/// Code length in bits of each symbol: octets 0 to 255, then EOS (256). The code
/// itself follows from these, being canonical (checked against appendix B's codes
/// in the tests).
const LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, //
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, //
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, //
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, //
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, //
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, //
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, //
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, //
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, //
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, //
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, //
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, //
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, //
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, //
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, //
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, //
    30,
];

const EOS: u16 = 256;
const SHORTEST: usize = 5;
const LONGEST: usize = 30;
/// Bits the fast table looks at.
const FAST_BITS: u32 = 8;

struct Tables {
    /// The first code of each length, as an integer of that many bits.
    first: [u32; LONGEST + 1],
    /// How many codes each length has.
    count: [u32; LONGEST + 1],
    /// Where each length's symbols start in `symbols`.
    offset: [u16; LONGEST + 1],
    /// The symbols ordered by (length, symbol), that is, by code.
    symbols: [u16; 257],
    /// For the next eight bits: `length << 8 | symbol` of the code they start
    /// with when it is at most eight bits long, else 0.
    fast: [u16; 1 << FAST_BITS],
}

const fn build() -> Tables {
    let mut t = Tables {
        first: [0; LONGEST + 1],
        count: [0; LONGEST + 1],
        offset: [0; LONGEST + 1],
        symbols: [0; 257],
        fast: [0; 1 << FAST_BITS],
    };
    let mut s = 0;
    while s < 257 {
        t.count[LENGTHS[s] as usize] += 1;
        s += 1;
    }
    let (mut code, mut at, mut len) = (0u32, 0u16, 1);
    while len <= LONGEST {
        code = (code + t.count[len - 1]) << 1;
        t.first[len] = code;
        t.offset[len] = at;
        let mut s = 0;
        let mut rank = 0;
        while s < 257 {
            if LENGTHS[s] as usize == len {
                t.symbols[at as usize] = s as u16;
                if len <= FAST_BITS as usize {
                    let spread = 1 << (FAST_BITS as usize - len);
                    let start = ((code + rank) as usize) << (FAST_BITS as usize - len);
                    let mut i = 0;
                    while i < spread {
                        t.fast[start + i] = ((len as u16) << 8) | s as u16;
                        i += 1;
                    }
                }
                at += 1;
                rank += 1;
            }
            s += 1;
        }
        len += 1;
    }
    t
}

static TABLES: Tables = build();

/// A Huffman string that RFC 7541 section 5.2 makes a decoding error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HuffmanError {
    /// The string codes the EOS symbol.
    Eos,
    /// Padding longer than seven bits, or not the first bits of EOS (all ones).
    Padding,
}

/// The code that the first `avail` bits of `bits` (left-aligned) start with, as
/// (symbol, length); `None` when no code fits in them.
fn long_code(bits: u64, avail: u32) -> Option<(u16, u32)> {
    let t = &TABLES;
    let mut len = SHORTEST;
    while len <= LONGEST && len as u32 <= avail {
        let code = (bits >> (64 - len)) as u32;
        // Canonical: the `len`-bit prefix is below the first code of this length
        // only if a shorter code matched, so checking the upper bound suffices.
        if code < t.first[len] + t.count[len] {
            let symbol = t.symbols[usize::from(t.offset[len]) + (code - t.first[len]) as usize];
            return Some((symbol, len as u32));
        }
        len += 1;
    }
    None
}

/// Appends the decoding of Huffman string `src` to `out`.
pub fn decode(src: &[u8], out: &mut Vec<u8>) -> Result<(), HuffmanError> {
    let fast = &TABLES.fast;
    // The unread bits, left-aligned; below them only zeros.
    let mut bits = 0u64;
    let mut avail = 0u32;
    let mut input = src.iter();
    out.reserve(src.len() + src.len() / 2);
    loop {
        while avail <= 56 {
            let Some(&b) = input.next() else { break };
            bits |= u64::from(b) << (56 - avail);
            avail += 8;
        }
        if avail == 0 {
            return Ok(());
        }
        let entry = fast[(bits >> (64 - FAST_BITS)) as usize];
        let len = u32::from(entry >> 8);
        let (symbol, len) = if len != 0 && len <= avail {
            (entry & 0xff, len)
        } else {
            match long_code(bits, avail) {
                Some(code) => code,
                // No code fits in what is left: it must be padding, the first
                // bits of EOS (all ones), at most seven of them.
                None if avail <= 7 && bits >> (64 - avail) == (1 << avail) - 1 => return Ok(()),
                None => return Err(HuffmanError::Padding),
            }
        };
        if symbol == EOS {
            return Err(HuffmanError::Eos);
        }
        out.push(symbol as u8);
        bits <<= len;
        avail -= len;
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::hex;
    use super::*;

    /// Encodes `s` with the canonical code derived from `LENGTHS`, padding with ones.
    fn encode(s: &[u8]) -> Vec<u8> {
        let t = &TABLES;
        let code_of = |sym: u16| {
            let len = LENGTHS[sym as usize] as usize;
            let rank = (t.offset[len] as usize..).position(|i| t.symbols[i] == sym).unwrap();
            (t.first[len] + rank as u32, len)
        };
        let (mut out, mut acc, mut n) = (Vec::new(), 0u64, 0);
        for &b in s {
            let (code, len) = code_of(u16::from(b));
            acc = (acc << len) | u64::from(code);
            n += len;
            while n >= 8 {
                out.push((acc >> (n - 8)) as u8);
                n -= 8;
            }
        }
        if n > 0 {
            out.push(((acc << (8 - n)) as u8) | ((1u8 << (8 - n)) - 1));
        }
        out
    }

    fn decoded(src: &[u8]) -> Result<Vec<u8>, HuffmanError> {
        let mut out = Vec::new();
        decode(src, &mut out).map(|()| out)
    }

    /// Appendix B's codes of a few symbols of each kind, as (symbol, code, length).
    #[test]
    fn the_derived_code_is_appendix_b() {
        let t = &TABLES;
        let cases: [(u16, u32, usize); 8] = [
            (b'0' as u16, 0x0, 5),
            (b' ' as u16, 0x14, 6),
            (b'A' as u16, 0x21, 6),
            (b'Z' as u16, 0xfd, 8),
            (b'\\' as u16, 0x7fff0, 19),
            (0, 0x1ff8, 13),
            (255, 0x3ffffee, 26),
            (EOS, 0x3fffffff, 30),
        ];
        for (sym, code, len) in cases {
            assert_eq!(LENGTHS[sym as usize] as usize, len, "symbol {sym}");
            let rank = code - t.first[len];
            assert_eq!(t.symbols[t.offset[len] as usize + rank as usize], sym, "symbol {sym}");
        }
    }

    /// RFC 7541 appendix C.4 and C.6 strings.
    #[test]
    fn decodes_appendix_c_strings() {
        let cases: [(&str, &str); 7] = [
            ("f1e3 c2e5 f23a 6ba0 ab90 f4ff", "www.example.com"),
            ("a8eb 1064 9cbf", "no-cache"),
            ("25a8 49e9 5ba9 7d7f", "custom-key"),
            ("25a8 49e9 5bb8 e8b4 bf", "custom-value"),
            ("6402", "302"),
            ("aec3 771a 4b", "private"),
            ("d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff", "Mon, 21 Oct 2013 20:13:21 GMT"),
        ];
        for (coded, plain) in cases {
            assert_eq!(decoded(&hex(coded)), Ok(plain.as_bytes().to_vec()), "{plain}");
        }
    }

    #[test]
    fn refuses_bad_padding_and_eos() {
        let cases: [(&str, HuffmanError); 5] = [
            // '0' (00000) padded with zeros.
            ("00", HuffmanError::Padding),
            // A whole byte of ones after a complete symbol: eight bits of padding.
            ("07 ff", HuffmanError::Padding),
            // EOS itself (30 ones) and two bits of padding.
            ("ff ff ff ff", HuffmanError::Eos),
            // Ones, then a zero: the start of no code that ends in time.
            ("fe", HuffmanError::Padding),
            // 'a' (00011) then "101" as padding.
            ("1d", HuffmanError::Padding),
        ];
        for (coded, err) in cases {
            assert_eq!(decoded(&hex(coded)), Err(err), "{coded}");
        }
        assert_eq!(decoded(&[]), Ok(Vec::new()));
        // '0' then seven ones of padding is fine.
        assert_eq!(decoded(&hex("07")), Ok(b"0".to_vec()));
    }

    /// Every octet, and pseudo-random strings of every octet, survive a round trip.
    #[test]
    fn round_trips_random_strings() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decoded(&encode(&all)), Ok(all));
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = (state % 40) as usize;
            let s: Vec<u8> = (0..len)
                .map(|i| {
                    let r = state.rotate_left(i as u32 * 7);
                    // Mostly the characters of paths and names, sometimes any octet.
                    if r % 5 == 0 {
                        r as u8
                    } else {
                        b"abcdefghijklmnopqrstuvwxyz0123456789/.-_=&?%ABCXYZ"[(r % 50) as usize]
                    }
                })
                .collect();
            assert_eq!(decoded(&encode(&s)), Ok(s.clone()), "{s:?}");
        }
    }
}
