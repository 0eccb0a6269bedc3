"""WebSocket over HTTP/2 (RFC 8441) with Python's h2, frame by frame: an extended
CONNECT to ktlsd, then WebSocket frames (RFC 6455, masked as a client's) in DATA
frames. Usage: h2_ws.py HOST PORT PATH SCENARIO. Prints `settings N` (the server's
SETTINGS_ENABLE_CONNECT_PROTOCOL), `status S` and one line per check (`ok NAME` or
`fail NAME: why`); exits 1 if any failed.

Scenarios:
  echo    a text message, a 300 kB binary one (more than the stream's window, so
          both ways wait for WINDOW_UPDATE), then a close (1000) answered by the
          upstream's close and END_STREAM
  reset   one echo, then RST_STREAM(CANCEL); the connection goes on: a second
          extended CONNECT on it echoes too
  refused prints the status of an extended CONNECT the upstream refuses
  slow    PATH is an upstream that reads nothing: sends on it as long as the
          stream's window opens (prints `sent N`, `ok stalled` once no credit has
          come for 1.5 s), then a second tunnel on the same connection to
          /api/echo echoes a text and a 300 kB message (`ok other text`,
          `ok other 300kB`) while the first stays stalled
  after   DATA after the client's END_STREAM on a tunnel whose upstream is still
          open: the server resets that stream with STREAM_CLOSED (`ok reset after
          end`), and the connection goes on (`ok after`)
"""

import socket
import ssl
import struct
import sys

import h2.config
import h2.connection
import h2.events
import h2.settings

from wsframe import ws_frame, ws_parse

failed = False


def check(name, ok, why=""):
    global failed
    print(f"ok {name}" if ok else f"fail {name}: {why}", flush=True)
    failed |= not ok


class Client:
    def __init__(self, host, port):
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        self.sock = ctx.wrap_socket(socket.create_connection((host, port), timeout=20), server_hostname="localhost")
        self.authority = f"{host}:{port}"
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.flush()
        self.events = []
        while not any(isinstance(e, h2.events.RemoteSettingsChanged) for e in self.events):
            self.pump()
        print(f"settings {self.conn.remote_settings.enable_connect_protocol}", flush=True)
        self.buffers = {}
        self.ended = set()

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self):
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("the server closed the connection")
        for e in self.conn.receive_data(data):
            self.events.append(e)
            if isinstance(e, h2.events.DataReceived):
                self.buffers.setdefault(e.stream_id, bytearray()).extend(e.data)
                self.conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
            if isinstance(e, h2.events.StreamEnded):
                self.ended.add(e.stream_id)
        self.flush()

    def connect(self, path):
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(
            sid,
            [
                (":method", "CONNECT"),
                (":protocol", "websocket"),
                (":scheme", "https"),
                (":path", path),
                (":authority", self.authority),
                ("sec-websocket-version", "13"),
                ("user-agent", "h2_ws.py"),
            ],
        )
        self.flush()
        while True:
            for e in self.events:
                if isinstance(e, h2.events.ResponseReceived) and e.stream_id == sid:
                    self.events.remove(e)
                    return sid, dict((k.decode(), v.decode()) for k, v in e.headers)
            self.pump()

    def send(self, sid, data):
        """Sends data within the flow-control windows, waiting for WINDOW_UPDATE."""
        while data:
            room = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
            if room <= 0:
                self.pump()
                continue
            self.conn.send_data(sid, data[:room])
            data = data[room:]
            self.flush()

    def message(self, sid):
        buf = self.buffers.setdefault(sid, bytearray())
        while True:
            parsed = ws_parse(buf)
            if parsed:
                del buf[: parsed[2]]
                return parsed[0], parsed[1]
            if sid in self.ended:
                return None
            self.pump()


def text_and_big(c, sid, text, prefix=""):
    """Echoes of a text message and of a 300 kB binary one (more than the stream's window)."""
    c.send(sid, ws_frame(1, text))
    check(f"{prefix}text", c.message(sid) == (1, text))
    big = bytes(i % 253 for i in range(300_000))
    c.send(sid, ws_frame(2, big))
    got = c.message(sid)
    check(f"{prefix}300kB", got == (2, big), f"{got and len(got[1])} bytes")


def echo(c, path):
    sid, head = c.connect(path)
    print(f"status {head.get(':status')}", flush=True)
    check("no accept", "sec-websocket-accept" not in head, repr(head))
    text_and_big(c, sid, b"hello")
    c.send(sid, ws_frame(8, struct.pack("!H", 1000) + b"bye"))
    got = c.message(sid)
    check("close", got is not None and got[0] == 8 and got[1][:2] == struct.pack("!H", 1000), repr(got))
    while sid not in c.ended:
        c.pump()
    check("end_stream", True)


def reset(c, path):
    sid, head = c.connect(path)
    print(f"status {head.get(':status')}", flush=True)
    c.send(sid, ws_frame(1, b"one"))
    check("first", c.message(sid) == (1, b"one"))
    c.conn.reset_stream(sid, error_code=8)
    c.flush()
    sid, head = c.connect(path)
    check("second status", head.get(":status") == "200", repr(head))
    c.send(sid, ws_frame(1, b"two"))
    check("second", c.message(sid) == (1, b"two"))


def refused(c, path):
    sid, head = c.connect(path)
    print(f"status {head.get(':status')}", flush=True)


def slow(c, path):
    import time

    sink, head = c.connect(path)
    check("sink status", head.get(":status") == "200", repr(head))
    frame = ws_frame(2, b"s" * (1 << 20), key=b"\0\0\0\0")
    sent, limit, last = 0, 256 << 20, time.monotonic()
    c.sock.settimeout(0.1)
    while sent < limit and time.monotonic() - last < 1.5:
        room = min(c.conn.local_flow_control_window(sink), c.conn.max_outbound_frame_size)
        if room > 0:
            at = sent % len(frame)
            c.conn.send_data(sink, frame[at : at + room])
            sent += min(room, len(frame) - at)
            c.flush()
            last = time.monotonic()
            continue
        try:
            c.pump()
        except socket.timeout:
            pass
    c.sock.settimeout(20)
    print(f"sent {sent}", flush=True)
    check("stalled", sent < limit, f"{sent} bytes went without the window shutting")
    other, head = c.connect("/api/echo")
    check("other status", head.get(":status") == "200", repr(head))
    text_and_big(c, other, b"still here", "other ")
    check("sink still shut", c.conn.local_flow_control_window(sink) < (1 << 20), str(c.conn.local_flow_control_window(sink)))


def after(c, path):
    sid, head = c.connect(path)
    print(f"status {head.get(':status')}", flush=True)
    # A last frame with END_STREAM, then DATA after it, written by hand (h2 would
    # refuse it), in one write so that the server reads both before it acts on the
    # first: a stream error (STREAM_CLOSED), not the connection's.
    c.conn.send_data(sid, ws_frame(1, b"last"), end_stream=True)
    payload = ws_frame(1, b"after end")
    raw = struct.pack("!I", len(payload))[1:] + bytes([0, 0]) + struct.pack("!I", sid) + payload
    c.sock.sendall(c.conn.data_to_send() + raw)
    while not any(isinstance(e, (h2.events.StreamReset, h2.events.ConnectionTerminated)) for e in c.events):
        c.pump()
    reset = [e for e in c.events if isinstance(e, h2.events.StreamReset) and e.stream_id == sid]
    check("reset after end", reset and reset[0].error_code == 5, repr(c.events))
    other, head = c.connect("/api/echo")
    check("after status", head.get(":status") == "200", repr(head))
    c.send(other, ws_frame(1, b"again"))
    check("after", c.message(other) == (1, b"again"))


def main():
    host, port, path, scenario = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    c = Client(host, port)
    {"echo": echo, "reset": reset, "refused": refused, "slow": slow, "after": after}[scenario](c, path)


main()
sys.exit(1 if failed else 0)
