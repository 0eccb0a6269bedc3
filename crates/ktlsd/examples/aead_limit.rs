//! The crypto limit of a TLS download: CPU seconds per GiB that AES-128-GCM alone costs when it
//! seals 16 KiB records with aws-lc-rs (the library ktlsd's record layer uses) on one core.
//!
//! `bench/run` builds and runs this beside each throughput scenario and reports the server's CPU
//! seconds per GiB as a multiple of it. It is not a TLS record layer: no record header, no
//! sequence-number bookkeeping beyond the nonce, no I/O; only the AEAD over the same buffer, so
//! the result is a floor no server can go under with this cipher on this machine.
//!
//! ```text
//! cargo build --release -p ktlsd --example aead_limit
//! target/release/examples/aead_limit [--seconds S] [--record BYTES]
//! ```
//!
//! Prints one JSON object. CPU time is the thread's user plus system time from
//! `/proc/thread-self/stat`, in the kernel's fixed 100 Hz clock ticks; the loop runs until it
//! has used at least `--seconds` of CPU (default 3), so the tick adds at most a few tenths of a
//! percent.

use std::error::Error;
use std::fs;
use std::time::Instant;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, NONCE_LEN};

/// The tick of `utime`/`stime` in `/proc/*/stat` (USER_HZ, 100 on every Linux architecture).
const TICKS_PER_SECOND: f64 = 100.0;
const GIB: f64 = (1u64 << 30) as f64;

fn main() -> Result<(), Box<dyn Error>> {
    let (seconds, record) = parse_args()?;
    let key = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &[0x42; 16]).map_err(|_| "AES-128-GCM key rejected")?);
    // The TLS 1.3 record's inner plaintext: the body bytes and one content-type byte.
    let mut buf = vec![0x5a_u8; record + 1];
    let aad_header = [23_u8, 3, 3, 0, 0];
    let start_cpu = thread_cpu_seconds()?;
    let start = Instant::now();
    let mut records: u64 = 0;
    let mut cpu = 0.0;
    while cpu < seconds {
        // A batch between clock reads keeps the /proc read out of the measured cost.
        for _ in 0..64 {
            let mut nonce = [0_u8; NONCE_LEN];
            nonce[4..].copy_from_slice(&records.to_be_bytes());
            let tag = key
                .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad_header), &mut buf)
                .map_err(|_| "AES-128-GCM seal failed")?;
            std::hint::black_box(tag.as_ref());
            records += 1;
        }
        cpu = thread_cpu_seconds()? - start_cpu;
    }
    let wall = start.elapsed().as_secs_f64();
    let bytes = records * record as u64;
    println!(
        "{{\"aead\": \"AES_128_GCM\", \"library\": \"aws-lc-rs\", \"record_bytes\": {record}, \"records\": {records}, \
         \"bytes\": {bytes}, \"cpu_seconds\": {cpu:.3}, \"wall_seconds\": {wall:.3}, \"cpu_s_per_gib\": {:.4}, \
         \"mb_per_cpu_second\": {:.1}}}",
        cpu / (bytes as f64 / GIB),
        bytes as f64 / cpu / 1e6,
    );
    Ok(())
}

/// `--seconds S` (CPU seconds to run, default 3) and `--record BYTES` (default 16384).
fn parse_args() -> Result<(f64, usize), Box<dyn Error>> {
    let (mut seconds, mut record) = (3.0, 16384);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--seconds" => seconds = value.parse().map_err(|e| format!("--seconds {value}: {e}"))?,
            "--record" => record = value.parse().map_err(|e| format!("--record {value}: {e}"))?,
            _ => return Err(format!("unknown option {flag}; usage: aead_limit [--seconds S] [--record BYTES]").into()),
        }
    }
    if record == 0 || record > 16384 {
        return Err("--record must be 1 to 16384 bytes (a TLS record's largest plaintext)".into());
    }
    Ok((seconds, record))
}

/// This thread's user plus system CPU time.
fn thread_cpu_seconds() -> Result<f64, Box<dyn Error>> {
    let stat =
        fs::read_to_string("/proc/thread-self/stat").map_err(|e| format!("reading /proc/thread-self/stat: {e}"))?;
    // Fields after the command name (which may hold spaces) close with ')'; utime and stime are
    // the 14th and 15th fields overall, the 12th and 13th after it.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).ok_or("unexpected /proc/thread-self/stat format")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<f64, Box<dyn Error>> {
        Ok(fields.get(i).ok_or("short /proc/thread-self/stat")?.parse::<u64>()? as f64)
    };
    Ok((ticks(11)? + ticks(12)?) / TICKS_PER_SECOND)
}
