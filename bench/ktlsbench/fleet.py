"""Scenario fleet (this machine): three ktlsd members behind HAProxy in TCP mode (round robin),
with per-process session-ticket keys against keys shared through etcd (`[cluster]`), interleaved
over --runs rounds.

The client is Python's ssl module over TLS 1.3, one connection after another through the
balancer, each offering the newest ticket it holds (as a browser does) and fetching a 10 KiB file.
After a warm-up of 30 connections it counts, over 300 connections: the share resumed
(`session_reused`), the new-connection rate, and the members' CPU per connection (utime+stime of
the three processes from /proc). The client and HAProxy run on the same two cores, so the rate is
the client's as much as the servers'; the CPU per connection is the members' alone.

Cache peers: the three members cache `/obj/*` from a counting origin (Python, in this process)
behind the same balancer, each member with its own `[cache]`, once without and once with
`cache_peers = true`; OBJECTS distinct objects are each fetched three times through the balancer
(one connection per request, so round robin sends each object to every member), and the origin's
requests per object are counted."""

import http.server
import os
import socket
import threading
import ssl
import subprocess
import tempfile
import time

from . import servers
from .stats import median
from .system import cpu_seconds, log, make_file, wait_port

MEMBERS = 3
WARM = 30
COUNT = 1000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    def __init__(self, work):
        self.client, peer = free_port(), free_port()
        url, purl = f"http://127.0.0.1:{self.client}", f"http://127.0.0.1:{peer}"
        self.proc = subprocess.Popen(
            ["etcd", "--name", "e0", "--data-dir", os.path.join(work, "etcd"), "--listen-client-urls", url,
             "--advertise-client-urls", url, "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
             "--initial-cluster", f"e0={purl}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.client)
        self.url = url

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


class Haproxy:
    def __init__(self, work, backends):
        self.port = free_port()
        servers_ = "".join(f"  server m{i} 127.0.0.1:{p}\n" for i, p in enumerate(backends))
        cfg = os.path.join(work, "haproxy.cfg")
        with open(cfg, "w") as f:
            f.write("defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n"
                    f"frontend f\n  bind 127.0.0.1:{self.port}\n  default_backend members\n"
                    f"backend members\n  balance roundrobin\n{servers_}")
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", cfg], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_port(self.port)

    def stop(self):
        self.proc.kill()
        self.proc.wait(timeout=30)


def client_context():
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    return ctx


def connections(ctx, port, n, session):
    """n TLS 1.3 connections to port, each offering the newest ticket; (resumed, seconds, session)."""
    request = b"GET /10k HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    resumed, start = 0, time.perf_counter()
    for _ in range(n):
        with socket.create_connection(("127.0.0.1", port)) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost", session=session) as s:
                s.sendall(request)
                while s.recv(65536):
                    pass
                resumed += s.session_reused
                session = s.session or session
    return resumed, time.perf_counter() - start, session


def one_round(args, work, root, mode, etcd, secret):
    members = []
    prefix = f"/bench-{time.monotonic_ns()}"  # one fleet per round, starting without keys
    for i in range(MEMBERS):
        port = free_port()
        extra = ["--state-dir", os.path.join(work, f"state-{mode}-{i}")]
        if mode == "cluster":
            cfg = os.path.join(work, f"m{i}.toml")
            with open(cfg, "w") as f:
                f.write(f'[cluster]\netcd = ["{etcd.url}"]\nname = "m{i}"\nsecret_file = "{secret}"\n'
                        f'prefix = "{prefix}"\n')
            extra += ["--config", cfg]
        members.append(servers.Ktlsd(f"{mode}-{i}", args.ktlsd, root, port, work, extra))
    lb = Haproxy(work, [m.port for m in members])
    try:
        time.sleep(2 if mode == "cluster" else 0.2)  # the shared keys reach every member by watch
        ctx = client_context()  # a session resumes only through the context that made it
        _, _, session = connections(ctx, lb.port, WARM, None)
        pids = [p for m in members for p in m.pids()]
        cpu0 = cpu_seconds(pids)
        resumed, secs, _ = connections(ctx, lb.port, COUNT, session)
        cpu = cpu_seconds(pids) - cpu0
    finally:
        lb.stop()
        for m in members:
            m.stop()
    return {"resumed": resumed / COUNT, "rate": COUNT / secs, "cpu_us": cpu / COUNT * 1e6}


OBJECTS = 100


class CountingOrigin:
    """An HTTP/1.1 origin answering every path with 10 KiB, cacheable for ten minutes, counting requests."""

    def __init__(self):
        counts, lock = {}, threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                with lock:
                    counts[self.path] = counts.get(self.path, 0) + 1
                body = b"x" * 10240
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "max-age=600")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.counts = counts
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


def cache_round(args, work, root, peers, etcd, secret):
    """Origin requests per object through three caching members, with or without cache peers."""
    origin = CountingOrigin()
    prefix = f"/bench-cache-{time.monotonic_ns()}"
    members = []
    try:
        for i in range(MEMBERS):
            port = free_port()
            cfg = os.path.join(work, f"c{i}.toml")
            with open(cfg, "w") as f:
                f.write(f'[[proxy]]\npath = "/obj/**"\nupstream = ["http://127.0.0.1:{origin.port}"]\ncache = true\n'
                        f'[cache]\ndir = "{os.path.join(work, f"cache-{prefix[1:]}-{i}")}"\n'
                        f'[cluster]\netcd = ["{etcd.url}"]\nname = "m{i}"\nsecret_file = "{secret}"\n'
                        f'prefix = "{prefix}"\n')
                if peers:
                    f.write(f'cache_peers = true\npeer_listen = "127.0.0.1:{free_port()}"\n')
            extra = ["--state-dir", os.path.join(work, f"state-cache-{i}"), "--config", cfg]
            members.append(servers.Ktlsd(f"cache-{'peers' if peers else 'alone'}-{i}", args.ktlsd, root, port, work,
                                         extra))
        lb = Haproxy(work, [m.port for m in members])
        try:
            time.sleep(3 if peers else 0.5)  # the members learn each other by watch
            ctx = client_context()
            for n in range(OBJECTS):
                for _ in range(MEMBERS):
                    with socket.create_connection(("127.0.0.1", lb.port)) as raw:
                        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                            s.sendall(f"GET /obj/{n} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
                                      .encode())
                            while s.recv(65536):
                                pass
        finally:
            lb.stop()
    finally:
        for m in members:
            m.stop()
        origin.stop()
    return sum(origin.counts.values()) / OBJECTS


def scenario_fleet(args, work):
    root = os.path.join(work, "root")
    os.makedirs(root)
    make_file(os.path.join(root, "10k"), 10 * 1024)
    secret = os.path.join(work, "cluster.key")
    with open(secret, "wb") as f:
        f.write(os.urandom(32))
    etcd = Etcd(work)
    results = {"per-process": [], "cluster": [], "cache-alone": [], "cache-peers": []}
    try:
        for r in range(args.runs):
            for mode in (["per-process", "cluster"] if r % 2 == 0 else ["cluster", "per-process"]):
                res = one_round(args, work, root, mode, etcd, secret)
                log(f"round {r + 1} {mode}: {res}")
                results[mode].append(res)
            for peers in ([False, True] if r % 2 == 0 else [True, False]):
                per_object = cache_round(args, work, root, peers, etcd, secret)
                mode = "cache-peers" if peers else "cache-alone"
                log(f"round {r + 1} {mode}: {per_object:.2f} origin requests per object")
                results[mode].append(per_object)
    finally:
        etcd.stop()
    rows = ["| three members behind HAProxy (round robin) | per-process keys | [cluster] (etcd) | cluster/per-process |",
            "|---|---|---|---|"]
    for key, what, fmt in [("resumed", "TLS 1.3 connections resumed", "{:.1%}"),
                           ("rate", "new connections per second (one client)", "{:.0f}"),
                           ("cpu_us", "members' CPU per connection (us)", "{:.0f}")]:
        a, b = median([x[key] for x in results["per-process"]]), median([x[key] for x in results["cluster"]])
        ratio = f"{b / a:.2f}x" if a else "-"
        rows.append(f"| {what} | {fmt.format(a)} | {fmt.format(b)} | {ratio} |")
    alone, shared = median(results["cache-alone"]), median(results["cache-peers"])
    rows += ["", "| three caching members behind HAProxy (round robin) | each its own cache | cache_peers = true |",
             "|---|---|---|",
             f"| origin requests per object ({OBJECTS} objects, each fetched {MEMBERS} times) | {alone:.2f} | {shared:.2f} |"]
    note = (f"\n\nMedians of {args.runs} interleaved rounds; each round {WARM} warm-up then {COUNT} measured "
            "connections, the client offering its newest ticket. Goal: resumed >= 95% with [cluster]; "
            "one origin request per object with cache peers.")
    return "\n".join(rows) + note, results
