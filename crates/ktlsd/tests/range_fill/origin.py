"""The origin of the range fill tests: objects of any size whose bytes the tests
compute too, with Range honoured (one range, suffix and open ranges), ETag and
Last-Modified. It prints "listening PORT", then one line per request it reads:
"req TARGET RANGE" (RANGE "-" when the request had none).

  /obj/NAME?size=N            N bytes: byte i = (i % 251 + 7 * v + (i >> 12)) % 256,
                              v the object's version (0 until bumped), ETag "NAME-v"
      &cc=VALUE               Cache-Control (default "max-age=3600")
      &pace=SECONDS           sleep this long after each 64 KiB piece
      &ranges=ignore          answer every Range with 200 and the whole body
      &ranges=wrong           answer a Range with a 206 one byte off (its
                              Content-Range says so, honestly)
  /bump/NAME                  v += 1 for NAME (its bytes and ETag change)
"""

import http.server
import socketserver
import sys
import threading
import time
import urllib.parse

versions = {}
lock = threading.Lock()
bodies = {}


def body(v, n):
    key = (v, n)
    with lock:
        b = bodies.get(key)
    if b is None:
        pattern = bytes((i % 251 + 7 * v + (i >> 12)) % 256 for i in range(n))
        b = pattern
        with lock:
            bodies[key] = b
    return b


def parse_range(value, size):
    """(start, end exclusive) of a single byte range, None when unsatisfiable,
    "ignore" when it is not one we honour."""
    if not value.startswith("bytes=") or "," in value:
        return "ignore"
    a, _, b = value[6:].strip().partition("-")
    if a == "":
        n = int(b)
        return (max(size - n, 0), size) if n > 0 and size > 0 else None
    first = int(a)
    last = int(b) if b else size - 1
    if first >= size:
        return None
    return (first, min(last, size - 1) + 1)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        rng = self.headers.get("Range")
        print("req %s %s" % (self.path, rng.replace(" ", "") if rng else "-"), flush=True)
        url = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(url.query))
        parts = url.path.strip("/").split("/")
        if parts[0] == "bump" and len(parts) == 2:
            with lock:
                versions[parts[1]] = versions.get(parts[1], 0) + 1
            self.send_response(204)
            self.end_headers()
            return
        if parts[0] != "obj" or len(parts) != 2:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        name = parts[1]
        with lock:
            v = versions.get(name, 0)
        data = body(v, int(q.get("size", "1000")))
        size = len(data)
        status, start, end = 200, 0, size
        if rng:
            r = parse_range(rng, size)
            if r is None:
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % size)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if r != "ignore" and q.get("ranges") != "ignore":
                status, (start, end) = 206, r
                if q.get("ranges") == "wrong" and end < size:
                    start, end = start + 1, end + 1
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Cache-Control", q.get("cc", "max-age=3600"))
        self.send_header("ETag", '"%s-%d"' % (name, v))
        self.send_header("Last-Modified", "Mon, 02 Nov 2026 10:00:00 GMT")
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end - 1, size))
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        pace = float(q.get("pace", "0"))
        at = start
        try:
            while at < end:
                piece = data[at : min(at + 65536, end)]
                self.wfile.write(piece)
                self.wfile.flush()
                at += len(piece)
                if pace:
                    time.sleep(pace)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


srv = Server(("127.0.0.1", 0), Handler)
print("listening %d" % srv.server_address[1], flush=True)
srv.serve_forever()
