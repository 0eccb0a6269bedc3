"""Starting and stopping the servers under test: ktlsd and Debian's nginx with the same worker
count, the same ECDSA P-256 certificate (make_cert) and an access log each. WORKERS, CERT and KEY
are set once by the command line before any server starts."""

import os
import signal
import subprocess

from .system import children, sh, wait_port

# Set by the command line before any server starts.
WORKERS = os.cpu_count()
CERT = KEY = None


class Ktlsd:
    def __init__(self, name, binary, root, port, work, extra=()):
        self.name, self.port = name, port
        self.err = open(os.path.join(work, f"{name}.err"), "w")
        cmd = [binary, "serve", root, "--listen", f"127.0.0.1:{port}", "--workers", str(WORKERS),
               "--cert", CERT, "--key", KEY, "--access-log", os.path.join(work, f"{name}.access"), *extra]
        if os.geteuid() == 0:
            cmd.append("--allow-root")  # the bench's files are root's; nginx reads them as root too
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.err)
        wait_port(port)

    def pids(self):
        return [self.proc.pid]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)


class Nginx:
    def __init__(self, name, root, port, work, ktls=False, buffer="16k", connections=4096, http2=False, extra=""):
        self.name, self.port = name, port
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        conf = os.path.join(d, "nginx.conf")
        ktls_line = "ssl_conf_command Options KTLS;" if ktls else ""
        with open(conf, "w") as f:
            f.write(f"""
user root;
worker_processes {WORKERS};
pid {d}/nginx.pid;
error_log {d}/error.log;
worker_rlimit_nofile {2 * connections + 64};
events {{ worker_connections {connections}; }}
http {{
  include /etc/nginx/mime.types;
  access_log {d}/access.log;
  sendfile on;
  keepalive_requests 1000000;
  server {{
    listen 127.0.0.1:{port} ssl{" http2" if http2 else ""} reuseport;
    ssl_certificate {CERT};
    ssl_certificate_key {KEY};
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_tickets on;
    ssl_buffer_size {buffer};
    {ktls_line}
    {extra}
    root {root};
  }}
}}
""")
        self.proc = subprocess.Popen(["nginx", "-c", conf, "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(port)

    def pids(self):
        return [self.proc.pid] + children(self.proc.pid)

    def stop(self):
        self.proc.send_signal(signal.SIGQUIT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def make_cert(work):
    global CERT, KEY
    CERT, KEY = os.path.join(work, "cert.pem"), os.path.join(work, "key.pem")
    sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", KEY, "-out", CERT, "-days", "30", "-subj", "/CN=localhost",
        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])


def require_ktls(work, names):
    """Fails unless every response in these ktlsd servers' access logs went out over kTLS."""
    for name in names:
        with open(os.path.join(work, f"{name}.access")) as f:
            modes = {l.rsplit("tls=", 1)[-1].strip() for l in f if "tls=" in l}
        if modes != {"ktls"}:
            raise RuntimeError(f"{name} connections ran in modes {modes}, expected only ktls")
