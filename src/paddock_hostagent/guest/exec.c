/* EXEC: run one command, stream its output, report how it ended; hang-up kills its process group. */
#include "guest.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

static int set_nonblock(int fd) {
    int flags = fcntl(fd, F_GETFL);
    return flags < 0 ? -1 : fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

struct exec_request {
    uint32_t flags;
    char *cmd;
    char **argv; /* argv[0] = cmd */
    char **envp;
    char *cwd;
    char *user; /* EXEC_AS: a name or a uid of the sandbox's /etc/passwd */
    uint32_t envc;
    int has_user;
    struct run_as as;
};

#define EXEC_HAS_STDIN 1u

/* A handler serves one request after another on a kept connection, so it gives back what it took. */
static void free_exec(struct exec_request *req) {
    free(req->cmd);
    if (req->argv)
        for (char **arg = req->argv + 1; *arg; arg++) free(*arg); /* argv[0] is cmd */
    if (req->envp)
        for (char **var = req->envp; *var; var++) free(*var);
    free(req->argv);
    free(req->envp);
    free(req->cwd);
    free(req->user);
}

static int parse_exec(const unsigned char *payload, uint32_t len, struct exec_request *req) {
    struct cursor c = {payload, len, 0};
    if (req->has_user) {
        req->user = cur_str(&c);
        if (c.bad || !req->user[0] || strlen(req->user) > RUN_AS_MAX_NAME) return -1;
    }
    req->flags = cur_u32(&c);
    uint32_t argc = cur_u32(&c);
    uint32_t envc = cur_u32(&c);
    if (c.bad || argc > 65536 || envc > 65536) return -1;
    req->envc = envc;
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
int resolve_command(const char *cmd, char *const envp[], char *out, size_t out_len) {
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
enum { STAGE_DUP2 = 1, STAGE_CHDIR = 2, STAGE_EXEC = 3, STAGE_USER = 4 };

/* vfork: the handler is suspended until the child has exec'd, and no page tables are copied. The
 * child only makes system calls and writes the two shared ints above. */
static pid_t spawn_command(struct exec_request *req, const char *program, int in_fd, int out_fd, int err_fd) {
    /* No directory asked for: a user's own home (or / when it cannot enter it), root's /. */
    const char *cwd = (req->cwd && req->cwd[0]) ? req->cwd : req->has_user ? req->as.home : "/";
    int cwd_fallback = !(req->cwd && req->cwd[0]);
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
    if (req->has_user && apply_user(&req->as) < 0) {
        spawn_errno = errno;
        spawn_stage = STAGE_USER;
        _exit(127);
    }
    if (chdir(cwd) < 0 && !(cwd_fallback && chdir("/") == 0)) {
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

/* Output is read into one buffer per handler (it serves one request at a time): no allocation per
 * command. A handler on a kept connection lives on, so what a large output dirtied of it is given back
 * after that command (OUTPUT_PAGES_KEPT: a few pages stay, for the small outputs most commands make). */
static unsigned char output_buf[IO_CHUNK] __attribute__((aligned(4096)));
static size_t output_used;
#define OUTPUT_PAGES_KEPT (16u << 10)

static int forward_output(int sock, int *fd, uint8_t type, unsigned char *buf) {
    ssize_t n = read(*fd, buf, IO_CHUNK);
    if (n > 0 && (size_t)n > output_used) output_used = (size_t)n;
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

/* Returns EXEC_KEPT when the connection may carry another request, 0 when it must be closed. */
static int run_exec(int sock, struct exec_request req) {
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
        if (spawn_stage == STAGE_USER)
            return send_error(sock, E_SPAWN, "becoming user %s: %s", req.user, strerror(spawn_errno));
        if (spawn_stage == STAGE_DUP2) return send_error(sock, E_SPAWN, "dup2: %s", strerror(spawn_errno));
        return send_error(sock, E_SPAWN, "%s: %s", req.cmd, strerror(spawn_errno));
    }

    int pidfd = pidfd_open_compat(pid);
    fcntl(out[0], F_SETFL, O_NONBLOCK); /* read ends: their flags are known to be plain O_RDONLY */
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    struct stdin_buffer sin = {NULL, 0, 0, has_stdin ? in[1] : -1, !has_stdin};
    if (sin.fd >= 0) set_nonblock(sin.fd);
    int out_fd = out[0], err_fd = err[0];
    unsigned char *buf = output_buf;
    int status = 0, exited = 0, client_gone = 0;
    int64_t drain_deadline = 0;

    while (!client_gone) {
        if (exited && out_fd < 0 && err_fd < 0) break;
        if (exited && mono_ms() >= drain_deadline) break; /* a background job holds the pipes open */
        struct pollfd pfd[5];
        int nfds = 0, i_sock = -1, i_out = -1, i_err = -1, i_in = -1, i_pid = -1;
        short sock_events = POLLRDHUP;
        /* After stdin's EOF the socket is still read: under gVisor a host socket whose peer closed
         * reports only POLLIN (no POLLRDHUP/POLLHUP), and the read of EOF is what says the client left. */
        if (sin.eof_seen || sin.off >= sin.len) sock_events |= POLLIN;
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
    free(sin.data);
    if (output_used > OUTPUT_PAGES_KEPT) madvise(output_buf, IO_CHUNK, MADV_DONTNEED);
    output_used = 0;
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
    unsigned char reply[12];
    int32_t code = 0, sig = 0;
    if (WIFEXITED(status)) code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status)) { sig = WTERMSIG(status); code = 128 + sig; }
    /* A command given stdin may have left STDIN frames unread on the socket: such a connection is not
     * kept, so what follows on a kept connection is always the start of a new request. */
    uint32_t flags = has_stdin ? 0 : EXIT_KEPT;
    put_u32(reply, (uint32_t)code);
    put_u32(reply + 4, (uint32_t)sig);
    put_u32(reply + 8, flags);
    if (send_frame(sock, FR_EXIT, reply, sizeof reply) < 0) return 0;
    return flags & EXIT_KEPT ? EXEC_KEPT : 0;
}

int handle_exec(int sock, const unsigned char *payload, uint32_t len, int as_user) {
    static struct exec_request req; /* static: struct run_as is ~4 KiB, and a handler serves one at a time */
    memset(&req, 0, sizeof req);
    req.has_user = as_user;
    char why[512];
    int kept = 0;
    if (parse_exec(payload, len, &req) < 0) send_error(sock, E_PROTOCOL, "malformed exec request");
    else if (req.has_user && resolve_user(req.user, &req.as, why, sizeof why) < 0) send_error(sock, E_USER, "%s", why);
    else if (req.has_user && user_env(&req.envp, &req.envc, &req.as) < 0) send_error(sock, E_SPAWN, "out of memory");
    else if (req.has_user && send_frame(sock, FR_OK, NULL, 0) < 0) kept = 0; /* EXEC_AS: the user is known */
    else kept = run_exec(sock, req);
    free_exec(&req);
    return kept;
}
