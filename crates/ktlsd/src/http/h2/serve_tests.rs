//! The HTTP/2 connection loop over the in-memory transport: requests answered
//! from real files, DATA frames sized to the record, timeouts and shutdown.

use std::net::SocketAddr;
use std::time::Duration;

use tempfile::TempDir;
use tokio::sync::watch;

use super::*;
use crate::files::{Options, Root};
use crate::handler::{Site, Sites};
use crate::http::h2::PREFACE;
use crate::http::testing::{MemError, Memory, Step};
use crate::http::{Context, End};
use crate::log::AccessLog;

const FRAME_DATA: u8 = 0x0;
const FRAME_HEADERS: u8 = 0x1;
const FRAME_SETTINGS: u8 = 0x4;
const FRAME_PING: u8 = 0x6;
const FRAME_GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// Preface and SETTINGS (with `params`), then a GET or HEAD of each path on streams 1, 3, ...
fn client(params: &[(u16, u32)], requests: &[(&str, &str)]) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    let settings: Vec<u8> =
        params.iter().flat_map(|(id, v)| id.to_be_bytes().into_iter().chain(v.to_be_bytes())).collect();
    out.extend(frame(FRAME_SETTINGS, 0, 0, &settings));
    let mut enc = loona_hpack::Encoder::new();
    for (i, (method, path)) in requests.iter().enumerate() {
        let fields: [(&[u8], &[u8]); 4] = [
            (b":method", method.as_bytes()),
            (b":scheme", b"https"),
            (b":authority", b"example.test"),
            (b":path", path.as_bytes()),
        ];
        let block = enc.encode(fields);
        out.extend(frame(FRAME_HEADERS, END_HEADERS | END_STREAM, 1 + 2 * i as u32, &block));
    }
    out
}

/// A frame the server sent.
#[derive(Debug)]
struct Got {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

fn frames(mut out: &[u8]) -> Vec<Got> {
    let mut all = Vec::new();
    while out.len() >= 9 {
        let len = u32::from_be_bytes([0, out[0], out[1], out[2]]) as usize;
        let stream = u32::from_be_bytes([out[5], out[6], out[7], out[8]]) & 0x7fff_ffff;
        all.push(Got { kind: out[3], flags: out[4], stream, payload: out[9..9 + len].to_vec() });
        out = &out[9 + len..];
    }
    assert!(out.is_empty(), "whole frames");
    all
}

/// Status and body of each stream, decoded from the frames.
fn responses(got: &[Got]) -> Vec<(u32, u16, Vec<u8>)> {
    let mut dec = loona_hpack::Decoder::new();
    let mut all: Vec<(u32, u16, Vec<u8>)> = Vec::new();
    for f in got {
        match f.kind {
            FRAME_HEADERS => {
                let fields = dec.decode(&f.payload).expect("HPACK");
                let status = fields
                    .iter()
                    .find(|(n, _)| n == b":status")
                    .map(|(_, v)| String::from_utf8_lossy(v).parse().unwrap());
                all.push((f.stream, status.unwrap_or(0), Vec::new()));
            }
            FRAME_DATA => {
                let r = all.iter_mut().find(|r| r.0 == f.stream).expect("DATA after HEADERS");
                r.2.extend(&f.payload);
            }
            _ => {}
        }
    }
    all
}

struct Fixture {
    _dir: TempDir,
    root: Root,
    settings: Settings,
    body: Vec<u8>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let body: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.path().join("f"), &body).unwrap();
    let root = Root::new(dir.path()).unwrap();
    let settings = Settings {
        limits: Limits::default(),
        idle_timeout: Duration::from_secs(60),
        stall_timeout: Duration::from_secs(30),
        max_body_bytes: 1024 * 1024,
    };
    Fixture { _dir: dir, root, settings, body }
}

impl Fixture {
    async fn serve(&self, mem: &mut Memory, shutdown: watch::Receiver<bool>) -> End<MemError> {
        let files = Options { dotfiles: false, autoindex: false, cache_entries: 0 };
        let site = Site::new(&self.root, files, None, crate::handler::Content::none());
        let log = AccessLog::new(None);
        let peer: SocketAddr = "192.0.2.7:4000".parse().unwrap();
        serve(
            mem,
            Context { peer, settings: &self.settings, sites: Sites::single(site), log: &log, shutdown, alt_svc: None },
        )
        .await
    }
}

/// The peer's script: `first`, then silence for every look between frames (each
/// look takes one step), enough for a whole test.
fn then_silence(first: Step) -> Memory {
    Memory::new(std::iter::once(first).chain(std::iter::repeat_n(Step::Silence, 1000)))
}

/// Each DATA frame is sent alone or after whole frames, in one send no longer than
/// the record the transport announced; the bodies arrive whole.
#[tokio::test]
async fn data_frames_fit_the_record() {
    let fx = fixture();
    let mut mem = then_silence(Step::Data(client(&[], &[("GET", "/f"), ("HEAD", "/f"), ("GET", "/nope")])));
    mem.record = 4096;
    let (_tx, rx) = watch::channel(false);
    // The client keeps the connection open: the loop ends up waiting for it.
    let waited = tokio::time::timeout(Duration::from_millis(500), fx.serve(&mut mem, rx)).await;
    assert!(waited.is_err(), "the connection stays open");
    let got = frames(&mem.output);
    let r = responses(&got);
    assert_eq!(r.len(), 3, "{r:?}");
    assert_eq!((r[0].0, r[0].1), (1, 200));
    assert_eq!(r[0].2, fx.body);
    assert_eq!((r[1].0, r[1].1, r[1].2.len()), (3, 200, 0), "HEAD has no DATA");
    assert_eq!((r[2].0, r[2].1), (5, 404));
    assert!(mem.send_lens.iter().all(|&n| n <= 4096), "{:?}", mem.send_lens);
    let full = got.iter().filter(|f| f.kind == FRAME_DATA && f.payload.len() == 4096 - 9).count();
    assert!(full >= fx.body.len() / 4096 - 1, "DATA frames fill their records: {full}");
    assert!(got.iter().any(|f| f.kind == FRAME_DATA && f.stream == 1 && f.flags & END_STREAM != 0));
}

/// A connection without streams is closed with GOAWAY at the idle timeout.
#[tokio::test]
async fn idle_connection_gets_goaway() {
    let fx = fixture();
    // The few bytes of the SETTINGS exchange call for no look at the input between
    // frames; the wait that follows times out.
    // The second timeout is the wait for the ACK of the close's PING.
    let mut mem = Memory::new([Step::Data(client(&[], &[])), Step::Timeout, Step::Timeout, Step::Silence]);
    let (_tx, rx) = watch::channel(false);
    let end = fx.serve(&mut mem, rx).await;
    assert!(matches!(end, End::Done), "{end:?}");
    assert_eq!(mem.read_timeouts[1], fx.settings.idle_timeout);
    assert!(mem.read_timeouts[2] <= SHUTDOWN_ACK_WAIT, "{:?}", mem.read_timeouts);
    assert_eq!(goaways(&frames(&mem.output)), [(1 << 31) - 1, 0]);
    assert!(mem.lingered, "the close after GOAWAY drains the client's input");
}

/// A peer that keeps its window shut (SETTINGS_INITIAL_WINDOW_SIZE 0) times out
/// after the stall timeout, not the idle one.
#[tokio::test]
async fn zero_window_stall_times_out() {
    let fx = fixture();
    let mut mem = Memory::new([Step::Data(client(&[(0x4, 0)], &[("GET", "/f")])), Step::Timeout]);
    let (_tx, rx) = watch::channel(false);
    let end = fx.serve(&mut mem, rx).await;
    assert!(matches!(end, End::Timeout), "{end:?}");
    assert_eq!(mem.read_timeouts.last(), Some(&fx.settings.stall_timeout));
    assert!(!frames(&mem.output).iter().any(|f| f.kind == FRAME_DATA && !f.payload.is_empty()));
}

/// Shutdown while a request is in flight: GOAWAY goes out, the response finishes,
/// and the connection ends without waiting for the peer.
#[tokio::test]
async fn shutdown_finishes_streams_then_goaway() {
    let fx = fixture();
    let (tx, rx) = watch::channel(false);
    let mut mem = Memory::new([
        Step::DataThenShutdown(client(&[], &[("GET", "/f")])),
        Step::Data(frame(FRAME_PING, ACK, 0, b"ktlsd-gw")),
        Step::Silence,
    ]);
    mem.shutdown = Some(tx);
    let end = fx.serve(&mut mem, rx).await;
    assert!(matches!(end, End::Done), "{end:?}");
    let got = frames(&mem.output);
    assert_eq!(goaways(&got), [(1 << 31) - 1, 1]);
    let r = responses(&got);
    assert_eq!((r[0].1, r[0].2.len()), (200, fx.body.len()));
    assert!(mem.lingered);
}

/// The last-stream-id of each GOAWAY sent, in order.
fn goaways(got: &[Got]) -> Vec<u32> {
    got.iter()
        .filter(|f| f.kind == FRAME_GOAWAY)
        .map(|f| u32::from_be_bytes(f.payload[..4].try_into().unwrap()))
        .collect()
}

/// Retired between its handshake and its first request: the request the client sent
/// before it saw the first GOAWAY is served, the PING's ACK (its payload is the one
/// the server sends) brings the final GOAWAY naming it, and the connection closes.
#[tokio::test]
async fn a_request_crossing_the_first_goaway_is_served() {
    let fx = fixture();
    let (tx, rx) = watch::channel(false);
    tx.send_replace(true);
    let mut input = client(&[], &[("GET", "/f")]);
    input.extend(frame(FRAME_PING, ACK, 0, b"ktlsd-gw"));
    let mut mem = Memory::new([Step::Data(input), Step::Silence]);
    let end = fx.serve(&mut mem, rx).await;
    assert!(matches!(end, End::Done), "{end:?}");
    let got = frames(&mem.output);
    assert_eq!(goaways(&got), [(1 << 31) - 1, 1]);
    let ping = got.iter().find(|f| f.kind == FRAME_PING && f.flags & ACK == 0).expect("a PING with the GOAWAY");
    assert_eq!(ping.payload, b"ktlsd-gw");
    let first = got.iter().position(|f| f.kind == FRAME_GOAWAY).unwrap();
    let head = got.iter().position(|f| f.kind == FRAME_HEADERS).unwrap();
    assert!(first < head, "the first GOAWAY goes out before the request is read");
    let r = responses(&got);
    assert_eq!((r[0].0, r[0].1, &r[0].2), (1, 200, &fx.body));
    assert!(mem.lingered);
}
