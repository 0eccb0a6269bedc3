/* WebSocket tunnel load for the proxy bench (bench/ktlsbench/proxy.py): both ends of a tunnel in
 * one small epoll program, so that neither is the bottleneck of what is measured (the proxy in
 * between). A proxy relays a tunnel's bytes without reading its frames, so after the handshake the
 * ends deal in bytes: the client sends whole masked WebSocket frames and the echo upstream sends
 * the same bytes back.
 *
 *   wsload upstream PORT
 *       Plain-TCP WebSocket upstream on 127.0.0.1:PORT: answers each handshake with a 101
 *       (Sec-WebSocket-Accept computed), then a path ending in /echo echoes every byte, one
 *       ending in /bulk sends 64 KiB binary frames for as long as the client takes them.
 *       Prints `listening PORT`.
 *   wsload rt PORT PATH CONNS SECONDS
 *       CONNS tunnels over TLS (HTTP/1.1 Upgrade) to 127.0.0.1:PORT; each sends a 32-byte frame
 *       and waits for its 32 bytes back, again and again. Prints `rt N SECONDS`.
 *   wsload bulk PORT PATH CONNS SECONDS
 *       CONNS tunnels that read what the upstream sends. Prints `bytes N SECONDS`.
 *
 * Exits 1 with a message on any failure (a handshake not answered 101, a connection closed).
 * Build: cc -O2 -o wsload wsload.c -lssl -lcrypto */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RT_FRAME 32
#define BULK_FRAME (64 * 1024)

static void die(const char *what) {
    fprintf(stderr, "wsload: %s: %s\n", what, strerror(errno));
    exit(1);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void nonblocking(int fd) {
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* ---- upstream ---- */

struct up {
    int fd, mode; /* mode: 0 head, 1 echo, 2 bulk */
    char head[4096];
    size_t len;
    size_t off; /* bulk: where in the frame the next write starts */
};

static unsigned char bulk_frame[BULK_FRAME + 10];

static void accept_value(const char *key, size_t n, char out[64]) {
    unsigned char in[128], md[SHA_DIGEST_LENGTH];
    static const char guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    if (n > 64) n = 64;
    memcpy(in, key, n);
    memcpy(in + n, guid, sizeof guid - 1);
    SHA1(in, n + sizeof guid - 1, md);
    EVP_EncodeBlock((unsigned char *)out, md, SHA_DIGEST_LENGTH);
}

static int upstream_head(struct up *u) {
    char *end = memmem(u->head, u->len, "\r\n\r\n", 4);
    if (!end) return u->len < sizeof u->head - 1 ? 0 : -1;
    u->head[u->len] = 0;
    char *path_end = strchr(u->head + 4, ' ');
    if (!path_end) return -1;
    u->mode = (path_end - u->head >= 5 && !memcmp(path_end - 5, "/bulk", 5)) ? 2 : 1;
    const char *key = strcasestr(u->head, "\r\nsec-websocket-key:");
    char acc[64] = "";
    if (key) {
        key += 20;
        while (*key == ' ') key++;
        accept_value(key, strcspn(key, "\r\n "), acc);
    }
    char resp[256];
    int n = snprintf(resp, sizeof resp,
                     "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Accept: %s\r\n\r\n",
                     acc);
    if (write(u->fd, resp, n) != n) return -1;
    /* Bytes after the head (echo): sent back as the rest will be. */
    size_t used = end + 4 - u->head;
    if (u->mode == 1 && u->len > used && write(u->fd, end + 4, u->len - used) < 0) return -1;
    return 1;
}

static _Noreturn void run_upstream(int port) {
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001)};
    if (bind(ls, (void *)&a, sizeof a) || listen(ls, 4096)) die("listen");
    bulk_frame[0] = 0x82;
    bulk_frame[1] = 127;
    for (int i = 0; i < 8; i++) bulk_frame[2 + i] = (BULK_FRAME >> (8 * (7 - i))) & 0xff;
    memset(bulk_frame + 10, 'b', BULK_FRAME);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    printf("listening %d\n", port);
    fflush(stdout);
    static char buf[256 * 1024];
    struct epoll_event evs[256];
    for (;;) {
        int n = epoll_wait(ep, evs, 256, -1);
        for (int i = 0; i < n; i++) {
            struct up *u = evs[i].data.ptr;
            if (!u) {
                int fd = accept(ls, NULL, NULL);
                if (fd < 0) continue;
                nonblocking(fd);
                u = calloc(1, sizeof *u);
                u->fd = fd;
                struct epoll_event e = {.events = EPOLLIN, .data.ptr = u};
                epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
                continue;
            }
            int gone = 0;
            if (u->mode == 0) {
                ssize_t r = read(u->fd, u->head + u->len, sizeof u->head - 1 - u->len);
                if (r <= 0) gone = 1;
                else {
                    u->len += r;
                    int h = upstream_head(u);
                    if (h < 0) gone = 1;
                    else if (h > 0 && u->mode == 2) {
                        struct epoll_event e = {.events = EPOLLIN | EPOLLOUT, .data.ptr = u};
                        epoll_ctl(ep, EPOLL_CTL_MOD, u->fd, &e);
                    }
                }
            } else if (u->mode == 1) {
                for (;;) {
                    ssize_t r = read(u->fd, buf, sizeof buf);
                    if (r == 0 || (r < 0 && errno != EAGAIN)) { gone = 1; break; }
                    if (r < 0) break;
                    /* Small echoes: the socket takes them whole. */
                    if (write(u->fd, buf, r) != r) { gone = 1; break; }
                }
            } else {
                if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                    ssize_t r = read(u->fd, buf, sizeof buf);
                    if (r == 0 || (r < 0 && errno != EAGAIN)) gone = 1;
                }
                while (!gone) {
                    ssize_t w = write(u->fd, bulk_frame + u->off, sizeof bulk_frame - u->off);
                    if (w < 0) {
                        if (errno != EAGAIN) gone = 1;
                        break;
                    }
                    u->off = (u->off + w) % sizeof bulk_frame;
                }
            }
            if (gone) {
                close(u->fd);
                free(u);
            }
        }
    }
}

/* ---- client ---- */

struct cl {
    int fd;
    SSL *ssl;
    size_t got;
};

static int tunnel(SSL_CTX *ctx, int port, const char *path, struct cl *c) {
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001)};
    if (connect(c->fd, (void *)&a, sizeof a)) die("connect");
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->ssl = SSL_new(ctx);
    SSL_set_fd(c->ssl, c->fd);
    SSL_set_tlsext_host_name(c->ssl, "localhost");
    if (SSL_connect(c->ssl) != 1) die("TLS handshake");
    char req[512];
    int n = snprintf(req, sizeof req,
                     "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                     "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
                     path, port);
    if (SSL_write(c->ssl, req, n) != n) die("handshake write");
    char head[4096];
    size_t len = 0;
    while (!memmem(head, len, "\r\n\r\n", 4)) {
        int r = SSL_read(c->ssl, head + len, 1); /* a byte at a time: nothing after the head is taken */
        if (r <= 0 || ++len == sizeof head) die("handshake read");
    }
    if (memcmp(head, "HTTP/1.1 101", 12)) {
        head[len < 200 ? len : 200] = 0;
        fprintf(stderr, "wsload: %s answered: %s\n", path, head);
        exit(1);
    }
    nonblocking(c->fd);
    return 0;
}

static int run_client(int bulk, int port, const char *path, int conns, double seconds) {
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    unsigned char alpn[] = "\x08http/1.1";
    SSL_CTX_set_alpn_protos(ctx, alpn, sizeof alpn - 1);
    struct cl *cs = calloc(conns, sizeof *cs);
    int ep = epoll_create1(0);
    /* A final masked binary frame of 26 payload bytes (zero mask key: the payload as is). */
    unsigned char frame[RT_FRAME] = {0x82, 0x80 | (RT_FRAME - 6), 0, 0, 0, 0};
    memset(frame + 6, 'r', RT_FRAME - 6);
    for (int i = 0; i < conns; i++) {
        tunnel(ctx, port, path, &cs[i]);
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = &cs[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, cs[i].fd, &e);
    }
    double start = now(), end = start + seconds;
    unsigned long long count = 0;
    if (!bulk)
        for (int i = 0; i < conns; i++)
            if (SSL_write(cs[i].ssl, frame, RT_FRAME) != RT_FRAME) die("write");
    static char buf[256 * 1024];
    struct epoll_event evs[256];
    while (now() < end) {
        int n = epoll_wait(ep, evs, 256, 100);
        for (int i = 0; i < n; i++) {
            struct cl *c = evs[i].data.ptr;
            for (;;) {
                int r = SSL_read(c->ssl, buf, sizeof buf);
                if (r <= 0) {
                    int err = SSL_get_error(c->ssl, r);
                    if (err == SSL_ERROR_WANT_READ) break;
                    fprintf(stderr, "wsload: a tunnel ended (SSL error %d)\n", err);
                    exit(1);
                }
                if (bulk) {
                    count += r;
                    continue;
                }
                c->got += r;
                while (c->got >= RT_FRAME) {
                    c->got -= RT_FRAME;
                    count++;
                    if (SSL_write(c->ssl, frame, RT_FRAME) != RT_FRAME) die("write");
                }
            }
        }
    }
    double took = now() - start;
    printf("%s %llu %.3f\n", bulk ? "bytes" : "rt", count, took);
    return 0;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc == 3 && !strcmp(argv[1], "upstream")) run_upstream(atoi(argv[2]));
    if (argc == 6 && (!strcmp(argv[1], "rt") || !strcmp(argv[1], "bulk")))
        return run_client(!strcmp(argv[1], "bulk"), atoi(argv[2]), argv[3], atoi(argv[4]), atof(argv[5]));
    fprintf(stderr, "usage: wsload upstream PORT | wsload rt|bulk PORT PATH CONNS SECONDS\n");
    return 2;
}
