/*
 * paddock-guest: the in-sandbox guest agent.
 *
 * Runs as PID 1 of a sandbox (so it reaps every orphan) and serves requests on a unix stream socket
 * that the host agent created and handed over as an inherited file descriptor (`--fd N`), or that it
 * binds itself (`--listen PATH`, for tests outside a container).
 *
 * One connection carries one request. PID 1 accepts and forks a handler process per connection; the
 * handler speaks the protocol with blocking I/O and exits when the request is done. Commands run in
 * their own session (so their whole process group can be killed) as children of the handler.
 *
 * Framing (both directions): u8 type, u32 little-endian payload length, payload. Strings inside a
 * payload are u32 length + bytes (no NUL). See protocol.py for the host side of the same table.
 *
 *   client -> guest                              guest -> client
 *   EXEC  flags,argc,envc,cmd,args..,env..,cwd   STDOUT bytes / STDERR bytes ... EXIT i32 code, i32 signal
 *   STDIN bytes ... STDIN_EOF                    or ERROR u32 code + message (the command did not start)
 *   WRITE path; DATA bytes ...; DATA_END         OK (ready) ... OK u64 size, or ERROR
 *   READ path                                    SIZE u64 (UINT64_MAX: unknown), DATA ..., DATA_END, or ERROR
 *   INFO                                         INFO u64 last_activity_ms, u32 active, u32 version
 *
 * Closing the connection while a command runs kills the command's process group.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROTOCOL_VERSION 1u

enum frame_type {
    FR_EXEC = 1, FR_STDIN = 2, FR_STDIN_EOF = 3, FR_WRITE = 4, FR_READ = 5, FR_DATA = 6, FR_DATA_END = 7,
    FR_INFO = 8,
    FR_STDOUT = 32, FR_STDERR = 33, FR_EXIT = 34, FR_ERROR = 35, FR_OK = 36, FR_SIZE = 37, FR_INFO_REPLY = 38,
};

enum error_code {
    E_SPAWN = 1, E_FILE_NOT_FOUND = 2, E_PARENT_NOT_FOUND = 3, E_IS_DIRECTORY = 4, E_BAD_PATH = 5,
    E_IO = 6, E_PROTOCOL = 7,
};

#define MAX_CONTROL_PAYLOAD (4u << 20) /* an exec request with its env must fit in 4 MiB */
#define MAX_DATA_PAYLOAD (1u << 20)
#define IO_CHUNK (256u << 10)
#define DRAIN_AFTER_EXIT_MS 100
#define SPARE_HANDLERS 2

struct shared_state {
    volatile int64_t last_activity_ms;
    volatile int32_t active;
};

static struct shared_state *shared;

/* ---------- small helpers ---------- */

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void touch_activity(void) {
    if (shared) shared->last_activity_ms = now_ms();
}

static int write_all(int fd, const void *buf, size_t len) {
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

static int read_all(int fd, void *buf, size_t len) {
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

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = v & 0xff; p[1] = (v >> 8) & 0xff; p[2] = (v >> 16) & 0xff; p[3] = (v >> 24) & 0xff;
}

static void put_u64(unsigned char *p, uint64_t v) {
    put_u32(p, (uint32_t)v);
    put_u32(p + 4, (uint32_t)(v >> 32));
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static int send_frame(int fd, uint8_t type, const void *payload, uint32_t len) {
    unsigned char hdr[5];
    hdr[0] = type;
    put_u32(hdr + 1, len);
    if (len > 0 && len <= 4096) { /* one syscall for small frames */
        unsigned char buf[5 + 4096];
        memcpy(buf, hdr, 5);
        memcpy(buf + 5, payload, len);
        return write_all(fd, buf, 5 + len);
    }
    if (write_all(fd, hdr, 5) < 0) return -1;
    return len ? write_all(fd, payload, len) : 0;
}

static int send_error(int fd, uint32_t code, const char *fmt, ...) {
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
static int read_header(int fd, uint32_t *len) {
    unsigned char hdr[5];
    if (read_all(fd, hdr, 5) < 0) return -1;
    *len = get_u32(hdr + 1);
    return hdr[0];
}

/* A cursor over a request payload. */
struct cursor {
    const unsigned char *p;
    size_t left;
    int bad;
};

static uint32_t cur_u32(struct cursor *c) {
    if (c->left < 4) { c->bad = 1; return 0; }
    uint32_t v = get_u32(c->p);
    c->p += 4;
    c->left -= 4;
    return v;
}

/* Returns a freshly allocated NUL-terminated copy; marks the cursor bad on NUL bytes or overrun. */
static char *cur_str(struct cursor *c) {
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

static unsigned char *read_payload(int fd, uint32_t len, uint32_t max) {
    if (len > max) return NULL;
    unsigned char *buf = malloc(len ? len : 1);
    if (!buf) return NULL;
    if (read_all(fd, buf, len) < 0) { free(buf); return NULL; }
    return buf;
}

static void reset_signals(void) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* The raw syscall also reaches the signals libc reserves (32, 33), which a runtime may have left
     * ignored; ignored dispositions would otherwise survive exec into every command. */
    struct { void *handler; unsigned long flags; void *restorer; uint64_t mask; } dfl = {0, 0, 0, 0};
    for (int sig = 1; sig < 65; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP) continue;
        syscall(SYS_rt_sigaction, sig, &dfl, NULL, sizeof dfl.mask);
    }
}

static int set_nonblock(int fd) {
    int flags = fcntl(fd, F_GETFL);
    return flags < 0 ? -1 : fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

/* ---------- exec ---------- */

struct exec_request {
    uint32_t flags;
    char *cmd;
    char **argv; /* argv[0] = cmd */
    char **envp;
    char *cwd;
};

#define EXEC_HAS_STDIN 1u

static int parse_exec(const unsigned char *payload, uint32_t len, struct exec_request *req) {
    struct cursor c = {payload, len, 0};
    req->flags = cur_u32(&c);
    uint32_t argc = cur_u32(&c);
    uint32_t envc = cur_u32(&c);
    if (c.bad || argc > 65536 || envc > 65536) return -1;
    req->cmd = cur_str(&c);
    req->argv = calloc((size_t)argc + 2, sizeof(char *));
    req->envp = calloc((size_t)envc + 1, sizeof(char *));
    if (!req->argv || !req->envp || c.bad) return -1;
    req->argv[0] = req->cmd;
    for (uint32_t i = 0; i < argc && !c.bad; i++) req->argv[i + 1] = cur_str(&c);
    for (uint32_t i = 0; i < envc && !c.bad; i++) req->envp[i] = cur_str(&c);
    req->cwd = cur_str(&c);
    if (c.bad || req->cmd[0] == 0) return -1;
    return 0;
}

/* Finds the executable the way execvp would, but on the *request's* PATH (the agent's own environment
 * is not the command's). Returns 0 and fills ``out``, or -1 with errno set. */
static int resolve_command(const char *cmd, char *const envp[], char *out, size_t out_len) {
    if (strchr(cmd, '/')) {
        if ((size_t)snprintf(out, out_len, "%s", cmd) >= out_len) { errno = ENAMETOOLONG; return -1; }
        return 0;
    }
    const char *path = "/usr/local/bin:/usr/bin:/bin";
    for (char *const *e = envp; *e; e++)
        if (!strncmp(*e, "PATH=", 5)) { path = *e + 5; break; }
    int saw_eacces = 0;
    for (const char *p = path;; p++) {
        const char *end = strchr(p, ':');
        size_t dir_len = end ? (size_t)(end - p) : strlen(p);
        int n = dir_len ? snprintf(out, out_len, "%.*s/%s", (int)dir_len, p, cmd) : snprintf(out, out_len, "%s", cmd);
        if (n > 0 && (size_t)n < out_len) {
            struct stat st;
            if (stat(out, &st) == 0 && S_ISREG(st.st_mode)) {
                if (access(out, X_OK) == 0) return 0;
                saw_eacces = 1;
            }
        }
        if (!end) break;
        p = end;
    }
    errno = saw_eacces ? EACCES : ENOENT;
    return -1;
}

/* Written by a vfork()ed child before it gives up (it shares our memory until exec or _exit). */
static volatile int spawn_errno, spawn_stage;
enum { STAGE_DUP2 = 1, STAGE_CHDIR = 2, STAGE_EXEC = 3 };

/* vfork: the handler is suspended until the child has exec'd, and no page tables are copied. The
 * child only makes system calls and writes the two shared ints above. */
static pid_t spawn_command(struct exec_request *req, const char *program, int in_fd, int out_fd, int err_fd) {
    const char *cwd = (req->cwd && req->cwd[0]) ? req->cwd : "/";
    spawn_errno = 0;
    spawn_stage = 0;
    pid_t pid = vfork();
    if (pid != 0) return pid;
    reset_signals();
    setsid();
    if (dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0) {
        spawn_errno = errno;
        spawn_stage = STAGE_DUP2;
        _exit(127);
    }
    if (chdir(cwd) < 0) {
        spawn_errno = errno;
        spawn_stage = STAGE_CHDIR;
        _exit(127);
    }
    execve(program, req->argv, req->envp);
    spawn_errno = errno;
    spawn_stage = STAGE_EXEC;
    _exit(127);
}

static int pidfd_open_compat(pid_t pid) {
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    errno = ENOSYS;
    return -1;
#endif
}

struct stdin_buffer {
    unsigned char *data;
    size_t len, off;
    int fd;        /* write end of the command's stdin pipe; -1 once closed */
    int eof_seen;  /* the client sent STDIN_EOF */
};

/* Reads one client frame while a command runs. Returns 0, or -1 when the client went away. */
static int handle_client_frame(int sock, struct stdin_buffer *in) {
    uint32_t len;
    int type = read_header(sock, &len);
    if (type < 0) return -1;
    if (type == FR_STDIN && len <= MAX_DATA_PAYLOAD) {
        unsigned char *buf = read_payload(sock, len, MAX_DATA_PAYLOAD);
        if (!buf) return -1;
        if (in->fd >= 0 && len > 0) {
            free(in->data);
            in->data = buf;
            in->len = len;
            in->off = 0;
        } else {
            free(buf); /* the command already closed its stdin: drop the bytes */
        }
        return 0;
    }
    if (type == FR_STDIN_EOF && len == 0) {
        in->eof_seen = 1;
        return 0;
    }
    return -1; /* anything else is a protocol violation: treat it as a hang-up */
}

static int forward_output(int sock, int *fd, uint8_t type, unsigned char *buf) {
    ssize_t n = read(*fd, buf, IO_CHUNK);
    if (n > 0) return send_frame(sock, type, buf, (uint32_t)n) < 0 ? -1 : 1;
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 1;
    close(*fd);
    *fd = -1;
    return 0;
}

static void kill_group(pid_t pid) {
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
}

static int handle_exec(int sock, const unsigned char *payload, uint32_t len) {
    struct exec_request req;
    memset(&req, 0, sizeof req);
    if (parse_exec(payload, len, &req) < 0) return send_error(sock, E_PROTOCOL, "malformed exec request");

    char program[PATH_MAX];
    if (resolve_command(req.cmd, req.envp, program, sizeof program) < 0)
        return send_error(sock, E_SPAWN, "%s: %s", req.cmd, strerror(errno));
    int out[2], err[2], in[2] = {-1, -1};
    if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0)
        return send_error(sock, E_SPAWN, "pipe: %s", strerror(errno));
    int has_stdin = (req.flags & EXEC_HAS_STDIN) != 0;
    if (has_stdin) {
        if (pipe2(in, O_CLOEXEC) < 0) return send_error(sock, E_SPAWN, "pipe: %s", strerror(errno));
    } else {
        in[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (in[0] < 0) return send_error(sock, E_SPAWN, "/dev/null: %s", strerror(errno));
    }
    pid_t pid = spawn_command(&req, program, in[0], out[1], err[1]);
    close(in[0]);
    close(out[1]);
    close(err[1]);
    if (pid < 0) return send_error(sock, E_SPAWN, "fork: %s", strerror(errno));
    if (spawn_stage) {
        waitpid(pid, NULL, 0);
        if (spawn_stage == STAGE_CHDIR) return send_error(sock, E_SPAWN, "chdir %s: %s", req.cwd, strerror(spawn_errno));
        if (spawn_stage == STAGE_DUP2) return send_error(sock, E_SPAWN, "dup2: %s", strerror(spawn_errno));
        return send_error(sock, E_SPAWN, "%s: %s", req.cmd, strerror(spawn_errno));
    }

    int pidfd = pidfd_open_compat(pid);
    fcntl(out[0], F_SETFL, O_NONBLOCK); /* read ends: their flags are known to be plain O_RDONLY */
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    struct stdin_buffer sin = {NULL, 0, 0, has_stdin ? in[1] : -1, !has_stdin};
    if (sin.fd >= 0) set_nonblock(sin.fd);
    int out_fd = out[0], err_fd = err[0];
    unsigned char *buf = malloc(IO_CHUNK);
    int status = 0, exited = 0, client_gone = 0;
    int64_t drain_deadline = 0;

    while (!client_gone) {
        if (exited && out_fd < 0 && err_fd < 0) break;
        if (exited && mono_ms() >= drain_deadline) break; /* a background job holds the pipes open */
        struct pollfd pfd[5];
        int nfds = 0, i_sock = -1, i_out = -1, i_err = -1, i_in = -1, i_pid = -1;
        short sock_events = POLLRDHUP;
        if (!sin.eof_seen && sin.off >= sin.len) sock_events |= POLLIN;
        pfd[nfds] = (struct pollfd){sock, sock_events, 0}; i_sock = nfds++;
        if (out_fd >= 0) { pfd[nfds] = (struct pollfd){out_fd, POLLIN, 0}; i_out = nfds++; }
        if (err_fd >= 0) { pfd[nfds] = (struct pollfd){err_fd, POLLIN, 0}; i_err = nfds++; }
        if (sin.fd >= 0 && sin.off < sin.len) { pfd[nfds] = (struct pollfd){sin.fd, POLLOUT, 0}; i_in = nfds++; }
        if (!exited && pidfd >= 0) { pfd[nfds] = (struct pollfd){pidfd, POLLIN, 0}; i_pid = nfds++; }
        int timeout = -1;
        if (exited) timeout = (int)(drain_deadline - mono_ms());
        else if (pidfd < 0) timeout = 20; /* no pidfd: poll waitpid */
        if (timeout < 0 && exited) timeout = 0;
        int r = poll(pfd, (nfds_t)nfds, timeout);
        if (r < 0 && errno != EINTR) break;
        if (r > 0) {
            if (pfd[i_sock].revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) {
                if ((pfd[i_sock].revents & POLLIN) && !(pfd[i_sock].revents & (POLLRDHUP | POLLHUP))) {
                    if (handle_client_frame(sock, &sin) < 0) client_gone = 1;
                } else if (!exited) {
                    client_gone = 1;
                } else {
                    break;
                }
            }
            if (i_out >= 0 && (pfd[i_out].revents & (POLLIN | POLLHUP)))
                if (forward_output(sock, &out_fd, FR_STDOUT, buf) < 0) client_gone = 1;
            if (i_err >= 0 && (pfd[i_err].revents & (POLLIN | POLLHUP)))
                if (forward_output(sock, &err_fd, FR_STDERR, buf) < 0) client_gone = 1;
            if (i_in >= 0 && (pfd[i_in].revents & (POLLOUT | POLLERR | POLLHUP))) {
                ssize_t w = write(sin.fd, sin.data + sin.off, sin.len - sin.off);
                if (w > 0) sin.off += (size_t)w;
                else if (w < 0 && errno != EAGAIN && errno != EINTR) { /* EPIPE: reader gone */
                    close(sin.fd);
                    sin.fd = -1;
                    sin.off = sin.len;
                }
            }
        }
        if (sin.fd >= 0 && sin.eof_seen && sin.off >= sin.len) {
            close(sin.fd);
            sin.fd = -1;
        }
        if (!exited && (i_pid < 0 || (r > 0 && (pfd[i_pid].revents & POLLIN)))) {
            pid_t w = waitpid(pid, &status, WNOHANG);
            if (w == pid) {
                exited = 1;
                drain_deadline = mono_ms() + DRAIN_AFTER_EXIT_MS;
            }
        }
    }
    free(buf);
    free(sin.data);
    if (sin.fd >= 0) close(sin.fd);
    if (out_fd >= 0) close(out_fd);
    if (err_fd >= 0) close(err_fd);
    if (pidfd >= 0) close(pidfd);
    if (client_gone && !exited) {
        kill_group(pid);
        waitpid(pid, NULL, 0);
        return -1;
    }
    if (!exited) {
        waitpid(pid, &status, 0);
    }
    unsigned char reply[8];
    int32_t code = 0, sig = 0;
    if (WIFEXITED(status)) code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status)) { sig = WTERMSIG(status); code = 128 + sig; }
    put_u32(reply, (uint32_t)code);
    put_u32(reply + 4, (uint32_t)sig);
    return send_frame(sock, FR_EXIT, reply, sizeof reply);
}

/* ---------- files ---------- */

static int check_path(int sock, const char *path) {
    if (path[0] != '/') { send_error(sock, E_BAD_PATH, "path must be absolute"); return -1; }
    if (strlen(path) >= PATH_MAX) { send_error(sock, E_BAD_PATH, "path too long"); return -1; }
    return 0;
}

static int handle_write(int sock, const unsigned char *payload, uint32_t len) {
    struct cursor c = {payload, len, 0};
    char *path = cur_str(&c);
    if (c.bad) return send_error(sock, E_BAD_PATH, "malformed path");
    if (check_path(sock, path) < 0) return -1;

    char target[PATH_MAX];
    struct stat st;
    int exists = 0;
    snprintf(target, sizeof target, "%s", path);
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
        /* write through a symlink to its target, like `>` in a shell would */
        if (realpath(path, target) == NULL) snprintf(target, sizeof target, "%s", path);
    }
    if (stat(target, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return send_error(sock, E_IS_DIRECTORY, "%s is a directory", path);
        if (!S_ISREG(st.st_mode)) return send_error(sock, E_BAD_PATH, "%s is not a regular file", path);
        exists = 1;
    }
    size_t tlen = strlen(target);
    if (target[tlen - 1] == '/') return send_error(sock, E_BAD_PATH, "%s names a directory", path);
    char dir[PATH_MAX];
    memcpy(dir, target, tlen + 1);
    char *slash = strrchr(dir, '/');
    if (slash == dir) dir[1] = 0; else *slash = 0;
    struct stat dst;
    if (stat(dir, &dst) < 0 || !S_ISDIR(dst.st_mode))
        return send_error(sock, E_PARENT_NOT_FOUND, "parent directory of %s does not exist", path);

    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s/.paddock-upload-XXXXXX", strcmp(dir, "/") ? dir : "");
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) return send_error(sock, E_IO, "create temp file in %s: %s", dir, strerror(errno));
    fchmod(fd, exists ? (st.st_mode & 07777) : 0644);
    if (exists) (void)!fchown(fd, st.st_uid, st.st_gid);
    if (send_frame(sock, FR_OK, NULL, 0) < 0) goto gone;

    unsigned char *buf = malloc(MAX_DATA_PAYLOAD);
    uint64_t size = 0;
    int write_errno = 0;
    for (;;) {
        uint32_t flen;
        int type = read_header(sock, &flen);
        if (type == FR_DATA_END && flen == 0) break;
        if (type != FR_DATA || flen > MAX_DATA_PAYLOAD || read_all(sock, buf, flen) < 0) {
            free(buf);
            goto gone;
        }
        if (write_errno) continue;
        size_t off = 0;
        while (off < flen) {
            ssize_t w = write(fd, buf + off, flen - off);
            if (w < 0) {
                if (errno == EINTR) continue;
                write_errno = errno;
                break;
            }
            off += (size_t)w;
        }
        size += flen;
        touch_activity();
    }
    free(buf);
    if (write_errno) {
        close(fd);
        unlink(tmp);
        return send_error(sock, E_IO, "write %s: %s", path, strerror(write_errno));
    }
    if (close(fd) < 0) {
        int e = errno;
        unlink(tmp);
        return send_error(sock, E_IO, "write %s: %s", path, strerror(e));
    }
    if (rename(tmp, target) < 0) {
        int e = errno;
        unlink(tmp);
        if (e == EISDIR) return send_error(sock, E_IS_DIRECTORY, "%s is a directory", path);
        return send_error(sock, E_IO, "rename to %s: %s", path, strerror(e));
    }
    unsigned char reply[8];
    put_u64(reply, size);
    return send_frame(sock, FR_OK, reply, sizeof reply);
gone:
    close(fd);
    unlink(tmp);
    return -1;
}

static int handle_read(int sock, const unsigned char *payload, uint32_t len) {
    struct cursor c = {payload, len, 0};
    char *path = cur_str(&c);
    if (c.bad) return send_error(sock, E_BAD_PATH, "malformed path");
    if (check_path(sock, path) < 0) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR) return send_error(sock, E_FILE_NOT_FOUND, "%s not found", path);
        if (errno == EISDIR) return send_error(sock, E_IS_DIRECTORY, "%s is a directory", path);
        return send_error(sock, E_IO, "open %s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) < 0) { close(fd); return send_error(sock, E_IO, "stat %s: %s", path, strerror(errno)); }
    if (S_ISDIR(st.st_mode)) { close(fd); return send_error(sock, E_IS_DIRECTORY, "%s is a directory", path); }
    if (!S_ISREG(st.st_mode)) { close(fd); return send_error(sock, E_BAD_PATH, "%s is not a regular file", path); }
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    /* A regular file with st_size 0 may still have content (/proc, /sys): stream it with unknown size.
     * Otherwise send exactly st_size bytes, so the host's Content-Length is honest even if the file
     * changes while it is read. */
    uint64_t size = st.st_size > 0 ? (uint64_t)st.st_size : UINT64_MAX;
    unsigned char sz[8];
    put_u64(sz, size);
    if (send_frame(sock, FR_SIZE, sz, sizeof sz) < 0) { close(fd); return -1; }
    unsigned char *buf = malloc(IO_CHUNK);
    uint64_t sent = 0;
    for (;;) {
        size_t want = IO_CHUNK;
        if (size != UINT64_MAX) {
            if (sent >= size) break;
            if (size - sent < want) want = (size_t)(size - sent);
        }
        ssize_t n = read(fd, buf, want);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            free(buf);
            close(fd);
            return send_error(sock, E_IO, "read %s: %s", path, strerror(errno));
        }
        if (n == 0) {
            if (size == UINT64_MAX) break;
            memset(buf, 0, want); /* the file shrank while being read: pad to the announced size */
            n = (ssize_t)want;
        }
        if (send_frame(sock, FR_DATA, buf, (uint32_t)n) < 0) { free(buf); close(fd); return -1; }
        sent += (uint64_t)n;
        touch_activity();
    }
    free(buf);
    close(fd);
    return send_frame(sock, FR_DATA_END, NULL, 0);
}

/* ---------- connection handler and PID 1 loop ---------- */

static void handle_connection(int sock) {
    uint32_t len;
    int type = read_header(sock, &len);
    if (type < 0) return;
    unsigned char *payload = read_payload(sock, len, MAX_CONTROL_PAYLOAD);
    if (!payload) {
        send_error(sock, E_PROTOCOL, "request too large or truncated");
        return;
    }
    if (type == FR_INFO) {
        unsigned char reply[16];
        put_u64(reply, (uint64_t)shared->last_activity_ms);
        put_u32(reply + 8, (uint32_t)shared->active);
        put_u32(reply + 12, PROTOCOL_VERSION);
        send_frame(sock, FR_INFO_REPLY, reply, sizeof reply);
        return;
    }
    __sync_fetch_and_add(&shared->active, 1);
    touch_activity();
    switch (type) {
    case FR_EXEC: handle_exec(sock, payload, len); break;
    case FR_WRITE: handle_write(sock, payload, len); break;
    case FR_READ: handle_read(sock, payload, len); break;
    default: send_error(sock, E_PROTOCOL, "unknown request type %d", type); break;
    }
    touch_activity();
    __sync_fetch_and_sub(&shared->active, 1);
}

static int listen_on(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof addr.sun_path) { fprintf(stderr, "socket path too long\n"); exit(2); }
    strcpy(addr.sun_path, path);
    unlink(path);
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(fd, 128) < 0) {
        perror("listen");
        exit(2);
    }
    return fd;
}

int main(int argc, char **argv) {
    int listen_fd = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--fd") && i + 1 < argc) listen_fd = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--listen") && i + 1 < argc) listen_fd = listen_on(argv[++i]);
        else if (!strcmp(argv[i], "--version")) { printf("paddock-guest %u\n", PROTOCOL_VERSION); return 0; }
    }
    if (listen_fd < 0) {
        fprintf(stderr, "usage: paddock-guest --fd N | --listen PATH\n");
        return 2;
    }
    fcntl(listen_fd, F_SETFD, FD_CLOEXEC);
    for (;;) { /* keep fds 0-2 taken, so pipes never land there and dup2 never no-ops */
        int fd = open("/dev/null", O_RDWR);
        if (fd < 0 || fd > 2) { if (fd > 2) close(fd); break; }
    }
    if (getpid() != 1) prctl(PR_SET_CHILD_SUBREAPER, 1); /* reap orphans outside a pid namespace too */

    shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) { perror("mmap"); return 1; }
    shared->last_activity_ms = now_ms();
    shared->active = 0;

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    signal(SIGPIPE, SIG_IGN);
    int notify[2];
    if (pipe2(notify, O_CLOEXEC) < 0) { perror("pipe"); return 1; }
    fcntl(notify[0], F_SETFL, O_NONBLOCK);

    /* Pre-forked handlers wait in accept(), so a request never waits for a fork: a handler that
     * accepted tells PID 1 (its pid on the notify pipe), and PID 1 forks its replacement. */
    pid_t idle[SPARE_HANDLERS] = {0};
    for (;;) {
        for (int i = 0; i < SPARE_HANDLERS; i++) {
            if (idle[i] > 0) continue;
            pid_t parent = getpid();
            pid_t pid = fork();
            if (pid == 0) {
                prctl(PR_SET_PDEATHSIG, SIGKILL); /* no handler outlives the agent */
                if (getppid() != parent) _exit(0);
                close(sfd);
                close(notify[0]);
                sigprocmask(SIG_UNBLOCK, &mask, NULL);
                int conn;
                do conn = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC); while (conn < 0 && errno == EINTR);
                pid_t me = getpid();
                (void)!write(notify[1], &me, sizeof me);
                close(notify[1]);
                close(listen_fd);
                if (conn >= 0) {
                    handle_connection(conn);
                    shutdown(conn, SHUT_RDWR);
                }
                _exit(0);
            }
            if (pid > 0) idle[i] = pid;
            else usleep(10000); /* out of processes: retry later */
        }
        struct pollfd pfd[2] = {{notify[0], POLLIN, 0}, {sfd, POLLIN, 0}};
        if (poll(pfd, 2, -1) < 0 && errno != EINTR) continue;
        if (pfd[0].revents & POLLIN) {
            pid_t busy;
            while (read(notify[0], &busy, sizeof busy) == sizeof busy)
                for (int i = 0; i < SPARE_HANDLERS; i++)
                    if (idle[i] == busy) idle[i] = 0;
        }
        if (pfd[1].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == sizeof si) {
                if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) return 0;
            }
            pid_t gone;
            int idle_died = 0;
            while ((gone = waitpid(-1, NULL, WNOHANG)) > 0)
                for (int i = 0; i < SPARE_HANDLERS; i++)
                    if (idle[i] == gone) { idle[i] = 0; idle_died = 1; }
            if (idle_died) usleep(1000); /* an idle handler died without a request: do not spin */
        }
    }
}
