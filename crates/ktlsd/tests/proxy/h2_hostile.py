#!/usr/bin/python3
"""A hostile HTTP/2 upstream (prior knowledge, plain TCP) for the proxy tests, at frame
level. Usage: h2_hostile.py PORT; prints "ready" once listening. What each request
gets is chosen by its path:

  /rst-head      RST_STREAM INTERNAL_ERROR before any answer
  /rst           a 200 head and 5 body bytes, then RST_STREAM INTERNAL_ERROR
  /goaway-head   GOAWAY (last stream 0, NO_ERROR) before any answer, then close
  /goaway        a 200 head and 5 body bytes, then GOAWAY INTERNAL_ERROR and close
  /bad-hpack     a HEADERS frame whose block indexes no table entry
  /continuation  a HEADERS frame without END_HEADERS, then CONTINUATION frames of
                 16 KiB of header fields without end (until the peer gives up)
  /flood         a 200 head, then 16 KiB DATA frames without end as fast as the socket
                 takes them, never waiting for flow-control credit (64 MiB at most)
  /trailers      a 200, "hello", and trailers x-check: done
  /linger        200 "ok", then half a second without reading, then a close without
                 GOAWAY (a request sent meanwhile is never answered)
anything else    200 "ok"
"""

import socket
import struct
import sys
import threading
import time

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST, SETTINGS, PING, GOAWAY, WINDOW, CONT = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def read_exact(conn, n):
    buf = b""
    while len(buf) < n:
        got = conn.recv(n - len(buf))
        if not got:
            raise EOFError
        buf += got
    return buf


def read_frame(conn):
    head = read_exact(conn, 9)
    length = int.from_bytes(head[:3], "big")
    kind, flags = head[3], head[4]
    stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
    return kind, flags, stream, read_exact(conn, length)


def serve(conn):
    enc = hpack.Encoder()
    dec = hpack.Decoder()
    try:
        read_exact(conn, len(PREFACE))
        conn.sendall(frame(SETTINGS, 0, 0))
        block, stream = b"", 0
        while True:
            kind, flags, sid, payload = read_frame(conn)
            if kind == SETTINGS and not flags & ACK:
                conn.sendall(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                conn.sendall(frame(PING, ACK, 0, payload))
            elif kind in (HEADERS, CONT):
                if kind == HEADERS:
                    stream, block = sid, b""
                    if flags & 0x8:  # PADDED
                        payload = payload[1 : len(payload) - payload[0]]
                    if flags & 0x20:  # PRIORITY
                        payload = payload[5:]
                block += payload
                if flags & END_HEADERS:
                    fields = dict(dec.decode(block))
                    if not answer(conn, enc, stream, fields.get(":path", "/")):
                        return
    except (EOFError, OSError):
        pass
    finally:
        conn.close()


def answer(conn, enc, sid, path):
    """Answers stream `sid` as `path` says; False: the connection is done."""
    head = lambda end: frame(HEADERS, END_HEADERS | (END_STREAM if end else 0), sid, enc.encode([(":status", "200")]))
    if path == "/rst-head":
        conn.sendall(frame(RST, 0, sid, struct.pack(">I", 2)))
    elif path == "/rst":
        conn.sendall(head(False) + frame(DATA, 0, sid, b"hello") + frame(RST, 0, sid, struct.pack(">I", 2)))
    elif path == "/goaway-head":
        conn.sendall(frame(GOAWAY, 0, 0, struct.pack(">II", 0, 0)))
        return False
    elif path == "/goaway":
        conn.sendall(head(False) + frame(DATA, 0, sid, b"hello") + frame(GOAWAY, 0, 0, struct.pack(">II", sid, 2)))
        return False
    elif path == "/bad-hpack":
        conn.sendall(frame(HEADERS, END_HEADERS | END_STREAM, sid, b"\xff\xff\xff\xff\x0f"))
    elif path == "/continuation":
        conn.sendall(frame(HEADERS, 0, sid, enc.encode([(":status", "200")])))
        field = enc.encode([("x-filler", "f" * 16000)])
        try:
            for _ in range(100000):
                conn.sendall(frame(CONT, 0, sid, field))
        except OSError:
            pass
        return False
    elif path == "/flood":
        conn.sendall(head(False))
        chunk = frame(DATA, 0, sid, b"x" * 16384)
        try:
            for _ in range(4096):
                conn.sendall(chunk)
        except OSError:
            pass
        return False
    elif path == "/linger":
        conn.sendall(frame(HEADERS, END_HEADERS, sid, enc.encode([(":status", "200"), ("content-length", "2")]))
                     + frame(DATA, END_STREAM, sid, b"ok"))
        time.sleep(0.5)
        return False
    elif path == "/trailers":
        conn.sendall(head(False) + frame(DATA, 0, sid, b"hello")
                     + frame(HEADERS, END_HEADERS | END_STREAM, sid, enc.encode([("x-check", "done")])))
    else:
        conn.sendall(frame(HEADERS, END_HEADERS, sid, enc.encode([(":status", "200"), ("content-length", "2")]))
                     + frame(DATA, END_STREAM, sid, b"ok"))
    return True


def main():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(sys.argv[1])))
    s.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = s.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


main()
