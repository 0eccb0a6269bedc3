#!/usr/bin/python3
"""One HTTP/2 connection that asks for many proxied bodies and reads none of them, for
the proxy's memory tests. Usage: h2_hold.py HOST PORT SECONDS PATH...

Sends one request per PATH at once (each its own stream), then for SECONDS reads
what the server sends without ever opening a flow-control window (no WINDOW_UPDATE),
so the server can send at most 65,535 body bytes in all. Prints one JSON object:
{"heads": [[path, status, seconds from the requests to the head], ...]} for the heads
that arrived. Exit status 0 unless the connection fails.
"""

import json
import socket
import ssl
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.settings


def main():
    host, port, seconds, paths = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    sock = ctx.wrap_socket(socket.create_connection((host, port), timeout=20), server_hostname="localhost")
    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1000})
    sock.sendall(conn.data_to_send())
    streams = {}
    for path in paths:
        sid = conn.get_next_available_stream_id()
        fields = [(":method", "GET"), (":scheme", "https"), (":authority", "localhost"), (":path", path)]
        conn.send_headers(sid, fields, end_stream=True)
        streams[sid] = path
    sock.sendall(conn.data_to_send())
    start = time.monotonic()
    heads = []
    sock.settimeout(0.2)
    while time.monotonic() - start < seconds:
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        if not data:
            sys.exit("the server closed the connection")
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                status = dict(ev.headers)[b":status"].decode()
                heads.append([streams.get(ev.stream_id), int(status), round(time.monotonic() - start, 3)])
        out = conn.data_to_send()
        if out:
            sock.sendall(out)
    print(json.dumps({"heads": heads}), flush=True)
    sock.close()


main()
