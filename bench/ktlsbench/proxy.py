"""Scenario proxy (this machine): ktlsd's reverse proxy and response cache against nginx's
`proxy_pass` and `proxy_cache`, both in front of the same upstream, in one interleaved plan.

The upstream is a third server, not measured: nginx over plain HTTP on loopback (`Origin`),
serving 10 KiB files with `expires 1h` (so both caches may keep them), and a slow copy of them
under /slow/ (`limit_rate`, about 2.5 s per answer) whose requests it logs, so that the bench
counts at the origin what 100 concurrent misses on one key cost. Both proxies keep upstream
connections alive (nginx: `upstream { keepalive 32; }`, `proxy_http_version 1.1`; ktlsd: its
default `keepalive = 32`), have 2 workers (`--workers`), the bench's certificate, `sendfile on`
(nginx) and no access log.

Measures, each as the ratio ktlsd/nginx beside its goal:
- 10 KiB cache hits: req/s over HTTP/1.1 (`wrk -t1 -c64`) and HTTP/2 (`h2load -c16 -m32`);
- 10 KiB through the proxy without cache: req/s over HTTP/1.1 (`wrk -t1 -c64`);
- the server CPU per request of a 10 KiB hit against ktlsd serving the same bytes as a static
  file, both measured in the same run (`wrk`, utime+stime from /proc);
- 100 concurrent misses on one fresh key (`curl --parallel`, 100 connections): the requests the
  origin received (ktlsd coalesces; nginx with `proxy_cache_lock on`);
- WebSocket tunnels (HTTP/1.1 Upgrade; nginx as its documentation proxies WebSockets:
  `proxy_http_version 1.1`, `proxy_set_header Upgrade $http_upgrade` and `Connection "upgrade"`)
  to a third upstream, `wsload upstream` (`wsload.c`, built here with cc: a C epoll program, so
  that neither end of the tunnel is the bottleneck): echo round trips per second of a 32-byte
  frame on 64 tunnels (`wsload rt`) with the server's CPU per round trip, and bulk MB/s of 64 KiB
  frames from the upstream through one tunnel (`wsload bulk`) with the server's CPU per GiB;
- gRPC-style HTTP/2 to an HTTP/2 upstream: 1 KiB answers, h2load -c16 -m32 through the proxy
  (TLS, h2) to nghttpd without TLS (`H2cOrigin`, prior knowledge): ktlsd's `h2c://` upstream
  against nginx's `grpc_pass grpc://` (an `upstream` block with `keepalive 32`, so that nginx
  reuses its upstream connections), req/s and the proxy's CPU per request.

wrk, the proxy and the origin share this machine's cores, so the proxied rate is set by the CPU
all three spend per request. The scenario therefore also measures wrk's and the origin's CPU per
proxied request, and the upstream leg's floor (`upstream_leg_floor`): the kernel time of sending a
proxy's request head to the origin and reading its 10 KiB answer on keep-alive loopback connections,
with nothing else done. From these it states what ktlsd's CPU per proxied request would have to be
for the rate goal, beside the least it can be (its static-file CPU for the same bytes plus that floor).

With --vm (in the guest, through `bench/run proxy --vm`): large bodies over kTLS instead (a cache
hit, and a body proxied without the cache over HTTP/1.1 and HTTP/2), see scenario_proxy_vm."""

import math
import os
import random
import re
import resource
import select
import socket
import subprocess
import time
import urllib.request

from . import crypto, peers, servers
from .clients import h2load, wrk_rps
from .servers import Ktlsd, require_ktls
from .stats import median, ratio_ci, size_name, versus_table
from .system import cpu_seconds, log, make_file, proc_counters_flat, sh

ORIGIN_PORT = 18680
WS_PORT = 18681
# Tunnels of the round-trip measure, and of the bulk one.
WS_RT_CONNS = 64
WS_BULK_CONNS = 1
H2C_PORT = 18682
KTLSD_PORT = 18643
NGINX_PORT = 18644
# The slow path's rate: a 10 KiB answer takes about 2.5 s, longer than 100 handshakes here and
# shorter than ktlsd's coalescing wait (5 s), after which a waiter would go upstream itself.
SLOW_RATE = "4k"
MISSES = 100


# The measures of each plan, selectable with --parts (default: all). On this machine: `misses`
# is the 100 concurrent misses, `floor` the upstream leg's floor, the others rows of the plan.
HOST_PARTS = ("hit", "pass", "static", "hit-h2", "h2c", "ws-rt", "ws-bulk", "misses", "floor")
# In the VM (--vm): the cache hit, the proxied bodies (HTTP/1.1 and HTTP/2), the tunnel.
VM_PARTS = ("hit", "proxied", "tunnel")
# Shorthands on this machine.
PART_GROUPS = {"tunnel": ("ws-rt", "ws-bulk")}


def parts(spec, vm):
    """The measures `spec` (comma-separated, or "all") names, in the plan's order; ValueError
    for a name the plan (of the VM with `vm`) does not have."""
    known = VM_PARTS if vm else HOST_PARTS
    if spec == "all":
        return list(known)
    want = set()
    for name in (n.strip() for n in spec.split(",") if n.strip()):
        group = PART_GROUPS.get(name, (name,)) if not vm else (name,)
        for n in group:
            if n not in known:
                raise ValueError(f"no measure {name!r} {'in the VM' if vm else 'on this machine'}; "
                                 f"choose from {', '.join(known)}" + ("" if vm else ", tunnel"))
            want.add(n)
    if not want:
        raise ValueError("no measure named")
    return [n for n in known if n in want]


class Origin(peers.Peer):
    """The upstream of both proxies: nginx over plain HTTP, 2 workers, `expires 1h` on every
    file, and `limit_rate` with an access log under /slow/ only (the coalescing count)."""
    kind = "origin"
    stop_signal = peers.Nginx.stop_signal

    def launch(self, root, port, ktls, http2, connections):
        return peers.nginx(self, 2, connections, f"""
  server {{
    listen 127.0.0.1:{port} reuseport;
    root {root};
    expires 1h;
    location /slow/ {{
      limit_rate {SLOW_RATE};
      access_log {self.path("slow.log")};
    }}
  }}""")

    def slow_requests(self, marker):
        """Requests the origin logged whose line holds `marker` (a run's query string)."""
        try:
            with open(self.path("slow.log")) as f:
                return sum(marker in line for line in f)
        except FileNotFoundError:
            return 0


class H2cOrigin(peers.Peer):
    """The HTTP/2 upstream of the gRPC-style rows: nghttpd without TLS (prior knowledge),
    2 workers, serving the origin's files."""
    kind = "h2c-origin"

    def launch(self, root, port, ktls, http2, connections):
        return ["nghttpd", "--no-tls", "-n", "2", "-d", root, str(port)], {}


class NginxProxy(peers.Nginx):
    """nginx as a caching reverse proxy, as its documentation configures one: an `upstream`
    block with `keepalive 32`, `proxy_http_version 1.1` and an empty Connection field;
    `proxy_cache` on /cache/ and /slow/ (with `proxy_cache_lock on` there), `proxy_pass`
    alone on /pass/; HTTP/2 on its listen line (wrk still speaks HTTP/1.1 to it); with `ktls`,
    `ssl_conf_command Options KTLS` (OpenSSL hands the records to the kernel, and a hit leaves
    by `SSL_sendfile`)."""

    def launch(self, root, port, ktls, http2, connections):
        cache = self.path("cache")
        os.makedirs(cache, exist_ok=True)
        proxy = """proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";"""
        return peers.nginx(self, servers.WORKERS, connections, f"""
  upstream origin {{
    server 127.0.0.1:{ORIGIN_PORT};
    keepalive 32;
  }}
  upstream h2c {{
    server 127.0.0.1:{H2C_PORT};
    keepalive 32;
  }}
  proxy_cache_path {cache} levels=1:2 keys_zone=bench:10m max_size=1g inactive=60m use_temp_path=off;
  server {{
    listen 127.0.0.1:{port} ssl http2 reuseport;
    ssl_certificate {servers.CERT};
    ssl_certificate_key {servers.KEY};
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_tickets on;
    {"ssl_conf_command Options KTLS;" if ktls else ""}
    root {root};
    location /cache/ {{
      {proxy}
      proxy_cache bench;
      add_header X-Cache-Status $upstream_cache_status;
    }}
    location /slow/ {{
      {proxy}
      proxy_cache bench;
      proxy_cache_lock on;
      proxy_cache_lock_timeout 5s;
      add_header X-Cache-Status $upstream_cache_status;
    }}
    location /pass/ {{
      {proxy}
    }}
    location /ws/ {{
      proxy_pass http://127.0.0.1:{WS_PORT};
      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection "upgrade";
      proxy_read_timeout 1h;
    }}
    location /h2c/ {{
      grpc_pass grpc://h2c;
    }}
  }}""", self.access_log())


def ktlsd_config(work, cache_limits='max_size = "1G"'):
    """ktlsd's configuration: the same three paths, /cache/ and /slow/ cached, with
    `cache_limits` in [cache]."""
    cache = os.path.join(work, "ktlsd-cache")
    up = f'upstream = ["http://127.0.0.1:{ORIGIN_PORT}"]'
    path = os.path.join(work, "ktlsd-proxy.toml")
    with open(path, "w") as f:
        f.write(f"""[[proxy]]
path = "/cache/**"
{up}
cache = true

[[proxy]]
path = "/slow/**"
{up}
cache = true

[[proxy]]
path = "/pass/**"
{up}

[[proxy]]
path = "/ws/**"
upstream = ["http://127.0.0.1:{WS_PORT}"]

[[proxy]]
path = "/h2c/**"
upstream = ["h2c://127.0.0.1:{H2C_PORT}"]

[cache]
dir = "{cache}"
{cache_limits}
""")
    return path


def head_field(port, path, field):
    """`field` of a GET of `path` (HTTP/1.1), after checking the answer is 200 and 10 KiB."""
    out = sh(["curl", "-sk", "--http1.1", "-D", "-", "-o", "/dev/null", "-w", "%{size_download}",
              f"https://127.0.0.1:{port}{path}"])
    size = int(out.rsplit("\n", 1)[-1])
    status = out.split(" ", 2)[1] if out.startswith("HTTP/") else "?"
    if status != "200" or size != 10 * 1024:
        raise RuntimeError(f"GET {path} on port {port}: status {status}, {size} bytes:\n{out}")
    m = re.search(rf"(?im)^{re.escape(field)}:\s*(.*?)\s*$", out)
    return m.group(1) if m else None


def warm(server, status_field, hit):
    """Fills the server's cache with /cache/10k.bin and fails unless the next answer is a hit."""
    head_field(server.port, "/cache/10k.bin", status_field)
    got = head_field(server.port, "/cache/10k.bin", status_field)
    if not got or not hit(got):
        raise RuntimeError(f"{server.name}: /cache/10k.bin is not a cache hit after one request ({status_field}: {got})")
    head_field(server.port, "/pass/10k.bin", status_field)


def concurrent_misses(server, origin, marker):
    """MISSES clients at once (each on its own HTTP/1.1 connection) ask for one fresh key;
    returns the requests the origin received for it. Fails on any answer but a whole 200."""
    url = f"https://127.0.0.1:{server.port}/slow/10k.bin?{marker}"
    cmd = ["curl", "-sk", "--http1.1", "--parallel", "--parallel-immediate", "--parallel-max", str(MISSES),
           "-w", "%{http_code} %{size_download}\\n"]
    for _ in range(MISSES):
        cmd += ["-o", "/dev/null", url]
    out = subprocess.run(cmd, text=True, capture_output=True, timeout=120).stdout.split("\n")
    answers = [l for l in out if l.strip()]
    bad = [a for a in answers if a != f"200 {10 * 1024}"]
    if len(answers) != MISSES or bad:
        raise RuntimeError(f"{server.name}: {len(answers)} answers to {MISSES} concurrent misses, bad: {bad[:5]}")
    return origin.slow_requests(marker)


class WsLoad:
    """`wsload.c` built into `work`, and its upstream (`wsload upstream WS_PORT`) running."""

    def __init__(self, work):
        self.bin = os.path.join(work, "wsload")
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wsload.c")
        sh(["cc", "-O2", "-o", self.bin, src, "-lssl", "-lcrypto"])
        self.proc = subprocess.Popen([self.bin, "upstream", str(WS_PORT)], stdout=subprocess.PIPE, text=True)
        if not self.proc.stdout.readline().startswith("listening"):
            raise RuntimeError("wsload upstream did not start")

    def pids(self):
        return [self.proc.pid]

    def run(self, server, mode, conns, seconds):
        """`wsload MODE` through `server` for `seconds`: (count, seconds, server CPU seconds), the
        count in round trips (rt) or bytes (bulk)."""
        path = "/ws/echo" if mode == "rt" else "/ws/bulk"
        c0 = cpu_seconds(server.pids())
        out = sh([self.bin, mode, str(server.port), path, str(conns), str(seconds)]).split()
        cpu = cpu_seconds(server.pids()) - c0
        if len(out) != 3 or int(out[1]) == 0:
            raise RuntimeError(f"wsload {mode} through {server.name}: {out}")
        return int(out[1]), float(out[2]), cpu

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def require_free(*ports):
    """Fails when another process already listens on one of `ports` (it would answer instead).
    SO_REUSEADDR, as the servers bind: connections of a finished run in TIME-WAIT do not count."""
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError as e:
                raise RuntimeError(f"port {port} is taken ({e}): stop what listens there") from None


# The upstream leg's floor: as many keep-alive connections to the origin as wrk holds to a proxy,
# and a request head like the one ktlsd forwards (the client's, X-Forwarded-*, Forwarded, Via).
LEG_CONNS = 64
LEG_HEAD = (f"GET /pass/10k.bin HTTP/1.1\r\nHost: 127.0.0.1:{KTLSD_PORT}\r\nX-Forwarded-For: 127.0.0.1\r\n"
            f"X-Forwarded-Proto: https\r\nX-Forwarded-Host: 127.0.0.1:{KTLSD_PORT}\r\n"
            f"Forwarded: for=127.0.0.1;host=\"127.0.0.1:{KTLSD_PORT}\";proto=https\r\nVia: 1.1 ktlsd\r\n\r\n").encode()


def upstream_leg_floor(seconds, slices=5):
    """Kernel CPU microseconds per request of the upstream leg alone: LEG_HEAD sent on each of
    LEG_CONNS keep-alive loopback connections to the origin, then each whole answer read, in
    rounds (a short sleep between the two halves, so that the reads rarely wait). Only this
    thread's system time counts (the loopback delivery it does in its context included), so the
    Python around it is not; the median of `slices`. The least any proxy pays for one request
    out and one 10 KiB response in; it leaves out the proxy's own waiting (epoll, wakeups)."""
    conns = [socket.create_connection(("127.0.0.1", ORIGIN_PORT)) for _ in range(LEG_CONNS)]
    buf = bytearray(1 << 16)
    try:
        # The answer's length, from a first exchange: the same file, so the same length each time.
        conns[0].sendall(LEG_HEAD)
        got = b""
        while b"\r\n\r\n" not in got:
            got += conns[0].recv(1 << 16) or _closed()
        head, body = got.split(b"\r\n\r\n", 1)
        m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        if not head.startswith(b"HTTP/1.1 200") or not m:
            raise RuntimeError(f"upstream leg floor: the origin answered {head[:200]!r}")
        answer = len(head) + 4 + int(m.group(1))
        left = answer - len(head) - 4 - len(body)
        while left > 0:
            left -= len(conns[0].recv(left) or _closed())
        for c in conns:
            c.setblocking(False)
        per_request = []
        for _ in range(slices):
            r0, c0, n = resource.getrusage(resource.RUSAGE_THREAD), time.thread_time(), 0
            while time.thread_time() - c0 < seconds / slices:
                for c in conns:
                    c.send(LEG_HEAD)
                time.sleep(0.002)
                for c in conns:
                    read = 0
                    while read < answer:
                        try:
                            got = c.recv_into(buf, answer - read) or _closed()
                        except BlockingIOError:
                            select.select([c], [], [])
                            continue
                        if read == 0 and not buf.startswith(b"HTTP/1.1 200 "):
                            raise RuntimeError(f"upstream leg floor: an answer began {bytes(buf[:40])!r}")
                        read += got
                n += len(conns)
            r1 = resource.getrusage(resource.RUSAGE_THREAD)
            per_request.append((r1.ru_stime - r0.ru_stime) * 1e6 / n)
    finally:
        for c in conns:
            c.close()
    per_request.sort()
    log("  upstream leg floor (request head out, 10 KiB answer in, loopback keep-alive): "
        f"{per_request[len(per_request) // 2]:.2f} kernel us/request (median of "
        + ", ".join(f"{x:.2f}" for x in per_request) + ")")
    return per_request[len(per_request) // 2]


def _closed():
    raise RuntimeError("upstream leg floor: the origin closed a keep-alive connection")


def scenario_proxy(args, work):
    if args.vm:
        return scenario_proxy_vm(args, work)
    if "nginx" not in peers.PEERS:
        raise RuntimeError("the proxy scenario compares with nginx: keep it in --peers")
    require_free(ORIGIN_PORT, KTLSD_PORT, NGINX_PORT, WS_PORT, H2C_PORT)
    root, origin_root = os.path.join(work, "www"), os.path.join(work, "origin")
    for d in ("cache", "pass", "slow"):
        os.makedirs(os.path.join(origin_root, d))
        make_file(os.path.join(origin_root, d, "10k.bin"), 10 * 1024)
    os.makedirs(os.path.join(origin_root, "h2c"))
    make_file(os.path.join(origin_root, "h2c", "1k.bin"), 1024)
    os.makedirs(root)
    # The static file: the same bytes as the cached one.
    with open(os.path.join(origin_root, "cache", "10k.bin"), "rb") as f, \
            open(os.path.join(root, "10k.bin"), "wb") as g:
        g.write(f.read())
    origin = Origin("origin", origin_root, ORIGIN_PORT, work)
    started = [origin]
    try:
        ws = WsLoad(work)
        started.append(ws)
        started.append(H2cOrigin("h2c-origin", origin_root, H2C_PORT, work))
        ktlsd = Ktlsd("ktlsd", args.ktlsd, root, KTLSD_PORT, work, ["--config", ktlsd_config(work)])
        started.append(ktlsd)
        nginx = NginxProxy("nginx", root, NGINX_PORT, work, http2=True)
        started.append(nginx)
        warm(ktlsd, "cache-status", lambda v: v.startswith("ktlsd; hit"))
        warm(nginx, "x-cache-status", lambda v: v == "HIT")
        return measure(args, ktlsd, nginx, origin, ws)
    finally:
        for s in reversed(started):
            s.stop()


def measure(args, ktlsd, nginx, origin, ws):
    d = args.duration
    plan = [(ktlsd, "hit"), (ktlsd, "pass"), (ktlsd, "static"), (ktlsd, "hit-h2"), (ktlsd, "h2c"), (ktlsd, "ws-rt"),
            (ktlsd, "ws-bulk"), (nginx, "hit"), (nginx, "pass"), (nginx, "hit-h2"), (nginx, "h2c"), (nginx, "ws-rt"),
            (nginx, "ws-bulk")]
    paths = {"hit": "cache/10k.bin", "hit-h2": "cache/10k.bin", "pass": "pass/10k.bin", "static": "10k.bin",
             "h2c": "h2c/1k.bin"}
    res = {s.name: {m: [] for t, m in plan if t is s} for s in (ktlsd, nginx)}
    cpu = {s.name: {m: [] for t, m in plan if t is s} for s in (ktlsd, nginx)}
    misses = {ktlsd.name: [], nginx.name: []}
    # Every row has its lists (empty when --parts left its measure out); the plan runs those asked for.
    plan = [(s, m) for s, m in plan if m in args.parts]
    # wrk's and the origin's CPU per proxied request (us), and the upstream leg's floor.
    others = {s.name: {"wrk": [], "origin": []} for s in (ktlsd, nginx)}
    floor = []
    rounds = max(1, args.runs // 3)
    for i in range(rounds):
        for s, m in random.sample(plan, len(plan)):
            if m == "ws-rt":
                n, secs, c = ws.run(s, "rt", WS_RT_CONNS, d)
                rps, us = n / secs, c * 1e6 / n
            elif m == "ws-bulk":
                # MB/s, and CPU seconds per GiB.
                n, secs, c = ws.run(s, "bulk", WS_BULK_CONNS, d)
                rps, us = n / secs / 1e6, c / (n / (1 << 30))
            elif m in ("hit-h2", "h2c"):
                c0 = cpu_seconds(s.pids())
                secs, done, _ = h2load(["-c16", "-m32", f"-D{d}", f"https://127.0.0.1:{s.port}/{paths[m]}"])
                rps, us = done / secs, (cpu_seconds(s.pids()) - c0) * 1e6 / done
            else:
                wrk_cores, o0, t0 = [], cpu_seconds(origin.pids()), time.monotonic()
                rps, us = wrk_rps(s, paths[m], 64, d, threads=1, client=wrk_cores)
                if m == "pass":
                    requests = rps * (time.monotonic() - t0)
                    others[s.name]["wrk"].append(wrk_cores[0] * 1e6 / rps)
                    others[s.name]["origin"].append((cpu_seconds(origin.pids()) - o0) * 1e6 / requests)
            res[s.name][m].append(rps)
            cpu[s.name][m].append(us)
        if "misses" in args.parts:
            for s in random.sample([ktlsd, nginx], 2):
                misses[s.name].append(concurrent_misses(s, origin, f"run={s.name}-{i}"))
        if "floor" in args.parts:
            floor.append(upstream_leg_floor(d / 2))
        unit = {"ws-rt": ("rt/s", "us"), "ws-bulk": ("MB/s", "s/GiB")}
        log(f"  round {i + 1}/{rounds}: " + "; ".join(
            f"{n} " + ", ".join(f"{m} {v[-1]:.{2 if m == 'ws-bulk' else 0}f} {unit.get(m, ('req/s',))[0]} "
                                f"({cpu[n][m][-1]:.{3 if m == 'ws-bulk' else 1}f} {unit.get(m, (0, 'us'))[1]})"
                                for m, v in r.items() if v)
            + (f", misses -> {misses[n][-1]} upstream" if misses[n] else "") for n, r in res.items()))
    k, n = res["ktlsd"], res["nginx"]
    rows = [
        (f"10 KiB cache hit, HTTP/1.1 wrk -t1 -c64 {d}s, median req/s", median(k["hit"]),
         {"nginx": median(n["hit"])}, ">= 1.2"),
        (f"10 KiB cache hit, HTTP/2 h2load -c16 -m32 -D{d}, median req/s", median(k["hit-h2"]),
         {"nginx": median(n["hit-h2"])}, ">= 1.2"),
        (f"10 KiB proxied without cache (keep-alive upstream), wrk -t1 -c64 {d}s, median req/s",
         median(k["pass"]), {"nginx": median(n["pass"])}, ">= 1.2"),
        (f"1 KiB gRPC-style to an h2c upstream (nghttpd), h2load -c16 -m32 -D{d}, median req/s",
         median(k["h2c"]), {"nginx": median(n["h2c"])}, ">= 1.2"),
        ("server CPU us per h2c-proxied request, median", median(cpu["ktlsd"]["h2c"]),
         {"nginx": median(cpu["nginx"]["h2c"])}, "<= 0.8"),
        ("server CPU us per 10 KiB hit (HTTP/1.1), median", median(cpu["ktlsd"]["hit"]),
         {"nginx": median(cpu["nginx"]["hit"])}, "-"),
        ("server CPU us per 10 KiB proxied request, median", median(cpu["ktlsd"]["pass"]),
         {"nginx": median(cpu["nginx"]["pass"])}, "-"),
        (f"{MISSES} concurrent misses on one key: upstream requests, most in a round", max(misses["ktlsd"] or [math.nan]),
         {"nginx": max(misses["nginx"] or [math.nan])}, "ktlsd = 1"),
        (f"WebSocket echo, 32-byte frames on {WS_RT_CONNS} tunnels (wsload rt {d}s), median round trips/s",
         median(k["ws-rt"]), {"nginx": median(n["ws-rt"])}, ">= 1.2"),
        ("server CPU us per WebSocket round trip, median", median(cpu["ktlsd"]["ws-rt"]),
         {"nginx": median(cpu["nginx"]["ws-rt"])}, "<= 0.8"),
        (f"WebSocket bulk, upstream to client through {WS_BULK_CONNS} tunnel (wsload bulk {d}s), median MB/s",
         median(k["ws-bulk"]), {"nginx": median(n["ws-bulk"])}, ">= 1.2"),
        ("server CPU s per GiB through the tunnel, median", median(cpu["ktlsd"]["ws-bulk"]),
         {"nginx": median(cpu["nginx"]["ws-bulk"])}, "<= 0.8"),
    ]
    hit, static = median(cpu["ktlsd"]["hit"]), median(cpu["ktlsd"]["static"])
    ko, no = ({k: median(v) for k, v in others[n].items()} for n in ("ktlsd", "nginx"))
    rows += [("wrk's CPU us per proxied request, median", ko["wrk"], {"nginx": no["wrk"]}, "-"),
             ("the origin's CPU us per proxied request, median", ko["origin"], {"nginx": no["origin"]}, "-")]
    # The rate goal as CPU: the machine's CPU per request through nginx, over 1.2, less what wrk
    # and the origin spend per request through ktlsd, is what ktlsd may spend.
    machine = no["wrk"] + median(cpu["nginx"]["pass"]) + no["origin"]
    budget = machine / 1.2 - ko["wrk"] - ko["origin"]
    least = static + median(floor)
    # With --parts, only the rows of the measures that ran.
    rows = [r for r in rows if not math.isnan(r[1])]
    table = versus_table(rows, ["nginx"], "measure (10 KiB, nginx proxy_cache / proxy_pass)", digits=1) + "\n"
    if not math.isnan(hit / static):
        table += (f"\nktlsd's CPU per 10 KiB hit against the same bytes as a static file (wrk -t1 -c64, same "
                  f"run): {hit:.1f} us / {static:.1f} us = {hit / static:.2f}x (goal <= 1.05x)\n")
    if not math.isnan(budget + least):
        table += (f"\nThe proxied rate as CPU (wrk, the proxy and the origin share the cores): through nginx the "
                  f"three spend {machine:.1f} us per request. 1.2x nginx's rate leaves ktlsd {budget:.1f} us per "
                  f"proxied request, with wrk and the origin at their cost through ktlsd. The least ktlsd can spend "
                  f"is its static-file CPU for the same bytes ({static:.1f} us) plus the upstream leg's kernel floor "
                  f"({median(floor):.1f} us, `upstream_leg_floor`): {least:.1f} us. ktlsd spent "
                  f"{median(cpu['ktlsd']['pass']):.1f} us.\n")
    table += ("\nThe upstream: nginx over plain HTTP on loopback, 2 workers (not measured); nginx with "
              "`proxy_cache_lock on` on the coalescing path. Large hits over kTLS (CPU s/GiB): "
              "`bench/run proxy --vm`.\n")
    if args.parts != list(HOST_PARTS):
        table += f"\nMeasures run (--parts): {', '.join(args.parts)}.\n"
    table += ("\nTunnels: `wsload` (bench/ktlsbench/wsload.c) is both the client (TLS by OpenSSL) and the "
              "upstream, so the proxies relay between two C epoll loops.\n")
    return table, {"rps": res, "cpu_us_per_request": cpu, "upstream_requests_for_100_misses": misses,
                   "hit_vs_static_cpu": hit / static, "others_cpu_us_per_proxied_request": others,
                   "upstream_leg_floor_us": floor, "rate_goal_budget_us": budget, "least_us": least}


# Large hits over kTLS (--vm, in the guest): one entry of VM_SIZE, fetched as a hit from ktlsd and
# from nginx in interleaved rounds. Scaled to the emulated CPU (AES-GCM at tens of MB/s): a download
# takes a few seconds, and the origin's file and both caches' copies fit the guest's /tmp (RAM).
VM_SIZE = 128 << 20
VM_PATH = f"/cache/{VM_SIZE >> 20}m.bin"
ADMIN_PORT = 18690
# ktlsd's access log line: how the body left and where it was encrypted (`tls=` last, as
# servers.require_ktls reads it).
VM_LOG_FORMAT = '"$request" $status $body_bytes_sent body=$body_path tls=$record_layer'
SENDFILE_BYTES = 'ktlsd_cache_hit_bytes_total{by="sendfile"}'
COPY_BYTES = 'ktlsd_cache_hit_bytes_total{by="copy"}'
SPLICED_BYTES = 'ktlsd_proxy_body_bytes_total{by="splice"}'
COPIED_BYTES = 'ktlsd_proxy_body_bytes_total{by="copy"}'
# What may come with a proxied response's head, read before the body can be spliced.
HEAD_SLACK = 64 << 10
VM_PASS = f"/pass/{VM_SIZE >> 20}m.bin"
# The measures: (path, HTTP version, served from the cache).
VM_MEASURES = {"hit h1": (VM_PATH, "1.1", True), "proxied h1": (VM_PASS, "1.1", False),
               "proxied h2": (VM_PASS, "2", False), "tunnel h1": ("/ws/bulk", "1.1", False)}
# Each --parts name of the VM plan and its measures.
VM_PART_MEASURES = {"hit": ("hit h1",), "proxied": ("proxied h1", "proxied h2"), "tunnel": ("tunnel h1",)}


def tls_stat():
    """/proc/net/tls_stat by name; fails where the kernel has no kTLS (the scenario needs it)."""
    try:
        return proc_counters_flat("/proc/net/tls_stat")
    except OSError as e:
        raise RuntimeError(f"no /proc/net/tls_stat ({e}): proxy --vm needs kTLS; run it as bench/run proxy --vm") \
            from None


def ktlsd_metrics():
    """ktlsd's /metrics from its admin listener, as {name{labels}: value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{ADMIN_PORT}/metrics", timeout=30) as r:
        text = r.read().decode()
    pairs = (l.rsplit(" ", 1) for l in text.splitlines() if l and not l.startswith("#"))
    return {k: float(v) for k, v in pairs}


def download(server, path, http, status_field=None, hit=None):
    """One GET of `path` (VM_SIZE bytes) on a fresh connection with `http` ("1.1" or "2"), which
    must be a whole 200 (and a cache hit where `hit` is given): its speed (MB/s), the server's CPU
    seconds, the TlsTxSw rise (kTLS transmit contexts installed) and the highest TlsCurrTxSw rise
    seen while it ran (polled every 0.2 s)."""
    base, c0 = tls_stat(), cpu_seconds(server.pids())
    status_out = f" %header{{{status_field}}}" if status_field else ""
    proc = subprocess.Popen(["curl", "-sk", f"--http{http}", "-o", "/dev/null", "-w",
                             f"%{{http_code}} %{{size_download}} %{{speed_download}} %{{http_version}}{status_out}",
                             f"https://127.0.0.1:{server.port}{path}"], stdout=subprocess.PIPE, text=True)
    live = 0
    while proc.poll() is None:
        live = max(live, tls_stat()["TlsCurrTxSw"] - base["TlsCurrTxSw"])
        time.sleep(0.2)
    out = proc.communicate()[0]
    cpu, after = cpu_seconds(server.pids()) - c0, tls_stat()
    code, size, speed, version, status = (out.split(" ", 4) + ["", "", "", "", ""])[:5]
    if proc.returncode or code != "200" or size != str(VM_SIZE) or version != http or \
            (hit and not hit(status.strip())):
        raise RuntimeError(f"{server.name}: GET {path}: curl exit {proc.returncode}, status {code}, {size} bytes "
                           f"of {VM_SIZE} over HTTP/{version}, {status_field}: {status!r}; want a whole 200 over "
                           f"HTTP/{http}" + (" and a cache hit" if hit else ""))
    return float(speed) / 1e6, cpu, after["TlsTxSw"] - base["TlsTxSw"], live


def fill(server, status_field, hit):
    """Stores VM_PATH in the server's cache: GETs it until the answer is a hit (the first one
    stores it; a HEAD would not do: ktlsd passes HEAD on to the origin)."""
    url = f"https://127.0.0.1:{server.port}{VM_PATH}"
    for _ in range(5):
        out = sh(["curl", "-sk", "--http1.1", "--fail", "-o", "/dev/null", "-D", "-", url])
        m = re.search(rf"(?im)^{re.escape(status_field)}:\s*(.*?)\s*$", out)
        if m and hit(m.group(1)):
            return
        time.sleep(1)
    raise RuntimeError(f"{server.name}: {VM_PATH} is not a cache hit after 5 GETs:\n{out}")


def tunnel_bulk(server, ws, seconds):
    """`wsload bulk` through `server` on one fresh tunnel for `seconds`, as `download` measures
    a body: its speed (MB/s), the server's CPU seconds, the TlsTxSw rise, the highest TlsCurrTxSw
    rise seen while it ran; and the bytes the client received."""
    # The tunnel before this one may still be closing (its kTLS context live): wait until the
    # count of live contexts settles, so that it does not hide this one's.
    settled = tls_stat()["TlsCurrTxSw"]
    for _ in range(25):
        time.sleep(0.2)
        now = tls_stat()["TlsCurrTxSw"]
        if now == settled:
            break
        settled = now
    base, c0 = tls_stat(), cpu_seconds(server.pids())
    proc = subprocess.Popen([ws.bin, "bulk", str(server.port), "/ws/bulk", str(WS_BULK_CONNS), str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    live = 0
    while proc.poll() is None:
        live = max(live, tls_stat()["TlsCurrTxSw"] - base["TlsCurrTxSw"])
        time.sleep(0.2)
    out = proc.communicate()[0].split()
    cpu, after = cpu_seconds(server.pids()) - c0, tls_stat()
    if proc.returncode or len(out) != 3 or int(out[1]) == 0:
        raise RuntimeError(f"{server.name}: wsload bulk through the tunnel: exit {proc.returncode}, {out}")
    moved, secs = int(out[1]), float(out[2])
    return moved / secs / 1e6, cpu, after["TlsTxSw"] - base["TlsTxSw"], live, moved


def scenario_proxy_vm(args, work):
    """Large bodies over kTLS (VM): ktlsd (`--ktls on`, `[cache]`, `[[proxy]] cache = true` on
    /cache/, none on /pass/) and nginx (`proxy_cache`, `proxy_pass`, `sendfile on`,
    `ssl_conf_command Options KTLS`) in front of the same origin. Three measures of one VM_SIZE
    body, each fetched by curl on a fresh connection: a cache hit over HTTP/1.1, and the body
    proxied without the cache over HTTP/1.1 and over HTTP/2. In each of --runs rounds every
    measure runs once on each server, the servers in random order: MB/s and server CPU s/GiB
    (utime+stime from /proc, as the ktls scenario measures). Fails unless each download was a
    whole 200 (a hit where it should be) that installed one kTLS transmit context (TlsTxSw) live
    while it ran (TlsCurrTxSw); unless ktlsd's ktlsd_cache_hit_bytes_total{by="sendfile"} grew by
    the bytes of its hits (by="copy" not) and its ktlsd_proxy_body_bytes_total{by="splice"} by all
    of the proxied bytes but what came with each head; and unless its access log says
    `body=sendfile tls=ktls` for each hit and `body=splice tls=ktls` for each proxied body."""
    if "nginx" not in peers.PEERS:
        raise RuntimeError("the proxy scenario compares with nginx: keep it in --peers")
    measures = {m: VM_MEASURES[m] for p in args.parts for m in VM_PART_MEASURES[p]}
    tls_stat()
    require_free(ORIGIN_PORT, KTLSD_PORT, NGINX_PORT, ADMIN_PORT, WS_PORT)
    root, origin_root = os.path.join(work, "www"), os.path.join(work, "origin")
    for d in ("cache", "pass"):
        os.makedirs(os.path.join(origin_root, d))
    os.makedirs(root)
    make_file(os.path.join(origin_root, VM_PATH.lstrip("/")), VM_SIZE)
    os.link(os.path.join(origin_root, VM_PATH.lstrip("/")), os.path.join(origin_root, VM_PASS.lstrip("/")))
    origin = Origin("origin", origin_root, ORIGIN_PORT, work)
    started = [origin]
    try:
        # max_object_size is at most max_size / 8; the default (64M) would pass the entry on.
        config = ktlsd_config(work, 'max_size = "2G"\nmax_object_size = "256M"')
        ktlsd = Ktlsd("ktlsd", args.ktlsd, root, KTLSD_PORT, work,
                      ["--ktls", "on", "--config", config, "--admin", f"127.0.0.1:{ADMIN_PORT}",
                       "--access-log-format", "custom", "--access-log-custom", VM_LOG_FORMAT])
        started.append(ktlsd)
        nginx = NginxProxy("nginx", root, NGINX_PORT, work, ktls=True, http2=True)
        started.append(nginx)
        fields = {ktlsd.name: ("cache-status", lambda v: v.startswith("ktlsd; hit")),
                  nginx.name: ("x-cache-status", lambda v: v == "HIT")}
        if "hit" in args.parts:
            log(f"filling both caches with {size_name(VM_SIZE)} from the origin")
            for s in (ktlsd, nginx):
                fill(s, *fields[s.name])
        if "tunnel h1" in measures:
            ws = WsLoad(work)
            started.append(ws)
        res = {m: {s.name: {"speed": [], "cpu_per_gib": [], "ktls_tx": [], "ktls_live": []} for s in (ktlsd, nginx)}
               for m in measures}
        # Bytes ktlsd's tunnel clients received.
        tunnel_received = 0
        time.sleep(1)  # a worker counts a hit's bytes just after its last byte left
        m0 = ktlsd_metrics()
        log(f"{size_name(VM_SIZE)} bodies and {args.duration} s tunnels, {args.runs} rounds of "
            f"{', '.join(measures)}, interleaved")
        for i in range(args.runs):
            for m, (path, http, cached) in random.sample(list(measures.items()), len(measures)):
                for s in random.sample([ktlsd, nginx], 2):
                    if m == "tunnel h1":
                        speed, cpu, tx, live, moved = tunnel_bulk(s, ws, args.duration)
                        tunnel_received += moved if s is ktlsd else 0
                    else:
                        speed, cpu, tx, live = download(s, path, http, *(fields[s.name] if cached else ()))
                        moved = VM_SIZE
                    r = res[m][s.name]
                    r["speed"].append(speed)
                    r["cpu_per_gib"].append(cpu / (moved / (1 << 30)))
                    r["ktls_tx"].append(tx)
                    r["ktls_live"].append(live)
            log(f"  round {i + 1}/{args.runs}: " + "; ".join(
                f"{m}: " + ", ".join(f"{n} {r['speed'][-1]:.1f} MB/s {r['cpu_per_gib'][-1]:.2f} s/GiB"
                                     for n, r in res[m].items()) for m in measures))
        hit_bytes = args.runs * VM_SIZE if "hit" in args.parts else 0
        proxied_bytes = 2 * args.runs * VM_SIZE if "proxied" in args.parts else 0
        deadline = time.time() + 10
        while True:
            m1 = ktlsd_metrics()
            grew = {k: m1.get(k, 0) - m0.get(k, 0) for k in (SENDFILE_BYTES, COPY_BYTES, SPLICED_BYTES, COPIED_BYTES)}
            if grew[SENDFILE_BYTES] >= hit_bytes and \
                    grew[SPLICED_BYTES] + grew[COPIED_BYTES] >= proxied_bytes + tunnel_received \
                    or time.time() > deadline:
                break
            time.sleep(0.2)
    finally:
        for s in reversed(started):
            s.stop()
    for m, by_server in res.items():
        for n, r in by_server.items():
            if r["ktls_tx"] != [1] * args.runs or r["ktls_live"] != [1] * args.runs:
                raise RuntimeError(f"{n}, {m}: kTLS transmit contexts per download {r['ktls_tx']} (TlsTxSw), live "
                                   f"during it {r['ktls_live']} (TlsCurrTxSw); want 1 each: not every body went "
                                   f"over kTLS")
    if grew[SENDFILE_BYTES] != hit_bytes or grew[COPY_BYTES]:
        raise RuntimeError(f"ktlsd's cache-hit bytes grew by {grew[SENDFILE_BYTES]:.0f} by sendfile and "
                           f"{grew[COPY_BYTES]:.0f} by copy; want {hit_bytes} ({args.runs} hits) by sendfile, 0 by copy")
    # What came with each head (a proxied response's, a tunnel's 101) may be copied.
    with_heads = (2 * ("proxied" in args.parts) + ("tunnel" in args.parts)) * args.runs * HEAD_SLACK
    relayed = grew[SPLICED_BYTES] + grew[COPIED_BYTES]
    # A tunnel's server may have moved more than its client read before it stopped.
    if (relayed != proxied_bytes if not tunnel_received else relayed < proxied_bytes + tunnel_received) \
            or grew[COPIED_BYTES] > with_heads:
        raise RuntimeError(f"ktlsd's proxied body bytes grew by {grew[SPLICED_BYTES]:.0f} by splice and "
                           f"{grew[COPIED_BYTES]:.0f} by copy; want {proxied_bytes} proxied"
                           + (f" and at least {tunnel_received} through tunnels" if tunnel_received else "")
                           + f" in all, at most {with_heads} of them (what came with the heads) by copy")
    require_ktls(work, ["ktlsd"])
    with open(os.path.join(work, "ktlsd.access")) as f:
        lines = [l for l in f if l.startswith('"GET ')]
    hits = sum(VM_PATH in l and l.endswith(f" {VM_SIZE} body=sendfile tls=ktls\n") for l in lines)
    spliced = sum(VM_PASS in l and l.endswith(f" {VM_SIZE} body=splice tls=ktls\n") for l in lines)
    tunnels = sum(l.startswith('"GET /ws/bulk ') and " 101 " in l and l.endswith(" body=splice tls=ktls\n")
                  for l in lines)
    want = {"hits": args.runs if "hit" in args.parts else 0, "spliced": 2 * args.runs if "proxied" in args.parts else 0,
            "tunnels": args.runs if "tunnel" in args.parts else 0}
    if hits < want["hits"] or spliced != want["spliced"] or tunnels != want["tunnels"]:
        raise RuntimeError(f"ktlsd's access log has {hits} GET {VM_PATH} lines with body=sendfile tls=ktls (want at "
                           f"least {want['hits']}), {spliced} GET {VM_PASS} with body=splice tls=ktls (want "
                           f"{want['spliced']}) and {tunnels} GET /ws/bulk 101 with body=splice tls=ktls (want "
                           f"{want['tunnels']})")
    return vm_report(args, work, res, grew, hits, spliced, tunnels)


def vm_report(args, work, res, grew, hits, spliced, tunnels):
    """The table (MB/s and CPU s/GiB of each measure, ktlsd/nginx), the evidence that kTLS
    carried every body, and the kernel's kTLS send alone as the reference, measured now in the
    same guest."""
    size = size_name(VM_SIZE)
    how = {"hit h1": "cache hit, curl --http1.1", "proxied h1": "proxied without cache, curl --http1.1",
           "proxied h2": "proxied without cache, curl --http2",
           "tunnel h1": "WebSocket tunnel, upstream to client"}
    what = {m: f"{size} {h}" for m, h in how.items()}
    what["tunnel h1"] = f"{how['tunnel h1']} (wsload bulk {args.duration} s, 64 KiB frames)"
    goal = {"tunnel h1": "ktlsd/nginx <= 0.8"}
    rows, notes = [], []
    for m, by_server in res.items():
        k, n = by_server["ktlsd"], by_server["nginx"]
        rows += [(f"{what[m]}: median MB/s", median(k["speed"]), {"nginx": median(n["speed"])}, "-"),
                 (f"{what[m]}: server CPU s/GiB", median(k["cpu_per_gib"]), {"nginx": median(n["cpu_per_gib"])},
                  goal.get(m, "ktlsd/nginx <= 1"))]
        ratio, lo, hi = ratio_ci(k["cpu_per_gib"], n["cpu_per_gib"], 50)
        per_round = sorted(a / b for a, b in zip(k["cpu_per_gib"], n["cpu_per_gib"]))
        notes.append(f"- {how[m]}: CPU s/GiB ktlsd/nginx {ratio:.2f}x, 95% bootstrap interval [{lo:.2f}, {hi:.2f}]; "
                     f"per round (the two downloads run back to back) median {median(per_round):.2f}x, "
                     f"{per_round[0]:.2f}x to {per_round[-1]:.2f}x.")
    table = versus_table(rows, ["nginx"], f"measure (over kTLS, a fresh connection each, median of "
                                          f"{args.runs})", digits=3)
    kernel = crypto.kernel_ktls_limit(work, args.aead_seconds)
    downloads = len(res) * args.runs
    evidence = [
        "", "\n".join(notes),
        "", f"kTLS on both: each of the {downloads} downloads and tunnels per server installed one kernel TLS "
            f"transmit context (TlsTxSw +1), live while it ran (TlsCurrTxSw +1). ktlsd's `{SENDFILE_BYTES}` grew by "
            f"{grew[SENDFILE_BYTES]:.0f} bytes, by=\"copy\" by {grew[COPY_BYTES]:.0f}; its "
            f"`{SPLICED_BYTES}` grew by {grew[SPLICED_BYTES]:.0f} and by=\"copy\" by {grew[COPIED_BYTES]:.0f} (what "
            f"came with the heads); its access log: {hits} GET {VM_PATH} lines "
            f"`{VM_SIZE} body=sendfile tls=ktls`, {spliced} GET {VM_PASS} lines `{VM_SIZE} body=splice tls=ktls`, "
            f"{tunnels} GET /ws/bulk 101 lines `body=splice tls=ktls` (measures run: {', '.join(args.parts)}).",
        "", "The origin: nginx over plain HTTP on loopback, 2 workers (not measured); the entry was stored by "
            "one GET through each server before the rounds; the tunnels' upstream is `wsload upstream` (plain TCP), their client `wsload bulk` (OpenSSL, userspace). nginx proxies with its defaults (`proxy_buffering "
            "on`: what the client does not take yet goes to a temporary file)."]
    if kernel is not None:
        ref = kernel["cpu_s_per_gib"]
        evidence += ["", f"The kernel's kTLS send alone (tls_sw AES-128-GCM plus the TCP send path, sendfile over "
                         f"loopback, this guest): {ref:.3f} CPU s/GiB; of it, " + "; ".join(
                             f"{how[m]}: ktlsd {median(r['ktlsd']['cpu_per_gib']) / ref:.2f}x, nginx "
                             f"{median(r['nginx']['cpu_per_gib']) / ref:.2f}x" for m, r in res.items()) + "."]
    return table + "\n" + "\n".join(evidence) + "\n", {
        "measures": res, "bytes_grew": grew, "kernel_ktls_limit": kernel}
