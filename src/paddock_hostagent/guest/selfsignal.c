/* The in-sandbox self-signal API (control-plane spec 12.4): code inside a sandbox asks for its own pause
 * or deletion, with `POST http://127.0.0.1:1029/self/pause?reason=...` (or /self/delete), or by writing
 * `park` / `retire` as a line to the FIFO /run/self. The agent answers 202, then records the request in
 * the shared page; the host agent reads it with INFO and passes it to the control plane, which acts. */
#include "guest.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>

static void record(uint32_t action, const char *reason, size_t len) {
    if (len > SELF_REASON_MAX) len = SELF_REASON_MAX;
    memcpy(shared->self_reason, reason, len);
    shared->self_reason[len] = 0;
    shared->self_action = action;
    __sync_synchronize();
    __sync_fetch_and_add(&shared->self_seq, 1);
}

int self_http_listen(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(SELF_HTTP_PORT)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(fd, 16) < 0) {
        close(fd);
        return -1; /* no loopback, or the port is taken: the FIFO still works */
    }
    return fd;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes the `reason` query parameter into out; keeps printable characters only. */
static size_t query_reason(const char *query, char *out, size_t out_len) {
    size_t n = 0;
    for (const char *p = query; p && *p;) {
        const char *end = strchr(p, '&');
        if (!end) end = p + strlen(p);
        if (!strncmp(p, "reason=", 7)) {
            for (const char *q = p + 7; q < end && n < out_len; q++) {
                int c = (unsigned char)*q;
                if (c == '+') c = ' ';
                else if (c == '%' && q + 2 < end && hex_value(q[1]) >= 0 && hex_value(q[2]) >= 0) {
                    c = hex_value(q[1]) * 16 + hex_value(q[2]);
                    q += 2;
                }
                if (c >= 0x20 && c != 0x7f) out[n++] = (char)c;
            }
            break;
        }
        p = *end ? end + 1 : end;
    }
    return n;
}

static void respond(int conn, const char *status, const char *body) {
    char buf[256];
    int n = snprintf(buf, sizeof buf,
                     "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     status, strlen(body), body);
    if (n > 0) write_all(conn, buf, (size_t)n);
}

void self_http_serve(int conn) {
    struct timeval timeout = {5, 0}; /* a client that never finishes its request is dropped */
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    char req[8192];
    size_t got = 0;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (got < sizeof req - 1) {
        ssize_t n = read(conn, req + got, sizeof req - 1 - got);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            /* gVisor's hostinet answers a blocking read EAGAIN when no data is there yet: wait for
               it with poll, within the same 5 s, instead of taking half a request as the whole. */
            clock_gettime(CLOCK_MONOTONIC, &now);
            long waited_ms = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
            if (waited_ms >= 5000) break;
            struct pollfd pfd = {.fd = conn, .events = POLLIN};
            poll(&pfd, 1, (int)(5000 - waited_ms));
            continue;
        }
        if (n <= 0) break;
        got += (size_t)n;
        req[got] = 0;
        if (strstr(req, "\r\n\r\n")) break;
    }
    req[got] = 0;
    char method[16], target[4096];
    if (sscanf(req, "%15s %4095s", method, target) != 2) {
        respond(conn, "400 Bad Request", "{\"error\":\"bad request\"}");
        return;
    }
    char *query = strchr(target, '?');
    if (query) *query++ = 0;
    uint32_t action = !strcmp(target, "/self/pause") ? SELF_PAUSE : !strcmp(target, "/self/delete") ? SELF_DELETE : SELF_NONE;
    if (action == SELF_NONE) {
        respond(conn, "404 Not Found", "{\"error\":\"not found\"}");
        return;
    }
    if (strcmp(method, "POST")) {
        respond(conn, "405 Method Not Allowed", "{\"error\":\"method not allowed\"}");
        return;
    }
    char reason[SELF_REASON_MAX];
    size_t len = query_reason(query, reason, sizeof reason);
    respond(conn, "202 Accepted", "{\"status\":\"accepted\"}"); /* answer first, then act */
    record(action, reason, len);
}

int self_fifo_open(void) {
    if (mkfifo(SELF_FIFO_PATH, 0622) == 0) chmod(SELF_FIFO_PATH, 0622); /* any user in the sandbox may signal */
    struct stat st;
    if (lstat(SELF_FIFO_PATH, &st) < 0 || !S_ISFIFO(st.st_mode)) return -1;
    /* O_RDWR: we hold a writer ourselves, so the FIFO never reports EOF between signals. */
    return open(SELF_FIFO_PATH, O_RDWR | O_NONBLOCK | O_CLOEXEC);
}

void self_fifo_drain(int fd) {
    static char line[256];
    static size_t used;
    for (;;) {
        ssize_t n = read(fd, line + used, sizeof line - 1 - used);
        if (n <= 0) return;
        used += (size_t)n;
        char *newline;
        while ((newline = memchr(line, '\n', used)) != NULL) {
            *newline = 0;
            char *word = line;
            while (*word == ' ' || *word == '\t') word++;
            size_t wlen = strcspn(word, " \t\r");
            if (wlen == 4 && !strncmp(word, "park", 4)) record(SELF_PAUSE, "", 0);
            else if (wlen == 6 && !strncmp(word, "retire", 6)) record(SELF_DELETE, "", 0);
            size_t rest = used - (size_t)(newline + 1 - line);
            memmove(line, newline + 1, rest);
            used = rest;
        }
        if (used == sizeof line - 1) used = 0; /* an over-long line without a newline: drop it */
    }
}
