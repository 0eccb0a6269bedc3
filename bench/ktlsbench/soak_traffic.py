"""The soak's traffic (scenario soak): the source of truth every answer is checked against, the
request mix, and the three clients, each run in a process of its own until the run's deadline.

- The truth: files under ROOT (16 binary, 8 text), and the origin's bodies, a function of their
  path (`origin_body`), which the origin serves and the clients compute alike.
- `verify`: status (200, or 206 with the right Content-Range for a range), length and SHA-256
  against the source, a range against its slice, a gzip body after decompressing it.
- HTTP/1.1: `http.client`, keep-alive connections; a request on a reused connection that the
  server closed before any byte of the answer is sent again once on a new connection, as curl
  and browsers do (RFC 9112 section 9.3.1), and counted.
- HTTP/2: `curl --http2 --parallel`, 8 requests multiplexed on one connection per curl process.
- HTTP/3: Python `aioquic`, one long-lived QUIC connection, 4 requests at once; a new
  connection after any failure.

Each request is one line of the client's results file ([start, end, protocol, kind, outcome,
detail, flags]), which the scenario reads at the end."""

import asyncio
import gzip
import hashlib
import http.client
import json
import os
import random
import re
import socket
import ssl
import subprocess
import time

from .system import make_file

PORT = 18743  # HTTPS over TCP and HTTP/3 over UDP
CACHE_OBJECTS = 160  # /cache/obj-0 .. /cache/obj-159, 1 KiB to 97 KiB each
PASS_OBJECTS = 40
REQUEST_TIMEOUT = 15
# Each client's pause between requests (HTTP/1.1), batches of 4 (HTTP/3, twice it) and of 8
# (HTTP/2, four times it): the machine is shared, and a steady load shows growth as well as a
# saturating one.
PAUSE = 0.01

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
