/* Time, framing, the payload cursor and signal hygiene, shared by every part of the agent. */
#include "guest.h"

#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>

int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void touch_activity(void) {
    if (shared) shared->last_activity_ms = now_ms();
}

int write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == ENOTSOCK) n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Sends every byte of ``iov`` (it is consumed), as ``write_all`` does for one buffer. */
static int writev_all(int fd, struct iovec *iov, int count) {
    while (count > 0) {
        struct msghdr msg = {0};
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)count;
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (n < 0 && errno == ENOTSOCK) n = writev(fd, iov, count);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        while (count > 0 && (size_t)n >= iov->iov_len) {
            n -= (ssize_t)iov->iov_len;
            iov++;
            count--;
        }
        if (count > 0) {
            iov->iov_base = (char *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
        }
    }
    return 0;
}

int read_all(int fd, void *buf, size_t len) {
    char *p = buf;
    while (len > 0) {
        ssize_t n = read(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (n == 0) return -1; /* EOF in the middle of a frame */
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

void put_u32(unsigned char *p, uint32_t v) {
    p[0] = v & 0xff; p[1] = (v >> 8) & 0xff; p[2] = (v >> 16) & 0xff; p[3] = (v >> 24) & 0xff;
}

void put_u64(unsigned char *p, uint64_t v) {
    put_u32(p, (uint32_t)v);
    put_u32(p + 4, (uint32_t)(v >> 32));
}

uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

int send_frame(int fd, uint8_t type, const void *payload, uint32_t len) {
    unsigned char hdr[5];
    hdr[0] = type;
    put_u32(hdr + 1, len);
    if (len > 0 && len <= 4096) { /* one syscall for small frames */
        unsigned char buf[5 + 4096];
        memcpy(buf, hdr, 5);
        memcpy(buf + 5, payload, len);
        return write_all(fd, buf, 5 + len);
    }
    /* Header and payload in one system call: a DATA frame of a download is one send, not two. */
    struct iovec iov[2] = {{hdr, 5}, {(void *)payload, len}};
    return writev_all(fd, iov, len ? 2 : 1);
}

int send_error(int fd, uint32_t code, const char *fmt, ...) {
    char msg[1024];
    unsigned char buf[4 + sizeof msg];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof msg) n = sizeof msg - 1;
    put_u32(buf, code);
    memcpy(buf + 4, msg, (size_t)n);
    return send_frame(fd, FR_ERROR, buf, 4 + (uint32_t)n);
}

/* Reads one frame header and returns its type, or -1 on EOF/error. */
int read_header(int fd, uint32_t *len) {
    unsigned char hdr[5];
    if (read_all(fd, hdr, 5) < 0) return -1;
    *len = get_u32(hdr + 1);
    return hdr[0];
}

uint32_t cur_u32(struct cursor *c) {
    if (c->left < 4) { c->bad = 1; return 0; }
    uint32_t v = get_u32(c->p);
    c->p += 4;
    c->left -= 4;
    return v;
}

/* Returns a freshly allocated NUL-terminated copy; marks the cursor bad on NUL bytes or overrun. */
char *cur_str(struct cursor *c) {
    uint32_t len = cur_u32(c);
    if (c->bad || len > c->left) { c->bad = 1; return NULL; }
    if (memchr(c->p, 0, len)) { c->bad = 1; return NULL; }
    char *s = malloc((size_t)len + 1);
    if (!s) { c->bad = 1; return NULL; }
    memcpy(s, c->p, len);
    s[len] = 0;
    c->p += len;
    c->left -= len;
    return s;
}

unsigned char *read_payload(int fd, uint32_t len, uint32_t max) {
    if (len > max) return NULL;
    unsigned char *buf = malloc(len ? len : 1);
    if (!buf) return NULL;
    if (read_all(fd, buf, len) < 0) { free(buf); return NULL; }
    return buf;
}

/* The signals this agent's processes ignore (bit n-1 for signal n): what the runtime left ignored, and
 * SIGPIPE. Noted once by PID 1 before it forks anything; no process of the agent changes a disposition
 * after that, and execve resets every caught signal by itself, so only these need resetting in a child. */
static uint64_t ignored_signals;

void note_ignored_signals(void) {
    struct { void *handler; unsigned long flags; void *restorer; uint64_t mask; } old;
    for (int sig = 1; sig < 65; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP) continue;
        /* The raw syscall also reaches the signals libc reserves (32, 33), which a runtime may have left
         * ignored; ignored dispositions would otherwise survive exec into every command. */
        if (syscall(SYS_rt_sigaction, sig, NULL, &old, sizeof old.mask) == 0 && old.handler == (void *)SIG_IGN)
            ignored_signals |= 1ull << (sig - 1);
    }
}

void reset_signals(void) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    struct { void *handler; unsigned long flags; void *restorer; uint64_t mask; } dfl = {0, 0, 0, 0};
    for (int sig = 1; sig < 65; sig++)
        if (ignored_signals & (1ull << (sig - 1))) syscall(SYS_rt_sigaction, sig, &dfl, NULL, sizeof dfl.mask);
}
