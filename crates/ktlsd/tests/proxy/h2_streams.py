#!/usr/bin/python3
"""One HTTP/2 connection with one slow proxied stream and many quick ones, for the
proxy tests. Usage: h2_streams.py HOST PORT SLOW QUICK N [--reset] [--after PATH...]

Opens stream 1 for the path SLOW, then N streams for QUICK, all on one TLS
connection (ALPN h2), and prints one line per finished stream:
"STREAM STATUS SECONDS BYTES" (SECONDS since the first request). With --reset, once
the N quick streams are done, stream 1 is reset (CANCEL) and "reset 1" is printed.
Then each --after path is asked for on the same connection and printed the same way;
with --reset the script ends without waiting for stream 1. A stream reset by the
server prints "STREAM reset CODE SECONDS". Exit status 0 unless the connection fails.
"""

import argparse
import socket
import ssl
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.errors


def main():
    p = argparse.ArgumentParser()
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("slow")
    p.add_argument("quick")
    p.add_argument("n", type=int)
    p.add_argument("--reset", action="store_true")
    p.add_argument("--after", nargs="*", default=[])
    a = p.parse_args()

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    sock = ctx.wrap_socket(socket.create_connection((a.host, a.port), timeout=20), server_hostname="localhost")
    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())

    start = time.monotonic()
    status, size, done = {}, {}, set()

    def request(path):
        sid = conn.get_next_available_stream_id()
        fields = [(":method", "GET"), (":scheme", "https"), (":authority", "localhost"), (":path", path)]
        conn.send_headers(sid, fields, end_stream=True)
        sock.sendall(conn.data_to_send())
        return sid

    def pump(until):
        while not until():
            data = sock.recv(65536)
            if not data:
                sys.exit("the server closed the connection")
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.ResponseReceived):
                    status[ev.stream_id] = dict(ev.headers)[b":status"].decode()
                elif isinstance(ev, h2.events.DataReceived):
                    size[ev.stream_id] = size.get(ev.stream_id, 0) + len(ev.data)
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded):
                    done.add(ev.stream_id)
                    took = time.monotonic() - start
                    print(f"{ev.stream_id} {status.get(ev.stream_id)} {took:.3f} {size.get(ev.stream_id, 0)}", flush=True)
                elif isinstance(ev, h2.events.StreamReset):
                    done.add(ev.stream_id)
                    took = time.monotonic() - start
                    print(f"{ev.stream_id} reset {int(ev.error_code)} {took:.3f}", flush=True)
            sock.sendall(conn.data_to_send())

    slow = request(a.slow)
    quick = [request(a.quick) for _ in range(a.n)]
    pump(lambda: all(s in done for s in quick))
    if a.reset:
        conn.reset_stream(slow, h2.errors.ErrorCodes.CANCEL)
        sock.sendall(conn.data_to_send())
        print(f"reset {slow}", flush=True)
    after = [request(path) for path in a.after]
    pump(lambda: all(s in done for s in after) and (a.reset or slow in done))
    conn.close_connection()
    sock.sendall(conn.data_to_send())
    sock.close()


main()
