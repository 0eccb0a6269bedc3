#!/usr/bin/python3
"""A gRPC server and client (Debian's python3-grpcio) for the proxy tests, with raw
bytes as messages (no generated code).

  grpc_echo.py server ADDR      serves test.Echo on ADDR (HOST:PORT or unix:/PATH,
                                plain HTTP/2), prints "ready"
  grpc_echo.py client PORT CA   calls it through ktlsd on 127.0.0.1:PORT over TLS
                                (CA: the certificate to trust, for "localhost") and
                                prints one JSON object of what each call gave

Methods of test.Echo:
  Unary         answers the request
  ServerStream  the request N times (N: the request's length), "i:REQUEST"
  ClientStream  the requests joined with "+"
  Bidi          each request back as it comes, "echo:REQUEST" (ping-pong)
  Fail          status NOT_FOUND, details "no such thing", trailing metadata x-why
  Slow          answers after 3 s (the client's deadline is 0.5 s)
  Big           N bytes (N: the request as a decimal number)
"""

import json
import sys
import threading
import time
from concurrent import futures

import grpc

SERVICE = "test.Echo"


def handlers():
    def unary(req, ctx):
        return req

    def server_stream(req, ctx):
        for i in range(len(req)):
            yield b"%d:" % i + req

    def client_stream(reqs, ctx):
        return b"+".join(reqs)

    def bidi(reqs, ctx):
        for r in reqs:
            yield b"echo:" + r

    def fail(req, ctx):
        ctx.set_trailing_metadata((("x-why", "testing"),))
        ctx.abort(grpc.StatusCode.NOT_FOUND, "no such thing")

    def slow(req, ctx):
        time.sleep(3)
        return req

    def big(req, ctx):
        return b"x" * int(req)

    rpc = grpc
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Unary": rpc.unary_unary_rpc_method_handler(unary),
            "ServerStream": rpc.unary_stream_rpc_method_handler(server_stream),
            "ClientStream": rpc.stream_unary_rpc_method_handler(client_stream),
            "Bidi": rpc.stream_stream_rpc_method_handler(bidi),
            "Fail": rpc.unary_unary_rpc_method_handler(fail),
            "Slow": rpc.unary_unary_rpc_method_handler(slow),
            "Big": rpc.unary_unary_rpc_method_handler(big),
        },
    )


def serve(addr):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((handlers(),))
    if server.add_insecure_port(addr) == 0 and not addr.startswith("unix:"):
        sys.exit("cannot listen on " + addr)
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


def client(port, ca):
    creds = grpc.ssl_channel_credentials(root_certificates=open(ca, "rb").read())
    options = (("grpc.ssl_target_name_override", "localhost"), ("grpc.max_receive_message_length", 64 << 20))
    out = {}
    with grpc.secure_channel("127.0.0.1:%d" % port, creds, options=options) as ch:
        path = lambda m: "/%s/%s" % (SERVICE, m)

        def call(name, fn):
            try:
                out[name] = fn()
            except grpc.RpcError as e:
                out[name] = {"code": e.code().name, "details": e.details(),
                             "trailers": dict(e.trailing_metadata() or ())}

        call("unary", lambda: ch.unary_unary(path("Unary"))(b"hello", timeout=10).decode())
        call("server_stream", lambda: [m.decode() for m in ch.unary_stream(path("ServerStream"))(b"abc", timeout=10)])
        call("client_stream",
             lambda: ch.stream_unary(path("ClientStream"))(iter([b"a", b"b", b"c"]), timeout=10).decode())

        def ping_pong():
            # Each request is sent only once the answer to the previous one came back:
            # the proxy must move both directions at once.
            gate = threading.Semaphore(1)
            def requests():
                for i in range(5):
                    gate.acquire()
                    yield b"m%d" % i
            got = []
            for m in ch.stream_stream(path("Bidi"))(requests(), timeout=10):
                got.append(m.decode())
                gate.release()
            return got

        call("bidi", ping_pong)
        call("fail", lambda: ch.unary_unary(path("Fail"))(b"x", timeout=10))
        started = time.monotonic()
        call("deadline", lambda: ch.unary_unary(path("Slow"))(b"x", timeout=0.5))
        out["deadline_secs"] = round(time.monotonic() - started, 2)
        call("big", lambda: len(ch.unary_unary(path("Big"))(b"5000000", timeout=20)))
        many = []
        def one(i):
            many.append(ch.unary_unary(path("Unary"))(b"n%d" % i, timeout=10).decode())
        threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out["concurrent"] = len(many)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(sys.argv[2])
    else:
        client(int(sys.argv[2]), sys.argv[3])
