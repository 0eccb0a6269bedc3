"""Starting and stopping ktlsd, and what every server under test shares: the worker count
(WORKERS), the ECDSA P-256 certificate (make_cert: CERT, KEY) and whether access logs are written
(ACCESS_LOG: off unless a scenario reads ktlsd's, and then on for every server alike). All three
are set once before any server starts. The peers ktlsd is compared with are in peers."""

import os
import signal
import subprocess

from .system import sh, wait_port

# Set by the command line before any server starts.
WORKERS = os.cpu_count()
# The address every server listens on (tail --native: every address of the servers' namespace).
HOST = "127.0.0.1"
CERT = KEY = None
ACCESS_LOG = False


class Ktlsd:
    def __init__(self, name, binary, root, port, work, extra=()):
        self.name, self.port = name, port
        self.err = open(os.path.join(work, f"{name}.err"), "w")
        cmd = [binary, "serve", root, "--listen", f"{HOST}:{port}", "--workers", str(WORKERS),
               "--cert", CERT, "--key", KEY,
               "--access-log", os.path.join(work, f"{name}.access") if ACCESS_LOG else "off", *extra]
        if os.geteuid() == 0:
            cmd.append("--allow-root")  # the bench's files are root's; the peers read them as root too
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.err)
        wait_port(port)

    def pids(self):
        return [self.proc.pid]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)


def make_cert(work):
    global CERT, KEY
    CERT, KEY = os.path.join(work, "cert.pem"), os.path.join(work, "key.pem")
    sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", KEY, "-out", CERT, "-days", "30", "-subj", "/CN=localhost",
        "-addext", "subjectAltName=DNS:localhost,DNS:*.localhost,IP:127.0.0.1"])


def require_ktls(work, names):
    """Fails unless every response in these ktlsd servers' access logs went out over kTLS."""
    for name in names:
        with open(os.path.join(work, f"{name}.access")) as f:
            modes = {l.rsplit("tls=", 1)[-1].strip() for l in f if "tls=" in l}
        if modes != {"ktls"}:
            raise RuntimeError(f"{name} connections ran in modes {modes}, expected only ktls")
