"""The soak's faults and the processes they strike (scenario soak): the origin (a Python HTTP/1.1
server in a process of its own, which can be killed, or turned slow or garbage-sending through
its mode file), ktlsd under test (its configuration, changed by each reload; restarted after its
SIGKILL), the fault schedule's actions, and the sampler of ktlsd's RSS, descriptors and cache disk.

- origin-down: the origin SIGKILLed, restarted after the fault's seconds.
- origin-slow: its head after 1.5 s, its body in four pieces 0.3 s apart (within `read_timeout`).
- origin-garbage: a head that is not HTTP, or a head whose body is cut in the middle.
- server-sigkill: ktlsd SIGKILLed and started again at once (same configuration, same cache).
- cache-disk-full: a file written into the cache's tmpfs until ENOSPC, held, then deleted.
- descriptors: ktlsd's RLIMIT_NOFILE soft limit set 32 below the descriptors it has open
  (`prlimit`), held, then restored.
- reload: SIGHUP every few seconds after a new configuration is written (a response field on
  static files and the proxy's `read_timeout` change)."""

import errno
import hashlib
import os
import random
import resource
import signal
import subprocess
import sys
import threading
import time

from . import servers
from .soak_traffic import PORT, origin_body
from .system import log, rss_kib, wait_port

ADMIN_PORT = 18790
ORIGIN_PORT = 18780
SAMPLE_EVERY = 2.0
RELOAD_EVERY = 5.0

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

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True

        def handle_error(self, request, client_address):
            pass  # a connection ktlsd dropped (its SIGKILL, a cut response): expected here

    Server(("127.0.0.1", port), H).serve_forever()


class Origin:
    def __init__(self, work):
        self.mode_file = os.path.join(work, "origin.mode")
        self.set_mode("ok")
        self.proc = None
        self.start()

    def start(self):
        bench = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ktlsbench.soak_faults", "origin", str(ORIGIN_PORT), self.mode_file],
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


if __name__ == "__main__":
    if sys.argv[1:2] == ["origin"]:
        origin_main(int(sys.argv[2]), sys.argv[3])
