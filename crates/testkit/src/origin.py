"""A small HTTP/1.1 origin for the proxy tests, whose answers and misbehaviour the
request path chooses. Usage: origin.py PORT NAME LOG; prints "ready" once listening
and appends "METHOD TARGET PEER-PORT" to LOG for every request it reads. PORT may be
unix:/PATH, a Unix socket to listen on (PEER-PORT is then the connection's number).

Paths (the query is ignored unless stated):
  /api/echo        200, JSON of the method, target, fields and body (length, sha256)
  /api/name        200, the origin's NAME
  /api/big?n=N     200, N bytes with Content-Length, written in 64 KiB pieces
  /api/chunked?n=N 200, N bytes chunked, with a trailer
  /api/events?n=N&gap=S  200, N chunked lines "event I", each its own chunk, S seconds apart
  /api/close?n=N   200, N bytes delimited by closing (no Content-Length)
  /api/headers     200, with hop-by-hop and end-to-end fields to be filtered
  /api/garbage     not HTTP at all
  /api/short       Content-Length 100, 10 bytes, then close
  /api/endless     header fields forever
  /api/huge-head   a 100 KiB header field
  /api/slow-head   waits 3 s before the head
  /api/slow-body   the head and 5 bytes of 10, then waits 3 s
  /api/close-early closes without answering
  /api/bad-chunk   a chunked body with an invalid chunk size
  /api/long        Content-Length 10, then 100 bytes, then close
  /api/cut-chunked a chunked body that closes in the middle of a chunk
  /api/hints?delay=S  a 102, a 103 Early Hints with two Link fields, then after S
                   seconds (0.2) 200 "hinted"
  /healthz         200, the origin's NAME (a health check's target)
  /api/hold?s=S    200 after S seconds, unless the client closes first; appends
                   "! answered TARGET" or "! closed TARGET" to LOG
With `cc=1` in the query, the hostile answers above (and /api/big, /api/chunked) say
`Cache-Control: max-age=60`, so that a cache would keep them if it took them for whole.
  /api/set/ANY?h=NAME:VALUE&status=N&delay=S&short=1&n=N
                   status N (200) after S seconds, each `h` field sent as given, and the body
                   "NAME COUNT ACCEPT-ENCODING" (COUNT: requests for this target so far),
                   padded with dots to N bytes;
                   304 without a body when If-None-Match names the ETag given; with
                   `short`, a Content-Length 100 bytes longer than the body, then close
"""

import hashlib
import json
import select
import socket
import sys
import threading
import time

PORT, NAME, LOG = sys.argv[1], sys.argv[2], sys.argv[3]
LOCK = threading.Lock()
COUNTS = {}


def log(line):
    with LOCK, open(LOG, "a") as f:
        f.write(line + "\n")


def read_request(conn, buf):
    while b"\r\n\r\n" not in buf:
        data = conn.recv(65536)
        if not data:
            return None, buf
        buf += data
    head, buf = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    fields = [tuple(x.strip() for x in l.split(":", 1)) for l in lines[1:]]
    length = 0
    chunked = False
    for n, v in fields:
        if n.lower() == "content-length":
            length = int(v)
        if n.lower() == "transfer-encoding" and "chunked" in v.lower():
            chunked = True
    body = b""
    if chunked:
        while True:
            while b"\r\n" not in buf:
                buf += conn.recv(65536)
            size_line, buf = buf.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            while len(buf) < size + 2:
                buf += conn.recv(65536)
            body += buf[:size]
            buf = buf[size + 2:]
            if size == 0:
                break
    else:
        while len(buf) < length:
            data = conn.recv(65536)
            if not data:
                return None, buf
            buf += data
        body, buf = buf[:length], buf[length:]
    return (method, target, fields, body), buf


def query_n(target, default=1000):
    if "n=" in target:
        return int(target.split("n=", 1)[1].split("&")[0])
    return default


def ok(target):
    """A 200 status line, with a Cache-Control field when the query asks for one."""
    return b"HTTP/1.1 200 OK\r\n" + (b"Cache-Control: max-age=60\r\n" if "cc=1" in target else b"")


def hold(conn, secs):
    """Waits `secs` seconds for the client to close; True if it did."""
    deadline = time.time() + secs
    while True:
        left = deadline - time.time()
        if left <= 0:
            return False
        readable, _, _ = select.select([conn], [], [], left)
        if readable and conn.recv(1, socket.MSG_PEEK) == b"":
            return True
        if readable:
            time.sleep(left)
            return False


def answer(conn, req):
    method, target, fields, body = req
    path = target.split("?", 1)[0]
    log(f"{method} {target} {peer_of(conn)}")
    send = conn.sendall
    no_body = method == "HEAD"
    status = ok(target)
    if path == "/api/echo":
        out = json.dumps({
            "name": NAME, "method": method, "target": target, "fields": fields,
            "body_len": len(body), "body_sha256": hashlib.sha256(body).hexdigest(),
        }).encode()
        send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(out)
             + (b"" if no_body else out))
    elif path == "/api/name":
        out = NAME.encode()
        send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(out) + out)
    elif path == "/api/big":
        n = query_n(target)
        send(status + b"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % n)
        if not no_body:
            piece = bytes(i % 251 for i in range(65536))
            left = n
            while left > 0:
                send(piece[:min(left, len(piece))])
                left -= min(left, len(piece))
    elif path == "/api/chunked":
        n = query_n(target)
        send(status + b"Transfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n")
        piece = bytes(i % 251 for i in range(10000))
        left = n
        while left > 0:
            k = min(left, len(piece))
            send(b"%x\r\n" % k + piece[:k] + b"\r\n")
            left -= k
        send(b"0\r\nX-Sum: 1\r\n\r\n")
    elif path == "/api/events":
        query = dict(p.split("=", 1) for p in target.split("?", 1)[-1].split("&") if "=" in p)
        n, gap = int(query.get("n", "3")), float(query.get("gap", "1"))
        send(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(n):
            if i:
                time.sleep(gap)
            line = b"event %d\n" % i
            send(b"%x\r\n%s\r\n" % (len(line), line))
        send(b"0\r\n\r\n")
    elif path == "/api/close":
        n = query_n(target)
        send(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"c" * n)
        return False
    elif path == "/api/headers":
        send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: X-Private\r\nX-Private: secret\r\n"
             b"Keep-Alive: timeout=5\r\nProxy-Authenticate: Basic\r\nServer: origin\r\n"
             b"Set-Cookie: a=1\r\nSet-Cookie: b=2\r\nX-Origin: kept\r\n\r\nok")
    elif path == "/api/garbage":
        send(b"this is not http\r\n\r\n")
        return False
    elif path == "/api/short":
        send(status + b"Content-Length: 100\r\n\r\n" + b"s" * 10)
        return False
    elif path == "/api/endless":
        send(status)
        try:
            while True:
                send(b"X-More: " + b"m" * 100 + b"\r\n")
        except OSError:
            pass
        return False
    elif path == "/api/huge-head":
        send(status + b"X-Huge: " + b"h" * 100000 + b"\r\nContent-Length: 0\r\n\r\n")
        return False
    elif path == "/api/slow-head":
        time.sleep(3)
        send(status + b"Content-Length: 4\r\n\r\nlate")
    elif path == "/api/slow-body":
        send(status + b"Content-Length: 10\r\n\r\nslow.")
        time.sleep(3)
        return False
    elif path.startswith("/api/set/"):
        from urllib.parse import parse_qsl
        query = parse_qsl(target.split("?", 1)[1] if "?" in target else "")
        given = [v.split(":", 1) for k, v in query if k == "h"]
        status = int(dict(query).get("status", "200"))
        with LOCK:
            COUNTS[target] = COUNTS.get(target, 0) + 1
            count = COUNTS[target]
        time.sleep(float(dict(query).get("delay", "0")))
        asked = {n.lower(): v for n, v in fields}
        head = "".join(f"{n}: {v.strip()}\r\n" for n, v in given)
        etag = [v.strip() for n, v in given if n.lower() == "etag"]
        if etag and asked.get("if-none-match", "").strip() == etag[0]:
            send(f"HTTP/1.1 304 Not Modified\r\n{head}\r\n".encode())
            return True
        out = f"{NAME} {count} {asked.get('accept-encoding', '-')}".encode()
        out += b"." * max(0, int(dict(query).get("n", "0")) - len(out))
        if dict(query).get("short"):
            send(f"HTTP/1.1 200 OK\r\n{head}Content-Length: {len(out) + 100}\r\n\r\n".encode() + out)
            return False
        send(f"HTTP/1.1 {status} X\r\n{head}Content-Length: {len(out)}\r\n\r\n".encode() + (b"" if no_body else out))
    elif path == "/api/hints":
        # A 102 (dropped by the proxy), a 103 with two Link fields, then the answer after `delay` s.
        from urllib.parse import parse_qsl
        delay = float(dict(parse_qsl(target.split("?", 1)[1] if "?" in target else "")).get("delay", "0.2"))
        send(b"HTTP/1.1 102 Processing\r\n\r\n")
        send(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\n"
             b"Link: </app.js>; rel=preload; as=script\r\n\r\n")
        time.sleep(delay)
        send(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 6\r\n\r\n" + (b"" if no_body else b"hinted"))
    elif path == "/healthz":
        out = NAME.encode()
        send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(out) + (b"" if no_body else out))
    elif path == "/api/close-early":
        return False
    elif path == "/api/bad-chunk":
        send(status + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n")
        return False
    elif path == "/api/long":
        send(status + b"Content-Length: 10\r\n\r\n" + b"l" * 100)
        return False
    elif path == "/api/cut-chunked":
        send(status + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n10\r\nabc")
        return False
    elif path == "/api/hold":
        from urllib.parse import parse_qsl
        if hold(conn, float(dict(parse_qsl(target.split("?", 1)[1])).get("s", "2"))):
            log(f"! closed {target}")
            return False
        log(f"! answered {target}")
        send(status + b"Content-Length: 4\r\n\r\nheld")
    else:
        send(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
    return True


def peer_of(conn):
    """The peer's port, or for a Unix socket the connection's number."""
    peer = conn.getpeername()
    return peer[1] if isinstance(peer, tuple) else UNIX_IDS.get(conn.fileno(), 0)


UNIX_IDS = {}


def serve(conn):
    buf = b""
    try:
        while True:
            req, buf = read_request(conn, buf)
            if req is None or not answer(conn, req):
                break
    except OSError:
        pass
    finally:
        conn.close()


def main():
    if PORT.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(PORT[len("unix:"):])
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", int(PORT)))
    s.listen(128)
    print("ready", flush=True)
    accepted = 0
    while True:
        conn, _ = s.accept()
        accepted += 1
        UNIX_IDS[conn.fileno()] = accepted
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


main()
