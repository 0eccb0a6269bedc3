"""An upstream that answers every request with a fixed, wrong switch (for the tunnel
tests), on 127.0.0.1: prints `listening PORT`, then per request path:
  /api/no-upgrade  101 without Upgrade
  /api/h2c         101 to h2c, though websocket was asked for
  anything else    101 to websocket, whatever was asked (to a plain GET: unasked)
"""

import socket
import threading


def serve(conn):
    with conn:
        head = b""
        while b"\r\n\r\n" not in head:
            data = conn.recv(65536)
            if not data:
                return
            head += data
        path = head.split(b" ", 2)[1].decode()
        if path == "/api/no-upgrade":
            answer = b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n\r\n"
        elif path == "/api/h2c":
            answer = b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n"
        else:
            answer = b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n"
        conn.sendall(answer + b"tunnel bytes nobody asked for")
        conn.recv(1)


listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(16)
print(f"listening {listener.getsockname()[1]}", flush=True)
while True:
    c, _ = listener.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
