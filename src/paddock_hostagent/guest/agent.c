/*
 * paddock-guest: the in-sandbox guest agent.
 *
 * Runs as PID 1 of a sandbox (so it reaps every orphan) and serves requests on a unix stream socket
 * that the host agent created and handed over as an inherited file descriptor (`--fd N`), or that it
 * binds itself (`--listen PATH`, for tests outside a container).
 *
 * PID 1 keeps handler processes waiting in accept(); each serves one connection with blocking I/O, one
 * request after another while they leave the connection clean (an EXEC without stdin, an INFO), and
 * exits when the client closes it or after any other request. Commands run in
 * their own session (so their whole process group can be killed) as children of the handler.
 *
 * Framing (both directions): u8 type, u32 little-endian payload length, payload. Strings inside a
 * payload are u32 length + bytes (no NUL). See protocol.py for the host side of the same table.
 *
 *   client -> guest                              guest -> client
 *   EXEC  flags,argc,envc,cmd,args..,env..,cwd   STDOUT bytes / STDERR bytes ... EXIT i32 code, i32 signal,
 *                                                     u32 flags (EXIT_KEPT: the connection takes another request)
 *   STDIN bytes ... STDIN_EOF                    or ERROR u32 code + message (the command did not start)
 *   WRITE path; DATA bytes ...; DATA_END         OK (ready) ... OK u64 size, or ERROR
 *   READ path                                    SIZE u64 (UINT64_MAX: unknown), DATA ..., DATA_END, or ERROR
 *   INFO                                         INFO u64 last_activity_ms, u32 active, u32 version,
 *                                                     u32 self_seq, u32 self_action, reason bytes
 *   WATCH u32 flags, path                        OK u32 dirs, u32 flags; WATCH_EVENT u32 kind, u32 type,
 *                                                     relative path ... until the client closes (watch.c)
 *
 * Closing the connection while a command runs kills the command's process group.
 *
 *   PROC u32 op, ...                             a managed process request (process.c): the connection
 *                                                is passed to the process manager, which answers it
 *
 * Sources: agent.c (PID 1 loop, connection dispatch), wire.c (framing), exec.c, files.c, watch.c, process.c (managed
 * processes), selfsignal.c (the in-sandbox self-signal API on 127.0.0.1:1029 and /run/self), guest.h.
 */
#include "guest.h"

#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

struct shared_state *shared;

/* ---------- connection handler and PID 1 loop ---------- */

/* The process manager's end of a datagram socketpair: PROC connections are passed to it (process.c). */
static int proc_manager_fd = -1;

/* Passes the connection, unread, to the process manager. Returns 0 when it took it. */
static int hand_to_manager(int sock) {
    char byte = 0;
    char control[CMSG_SPACE(sizeof(int))];
    memset(control, 0, sizeof control);
    struct iovec iov = {&byte, 1};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &sock, sizeof sock);
    return sendmsg(proc_manager_fd, &msg, MSG_NOSIGNAL) == 1 ? 0 : -1;
}

/* Serves one request. Returns CONN_NEXT when the connection may carry another (a finished EXEC, an
 * INFO), CONN_DONE when it is to be shut down, CONN_HANDED_OFF when the process manager now has it. */
enum { CONN_DONE = 0, CONN_NEXT = 1, CONN_HANDED_OFF = 2 };

static int serve_request(int sock) {
    unsigned char peek;
    ssize_t peeked;
    do peeked = recv(sock, &peek, 1, MSG_PEEK); while (peeked < 0 && errno == EINTR);
    if (peeked == 1 && peek == FR_PROC) {
        if (proc_manager_fd >= 0 && hand_to_manager(sock) == 0) return CONN_HANDED_OFF;
        send_error(sock, E_PROTOCOL, "the process manager is not running");
        return CONN_DONE;
    }
    uint32_t len;
    int type = read_header(sock, &len);
    if (type < 0) return CONN_DONE;
    unsigned char *payload = read_payload(sock, len, MAX_CONTROL_PAYLOAD);
    if (!payload) {
        send_error(sock, E_PROTOCOL, "request too large or truncated");
        return CONN_DONE;
    }
    if (type == FR_INFO) {
        free(payload);
        unsigned char reply[24 + SELF_REASON_MAX];
        put_u64(reply, (uint64_t)shared->last_activity_ms);
        put_u32(reply + 8, (uint32_t)shared->active);
        put_u32(reply + 12, PROTOCOL_VERSION);
        put_u32(reply + 16, shared->self_seq);
        put_u32(reply + 20, shared->self_action);
        size_t reason_len = strnlen(shared->self_reason, SELF_REASON_MAX);
        memcpy(reply + 24, shared->self_reason, reason_len);
        return send_frame(sock, FR_INFO_REPLY, reply, (uint32_t)(24 + reason_len)) < 0 ? CONN_DONE : CONN_NEXT;
    }
    if (type == FR_WATCH) { /* open for as long as the client likes: a watch is not activity */
        handle_watch(sock, payload, len);
        free(payload);
        return CONN_DONE;
    }
    int next = CONN_DONE;
    __sync_fetch_and_add(&shared->active, 1);
    touch_activity();
    switch (type) {
    case FR_EXEC: next = handle_exec(sock, payload, len, 0) == EXEC_KEPT ? CONN_NEXT : CONN_DONE; break;
    case FR_EXEC_AS: next = handle_exec(sock, payload, len, 1) == EXEC_KEPT ? CONN_NEXT : CONN_DONE; break;
    case FR_WRITE: handle_write(sock, payload, len); break;
    case FR_READ: handle_read(sock, payload, len); break;
    default: send_error(sock, E_PROTOCOL, "unknown request type %d", type); break;
    }
    touch_activity();
    __sync_fetch_and_sub(&shared->active, 1);
    free(payload);
    return next;
}

/* A connection carries requests one after another until the client closes it (a host keeps one per
 * sandbox, so an exec skips the connect and this agent's fork of a replacement handler) or a request
 * leaves it mid-frame (a file transfer, an exec given stdin, an error). */
static void handle_connection(int sock) {
    int next;
    while ((next = serve_request(sock)) == CONN_NEXT) {}
    if (next == CONN_DONE) shutdown(sock, SHUT_RDWR);
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
    int listen_fd = -1, self_signal = getpid() == 1; /* outside a container only when asked */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--fd") && i + 1 < argc) listen_fd = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--listen") && i + 1 < argc) listen_fd = listen_on(argv[++i]);
        else if (!strcmp(argv[i], "--self-signal")) self_signal = 1;
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
    note_ignored_signals();
    int notify[2];
    if (pipe2(notify, O_CLOEXEC) < 0) { perror("pipe"); return 1; }
    fcntl(notify[0], F_SETFL, O_NONBLOCK);
    /* The process manager: forked once, before any handler, so every handler inherits its socket. */
    int manager_pair[2];
    if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, manager_pair) == 0) {
        pid_t agent = getpid();
        pid_t manager = fork();
        if (manager == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* it dies with the agent, as the handlers do */
            /* An agent killed before that line left it running for good (seen in the tests, where the
             * agent is not PID 1 of its own namespace). */
            if (getppid() != agent) _exit(0);
            close(manager_pair[1]);
            close(listen_fd);
            close(sfd);
            close(notify[0]);
            close(notify[1]);
            proc_manager_run(manager_pair[0]);
            _exit(0);
        }
        close(manager_pair[0]);
        if (manager > 0) proc_manager_fd = manager_pair[1];
        else close(manager_pair[1]);
    }
    int self_http = self_signal ? self_http_listen() : -1;
    int self_fifo = self_signal ? self_fifo_open() : -1;
    /* Set-up is done, and with it everything this agent ever writes to stderr. The stdio it inherited
     * is the host's (the OCI runtime's stdio, a pipe the host agent reads only while the sandbox
     * boots): any process in the sandbox could write to it as /proc/1/fd/N. From here on PID 1 holds
     * no file, pipe or terminal of the host's except its listening socket. */
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null_fd >= 0) {
        for (int fd = 0; fd <= 2; fd++) dup2(null_fd, fd);
        close(null_fd);
    }

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
                if (self_http >= 0) close(self_http);
                if (self_fifo >= 0) close(self_fifo);
                sigprocmask(SIG_UNBLOCK, &mask, NULL);
                int conn;
                do conn = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC); while (conn < 0 && errno == EINTR);
                pid_t me = getpid();
                (void)!write(notify[1], &me, sizeof me);
                close(notify[1]);
                close(listen_fd);
                if (conn >= 0) handle_connection(conn);
                _exit(0);
            }
            if (pid > 0) idle[i] = pid;
            else usleep(10000); /* out of processes: retry later */
        }
        struct pollfd pfd[4] = {{notify[0], POLLIN, 0}, {sfd, POLLIN, 0}, {self_http, POLLIN, 0}, {self_fifo, POLLIN, 0}};
        if (poll(pfd, 4, -1) < 0 && errno != EINTR) continue; /* negative fds are skipped by poll */
        if (pfd[2].revents & POLLIN) {
            int conn = accept4(self_http, NULL, NULL, SOCK_CLOEXEC);
            if (conn >= 0) {
                if (fork() == 0) { /* rare requests: a fork each, so a slow client never blocks PID 1 */
                    sigprocmask(SIG_UNBLOCK, &mask, NULL);
                    self_http_serve(conn);
                    _exit(0);
                }
                close(conn);
            }
        }
        if (pfd[3].revents & POLLIN) self_fifo_drain(self_fifo);
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
