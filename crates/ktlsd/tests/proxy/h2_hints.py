#!/usr/bin/python3
"""One HTTP/2 request through the proxy, every response head it gets reported, for
the early-hints test. Usage: h2_hints.py HOST PORT PATH

Opens a TLS connection (ALPN h2), GETs PATH and prints one JSON object:
{"interim": [[status, [[name, value], ...]], ...] (each InformationalResponseReceived),
"status": the final status, "headers": its fields, "body": the body as text}.
Exit status 0 unless the connection fails.
"""

import json
import socket
import ssl
import sys

import h2.config
import h2.connection
import h2.events


def main():
    host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    sock = ctx.wrap_socket(socket.create_connection((host, port), timeout=20), server_hostname="localhost")
    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    sid = conn.get_next_available_stream_id()
    fields = [(":method", "GET"), (":scheme", "https"), (":authority", "localhost"), (":path", path)]
    conn.send_headers(sid, fields, end_stream=True)
    sock.sendall(conn.data_to_send())

    def text(headers):
        return [[k.decode() if isinstance(k, bytes) else k, v.decode() if isinstance(v, bytes) else v]
                for k, v in headers]

    out = {"interim": [], "status": None, "headers": [], "body": ""}
    body = b""
    ended = False
    while not ended:
        data = sock.recv(65536)
        if not data:
            sys.exit("the server closed the connection")
        for e in conn.receive_data(data):
            if isinstance(e, h2.events.InformationalResponseReceived):
                h = text(e.headers)
                status = int(dict(h)[":status"])
                out["interim"].append([status, [f for f in h if not f[0].startswith(":")]])
            elif isinstance(e, h2.events.ResponseReceived):
                h = text(e.headers)
                out["status"] = int(dict(h)[":status"])
                out["headers"] = [f for f in h if not f[0].startswith(":")]
            elif isinstance(e, h2.events.DataReceived):
                body += e.data
                conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
            elif isinstance(e, h2.events.StreamEnded) and e.stream_id == sid:
                ended = True
            elif isinstance(e, h2.events.StreamReset):
                sys.exit(f"stream reset: {e.error_code}")
        pending = conn.data_to_send()
        if pending:
            sock.sendall(pending)
    out["body"] = body.decode("latin-1")
    print(json.dumps(out))


main()
