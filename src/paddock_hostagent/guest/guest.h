/* Shared declarations of the guest agent (see agent.c for the overview and the wire format). */
#ifndef PADDOCK_GUEST_H
#define PADDOCK_GUEST_H

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define PROTOCOL_VERSION 2u

enum frame_type {
    FR_EXEC = 1, FR_STDIN = 2, FR_STDIN_EOF = 3, FR_WRITE = 4, FR_READ = 5, FR_DATA = 6, FR_DATA_END = 7,
    FR_INFO = 8, FR_EXEC_AS = 9, /* EXEC with a user first: an older guest answers 'unknown request type' */
    FR_WATCH = 10, /* a directory's inotify events (watch.c); an older guest answers 'unknown request type' */
    FR_PROC = 16, /* managed processes (process.c): handed to the process manager */
    FR_STDOUT = 32, FR_STDERR = 33, FR_EXIT = 34, FR_ERROR = 35, FR_OK = 36, FR_SIZE = 37, FR_INFO_REPLY = 38,
    FR_PROC_REPLY = 40, FR_PROC_OUTPUT = 41, FR_PROC_EXIT = 42, FR_WATCH_EVENT = 43,
};

enum error_code {
    E_SPAWN = 1, E_FILE_NOT_FOUND = 2, E_PARENT_NOT_FOUND = 3, E_IS_DIRECTORY = 4, E_BAD_PATH = 5,
    E_IO = 6, E_PROTOCOL = 7, E_PROC_NOT_FOUND = 8, E_PROC_STATE = 9, E_USER = 10,
    E_NOT_DIRECTORY = 11, E_WATCH_UNAVAILABLE = 12, /* WATCH: no inotify instance or watch to be had */
};

/* WATCH (watch.c): the request's flags, the OK's flags, an event's kind and type */
#define WATCH_RECURSIVE 1u
#define WATCH_INCOMPLETE 1u
enum watch_kind { WATCH_CREATE = 1, WATCH_MODIFY = 2, WATCH_DELETE = 3, WATCH_OVERFLOW = 4 };
enum watch_type { WATCH_FILE = 1, WATCH_DIR = 2, WATCH_SYMLINK = 3, WATCH_OTHER = 4 };

enum proc_op {
    PROC_OP_START = 1, PROC_OP_LIST = 2, PROC_OP_GET = 3, PROC_OP_KILL = 4, PROC_OP_INPUT = 5,
    PROC_OP_STDIN_CLOSE = 6, PROC_OP_RESIZE = 7, PROC_OP_SIGNAL = 8, PROC_OP_WAIT = 9, PROC_OP_CONNECT = 10,
    PROC_OP_START_AS = 11, /* START with a user first */
};

/* What code inside the sandbox asked for through the self-signal API (spec 12.4). */
enum self_action { SELF_NONE = 0, SELF_PAUSE = 1, SELF_DELETE = 2 };

#define MAX_CONTROL_PAYLOAD (4u << 20) /* an exec request with its env must fit in 4 MiB */
#define MAX_DATA_PAYLOAD (1u << 20)
#define IO_CHUNK (256u << 10)
#define DRAIN_AFTER_EXIT_MS 100
/* One spare: the host keeps a connection (and so a handler) per guest for its execs and INFOs, and the
 * spare takes what comes while that one is busy. Each handler is ~80 KiB of a sandbox's memory. */
#define SPARE_HANDLERS 1
#define SELF_REASON_MAX 128
#define SELF_HTTP_PORT 1029
#define SELF_FIFO_PATH "/run/self"

/* One page shared by PID 1 and every handler it forks (MAP_SHARED). */
struct shared_state {
    volatile int64_t last_activity_ms;
    volatile int32_t active;
    volatile uint32_t self_seq; /* bumped by every self-signal; the host acts on a new value */
    volatile uint32_t self_action;
    char self_reason[SELF_REASON_MAX + 1];
};

extern struct shared_state *shared;

/* wire.c: time, framing, payload cursor, process hygiene */
int64_t now_ms(void);
int64_t mono_ms(void);
void touch_activity(void);
int write_all(int fd, const void *buf, size_t len);
int read_all(int fd, void *buf, size_t len);
void put_u32(unsigned char *p, uint32_t v);
void put_u64(unsigned char *p, uint64_t v);
uint32_t get_u32(const unsigned char *p);
int send_frame(int fd, uint8_t type, const void *payload, uint32_t len);
int send_error(int fd, uint32_t code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int read_header(int fd, uint32_t *len);
unsigned char *read_payload(int fd, uint32_t len, uint32_t max);
void note_ignored_signals(void); /* PID 1, before it forks: what reset_signals resets */
void reset_signals(void);

struct cursor {
    const unsigned char *p;
    size_t left;
    int bad;
};
uint32_t cur_u32(struct cursor *c);
char *cur_str(struct cursor *c);

/* exec.c, files.c: one request each, on a connected socket. handle_exec returns EXEC_KEPT when the
 * connection may carry another request (its EXIT frame then says EXIT_KEPT to the client). */
#define EXEC_KEPT 1
#define EXIT_KEPT 1u /* flags word of an EXIT frame */
int handle_exec(int sock, const unsigned char *payload, uint32_t len, int as_user);
int handle_write(int sock, const unsigned char *payload, uint32_t len);
int handle_read(int sock, const unsigned char *payload, uint32_t len);
int handle_watch(int sock, const unsigned char *payload, uint32_t len); /* until the client hangs up */
int resolve_command(const char *cmd, char *const envp[], char *out, size_t out_len);

/* user.c: a user of the sandbox's own /etc/passwd to run a command as */
#define RUN_AS_MAX_GROUPS 64
#define RUN_AS_MAX_NAME 256
struct run_as {
    uid_t uid;
    gid_t gid;
    int ngroups;
    gid_t groups[RUN_AS_MAX_GROUPS];
    char name[RUN_AS_MAX_NAME + 1];
    char home[PATH_MAX];
};
int resolve_user(const char *spec, struct run_as *out, char *err, size_t err_len);
int apply_user(const struct run_as *as);
int user_env(char ***envp, uint32_t *envc, const struct run_as *as);

/* process.c: the process manager's event loop (never returns); connections arrive on `ctl` */
void proc_manager_run(int ctl);

/* selfsignal.c: http://127.0.0.1:1029/self/{pause,delete} and the /run/self FIFO */
int self_http_listen(void);
void self_http_serve(int conn);
int self_fifo_open(void);
void self_fifo_drain(int fd);

#endif
