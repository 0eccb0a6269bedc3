"""Scenario soak (this machine): the fault soak. The release binary serves static files, proxies
to a Python origin, caches the origin's answers on a small tmpfs, answers ranges and compresses
on the fly, over HTTP/1.1, HTTP/2 and HTTP/3, for --minutes while faults are injected on a
schedule; every response is checked against its source of truth.

Traffic: four client processes, each looping until the end of the run over a random mix of
static files whole, static ranges, text files with `Accept-Encoding: gzip` (decompressed before
the check), cacheable origin objects (`/cache/`), ranges of them, new cacheable objects (each
asked for once: stored, evicting others by `max_size`), and uncacheable origin answers
(`/pass/`, `no-store`, a fresh query string each time):
- two HTTP/1.1 clients (Python `http.client`, keep-alive connections; a request on a reused
  connection that the server closed before any byte of the answer is sent again once on a new
  connection, as curl and browsers do: RFC 9112 section 9.3.1),
- one HTTP/2 client (`curl --http2 --parallel`, 8 requests multiplexed on one connection per
  curl process),
- one HTTP/3 client (Python `aioquic`, one long-lived QUIC connection, 4 requests at once).
Every answer is checked: status (200, or 206 with the right Content-Range for a range), length
and SHA-256 against the source (the file under ROOT, or the origin's body, which is a function
of its path), a range against the slice of the source, a gzip body after decompressing it.

Faults (`FAULTS`, one after another with a gap, the cycle repeated until the end): the origin
killed (SIGKILL) and restarted; the origin slow (head after 1.5 s, body in four pieces 0.3 s
apart: within `read_timeout`); the origin answering garbage (a head that is not HTTP, or a head
with its body cut in the middle); one SIGKILL of ktlsd and a restart (first cycle only); the
cache's tmpfs filled by a file written until ENOSPC, held, then deleted; ktlsd's RLIMIT_NOFILE
soft limit lowered to 32 below the descriptors it has open (`prlimit`), held, then restored. Besides these,
a reload (SIGHUP) every 5 s with a changed configuration (a response field on static files and
the proxy's `read_timeout`), all run long.

A failure is explained only by a fault whose window (plus `GRACE` s after it) overlaps the
request, and only when that fault can cause that symptom (`EXPLAINS`): a 502/504 or a cut body
of an origin answer while the origin is down, slow or sending garbage; a refused connection,
a reset or a timeout while ktlsd is killed or its descriptors are exhausted. A reload and a full
cache disk explain nothing: they must fail no request. Any unexplained failure, any corrupt
byte (a body of the right status whose bytes differ from the source) or RSS that is not flat
(mean of the last 5 minutes more than 10% off the mean of minutes 5-10; judged on runs of 15
minutes or more) fails the run.

The server's RSS and open descriptors are sampled from /proc every 2 s. At the end every cache
object is fetched once more and checked (those answered as a hit are the verified stored entries),
and `ktlsd_cache_entries` is read from the admin listener."""

import asyncio
import collections
import errno
import gzip
import hashlib
import http.client
import json
import multiprocessing
import os
import random
import re
import resource
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request

from . import servers
from .system import log, make_file, rss_kib, wait_port

PORT = 18743  # HTTPS over TCP and HTTP/3 over UDP
ADMIN_PORT = 18790
ORIGIN_PORT = 18780
TMPFS_SIZE = "24m"  # the cache's file system: small, so that it can be filled
CACHE_OBJECTS = 160  # /cache/obj-0 .. /cache/obj-159, 1 KiB to 97 KiB each
PASS_OBJECTS = 40
GRACE = 5.0  # seconds after a fault ends during which it still explains a failure
SAMPLE_EVERY = 2.0
RELOAD_EVERY = 5.0
REQUEST_TIMEOUT = 15
# Each client's pause between requests (HTTP/1.1), batches of 4 (HTTP/3, twice it) and of 8
# (HTTP/2, four times it): the machine is shared, and a steady load shows growth as well as a
# saturating one.
PAUSE = 0.01

# A fault and the symptoms it explains, for which kinds of request. Kinds: static, range,
# gzip (files under ROOT), cache, cache-range (cacheable origin objects), cache-new (a cacheable
# object asked for once), pass (no-store).
ORIGIN_KINDS = {"cache", "cache-range", "cache-new", "pass"}
ALL_KINDS = {"static", "range", "gzip"} | ORIGIN_KINDS
TRANSPORT = {"connect", "reset", "cut", "timeout"}
EXPLAINS = {
    "origin-down": (ORIGIN_KINDS, {"status-502", "status-503", "status-504", "cut"}),
    "origin-slow": (ORIGIN_KINDS, {"status-504", "cut"}),
    "origin-garbage": (ORIGIN_KINDS, {"status-502", "status-504", "cut"}),
    "server-sigkill": (ALL_KINDS, TRANSPORT),
    "descriptors": (ALL_KINDS, TRANSPORT | {"status-500", "status-502", "status-503", "status-504"}),
    "cache-disk-full": (set(), set()),
    "reload": (set(), set()),
}
# (fault, seconds it lasts); a gap of gap seconds follows each.
FAULTS = [("origin-down", 10), ("origin-slow", 15), ("origin-garbage", 10), ("server-sigkill", 0),
          ("cache-disk-full", 20), ("descriptors", 10)]


# --- the source of truth ---------------------------------------------------------------------

def origin_body(path):
    """The origin's body for `path` (without its query): random bytes seeded by the path, 1 KiB
    to 97 KiB under /cache/ (all of them fit in the cache's max_size), to 193 KiB elsewhere."""
    rng = random.Random(path)
    return rng.randbytes(1024 + rng.randrange((96 if path.startswith("/cache/") else 192) * 1024))


def make_root(root):
    """Static files: binary ones (ranges, whole) and compressible text ones (gzip)."""
    os.makedirs(root)
    rng = random.Random(7)
    for i in range(16):
        make_file(os.path.join(root, f"bin-{i}.bin"), rng.choice([1, 7, 100, 1000]) * 1024 + rng.randrange(4096))
    words = [bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randrange(2, 10)))
             for _ in range(500)]
    for i in range(8):
        size = rng.choice([2, 20, 200]) * 1024 + rng.randrange(1024)
        text = bytearray()
        while len(text) < size:
            text += rng.choice(words) + (b"\n" if rng.random() < 0.1 else b" ")
        with open(os.path.join(root, f"text-{i}.txt"), "wb") as f:
            f.write(text[:size])


class Truth:
    def __init__(self, root):
        self.files = {}
        for name in sorted(os.listdir(root)):
            with open(os.path.join(root, name), "rb") as f:
                self.files[name] = f.read()
        self.origin = {}

    def of_origin(self, path):
        if path not in self.origin:
            self.origin[path] = origin_body(path)
        return self.origin[path]


class Req:
    """One request of the mix: its kind, path, header fields, the full representation's bytes
    and, for a range, the inclusive (first, last) byte."""

    def __init__(self, kind, path, body, headers=(), rng=None):
        self.kind, self.path, self.body, self.headers, self.range = kind, path, body, list(headers), rng


def pick(truth, rnd):
    bins = [n for n in truth.files if n.endswith(".bin")]
    texts = [n for n in truth.files if n.endswith(".txt")]
    x = rnd.random()
    if x < 0.2:
        n = rnd.choice(bins)
        return Req("static", f"/{n}", truth.files[n])
    if x < 0.35:
        n = rnd.choice(bins)
        return ranged("range", f"/{n}", truth.files[n], rnd)
    if x < 0.5:
        n = rnd.choice(texts)
        return Req("gzip", f"/{n}", truth.files[n], [("accept-encoding", "gzip")])
    if x < 0.75:
        p = f"/cache/obj-{rnd.randrange(CACHE_OBJECTS)}"
        return Req("cache", p, truth.of_origin(p))
    if x < 0.85:
        p = f"/cache/obj-{rnd.randrange(CACHE_OBJECTS)}"
        return ranged("cache-range", p, truth.of_origin(p), rnd)
    if x < 0.9:  # a new cacheable object: a miss stored, evicting (max_size) or failing (a full disk)
        p = f"/cache/new-{rnd.randrange(1 << 40)}"
        return Req("cache-new", p, origin_body(p))
    p = f"/pass/obj-{rnd.randrange(PASS_OBJECTS)}"
    return Req("pass", f"{p}?n={rnd.randrange(1 << 30)}", truth.of_origin(p))


def ranged(kind, path, body, rnd):
    n = len(body)
    if rnd.random() < 0.2:  # a suffix range
        k = rnd.randrange(1, n + 1)
        return Req(kind, path, body, [("range", f"bytes=-{k}")], (n - k, n - 1))
    a = rnd.randrange(n)
    b = min(n - 1, a + rnd.randrange(1, 256 * 1024))
    return Req(kind, path, body, [("range", f"bytes={a}-{b}")], (a, b))


def verify(req, status, fields, body):
    """None when the answer is right, else (symptom, detail). `fields`: lower-case names."""
    want = req.body
    if req.range and status == 206:
        a, b = req.range
        want = req.body[a:b + 1]
        cr = fields.get("content-range", "")
        if cr != f"bytes {a}-{b}/{len(req.body)}":
            return "wrong-range", f"Content-Range {cr!r} for {a}-{b}/{len(req.body)}"
    elif status != 200 or (req.range and not req.kind.startswith("cache")):
        # A range of a cache miss may be answered whole (the origin ignores Range).
        return f"status-{status}", f"{req.path} {req.headers}"
    enc = fields.get("content-encoding", "identity")
    if enc == "gzip":
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError) as e:
            return "corrupt", f"gzip body does not decompress: {e}"
    elif enc != "identity":
        return "corrupt", f"unasked Content-Encoding {enc}"
    if len(body) != len(want):
        return "length", f"{len(body)} bytes of {len(want)}"
    if hashlib.sha256(body).digest() != hashlib.sha256(want).digest():
        return "corrupt", f"SHA-256 differs ({len(body)} bytes)"
    return None


class Recorder:
    """One line per request to the client's results file: [start, end, proto, kind, outcome,
    detail, flags]; outcome "ok" or a symptom; flags: "hit" (Cache-Status hit), "gz" (a
    gzip body), "retried" (sent again on a new connection after a keep-alive close)."""

    def __init__(self, path, proto):
        self.f, self.proto = open(path, "w", buffering=1 << 16), proto

    def add(self, t0, req, outcome, detail="", flags=""):
        self.f.write(json.dumps([round(t0, 3), round(time.time(), 3), self.proto, req.kind, outcome,
                                 detail[:300], flags]) + "\n")

    def close(self):
        self.f.close()


def flags_of(fields, retried=False):
    out = []
    if "hit" in fields.get("cache-status", ""):
        out.append("hit")
    if fields.get("content-encoding") == "gzip":
        out.append("gz")
    if retried:
        out.append("retried")
    return ",".join(out)


def client_context(alpn):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols([alpn])
    return ctx


# --- HTTP/1.1 -----------------------------------------------------------------------------------

def client_h1(root, out, deadline, seed):
    truth, rnd, rec = Truth(root), random.Random(seed), Recorder(out, "h1")
    ctx = client_context("http/1.1")
    conn, used = None, False
    while time.time() < deadline:
        req = pick(truth, rnd)
        t0, retried = time.time(), False
        while True:
            if conn is None:
                conn, used = http.client.HTTPSConnection("127.0.0.1", PORT, context=ctx, timeout=REQUEST_TIMEOUT), False
            reused = used
            try:
                conn.request("GET", req.path, headers={"Host": "localhost", **dict(req.headers)})
                resp = conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ssl.SSLEOFError) as e:
                conn.close()
                conn = None
                if reused and not retried:  # the keep-alive race: the server closed it first
                    retried = True
                    continue
                rec.add(t0, req, "reset" if reused else "connect", repr(e))
                break
            except (socket.timeout, TimeoutError) as e:
                conn.close()
                conn = None
                rec.add(t0, req, "timeout", repr(e))
                break
            except (OSError, ssl.SSLError, http.client.HTTPException) as e:
                conn.close()
                conn = None
                rec.add(t0, req, "connect" if not reused else "reset", repr(e))
                break
            fields = {k.lower(): v for k, v in resp.getheaders()}
            try:
                body = resp.read()
            except (http.client.IncompleteRead, OSError, ssl.SSLError, http.client.HTTPException) as e:
                conn.close()
                conn = None
                rec.add(t0, req, "timeout" if isinstance(e, (socket.timeout, TimeoutError)) else "cut", repr(e)[:200])
                break
            used = True
            if resp.will_close:
                conn.close()
                conn = None
            bad = verify(req, resp.status, fields, body)
            rec.add(t0, req, bad[0] if bad else "ok", bad[1] if bad else "", flags_of(fields, retried))
            break
        time.sleep(PAUSE)
    rec.close()


# --- HTTP/2 (curl) ------------------------------------------------------------------------------

def parse_heads(path):
    """The header blocks curl's -D wrote, one dict per response, the last block per transfer."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("latin-1")
    except OSError:
        return None, {}
    blocks = [b for b in re.split(r"\r?\n\r?\n", text) if b.startswith("HTTP/")]
    if not blocks:
        return None, {}
    lines = blocks[-1].splitlines()
    status = int(lines[0].split()[1])
    fields = {}
    for l in lines[1:]:
        if ":" in l:
            k, v = l.split(":", 1)
            fields[k.strip().lower()] = v.strip()
    return status, fields


def client_h2(root, out, deadline, seed, work):
    truth, rnd, rec = Truth(root), random.Random(seed), Recorder(out, "h2")
    d = os.path.join(work, f"h2-{seed}")
    os.makedirs(d, exist_ok=True)
    while time.time() < deadline:
        reqs = [pick(truth, rnd) for _ in range(8)]
        cmd = ["curl", "-sk", "--http2", "--parallel", "--parallel-max", "8", "--max-time", str(REQUEST_TIMEOUT),
               "--resolve", f"localhost:{PORT}:127.0.0.1"]
        for i, r in enumerate(reqs):
            if i:
                cmd.append("--next")
            cmd += ["--http2", "-sk", "--max-time", str(REQUEST_TIMEOUT), "-o", os.path.join(d, f"{i}.body"),
                    "-D", os.path.join(d, f"{i}.head"), "-w", f"{i} %{{exitcode}} %{{http_code}} %{{http_version}}\\n"]
            for k, v in r.headers:
                cmd += ["-H", f"{k}: {v}"]
            cmd.append(f"https://localhost:{PORT}{r.path}")
        for i in range(len(reqs)):
            for ext in ("body", "head"):
                try:
                    os.remove(os.path.join(d, f"{i}.{ext}"))
                except FileNotFoundError:
                    pass
        t0 = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=REQUEST_TIMEOUT * 4)
        results = {}
        for l in p.stdout.splitlines():
            parts = l.split()
            if len(parts) == 4:
                results[int(parts[0])] = (int(parts[1]), parts[2], parts[3])
        for i, r in enumerate(reqs):
            code, _, version = results.get(i, (-1, "000", "0"))
            if code != 0:
                # curl exit codes: 7 refused, 28 timeout, 35 TLS handshake, 16/92 HTTP/2 layer,
                # 18 partial file, 52 empty reply, 55/56 send/receive failure.
                kind = {7: "connect", 35: "connect", 28: "timeout", 18: "cut", 92: "cut", 16: "reset",
                        52: "reset", 55: "reset", 56: "cut"}.get(code, "reset")
                rec.add(t0, r, kind, f"curl exit {code}")
                continue
            if version != "2":
                rec.add(t0, r, "protocol", f"HTTP/{version}, not HTTP/2")
                continue
            status, fields = parse_heads(os.path.join(d, f"{i}.head"))
            try:
                with open(os.path.join(d, f"{i}.body"), "rb") as f:
                    body = f.read()
            except FileNotFoundError:
                body = b""
            bad = verify(r, status or 0, fields, body)
            rec.add(t0, r, bad[0] if bad else "ok", bad[1] if bad else "", flags_of(fields))
        time.sleep(PAUSE * 4)
    rec.close()


# --- HTTP/3 (aioquic) ---------------------------------------------------------------------------

def client_h3(root, out, deadline, seed):
    asyncio.run(h3_loop(root, out, deadline, seed))


async def h3_loop(root, out, deadline, seed):
    from aioquic.asyncio import connect
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.h3.connection import H3_ALPN, H3Connection
    from aioquic.h3.events import DataReceived, HeadersReceived
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.events import ConnectionTerminated, StreamReset

    class Client(QuicConnectionProtocol):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.h3 = H3Connection(self._quic)
            self.waiters = {}
            self.dead = None

        def _finish(self, sid, err=None, cut=False):
            fut, res = self.waiters.pop(sid, (None, None))
            if fut is not None and not fut.done():
                res["error"], res["cut"] = err, cut
                fut.set_result(res)

        def quic_event_received(self, event):
            if isinstance(event, ConnectionTerminated):
                self.dead = f"connection closed {event.error_code:#x} {event.reason_phrase}"
                for sid in list(self.waiters):
                    self._finish(sid, self.dead)
                return
            if isinstance(event, StreamReset):
                # HTTP/3 cuts a response by resetting its stream; the head sent before
                # may be discarded with it (RFC 9000 section 3.2): a cut either way.
                self._finish(event.stream_id, f"stream reset {event.error_code:#x}", cut=True)
            try:
                events = self.h3.handle_event(event)
            except Exception as e:  # aioquic's own check (e.g. Content-Length against the body)
                self.dead = f"h3 error {e!r}"
                for sid in list(self.waiters):
                    self._finish(sid, self.dead)
                return
            for e in events:
                if e.stream_id not in self.waiters:
                    continue
                res = self.waiters[e.stream_id][1]
                if isinstance(e, HeadersReceived):
                    res["fields"].update((k.decode().lower(), v.decode()) for k, v in e.headers)
                elif isinstance(e, DataReceived):
                    res["body"] += e.data
                if e.stream_ended:
                    self._finish(e.stream_id)

        async def get(self, req):
            sid = self._quic.get_next_available_stream_id()
            fut = asyncio.get_event_loop().create_future()
            self.waiters[sid] = (fut, {"fields": {}, "body": bytearray(), "error": None})
            fields = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"localhost"),
                      (b":path", req.path.encode())] + [(k.encode(), v.encode()) for k, v in req.headers]
            self.h3.send_headers(sid, fields, end_stream=True)
            self.transmit()
            return await asyncio.wait_for(fut, REQUEST_TIMEOUT)

    truth, rnd, rec = Truth(root), random.Random(seed), Recorder(out, "h3")
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, verify_mode=ssl.CERT_NONE,
                            server_name="localhost", idle_timeout=REQUEST_TIMEOUT)

    async def one(client, req, t0):
        try:
            res = await client.get(req)
        except asyncio.TimeoutError:
            rec.add(t0, req, "timeout", "no answer")
            return False
        if res["error"]:
            rec.add(t0, req, "cut" if res["fields"] or res.get("cut") else "reset", res["error"])
            return False
        status = int(res["fields"].get(":status", "0"))
        bad = verify(req, status, res["fields"], bytes(res["body"]))
        rec.add(t0, req, bad[0] if bad else "ok", bad[1] if bad else "", flags_of(res["fields"]))
        return True

    while time.time() < deadline:
        t0 = time.time()
        try:
            async with connect("127.0.0.1", PORT, configuration=cfg, create_protocol=Client,
                               wait_connected=True) as client:
                while time.time() < deadline and client.dead is None:
                    reqs = [pick(truth, rnd) for _ in range(4)]
                    t0 = time.time()
                    ok = await asyncio.gather(*(one(client, r, t0) for r in reqs))
                    if not all(ok):
                        break  # a new connection after any failure
                    await asyncio.sleep(PAUSE * 2)
                client.close()
        except (ConnectionError, OSError, asyncio.TimeoutError) as e:
            rec.add(t0, pick(truth, rnd), "connect", repr(e))
            await asyncio.sleep(0.5)
    rec.close()


# --- the origin ---------------------------------------------------------------------------------

def origin_main(port, mode_file):
    """The origin: HTTP/1.1 keep-alive, /cache/* cacheable for a day, /pass/* no-store; the body
    is origin_body(path). Reads its mode (ok, slow, garbage) from `mode_file` on each request."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    bodies = {}

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            try:
                with open(mode_file) as f:
                    mode = f.read().strip()
            except OSError:
                mode = "ok"
            if "/new-" in path:  # asked for once
                body = origin_body(path)
            else:
                if path not in bodies:
                    bodies[path] = origin_body(path)
                body = bodies[path]
            if mode == "garbage":
                if random.random() < 0.5:
                    self.wfile.write(os.urandom(64) + b"\r\n\r\n")
                else:
                    self.wfile.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n"
                                     "Cache-Control: public, max-age=86400\r\n\r\n".encode() + body[:len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            if mode == "slow":
                time.sleep(1.5)
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", '"%s"' % hashlib.sha256(body).hexdigest()[:16])
            self.send_header("Cache-Control", "public, max-age=86400" if path.startswith("/cache/") else "no-store")
            self.end_headers()
            if mode == "slow":
                q = len(body) // 4 + 1
                for i in range(0, len(body), q):
                    self.wfile.write(body[i:i + q])
                    self.wfile.flush()
                    time.sleep(0.3)
            else:
                self.wfile.write(body)

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.allow_reuse_address = True
    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()


class Origin:
    def __init__(self, work):
        self.mode_file = os.path.join(work, "origin.mode")
        self.set_mode("ok")
        self.proc = None
        self.start()

    def start(self):
        bench = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.proc = subprocess.Popen([sys.executable, "-m", "ktlsbench.soak", "origin", str(ORIGIN_PORT), self.mode_file],
                                     cwd=bench, stdout=subprocess.DEVNULL)
        wait_port(ORIGIN_PORT)

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def set_mode(self, mode):
        tmp = self.mode_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(mode)
        os.replace(tmp, self.mode_file)


# --- the server under test ----------------------------------------------------------------------

def write_config(path, work, generation):
    """The configuration: the same [cache] every time (a reload keeps the cache), a field on
    static files and the proxy's read_timeout changed by each generation."""
    cache = os.path.join(work, "cache-fs", "cache")
    up = f'upstream = ["http://127.0.0.1:{ORIGIN_PORT}"]'
    timeout = f'read_timeout = "{5 + generation % 2}s"\nfail_timeout = "2s"'
    text = f"""compress = ["gzip"]
admin = "127.0.0.1:{ADMIN_PORT}"
state_dir = "{os.path.join(work, 'state')}"
max_connections_per_ip = 4096

[[headers]]
path = "/**"
set = {{ "X-Soak-Generation" = "{generation}" }}

[[proxy]]
path = "/cache/**"
{up}
cache = true
{timeout}

[[proxy]]
path = "/pass/**"
{up}
{timeout}

[cache]
dir = "{cache}"
max_size = "12M"
max_object_size = "1M"
"""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class Server:
    """ktlsd under test, restartable after a SIGKILL; `lock` keeps reloads away from a restart."""

    def __init__(self, args, root, work, out, cfg):
        self.args, self.root, self.work, self.out, self.cfg = args, root, work, out, cfg
        self.lock = threading.Lock()
        self.starts = 0
        self.start()

    def start(self):
        self.starts += 1
        self.k = servers.Ktlsd(f"ktlsd-{self.starts}", self.args.ktlsd, self.root, PORT, self.out,
                               ["--config", self.cfg, "--http3"])

    @property
    def pid(self):
        return self.k.proc.pid


# --- faults -------------------------------------------------------------------------------------

class Faults:
    def __init__(self, server, origin, work):
        self.server, self.origin, self.work = server, origin, work
        self.windows = []  # (fault, start, end, detail)
        self.reloads = 0
        self.generation = 0

    def run(self, name, secs):
        t0, detail = time.time(), ""
        log(f"  {time.strftime('%H:%M:%S')} fault {name} ({secs} s)")
        if name == "origin-down":
            self.origin.kill()
            time.sleep(secs)
            self.origin.start()
        elif name in ("origin-slow", "origin-garbage"):
            self.origin.set_mode(name.split("-")[1])
            time.sleep(secs)
            self.origin.set_mode("ok")
        elif name == "server-sigkill":
            with self.server.lock:
                os.kill(self.server.pid, signal.SIGKILL)
                self.server.k.proc.wait()
                self.server.start()
            detail = f"down for {time.time() - t0:.2f} s"
        elif name == "cache-disk-full":
            filler = os.path.join(self.work, "cache-fs", "filler")
            written = 0
            with open(filler, "wb", buffering=0) as f:
                block = b"\0" * (1 << 20)
                while True:
                    try:
                        written += f.write(block)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        break
            detail = f"{written >> 20} MiB written until ENOSPC"
            time.sleep(secs)
            os.remove(filler)
        elif name == "descriptors":
            pid = self.server.pid
            soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
            held = len(os.listdir(f"/proc/{pid}/fd"))
            limit = max(64, held - 32)  # below what is open: nothing opens until ktlsd gives some back
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, hard))
            detail = f"RLIMIT_NOFILE {soft} -> {limit} ({held} open)"
            time.sleep(secs)
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        self.windows.append((name, t0, time.time(), detail))

    def reload_loop(self, stop):
        while not stop.wait(RELOAD_EVERY):
            with self.server.lock:
                self.generation += 1
                write_config(self.server.cfg, self.work, self.generation)
                t = time.time()
                os.kill(self.server.pid, signal.SIGHUP)
                self.reloads += 1
                self.windows.append(("reload", t, t, f"generation {self.generation}"))


def cache_fs(fs, pid):
    """The cache's file system: (MiB used, files under it, MiB of deleted files ktlsd holds open)."""
    st = os.statvfs(fs)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize / (1 << 20)
    files = sum(len(f) for _, _, f in os.walk(fs))
    held = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(fs) and target.endswith(" (deleted)"):
                    held += os.stat(f"/proc/{pid}/fd/{fd}").st_size
            except OSError:
                pass
    except OSError:
        pass
    return round(used, 2), files, round(held / (1 << 20), 2)


def sampler(server, samples, stop, t_start, fs):
    while True:
        pid = server.pid
        try:
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            fds = None
        rss = rss_kib([pid])
        if fds is not None and rss:
            samples.append((time.time() - t_start, rss / 1024, fds, server.starts, *cache_fs(fs, pid)))
        if stop.wait(SAMPLE_EVERY):
            return


# --- analysis and report ------------------------------------------------------------------------

def explain(rec, windows):
    """The faults that explain a failed request, [] when none does."""
    t0, t1, _, kind, outcome = rec[:5]
    found = []
    for name, s, e, _ in windows:
        kinds, symptoms = EXPLAINS[name]
        if kind in kinds and outcome in symptoms and t0 <= e + GRACE and t1 >= s:
            found.append(name)
    return found


def cache_check(truth):
    """Fetches every cache object once more over HTTP/1.1: (answered as hits and right, hits
    wrong, objects not hits)."""
    ctx = client_context("http/1.1")
    verified = bad = other = 0
    for i in range(CACHE_OBJECTS):
        p = f"/cache/obj-{i}"
        conn = http.client.HTTPSConnection("127.0.0.1", PORT, context=ctx, timeout=30)
        conn.request("GET", p, headers={"Host": "localhost"})
        r = conn.getresponse()
        fields = {k.lower(): v for k, v in r.getheaders()}
        body = r.read()
        conn.close()
        hit = "hit" in fields.get("cache-status", "")
        wrong = verify(Req("cache", p, truth.of_origin(p)), r.status, fields, body)
        if hit and not wrong:
            verified += 1
        elif hit:
            bad += 1
            log(f"  stored entry {p} is wrong: {wrong}")
        else:
            other += 1
    return verified, bad, other


def metric(name):
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{ADMIN_PORT}/metrics", timeout=10).read().decode()
    except OSError:
        return None
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else None


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def chart(samples, windows, path, t0):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b, c) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    mins = [s[0] / 60 for s in samples]
    a.plot(mins, [s[1] for s in samples], lw=1)
    a.set_ylabel("RSS (MiB)")
    a.set_ylim(bottom=0)
    b.plot(mins, [s[2] for s in samples], lw=1, color="tab:orange")
    b.set_ylabel("open descriptors")
    b.set_ylim(bottom=0)
    c.plot(mins, [s[4] for s in samples], lw=1, color="tab:green", label="cache disk used")
    c.plot(mins, [s[6] for s in samples], lw=1, color="tab:red", label="deleted files ktlsd holds open")
    c.set_ylabel("MiB")
    c.set_ylim(bottom=0)
    c.legend(loc="upper left", fontsize=7)
    c.set_xlabel("minutes")
    colours = {"origin-down": "tab:red", "origin-slow": "tab:olive", "origin-garbage": "tab:purple",
               "server-sigkill": "black", "cache-disk-full": "tab:cyan", "descriptors": "tab:brown"}
    seen = set()
    for name, s, e, _ in windows:
        if name in colours:
            for ax in (a, b, c):
                ax.axvspan((s - t0) / 60, max(e - t0, s - t0 + 1) / 60, color=colours[name], alpha=0.2,
                           label=name if ax is a and name not in seen else None)
            seen.add(name)
    a.legend(loc="upper left", fontsize=7, ncol=3)
    a.set_title("ktlsd under the fault soak: RSS and descriptors (faults shaded)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def scenario_soak(args, work):
    minutes = args.minutes
    reports = os.path.join(os.path.dirname(args.out), "reports")
    out = os.path.join(args.out, "soak")
    os.makedirs(out, exist_ok=True)
    servers.ACCESS_LOG = True  # ktlsd's access log goes to bench/results/soak/, for the failures
    root = os.path.join(work, "www")
    make_root(root)
    fs = os.path.join(work, "cache-fs")
    os.makedirs(fs)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", fs], check=True)
    stop = threading.Event()
    procs, threads = [], []
    origin = server = None
    try:
        origin = Origin(work)
        cfg = os.path.join(work, "ktlsd.toml")
        write_config(cfg, work, 0)
        server = Server(args, root, work, out, cfg)
        faults = Faults(server, origin, work)
        samples = []
        t_start = time.time()
        deadline = t_start + minutes * 60
        threads = [threading.Thread(target=sampler, args=(server, samples, stop, t_start, fs)),
                   threading.Thread(target=faults.reload_loop, args=(stop,))]
        for t in threads:
            t.start()
        ctx = multiprocessing.get_context("fork")
        files = {}
        for name, fn, extra in [("h1-a", client_h1, ()), ("h1-b", client_h1, ()), ("h2", client_h2, (work,)),
                                ("h3", client_h3, ())]:
            files[name] = os.path.join(out, f"requests-{name}.jsonl")
            p = ctx.Process(target=fn, args=(root, files[name], deadline, len(procs) + 1, *extra), name=name)
            p.start()
            procs.append(p)
        gap = 15 if minutes >= 10 else 5
        time.sleep(10)
        cycle = 0
        while time.time() < deadline - 25:
            for name, secs in FAULTS:
                if name == "server-sigkill" and cycle:
                    continue
                if time.time() + secs > deadline - 15:
                    break
                faults.run(name, secs)
                time.sleep(min(gap, max(0, deadline - time.time())))
            cycle += 1
        for p in procs:
            p.join(timeout=max(0, deadline - time.time()) + REQUEST_TIMEOUT * 5)
            if p.is_alive():
                p.kill()
                raise RuntimeError(f"client {p.name} did not finish")
            if p.exitcode != 0:
                raise RuntimeError(f"client {p.name} exited with {p.exitcode}")
        stop.set()
        for t in threads:
            t.join()
        time.sleep(3)
        fds_end = len(os.listdir(f"/proc/{server.pid}/fd"))
        entries = metric("ktlsd_cache_entries")
        verified, wrong, not_hit = cache_check(Truth(root))
        fds_after = len(os.listdir(f"/proc/{server.pid}/fd"))
        with server.lock:
            server.k.stop()
    finally:
        stop.set()
        for t in threads:
            if t.is_alive():
                t.join()
        for p in procs:
            if p.is_alive():
                p.kill()
        if origin and origin.proc:
            origin.kill()
        if server and server.k.proc.poll() is None:
            server.k.proc.kill()
            server.k.proc.wait()
        subprocess.run(["umount", "-l", fs], check=False)

    records = []
    for name, path in files.items():
        with open(path) as f:
            records += [json.loads(l) for l in f]
    windows = faults.windows
    per_proto = collections.Counter(r[2] for r in records)
    per_kind = collections.Counter(r[3] for r in records)
    failures = [r for r in records if r[4] != "ok"]
    explained, unexplained = collections.Counter(), []
    for r in failures:
        why = explain(r, windows)
        if why:
            explained[(r[4], "+".join(sorted(set(why))))] += 1
        else:
            unexplained.append(r)
    corrupt = [r for r in records if r[4] in ("corrupt", "length", "wrong-range")]
    retried = sum("retried" in r[6] for r in records)
    hits = sum("hit" in r[6] for r in records if r[4] == "ok")
    gz = sum("gz" in r[6] for r in records if r[4] == "ok")
    ranges206 = sum(1 for r in records if r[4] == "ok" and r[3] in ("range", "cache-range"))

    # RSS flat: the last 5 minutes against minutes 5-10.
    base = [s[1] for s in samples if 300 <= s[0] < 600]
    last = [s[1] for s in samples if s[0] >= minutes * 60 - 300]
    if minutes >= 15 and base and last:
        ratio = mean(last) / mean(base)
        rss_flat = abs(ratio - 1) <= 0.10
        rss_line = (f"mean {mean(base):.1f} MiB in minutes 5-10, {mean(last):.1f} MiB in the last 5 minutes: "
                    f"{ratio:.3f}x, {'flat' if rss_flat else 'NOT flat'} (goal: within 10%)")
        fbase = [s[2] for s in samples if 300 <= s[0] < 600]
        flast = [s[2] for s in samples if s[0] >= minutes * 60 - 300]
        fd_line = (f"descriptors: max {max(fbase)} (mean {mean(fbase):.0f}) in minutes 5-10, max {max(flast)} "
                   f"(mean {mean(flast):.0f}) in the last 5 minutes")
    else:
        rss_flat, rss_line = True, f"not judged: a run of {minutes} minutes has no minutes 5-10 and last 5 apart"
        fd_line = "descriptors: see the table"

    svg = f"soak-{minutes}m.svg"
    os.makedirs(reports, exist_ok=True)
    chart(samples, windows, os.path.join(reports, svg), t_start)

    faults_table = ["| fault | times | total seconds | details (first) |", "|---|---|---|---|"]
    by = collections.defaultdict(list)
    for w in windows:
        by[w[0]].append(w)
    for name in [f for f, _ in FAULTS] + ["reload"]:
        ws = by.get(name, [])
        faults_table.append(f"| {name} | {len(ws)} | {sum(e - s for _, s, e, _ in ws):.0f} | "
                            f"{ws[0][3] if ws else '-'} |")
    fail_table = ["| symptom | explained by | requests |", "|---|---|---|"]
    for (sym, why), n in sorted(explained.items()):
        fail_table.append(f"| {sym} | {why} | {n} |")
    for sym, n in sorted(collections.Counter(r[4] for r in unexplained).items()):
        fail_table.append(f"| {sym} | **unexplained** | {n} |")
    if len(fail_table) == 2:
        fail_table.append("| (none) | | 0 |")
    rss_rows = ["| minute | RSS MiB (mean) | descriptors (max) | server start | cache disk used MiB (max) "
                "| files on it (min) | deleted files ktlsd holds open, MiB (max) |", "|---|---|---|---|---|---|---|"]
    for m in range(minutes + 1):
        ss = [s for s in samples if m * 60 <= s[0] < (m + 1) * 60]
        if ss:
            rss_rows.append(f"| {m} | {mean([s[1] for s in ss]):.1f} | {max(s[2] for s in ss)} | {ss[-1][3]} | "
                            f"{max(s[4] for s in ss):.1f} | {min(s[5] for s in ss)} | {max(s[6] for s in ss):.1f} |")
    passed = not unexplained and not corrupt and rss_flat and wrong == 0
    load = os.getloadavg()
    text = f"""Soak of {minutes} minutes (`bench/run soak --minutes {minutes}`), ended {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}:
**{'PASSED' if passed else 'FAILED'}**. {len(records)} requests, {len(failures)} failed, of which
{len(failures) - len(unexplained)} explained by a fault and **{len(unexplained)} unexplained**;
**{len(corrupt)} corrupt** answers (a body or range that differs from the source).

The machine: 2 cores shared with other builds during the run (load average at the end
{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}), so the request rate says little; correctness does not depend on it.
The clients, the origin and ktlsd ({servers.WORKERS} workers) share those cores.

### Requests

| protocol | requests |
|---|---|
""" + "\n".join(f"| {p} | {n} |" for p, n in sorted(per_proto.items())) + """

| kind | requests |
|---|---|
""" + "\n".join(f"| {k} | {n} |" for k, n in sorted(per_kind.items())) + f"""

Answered right: {len(records) - len(failures)}; of them {hits} cache hits, {gz} gzip bodies
(decompressed, then checked), {ranges206} ranges (206 against the slice of the source, or a
cache miss answered whole). {retried} HTTP/1.1 requests were sent again on a new connection
after the server closed a keep-alive connection first (the reload's close between requests).

### Faults

{chr(10).join(faults_table)}

### Failures by cause

A failure counts as explained when a fault whose window (plus {GRACE:.0f} s) overlaps the request
can cause that symptom; reloads and the full cache disk explain none.

{chr(10).join(fail_table)}
""" + ("\nUnexplained (first 20):\n\n```\n" + "\n".join(json.dumps(r) for r in unexplained[:20]) + "\n```\n"
       if unexplained else "") + f"""
### Memory and descriptors

![RSS and descriptors over time]({svg})

RSS: {rss_line}. {fd_line}. The server was started {server.starts} times (the SIGKILL restarts it;
the samples are of the process serving at that time). Descriptors when the load ended: {fds_end}; after
the final cache check: {fds_after}.

{chr(10).join(rss_rows)}

### Cache

Entries stored at the end (`ktlsd_cache_entries`): {entries if entries is None else int(entries)}. Each of the
{CACHE_OBJECTS} cache objects fetched once more: {verified} answered from the cache (hit) with the right
SHA-256, {wrong} hits with wrong bytes, {not_hit} not hits (evicted by `max_size`, or never stored).
"""
    with open(os.path.join(reports, f"soak-{minutes}m.md"), "w") as f:
        f.write(f"## soak, {minutes} minutes (kernel {os.uname().release})\n\n{text}")
    raw = {"passed": passed, "requests": len(records), "failures": len(failures), "unexplained": len(unexplained),
           "corrupt": len(corrupt), "explained": {f"{k[0]} / {k[1]}": v for k, v in explained.items()},
           "samples": samples, "faults": windows, "cache": {"entries": entries, "verified": verified,
                                                            "wrong": wrong, "not_hit": not_hit}}
    return text, raw


if __name__ == "__main__":
    if sys.argv[1:2] == ["origin"]:
        origin_main(int(sys.argv[2]), sys.argv[3])
