/* WATCH: a directory's changes as inotify sees them, streamed until the client hangs up.
 *
 *   client -> guest: WATCH u32 flags (WATCH_RECURSIVE), path (absolute)
 *   guest -> client: OK u32 directories watched, u32 flags (WATCH_INCOMPLETE: the tree has more
 *                    directories than WATCH_MAX_DIRS, the rest are not watched), or ERROR
 *                    (E_FILE_NOT_FOUND, E_NOT_DIRECTORY, E_BAD_PATH, E_WATCH_UNAVAILABLE: no inotify
 *                    instance to be had, the caller may poll instead)
 *                    then WATCH_EVENT u32 kind, u32 type, path relative to the watched directory ...
 *                    and, if the watched directory itself goes away, ERROR E_FILE_NOT_FOUND, the last frame.
 *
 * Kinds: create (IN_CREATE, IN_MOVED_TO), modify (IN_MODIFY and IN_CLOSE_WRITE), delete (IN_DELETE,
 * IN_MOVED_FROM), overflow (IN_Q_OVERFLOW, or a new directory past WATCH_MAX_DIRS: events were lost,
 * re-list). A rename is a delete of the old name and a create of the new one, as a listing would show it.
 * A metadata change (chmod, a time set by touch -d) is not an event.
 *
 * Events are sent in batches: a batch goes once no event came for WATCH_QUIET_MS, or its oldest is
 * WATCH_BATCH_MS old, or it holds WATCH_MAX_PENDING. Within a batch a modify of a path already created or
 * modified in it is dropped (a file written in many writes is one modify per batch), so a file written
 * continuously is reported a few times a second, and its last write always is.
 *
 * Recursive: a directory that appears (made, or moved in) is watched with its subdirectories, and what
 * it holds is reported as created (a file made in it before its watch was added would otherwise be
 * missed; one made in between may be reported twice). A directory moved away stops being watched.
 * Bounds: WATCH_MAX_DIRS directories per watch; the kernel's queue (fs.inotify.max_queued_events) for
 * events not yet read, IN_Q_OVERFLOW past it; this agent blocks on a client that does not read (the
 * kernel's queue then fills and overflows). The guest's own upload temporaries (.paddock-upload-XXXXXX,
 * files.c) are never reported: an upload is the create of its name, or a modify when it replaced a file.
 *
 * Paths are resolved here, inside the sandbox's mount namespace (or its VM); symlinks below the watched
 * directory are reported, never followed. */
#include "guest.h"

#include <dirent.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>

#define WATCH_MAX_DIRS 4096
#define WATCH_MAX_DEPTH 64
#define WATCH_MAX_PENDING 256
#define WATCH_QUIET_MS 10
#define WATCH_BATCH_MS 50
#define WATCH_MASK                                                                                           \
    (IN_CREATE | IN_DELETE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF |   \
     IN_MOVE_SELF | IN_EXCL_UNLINK)
#define UPLOAD_TMP_PREFIX ".paddock-upload-"
#define UPDATE_TMP_PREFIX ".paddock-update-" /* an upload that replaces a file (files.c) */

struct wdir {
    int wd;
    char *rel; /* "" for the watched directory, else "a/b" */
};

struct pending {
    uint32_t kind, type;
    char *path;
};

struct watch {
    int sock, ifd, recursive, full;
    char root[PATH_MAX];
    struct wdir *dirs; /* sorted by wd: the kernel hands them out increasing */
    int ndirs;
    struct pending pending[WATCH_MAX_PENDING];
    int npending;
    int64_t first_ms, last_ms;
    uint32_t update_cookie; /* the rename of an upload replacing a file: its IN_MOVED_TO is a modify */
};

static int flush(struct watch *w) {
    int rc = 0;
    for (int i = 0; i < w->npending; i++) {
        struct pending *p = &w->pending[i];
        if (rc == 0) {
            size_t n = strlen(p->path);
            unsigned char *buf = malloc(8 + n);
            if (!buf) rc = -1;
            else {
                put_u32(buf, p->kind);
                put_u32(buf + 4, p->type);
                memcpy(buf + 8, p->path, n);
                rc = send_frame(w->sock, FR_WATCH_EVENT, buf, (uint32_t)(8 + n));
                free(buf);
            }
        }
        free(p->path);
    }
    w->npending = 0;
    return rc;
}

/* Queues an event; returns -1 when the client is gone (a full batch is sent first). */
static int push(struct watch *w, uint32_t kind, uint32_t type, const char *rel) {
    for (int i = w->npending - 1; i >= 0; i--) {
        struct pending *p = &w->pending[i];
        if (kind == WATCH_OVERFLOW && p->kind == WATCH_OVERFLOW) return 0;
        if (strcmp(p->path, rel)) continue;
        if (kind == WATCH_MODIFY && (p->kind == WATCH_MODIFY || p->kind == WATCH_CREATE)) return 0;
        break;
    }
    if (w->npending == WATCH_MAX_PENDING && flush(w) < 0) return -1;
    char *copy = strdup(rel);
    if (!copy) return 0;
    int64_t now = mono_ms();
    if (w->npending == 0) w->first_ms = now;
    w->last_ms = now;
    w->pending[w->npending++] = (struct pending){kind, type, copy};
    return 0;
}

static int find_dir(struct watch *w, int wd) {
    int lo = 0, hi = w->ndirs - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (w->dirs[mid].wd == wd) return mid;
        if (w->dirs[mid].wd < wd) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static void drop_dir(struct watch *w, int i) {
    free(w->dirs[i].rel);
    memmove(&w->dirs[i], &w->dirs[i + 1], (size_t)(w->ndirs - i - 1) * sizeof *w->dirs);
    w->ndirs--;
}

static int full_path(const struct watch *w, const char *rel, char *out) {
    int n = *rel ? snprintf(out, PATH_MAX, "%s/%s", strcmp(w->root, "/") ? w->root : "", rel)
                 : snprintf(out, PATH_MAX, "%s", w->root);
    return n > 0 && n < PATH_MAX ? 0 : -1;
}

static int join(const char *dir, const char *name, char *out) {
    int n = *dir ? snprintf(out, PATH_MAX, "%s/%s", dir, name) : snprintf(out, PATH_MAX, "%s", name);
    return n > 0 && n < PATH_MAX ? 0 : -1;
}

/* Watches the directory `rel`. 1: added (or already there, renamed), 0: not added (gone, or the cap
 * reached: `full` set), -1 at the top only: the kernel refused the watched directory itself. */
static int add_dir(struct watch *w, const char *rel) {
    char path[PATH_MAX];
    if (full_path(w, rel, path) < 0) return 0;
    if (w->ndirs >= WATCH_MAX_DIRS) { w->full = 1; return 0; }
    uint32_t mask = WATCH_MASK | IN_ONLYDIR | (*rel ? IN_DONT_FOLLOW : 0);
    int wd = inotify_add_watch(w->ifd, path, mask);
    if (wd < 0) {
        if (errno == ENOSPC) w->full = 1; /* fs.inotify.max_user_watches */
        return *rel ? 0 : -1;
    }
    char *copy = strdup(rel);
    if (!copy) { inotify_rm_watch(w->ifd, wd); return 0; }
    int at = find_dir(w, wd);
    if (at >= 0) { free(w->dirs[at].rel); w->dirs[at].rel = copy; return 1; } /* the same directory again */
    int i = w->ndirs;
    while (i > 0 && w->dirs[i - 1].wd > wd) i--;
    memmove(&w->dirs[i + 1], &w->dirs[i], (size_t)(w->ndirs - i) * sizeof *w->dirs);
    w->dirs[i] = (struct wdir){wd, copy};
    w->ndirs++;
    return 1;
}

static uint32_t type_of(mode_t mode) {
    if (S_ISREG(mode)) return WATCH_FILE;
    if (S_ISDIR(mode)) return WATCH_DIR;
    if (S_ISLNK(mode)) return WATCH_SYMLINK;
    return WATCH_OTHER;
}

static uint32_t lstat_type(const struct watch *w, const char *rel, uint32_t otherwise) {
    char path[PATH_MAX];
    struct stat st;
    if (full_path(w, rel, path) < 0 || lstat(path, &st) < 0) return otherwise;
    return type_of(st.st_mode);
}

static int is_upload_tmp(const char *name) {
    return (strncmp(name, UPLOAD_TMP_PREFIX, sizeof UPLOAD_TMP_PREFIX - 1) == 0 ||
            strncmp(name, UPDATE_TMP_PREFIX, sizeof UPDATE_TMP_PREFIX - 1) == 0) &&
           strlen(name) == sizeof UPLOAD_TMP_PREFIX - 1 + 6;
}

/* Watches the subdirectories of `rel` (already watched); with `report`, each entry is a create.
 * Returns -1 when the client is gone. */
static int walk(struct watch *w, const char *rel, int depth, int report) {
    char path[PATH_MAX];
    if (depth >= WATCH_MAX_DEPTH || full_path(w, rel, path) < 0) return 0;
    DIR *dir = opendir(path);
    if (!dir) return 0;
    struct dirent *d;
    int rc = 0;
    while (rc == 0 && (d = readdir(dir)) != NULL) {
        if (!strcmp(d->d_name, ".") || !strcmp(d->d_name, "..") || is_upload_tmp(d->d_name)) continue;
        char child[PATH_MAX];
        if (join(rel, d->d_name, child) < 0) continue;
        uint32_t type = d->d_type == DT_DIR ? WATCH_DIR
                      : d->d_type == DT_REG ? WATCH_FILE
                      : d->d_type == DT_LNK ? WATCH_SYMLINK
                      : d->d_type == DT_UNKNOWN ? lstat_type(w, child, WATCH_OTHER)
                      : WATCH_OTHER;
        if (report && push(w, WATCH_CREATE, type, child) < 0) rc = -1;
        if (rc == 0 && type == WATCH_DIR) {
            if (add_dir(w, child) == 1) rc = walk(w, child, depth + 1, report);
            else if (w->full && report && push(w, WATCH_OVERFLOW, WATCH_DIR, "") < 0) rc = -1;
        }
    }
    closedir(dir);
    return rc;
}

/* A directory moved away: it and everything under it are no longer watched. */
static void unwatch_tree(struct watch *w, const char *rel) {
    size_t n = strlen(rel);
    for (int i = w->ndirs - 1; i >= 0; i--) {
        const char *r = w->dirs[i].rel;
        if (*r && !strncmp(r, rel, n) && (r[n] == 0 || r[n] == '/')) {
            inotify_rm_watch(w->ifd, w->dirs[i].wd);
            drop_dir(w, i);
        }
    }
}

enum { GO_ON = 0, CLIENT_GONE = -1, ROOT_GONE = -2 };

static int on_event(struct watch *w, const struct inotify_event *ev) {
    if (ev->mask & IN_Q_OVERFLOW) return push(w, WATCH_OVERFLOW, WATCH_DIR, "");
    int at = find_dir(w, ev->wd);
    if (at < 0) return GO_ON;
    int is_root = w->dirs[at].rel[0] == 0;
    if (ev->mask & IN_IGNORED) {
        drop_dir(w, at);
        return is_root ? ROOT_GONE : GO_ON;
    }
    if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) return is_root ? ROOT_GONE : GO_ON;
    if (ev->len == 0) return GO_ON;
    if (is_upload_tmp(ev->name)) {
        if ((ev->mask & IN_MOVED_FROM) && !strncmp(ev->name, UPDATE_TMP_PREFIX, sizeof UPDATE_TMP_PREFIX - 1))
            w->update_cookie = ev->cookie;
        return GO_ON;
    }
    char rel[PATH_MAX];
    if (join(w->dirs[at].rel, ev->name, rel) < 0) return GO_ON;
    int is_dir = (ev->mask & IN_ISDIR) != 0;
    if ((ev->mask & IN_MOVED_TO) && ev->cookie && ev->cookie == w->update_cookie) {
        w->update_cookie = 0; /* an upload replaced the file: its content changed, as a write would */
        return push(w, WATCH_MODIFY, lstat_type(w, rel, WATCH_FILE), rel);
    }
    if (ev->mask & (IN_CREATE | IN_MOVED_TO)) {
        if (push(w, WATCH_CREATE, is_dir ? WATCH_DIR : lstat_type(w, rel, WATCH_FILE), rel) < 0) return CLIENT_GONE;
        if (is_dir && w->recursive) {
            int added = add_dir(w, rel);
            if (added == 1) return walk(w, rel, 1, 1);
            if (w->full) return push(w, WATCH_OVERFLOW, WATCH_DIR, "");
        }
        return GO_ON;
    }
    if (ev->mask & (IN_MODIFY | IN_CLOSE_WRITE)) return push(w, WATCH_MODIFY, lstat_type(w, rel, WATCH_FILE), rel);
    if (ev->mask & (IN_DELETE | IN_MOVED_FROM)) {
        if (is_dir && (ev->mask & IN_MOVED_FROM)) unwatch_tree(w, rel);
        return push(w, WATCH_DELETE, is_dir ? WATCH_DIR : WATCH_FILE, rel);
    }
    return GO_ON;
}

static int serve(struct watch *w) {
    /* Room for a burst of events; an event is at most sizeof(struct inotify_event) + NAME_MAX + 1. */
    static char buf[64 << 10] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        int timeout = -1;
        if (w->npending) {
            int64_t now = mono_ms(), due = w->last_ms + WATCH_QUIET_MS;
            if (due > w->first_ms + WATCH_BATCH_MS) due = w->first_ms + WATCH_BATCH_MS;
            timeout = due > now ? (int)(due - now) : 0;
        }
        struct pollfd pfd[2] = {{w->sock, POLLIN | POLLRDHUP, 0}, {w->ifd, POLLIN, 0}};
        int n = poll(pfd, 2, timeout);
        if (n < 0 && errno != EINTR) return CLIENT_GONE;
        /* The client sends nothing after WATCH: anything readable is its hang-up. */
        if (pfd[0].revents) return CLIENT_GONE;
        if (n == 0 || (n < 0 && errno == EINTR)) {
            if (w->npending && flush(w) < 0) return CLIENT_GONE;
            continue;
        }
        if (pfd[1].revents & POLLIN) {
            ssize_t got;
            while ((got = read(w->ifd, buf, sizeof buf)) > 0) {
                for (char *p = buf; p < buf + got;) {
                    const struct inotify_event *ev = (const struct inotify_event *)p;
                    int rc = on_event(w, ev);
                    if (rc == ROOT_GONE) return ROOT_GONE;
                    if (rc < 0) return CLIENT_GONE;
                    p += sizeof *ev + ev->len;
                }
            }
        }
        if (w->npending) {
            int64_t now = mono_ms();
            if ((now >= w->last_ms + WATCH_QUIET_MS || now >= w->first_ms + WATCH_BATCH_MS) && flush(w) < 0)
                return CLIENT_GONE;
        }
    }
}

int handle_watch(int sock, const unsigned char *payload, uint32_t len) {
    struct cursor c = {payload, len, 0};
    uint32_t flags = cur_u32(&c);
    char *path = cur_str(&c);
    if (c.bad) return send_error(sock, E_BAD_PATH, "malformed watch request");
    if (path[0] != '/' || strlen(path) >= PATH_MAX) {
        free(path);
        return send_error(sock, E_BAD_PATH, "path must be absolute and under %d bytes", PATH_MAX);
    }
    struct stat st;
    if (stat(path, &st) < 0) {
        int e = errno;
        send_error(sock, e == ENOENT || e == ENOTDIR ? E_FILE_NOT_FOUND : E_BAD_PATH, "%s: %s", path, strerror(e));
        free(path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        send_error(sock, E_NOT_DIRECTORY, "%s is not a directory", path);
        free(path);
        return -1;
    }
    static struct watch w; /* a handler serves one watch, then exits */
    memset(&w, 0, sizeof w);
    w.sock = sock;
    w.recursive = (flags & WATCH_RECURSIVE) != 0;
    snprintf(w.root, sizeof w.root, "%s", path);
    size_t rl = strlen(w.root);
    while (rl > 1 && w.root[rl - 1] == '/') w.root[--rl] = 0;
    free(path);
    w.dirs = calloc(WATCH_MAX_DIRS, sizeof *w.dirs);
    w.ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (!w.dirs || w.ifd < 0) {
        int e = errno;
        free(w.dirs);
        if (w.ifd >= 0) close(w.ifd);
        return send_error(sock, E_WATCH_UNAVAILABLE, "no inotify instance: %s", strerror(e));
    }
    int rc = add_dir(&w, "");
    if (rc < 0) {
        int e = errno;
        send_error(sock, e == ENOENT ? E_FILE_NOT_FOUND : e == ENOSPC ? E_WATCH_UNAVAILABLE : E_BAD_PATH,
                   "cannot watch %s: %s", w.root, strerror(e));
    } else {
        if (w.recursive) walk(&w, "", 1, 0);
        unsigned char ok[8];
        put_u32(ok, (uint32_t)w.ndirs);
        put_u32(ok + 4, w.full ? WATCH_INCOMPLETE : 0);
        if (send_frame(sock, FR_OK, ok, sizeof ok) == 0 && serve(&w) == ROOT_GONE && flush(&w) == 0)
            send_error(sock, E_FILE_NOT_FOUND, "the watched directory %s was removed or moved", w.root);
    }
    for (int i = 0; i < w.npending; i++) free(w.pending[i].path);
    for (int i = 0; i < w.ndirs; i++) free(w.dirs[i].rel);
    free(w.dirs);
    close(w.ifd);
    return -1;
}
