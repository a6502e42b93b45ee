/*
 * Managed processes (spec 12.2): long-lived commands, with or without a PTY, that outlive the
 * connection that started them.
 *
 * One process manager per sandbox, forked by PID 1 at start, owns them all. A connection handler that
 * reads a PROC frame type (peeked, not consumed) passes the connection itself to the manager over a
 * datagram socketpair (SCM_RIGHTS) and exits; the manager then reads the request and answers on that
 * connection. So a connect stream, an input request and a resize for the same process meet in one
 * single-threaded event loop, and no handler has to live as long as a process.
 *
 * Each process keeps its output in a bounded ring of chunks (PROC_RING_BYTES); every chunk has a
 * sequence number (from 1), so a client that went away reconnects with `after` and gets what it
 * missed. A connection that hangs up never touches the process.
 *
 *   request  FR_PROC  u32 op, then per op (strings are u32 length + bytes)
 *     START       u32 flags, u32 rows, u32 cols, u32 argc, u32 envc, cmd, args.., env.., cwd
 *                 flags: 1 a PTY; 2 stream: this connection is the process's stream from its first byte
 *                 (its reply says "streaming":true, output and exit follow as after a CONNECT from 0);
 *                 4 stdin closed at the start (as STDIN_CLOSE). A guest from before 2 and 4 ignores them.
 *     START_AS    user (a name or uid of the sandbox's /etc/passwd), then START's fields (user.c)
 *     LIST        -
 *     GET         id                       STDIN_CLOSE id
 *     KILL        id, u32 grace_ms         RESIZE      id, u32 rows, u32 cols
 *     INPUT       id, bytes                SIGNAL      id, u32 signo
 *     WAIT        id, u32 scope (0 leader, 1 tree), u32 timeout_ms
 *     CONNECT     id, u64 after
 *   reply    FR_PROC_REPLY JSON (the process, {"processes": [...]}, {"input_seq": n} or {"ok": true}),
 *            or FR_ERROR (E_PROC_NOT_FOUND, E_PROC_STATE, E_SPAWN, E_USER, E_PROTOCOL)
 *   CONNECT  FR_PROC_REPLY (the process), then FR_PROC_OUTPUT u64 seq, u32 stream, bytes ...,
 *            and FR_PROC_EXIT i32 code, i32 signal once the leader has exited and its output drained.
 */
#include "guest.h"

#include <dirent.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <termios.h>

#define MAX_PROCS 64
#define MAX_CLIENTS 128
#define PROC_RING_BYTES (1u << 20)
#define CLIENT_BACKLOG_MAX (16u << 20) /* a subscriber further behind than this is dropped; it reconnects */
#define INPUT_PENDING_MAX (1u << 20)
#define TREE_CHECK_MS 100
#define START_PTY 1u
#define START_STREAM 2u      /* subscribe the starting connection before any output is read */
#define START_CLOSE_STDIN 4u /* stdin's close, which a stream's connection can no longer send */

enum { ST_RUNNING = 1, ST_TERMINATING = 2, ST_EXITED = 3 };
enum { OUT_STDOUT = 1, OUT_STDERR = 2, OUT_PTY = 3 };

struct chunk {
    struct chunk *next;
    uint64_t seq;
    uint32_t stream, len;
    unsigned char data[];
};

struct proc {
    int used;
    char id[40];
    int pty;
    pid_t pid;
    int out_fd, err_fd, in_fd; /* pty: out_fd == in_fd == the master */
    int state, leader_exited, tree_exited, exit_announced;
    int exit_code, signo;
    int64_t created_ms, finished_ms, kill_at_ms, drain_until_ms;
    char *cmd, *cwd;
    char **args;
    uint32_t argc, rows, cols;
    struct chunk *head, *tail;
    uint64_t next_seq, input_seq;
    size_t ring_bytes;
    unsigned char *pending;
    size_t pending_len;
    int stdin_close_pending;
};

struct client {
    int fd;
    unsigned char *rbuf;
    size_t rlen;
    unsigned char *wbuf;
    size_t wlen, woff;
    int sub;  /* subscribed to procs[sub - 1]'s output */
    int wait; /* waiting on procs[wait - 1] */
    int wait_tree;
    int64_t wait_deadline_ms;
    int close_when_flushed;
};

static struct proc procs[MAX_PROCS];
static struct client clients[MAX_CLIENTS];

/* ---------- a growable byte buffer, used for JSON and for client write queues ---------- */

struct sbuf {
    char *p;
    size_t len, cap;
};

static void sb_put(struct sbuf *b, const void *data, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void sb_json_str(struct sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') { sb_put(b, "\\", 1); sb_put(b, p, 1); }
        else if (*p < 0x20) sb_printf(b, "\\u%04x", *p);
        else sb_put(b, p, 1);
    }
    sb_put(b, "\"", 1);
}

/* ---------- process inspection: sessions (the "tree") and the PTY's foreground job ---------- */

/* Calls fn(pid) for every live process in session `sid` (zombies excluded); returns how many. */
static int for_each_in_session(pid_t sid, int sig) {
    DIR *dir = opendir("/proc");
    if (!dir) return 0;
    int count = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", de->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0) continue;
        buf[n] = 0;
        char *rp = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
        if (!rp) continue;
        char state;
        int ppid, pgrp, session;
        if (sscanf(rp + 1, " %c %d %d %d", &state, &ppid, &pgrp, &session) != 4) continue;
        if (session != sid || state == 'Z' || state == 'X') continue;
        count++;
        if (sig) kill(atoi(de->d_name), sig);
    }
    closedir(dir);
    return count;
}

static void signal_tree(struct proc *p, int sig) {
    kill(-p->pid, sig);
    for_each_in_session(p->pid, sig);
}

static void sb_cmdline(struct sbuf *b, pid_t pid) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0) close(fd);
    if (n < 0) n = 0;
    buf[n] = 0;
    sb_json_str(b, buf);
    sb_put(b, ",\"args\":[", 9);
    size_t off = strlen(buf) + 1;
    for (int first = 1; off < (size_t)n; first = 0) {
        if (!first) sb_put(b, ",", 1);
        sb_json_str(b, buf + off);
        off += strlen(buf + off) + 1;
    }
    sb_put(b, "]", 1);
}

static const char *state_name(const struct proc *p) {
    switch (p->state) {
    case ST_TERMINATING: return "terminating";
    case ST_EXITED: return "exited";
    default: return "running";
    }
}

static void sb_proc(struct sbuf *b, struct proc *p) {
    sb_put(b, "{\"process_id\":", 14);
    sb_json_str(b, p->id);
    sb_printf(b, ",\"kind\":\"%s\",\"pid\":%d,\"state\":\"%s\",\"leader_exited\":%s,\"tree_exited\":%s",
              p->pty ? "pty" : "process", (int)p->pid, state_name(p), p->leader_exited ? "true" : "false",
              p->tree_exited ? "true" : "false");
    sb_printf(b, ",\"created_at_ms\":%lld", (long long)p->created_ms);
    if (p->leader_exited)
        sb_printf(b, ",\"finished_at_ms\":%lld,\"exit_code\":%d,\"signal_number\":%d", (long long)p->finished_ms,
                  p->exit_code, p->signo);
    sb_put(b, ",\"cmd\":", 7);
    sb_json_str(b, p->cmd);
    sb_put(b, ",\"args\":[", 9);
    for (uint32_t i = 0; i < p->argc; i++) {
        if (i) sb_put(b, ",", 1);
        sb_json_str(b, p->args[i]);
    }
    sb_put(b, "],\"cwd\":", 8);
    sb_json_str(b, p->cwd);
    if (p->pty) sb_printf(b, ",\"rows\":%u,\"cols\":%u", p->rows, p->cols);
    if (p->pty && !p->leader_exited && p->out_fd >= 0) {
        pid_t fg = tcgetpgrp(p->out_fd);
        if (fg > 0) {
            sb_printf(b, ",\"foreground\":{\"pid\":%d,\"cmd\":", (int)fg);
            sb_cmdline(b, fg);
            sb_put(b, "}", 1);
        }
    }
    sb_printf(b, ",\"output\":{\"oldest_seq\":%llu,\"newest_seq\":%llu,\"bytes\":%zu}}",
              (unsigned long long)(p->head ? p->head->seq : 0), (unsigned long long)(p->tail ? p->tail->seq : 0),
              p->ring_bytes);
}

/* ---------- client write queues ---------- */

static void client_queue(struct client *c, uint8_t type, const void *a, size_t alen, const void *b, size_t blen) {
    if (c->wlen - c->woff + alen + blen > CLIENT_BACKLOG_MAX) { /* too far behind: hang up, it can reconnect */
        c->close_when_flushed = 1;
        c->wlen = c->woff = 0;
        shutdown(c->fd, SHUT_RDWR);
        return;
    }
    size_t need = c->wlen + 5 + alen + blen;
    if (c->woff > 0 && c->woff == c->wlen) c->wlen = c->woff = 0, need = 5 + alen + blen;
    unsigned char *w = realloc(c->wbuf, need);
    if (!w) return;
    c->wbuf = w;
    unsigned char *p = w + c->wlen;
    p[0] = type;
    put_u32(p + 1, (uint32_t)(alen + blen));
    if (alen) memcpy(p + 5, a, alen);
    if (blen) memcpy(p + 5 + alen, b, blen);
    c->wlen = need;
}

static void client_json(struct client *c, struct sbuf *b) {
    client_queue(c, FR_PROC_REPLY, b->p, b->len, NULL, 0);
    free(b->p);
    memset(b, 0, sizeof *b);
}

static void client_error(struct client *c, uint32_t code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void client_error(struct client *c, uint32_t code, const char *fmt, ...) {
    char msg[512];
    unsigned char head[4];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof msg) n = sizeof msg - 1;
    put_u32(head, code);
    client_queue(c, FR_ERROR, head, 4, msg, (size_t)n);
}

static void client_reply_proc(struct client *c, struct proc *p) {
    struct sbuf b = {0};
    sb_proc(&b, p);
    client_json(c, &b);
}

static void client_drop(struct client *c) {
    close(c->fd);
    free(c->rbuf);
    free(c->wbuf);
    memset(c, 0, sizeof *c);
    c->fd = -1;
}

static void send_output(struct client *c, const struct chunk *ch) {
    unsigned char head[12];
    put_u64(head, ch->seq);
    put_u32(head + 8, ch->stream);
    client_queue(c, FR_PROC_OUTPUT, head, sizeof head, ch->data, ch->len);
}

static void send_exit(struct client *c, const struct proc *p) {
    unsigned char body[8];
    put_u32(body, (uint32_t)p->exit_code);
    put_u32(body + 4, (uint32_t)p->signo);
    client_queue(c, FR_PROC_EXIT, body, sizeof body, NULL, 0);
    c->sub = 0;
    c->close_when_flushed = 1; /* the stream closes after its exit frame */
}

/* ---------- the output ring ---------- */

static void ring_append(struct proc *p, uint32_t stream, const unsigned char *data, size_t len) {
    struct chunk *ch = malloc(sizeof *ch + len);
    if (!ch) return;
    ch->next = NULL;
    ch->seq = p->next_seq++;
    ch->stream = stream;
    ch->len = (uint32_t)len;
    memcpy(ch->data, data, len);
    if (p->tail) p->tail->next = ch;
    else p->head = ch;
    p->tail = ch;
    p->ring_bytes += len;
    while (p->ring_bytes > PROC_RING_BYTES && p->head != p->tail) { /* keep at least the newest chunk */
        struct chunk *old = p->head;
        p->head = old->next;
        p->ring_bytes -= old->len;
        free(old);
    }
    int idx = (int)(p - procs) + 1;
    for (int i = 0; i < MAX_CLIENTS; i++)
        if (clients[i].fd >= 0 && clients[i].sub == idx) send_output(&clients[i], ch);
    touch_activity();
}

static void proc_free(struct proc *p) {
    int idx = (int)(p - procs) + 1;
    for (int i = 0; i < MAX_CLIENTS; i++)
        if (clients[i].fd >= 0 && (clients[i].sub == idx || clients[i].wait == idx)) client_drop(&clients[i]);
    for (struct chunk *ch = p->head, *next; ch; ch = next) {
        next = ch->next;
        free(ch);
    }
    if (p->out_fd >= 0) close(p->out_fd);
    if (p->err_fd >= 0) close(p->err_fd);
    if (p->in_fd >= 0 && p->in_fd != p->out_fd) close(p->in_fd);
    for (uint32_t i = 0; i < p->argc; i++) free(p->args[i]);
    free(p->args);
    free(p->cmd);
    free(p->cwd);
    free(p->pending);
    memset(p, 0, sizeof *p);
}

static void write_input(struct proc *p);

/* The end of a process's input: EOF once what is pending is written, or a terminal's EOF character. */
static void close_stdin(struct proc *p) {
    if (p->pty) { /* a terminal has no end of input to close: send its EOF character instead */
        if (p->in_fd >= 0 && !p->leader_exited) {
            unsigned char *grown = realloc(p->pending, p->pending_len + 1);
            if (grown) { p->pending = grown; p->pending[p->pending_len++] = 4; }
        }
    } else {
        p->stdin_close_pending = 1;
    }
}

/* ---------- requests ---------- */

static struct proc *find_proc(struct client *c, struct cursor *cur) {
    char *id = cur_str(cur);
    if (cur->bad || !id) {
        free(id);
        client_error(c, E_PROTOCOL, "malformed process request");
        return NULL;
    }
    for (int i = 0; i < MAX_PROCS; i++)
        if (procs[i].used && !strcmp(procs[i].id, id)) {
            free(id);
            return &procs[i];
        }
    client_error(c, E_PROC_NOT_FOUND, "process %s not found", id);
    free(id);
    return NULL;
}

static struct proc *free_slot(void) {
    struct proc *oldest = NULL;
    for (int i = 0; i < MAX_PROCS; i++) {
        if (!procs[i].used) return &procs[i];
        if (procs[i].tree_exited && procs[i].exit_announced && (!oldest || procs[i].finished_ms < oldest->finished_ms))
            oldest = &procs[i];
    }
    if (oldest) proc_free(oldest); /* forget the longest-finished process to make room */
    return oldest;
}

static void set_winsize(int fd, uint32_t rows, uint32_t cols) {
    struct winsize ws = {(unsigned short)rows, (unsigned short)cols, 0, 0};
    ioctl(fd, TIOCSWINSZ, &ws);
}

static struct run_as start_as; /* the manager is single-threaded: one START at a time */

static void op_start(struct client *c, struct cursor *cur, int as_user) {
    char *user = as_user ? cur_str(cur) : NULL;
    if (as_user && (cur->bad || !user[0] || strlen(user) > RUN_AS_MAX_NAME)) {
        client_error(c, E_PROTOCOL, "malformed start request");
        free(user);
        return;
    }
    uint32_t flags = cur_u32(cur), rows = cur_u32(cur), cols = cur_u32(cur);
    uint32_t argc = cur_u32(cur), envc = cur_u32(cur);
    if (cur->bad || argc > 65536 || envc > 65536 || rows > 65535 || cols > 65535) {
        client_error(c, E_PROTOCOL, "malformed start request");
        free(user);
        return;
    }
    char *cmd = cur_str(cur);
    char **argv = calloc((size_t)argc + 2, sizeof(char *));
    char **envp = calloc((size_t)envc + 1, sizeof(char *));
    argv[0] = cmd;
    for (uint32_t i = 0; i < argc && !cur->bad; i++) argv[i + 1] = cur_str(cur);
    for (uint32_t i = 0; i < envc && !cur->bad; i++) envp[i] = cur_str(cur);
    char *cwd = cur_str(cur);
    char program[PATH_MAX];
    struct proc *p = NULL;
    int master = -1, out[2] = {-1, -1}, err[2] = {-1, -1}, in[2] = {-1, -1}, report[2] = {-1, -1};
    char slave_path[128] = "";
    if (cur->bad || !cmd || !cmd[0] || !cwd) {
        client_error(c, E_PROTOCOL, "malformed start request");
        goto done;
    }
    if (user) {
        char why[512];
        if (resolve_user(user, &start_as, why, sizeof why) < 0) {
            client_error(c, E_USER, "%s", why);
            goto done;
        }
        if (user_env(&envp, &envc, &start_as) < 0) {
            client_error(c, E_SPAWN, "out of memory");
            goto done;
        }
    }
    if (resolve_command(cmd, envp, program, sizeof program) < 0) {
        client_error(c, E_SPAWN, "%s: %s", cmd, strerror(errno));
        goto done;
    }
    p = free_slot();
    if (!p) {
        client_error(c, E_PROC_STATE, "too many processes (%d running or unread)", MAX_PROCS);
        goto done;
    }
    int is_pty = (flags & START_PTY) != 0;
    if (is_pty) {
        master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (master < 0 || grantpt(master) < 0 || unlockpt(master) < 0 ||
            ptsname_r(master, slave_path, sizeof slave_path) != 0) {
            client_error(c, E_SPAWN, "pty: %s", strerror(errno));
            p = NULL;
            goto done;
        }
        set_winsize(master, rows ? rows : 24, cols ? cols : 80);
    } else if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 || pipe2(in, O_CLOEXEC) < 0) {
        client_error(c, E_SPAWN, "pipe: %s", strerror(errno));
        p = NULL;
        goto done;
    }
    if (pipe2(report, O_CLOEXEC) < 0) {
        client_error(c, E_SPAWN, "pipe: %s", strerror(errno));
        p = NULL;
        goto done;
    }
    pid_t pid = fork();
    if (pid == 0) {
        int stage = 0;
        reset_signals();
        setsid();
        if (is_pty) {
            /* O_NOCTTY, then TIOCSCTTY: the terminal becomes the session's controlling tty by the ioctl
             * alone. Without O_NOCTTY the open already makes it so, and gVisor (unlike Linux) then fails
             * the ioctl with EINVAL ("already has a controlling terminal"): every PTY process failed to
             * start there with "Invalid argument". */
            int slave = open(slave_path, O_RDWR | O_NOCTTY);
            if (slave < 0 || ioctl(slave, TIOCSCTTY, 0) < 0) stage = 1;
            if (!stage && (dup2(slave, 0) < 0 || dup2(slave, 1) < 0 || dup2(slave, 2) < 0)) stage = 1;
            if (slave > 2) close(slave);
        } else if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || dup2(err[1], 2) < 0) {
            stage = 1;
        }
        if (!stage && user && apply_user(&start_as) < 0) stage = 4;
        /* No directory asked for: a user's own home (or / when it cannot enter it), root's /. */
        if (!stage && !cwd[0] && user && chdir(start_as.home) == 0) {
        } else if (!stage && chdir(cwd[0] ? cwd : "/") < 0) {
            stage = 2;
        }
        if (!stage) {
            execve(program, argv, envp);
            stage = 3;
        }
        int report_body[2] = {stage, errno};
        (void)!write(report[1], report_body, sizeof report_body);
        _exit(127);
    }
    close(report[1]);
    report[1] = -1;
    if (pid < 0) {
        client_error(c, E_SPAWN, "fork: %s", strerror(errno));
        p = NULL;
        goto done;
    }
    int report_body[2];
    ssize_t got;
    do got = read(report[0], report_body, sizeof report_body); while (got < 0 && errno == EINTR);
    if (got == (ssize_t)sizeof report_body) { /* exec failed: the child exits 127 and PID 1 never sees it */
        waitpid(pid, NULL, 0);
        if (report_body[0] == 2) client_error(c, E_SPAWN, "chdir %s: %s", cwd, strerror(report_body[1]));
        else if (report_body[0] == 4) client_error(c, E_SPAWN, "becoming user %s: %s", user, strerror(report_body[1]));
        else client_error(c, E_SPAWN, "%s: %s", cmd, strerror(report_body[1]));
        p = NULL;
        goto done;
    }
    memset(p, 0, sizeof *p);
    p->used = 1;
    unsigned char rnd[8] = {0};
    int ufd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (ufd >= 0) { (void)!read(ufd, rnd, sizeof rnd); close(ufd); }
    snprintf(p->id, sizeof p->id, "proc_%02x%02x%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2], rnd[3], rnd[4],
             rnd[5], rnd[6], rnd[7]);
    p->pty = is_pty;
    p->pid = pid;
    p->state = ST_RUNNING;
    p->created_ms = now_ms();
    p->next_seq = 1;
    p->rows = rows ? rows : 24;
    p->cols = cols ? cols : 80;
    p->cmd = cmd;
    p->cwd = cwd;
    p->argc = argc;
    p->args = calloc(argc ? argc : 1, sizeof(char *));
    for (uint32_t i = 0; i < argc; i++) p->args[i] = argv[i + 1];
    if (is_pty) {
        p->out_fd = p->in_fd = master;
        p->err_fd = -1;
        master = -1;
    } else {
        p->out_fd = out[0];
        p->err_fd = err[0];
        p->in_fd = in[1];
        out[0] = err[0] = in[1] = -1;
    }
    fcntl(p->out_fd, F_SETFL, fcntl(p->out_fd, F_GETFL) | O_NONBLOCK);
    if (p->err_fd >= 0) fcntl(p->err_fd, F_SETFL, O_NONBLOCK);
    if (p->in_fd != p->out_fd) fcntl(p->in_fd, F_SETFL, O_NONBLOCK | O_WRONLY);
    if (flags & START_CLOSE_STDIN) close_stdin(p);
    if (flags & START_STREAM) {
        /* Subscribed here, before the loop reads a byte of the process's output: a CONNECT sent after
         * this reply would come once the host had read it, and a fast command's output would by then
         * have pushed its first bytes out of the ring. */
        struct sbuf b = {0};
        sb_proc(&b, p);
        if (b.len && b.p[b.len - 1] == '}') {
            b.len--;
            static const char streaming[] = ",\"streaming\":true}";
            sb_put(&b, streaming, sizeof streaming - 1);
        }
        client_json(c, &b);
        c->sub = (int)(p - procs) + 1;
    } else {
        client_reply_proc(c, p);
    }
    cmd = cwd = NULL;
    argc = 0; /* the strings now belong to the process */
done:
    for (int *fd = (int[]){master, out[0], out[1], err[0], err[1], in[0], in[1], report[0], report[1]}, i = 0; i < 9; i++)
        if (fd[i] >= 0) close(fd[i]);
    for (uint32_t i = 0; i < argc; i++) free(argv[i + 1]);
    for (uint32_t i = 0; i < envc; i++) free(envp[i]);
    free(argv);
    free(envp);
    free(cmd);
    free(cwd);
    free(user);
}

static int wait_satisfied(const struct proc *p, int tree) {
    return tree ? p->tree_exited : (p->leader_exited && p->exit_announced);
}

static void dispatch(struct client *c, const unsigned char *payload, uint32_t len) {
    struct cursor cur = {payload, len, 0};
    uint32_t op = cur_u32(&cur);
    touch_activity();
    if (op == PROC_OP_START || op == PROC_OP_START_AS) { op_start(c, &cur, op == PROC_OP_START_AS); return; }
    if (op == PROC_OP_LIST) {
        struct sbuf b = {0};
        sb_put(&b, "{\"processes\":[", 14);
        int first = 1;
        for (int i = 0; i < MAX_PROCS; i++) {
            if (!procs[i].used) continue;
            if (!first) sb_put(&b, ",", 1);
            first = 0;
            sb_proc(&b, &procs[i]);
        }
        sb_put(&b, "]}", 2);
        client_json(c, &b);
        return;
    }
    struct proc *p = find_proc(c, &cur);
    if (!p) return;
    int idx = (int)(p - procs) + 1;
    switch (op) {
    case PROC_OP_GET: client_reply_proc(c, p); return;
    case PROC_OP_KILL: {
        uint32_t grace_ms = cur_u32(&cur);
        if (cur.bad) break;
        if (!p->leader_exited || !p->tree_exited) {
            if (grace_ms == 0) signal_tree(p, SIGKILL);
            else {
                signal_tree(p, SIGTERM);
                if (p->pty) signal_tree(p, SIGHUP); /* interactive shells ignore SIGTERM */
                p->kill_at_ms = mono_ms() + grace_ms;
            }
            if (!p->leader_exited) p->state = ST_TERMINATING;
        }
        client_reply_proc(c, p);
        return;
    }
    case PROC_OP_INPUT: {
        uint32_t n = cur_u32(&cur);
        if (cur.bad || n > cur.left) break;
        if (p->leader_exited || p->in_fd < 0 || p->stdin_close_pending) {
            client_error(c, E_PROC_STATE, "process %s no longer reads input", p->id);
            return;
        }
        if (p->pending_len + n > INPUT_PENDING_MAX) {
            client_error(c, E_PROC_STATE, "process %s is not reading its input (1 MiB pending)", p->id);
            return;
        }
        unsigned char *grown = realloc(p->pending, p->pending_len + n + 1);
        if (!grown) { client_error(c, E_PROC_STATE, "out of memory"); return; }
        p->pending = grown;
        memcpy(p->pending + p->pending_len, cur.p, n);
        p->pending_len += n;
        write_input(p); /* most input fits the terminal or pipe at once: no loop turn for a keystroke */
        struct sbuf b = {0};
        sb_printf(&b, "{\"input_seq\":%llu}", (unsigned long long)++p->input_seq);
        client_json(c, &b);
        return;
    }
    case PROC_OP_STDIN_CLOSE: {
        close_stdin(p);
        struct sbuf b = {0};
        sb_put(&b, "{\"ok\":true}", 11);
        client_json(c, &b);
        return;
    }
    case PROC_OP_RESIZE: {
        uint32_t rows = cur_u32(&cur), cols = cur_u32(&cur);
        if (cur.bad || rows > 65535 || cols > 65535) break;
        if (!p->pty) { client_error(c, E_PROC_STATE, "process %s has no terminal to resize", p->id); return; }
        if (rows) p->rows = rows;
        if (cols) p->cols = cols;
        if (p->out_fd >= 0) set_winsize(p->out_fd, p->rows, p->cols); /* the kernel sends SIGWINCH */
        client_reply_proc(c, p);
        return;
    }
    case PROC_OP_SIGNAL: {
        uint32_t signo = cur_u32(&cur);
        if (cur.bad || signo == 0 || signo > 64) break;
        if (p->leader_exited) { client_error(c, E_PROC_STATE, "process %s has exited", p->id); return; }
        kill(-p->pid, (int)signo);
        if (p->pty && p->out_fd >= 0) { /* and the terminal's foreground job, as a keystroke would */
            pid_t fg = tcgetpgrp(p->out_fd);
            if (fg > 0 && fg != p->pid) kill(-fg, (int)signo);
        }
        client_reply_proc(c, p);
        return;
    }
    case PROC_OP_WAIT: {
        uint32_t scope = cur_u32(&cur), timeout_ms = cur_u32(&cur);
        if (cur.bad || scope > 1) break;
        if (wait_satisfied(p, (int)scope) || timeout_ms == 0) { client_reply_proc(c, p); return; }
        c->wait = idx;
        c->wait_tree = (int)scope;
        c->wait_deadline_ms = mono_ms() + timeout_ms;
        return;
    }
    case PROC_OP_CONNECT: {
        if (cur.left < 8) break;
        uint64_t after = (uint64_t)get_u32(cur.p) | ((uint64_t)get_u32(cur.p + 4) << 32);
        client_reply_proc(c, p);
        for (struct chunk *ch = p->head; ch; ch = ch->next)
            if (ch->seq > after) send_output(c, ch);
        if (p->exit_announced) send_exit(c, p);
        else c->sub = idx;
        return;
    }
    default: client_error(c, E_PROTOCOL, "unknown process operation %u", op); return;
    }
    client_error(c, E_PROTOCOL, "malformed process request");
}

/* ---------- the event loop ---------- */

static void client_read(struct client *c) {
    unsigned char buf[65536];
    ssize_t n = read(c->fd, buf, sizeof buf);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) { client_drop(c); return; }
    if (n < 0) return;
    if (c->sub || c->close_when_flushed) return; /* a stream client sends nothing more */
    unsigned char *grown = realloc(c->rbuf, c->rlen + (size_t)n);
    if (!grown) { client_drop(c); return; }
    c->rbuf = grown;
    memcpy(c->rbuf + c->rlen, buf, (size_t)n);
    c->rlen += (size_t)n;
    while (c->fd >= 0 && c->rlen >= 5 && !c->sub && !c->wait) {
        uint32_t len = get_u32(c->rbuf + 1);
        if (c->rbuf[0] != FR_PROC || len > MAX_CONTROL_PAYLOAD) { client_drop(c); return; }
        if (c->rlen < 5 + (size_t)len) return;
        dispatch(c, c->rbuf + 5, len);
        if (c->fd < 0) return;
        memmove(c->rbuf, c->rbuf + 5 + len, c->rlen - 5 - len);
        c->rlen -= 5 + len;
    }
}

static void client_flush(struct client *c) {
    while (c->woff < c->wlen) {
        ssize_t n = send(c->fd, c->wbuf + c->woff, c->wlen - c->woff, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) return;
            client_drop(c);
            return;
        }
        c->woff += (size_t)n;
    }
    c->woff = c->wlen = 0;
    if (c->close_when_flushed) client_drop(c);
}

static void add_client(int fd) {
    for (int i = 0; i < MAX_CLIENTS; i++) {
        if (clients[i].fd >= 0) continue;
        memset(&clients[i], 0, sizeof clients[i]);
        clients[i].fd = fd;
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        return;
    }
    send_error(fd, E_PROC_STATE, "too many process connections");
    close(fd);
}

static void receive_connections(int ctl) {
    for (;;) {
        char byte;
        char control[CMSG_SPACE(sizeof(int))];
        struct iovec iov = {&byte, 1};
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        if (recvmsg(ctl, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) <= 0) return;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm), sizeof fd);
            add_client(fd);
        }
    }
}

static void read_output(struct proc *p, int *fd, uint32_t stream) {
    unsigned char buf[65536];
    ssize_t n = read(*fd, buf, sizeof buf);
    if (n > 0) { ring_append(p, stream, buf, (size_t)n); return; }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    /* EOF, or EIO from a PTY master once every slave is closed */
    if (p->in_fd == *fd) p->in_fd = -1;
    close(*fd);
    *fd = -1;
}

static void write_input(struct proc *p) {
    if (p->pending_len > 0 && p->in_fd >= 0) {
        ssize_t n = write(p->in_fd, p->pending, p->pending_len);
        if (n > 0) {
            memmove(p->pending, p->pending + n, p->pending_len - (size_t)n);
            p->pending_len -= (size_t)n;
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
            p->pending_len = 0; /* the reader is gone */
        }
    }
    if (p->stdin_close_pending && p->pending_len == 0 && p->in_fd >= 0 && !p->pty) {
        close(p->in_fd);
        p->in_fd = -1;
    }
}

static void reap(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < MAX_PROCS; i++) {
            struct proc *p = &procs[i];
            if (!p->used || p->pid != pid) continue;
            p->leader_exited = 1;
            p->state = ST_EXITED;
            p->finished_ms = now_ms();
            p->drain_until_ms = mono_ms() + DRAIN_AFTER_EXIT_MS;
            if (WIFEXITED(status)) p->exit_code = WEXITSTATUS(status);
            else if (WIFSIGNALED(status)) { p->signo = WTERMSIG(status); p->exit_code = 128 + p->signo; }
            if (!p->pty && p->in_fd >= 0) { close(p->in_fd); p->in_fd = -1; }
        }
    }
}

/* Timers: SIGKILL after a kill's grace, the exit frame once output drained, the tree check, waits. */
static int tick(void) {
    int64_t now = mono_ms();
    int64_t next = -1;
#define SOONER(t) do { int64_t _t = (t); if (next < 0 || _t < next) next = _t; } while (0)
    for (int i = 0; i < MAX_PROCS; i++) {
        struct proc *p = &procs[i];
        if (!p->used) continue;
        if (p->kill_at_ms) {
            if (now >= p->kill_at_ms) { signal_tree(p, SIGKILL); p->kill_at_ms = 0; }
            else SOONER(p->kill_at_ms);
        }
        if (p->leader_exited && !p->exit_announced) {
            int drained = p->out_fd < 0 && p->err_fd < 0;
            if (drained || now >= p->drain_until_ms) {
                p->exit_announced = 1;
                for (int j = 0; j < MAX_CLIENTS; j++)
                    if (clients[j].fd >= 0 && clients[j].sub == i + 1) send_exit(&clients[j], p);
            } else {
                SOONER(p->drain_until_ms);
            }
        }
        if (p->leader_exited && !p->tree_exited) {
            if (for_each_in_session(p->pid, 0) == 0) p->tree_exited = 1;
            else SOONER(now + TREE_CHECK_MS);
        }
    }
    for (int j = 0; j < MAX_CLIENTS; j++) {
        struct client *c = &clients[j];
        if (c->fd < 0 || !c->wait) continue;
        struct proc *p = &procs[c->wait - 1];
        if (wait_satisfied(p, c->wait_tree) || now >= c->wait_deadline_ms) {
            c->wait = 0;
            client_reply_proc(c, p);
        } else {
            SOONER(c->wait_deadline_ms);
        }
    }
#undef SOONER
    if (next < 0) return -1;
    return next <= now ? 0 : (int)(next - now);
}

void proc_manager_run(int ctl) {
    for (int i = 0; i < MAX_CLIENTS; i++) clients[i].fd = -1;
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_SETMASK, &mask, NULL); /* only SIGCHLD: PID 1's blocked SIGTERM is not ours to keep */
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    signal(SIGPIPE, SIG_IGN);
    struct pollfd pfd[2 + MAX_CLIENTS + 3 * MAX_PROCS];
    for (;;) {
        int timeout = tick();
        for (int j = 0; j < MAX_CLIENTS; j++) /* tick may have queued replies */
            if (clients[j].fd >= 0 && clients[j].wlen > clients[j].woff) client_flush(&clients[j]);
        int n = 0;
        pfd[n++] = (struct pollfd){ctl, POLLIN, 0};
        pfd[n++] = (struct pollfd){sfd, POLLIN, 0};
        int client_at[MAX_CLIENTS];
        for (int j = 0; j < MAX_CLIENTS; j++) {
            client_at[j] = -1;
            struct client *c = &clients[j];
            if (c->fd < 0) continue;
            short ev = POLLIN | POLLRDHUP;
            if (c->wlen > c->woff) ev |= POLLOUT;
            client_at[j] = n;
            pfd[n++] = (struct pollfd){c->fd, ev, 0};
        }
        int out_at[MAX_PROCS], err_at[MAX_PROCS], in_at[MAX_PROCS];
        for (int i = 0; i < MAX_PROCS; i++) {
            struct proc *p = &procs[i];
            out_at[i] = err_at[i] = in_at[i] = -1;
            if (!p->used) continue;
            if (p->out_fd >= 0) {
                out_at[i] = n;
                short ev = POLLIN;
                if (p->pty && p->pending_len) ev |= POLLOUT;
                pfd[n++] = (struct pollfd){p->out_fd, ev, 0};
            }
            if (p->err_fd >= 0) { err_at[i] = n; pfd[n++] = (struct pollfd){p->err_fd, POLLIN, 0}; }
            if (!p->pty && p->in_fd >= 0 && (p->pending_len || p->stdin_close_pending)) {
                in_at[i] = n;
                pfd[n++] = (struct pollfd){p->in_fd, POLLOUT, 0};
            }
        }
        if (poll(pfd, (nfds_t)n, timeout) < 0) {
            if (errno == EINTR) continue;
            usleep(10000);
            continue;
        }
        if (pfd[0].revents & POLLIN) receive_connections(ctl);
        if (pfd[1].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == sizeof si) {}
            reap();
        }
        for (int i = 0; i < MAX_PROCS; i++) {
            struct proc *p = &procs[i];
            if (!p->used) continue;
            if (out_at[i] >= 0 && (pfd[out_at[i]].revents & POLLOUT)) write_input(p);
            if (in_at[i] >= 0 && pfd[in_at[i]].revents) write_input(p);
            if (out_at[i] >= 0 && p->out_fd >= 0 && (pfd[out_at[i]].revents & (POLLIN | POLLHUP | POLLERR)))
                read_output(p, &p->out_fd, p->pty ? OUT_PTY : OUT_STDOUT);
            if (err_at[i] >= 0 && p->err_fd >= 0 && (pfd[err_at[i]].revents & (POLLIN | POLLHUP | POLLERR)))
                read_output(p, &p->err_fd, OUT_STDERR);
            if (!p->pty && p->stdin_close_pending && p->pending_len == 0 && p->in_fd >= 0) write_input(p);
        }
        for (int j = 0; j < MAX_CLIENTS; j++) {
            struct client *c = &clients[j];
            if (client_at[j] < 0 || c->fd < 0) continue;
            short re = pfd[client_at[j]].revents;
            if (re & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) {
                if (re & (POLLRDHUP | POLLHUP | POLLERR) && !(re & POLLIN)) { client_drop(c); continue; }
                client_read(c);
                if (c->fd < 0) continue;
                if (re & (POLLRDHUP | POLLHUP)) { client_flush(c); if (c->fd >= 0) client_drop(c); continue; }
            }
            if (c->fd >= 0 && c->wlen > c->woff) client_flush(c);
        }
    }
}
