/* WRITE and READ: files streamed in frames, never held whole; writes are atomic (temp file + rename).
 *
 * Every failure the caller can cause is answered with a code the host maps to a 4xx: a path the kernel
 * refuses (too long, a component over NAME_MAX, a loop), a place nothing may be written (read-only
 * mounts such as the agent's own, /proc and /sys, permission denied), a special file (/dev/null, a FIFO)
 * — all E_BAD_PATH with the reason. E_IO is left for what the caller cannot fix. */
#include "guest.h"

#include <sys/stat.h>
#include <sys/vfs.h>

#define PROC_SUPER_MAGIC 0x9fa0
#define SYSFS_MAGIC 0x62656572
#define CGROUP_SUPER_MAGIC 0x27e0eb
#define CGROUP2_SUPER_MAGIC 0x63677270

static int check_path(int sock, const char *path) {
    if (path[0] != '/') { send_error(sock, E_BAD_PATH, "path must be absolute"); return -1; }
    if (strlen(path) >= PATH_MAX) { send_error(sock, E_BAD_PATH, "path too long"); return -1; }
    for (const char *p = path; *p;) {
        const char *end = strchr(p, '/');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n > NAME_MAX) { send_error(sock, E_BAD_PATH, "a path component is over %d bytes", NAME_MAX); return -1; }
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

/* The code for an errno from creating, writing or renaming: the caller's doing (E_BAD_PATH) or not. */
static uint32_t write_error_code(int e) {
    switch (e) {
    case ENAMETOOLONG: case ELOOP: case EINVAL: case ENOTDIR: case EROFS: case EACCES: case EPERM:
    case EXDEV: case EBUSY: case ETXTBSY: case ENOENT: case EEXIST:
        return E_BAD_PATH;
    case EISDIR:
        return E_IS_DIRECTORY;
    default:
        return E_IO;
    }
}

/* Pseudo filesystems hold kernel knobs, not files: nothing is uploaded there. */
static int pseudo_fs(const char *dir) {
    struct statfs fs;
    if (statfs(dir, &fs) < 0) return 0;
    return fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC || fs.f_type == CGROUP_SUPER_MAGIC ||
           fs.f_type == CGROUP2_SUPER_MAGIC;
}

/* mkdir -p of an absolute directory (mode 0755 as spec 11.6 asks); a component that exists and is not a
 * directory is the caller's mistake. Returns 0, or -1 with the error sent. */
static int make_parents(int sock, char *dir, const char *path) {
    for (char *p = dir + 1;; p++) {
        if (*p != '/' && *p != 0) continue;
        char saved = *p;
        *p = 0;
        if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
            int e = errno;
            send_error(sock, write_error_code(e), "cannot create directory %s: %s", dir, strerror(e));
            *p = saved;
            return -1;
        }
        struct stat st;
        if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
            send_error(sock, E_BAD_PATH, "%s: %s is not a directory", path, dir);
            *p = saved;
            return -1;
        }
        *p = saved;
        if (saved == 0) return 0;
    }
}

int handle_write(int sock, const unsigned char *payload, uint32_t len) {
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
    } else if (errno == ENAMETOOLONG || errno == ELOOP) {
        return send_error(sock, E_BAD_PATH, "%s: %s", path, strerror(errno));
    }
    size_t tlen = strlen(target);
    if (target[tlen - 1] == '/') return send_error(sock, E_BAD_PATH, "%s names a directory", path);
    char dir[PATH_MAX];
    memcpy(dir, target, tlen + 1);
    char *slash = strrchr(dir, '/');
    if (slash == dir) dir[1] = 0; else *slash = 0;
    struct stat dst;
    if (stat(dir, &dst) < 0) {
        if (errno != ENOENT) return send_error(sock, write_error_code(errno), "%s: %s", dir, strerror(errno));
        if (make_parents(sock, dir, path) < 0) return -1;
    } else if (!S_ISDIR(dst.st_mode)) {
        return send_error(sock, E_BAD_PATH, "%s: %s is not a directory", path, dir);
    }
    if (pseudo_fs(dir)) return send_error(sock, E_BAD_PATH, "%s is on a kernel pseudo filesystem", path);

    char tmp[PATH_MAX + 32];
    /* The name says whether it replaces a file: a watch (watch.c) reports the rename as a modify then. */
    snprintf(tmp, sizeof tmp, "%s/.paddock-%s-XXXXXX", strcmp(dir, "/") ? dir : "", exists ? "update" : "upload");
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return send_error(sock, write_error_code(e), "cannot create %s in %s: %s", path, dir, strerror(e));
    }
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
        return send_error(sock, write_error_code(e), "cannot write %s: %s", path, strerror(e));
    }
    unsigned char reply[8];
    put_u64(reply, size);
    return send_frame(sock, FR_OK, reply, sizeof reply);
gone:
    close(fd);
    unlink(tmp);
    return -1;
}

int handle_read(int sock, const unsigned char *payload, uint32_t len) {
    struct cursor c = {payload, len, 0};
    char *path = cur_str(&c);
    if (c.bad) return send_error(sock, E_BAD_PATH, "malformed path");
    if (check_path(sock, path) < 0) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR) return send_error(sock, E_FILE_NOT_FOUND, "%s not found", path);
        if (errno == EISDIR) return send_error(sock, E_IS_DIRECTORY, "%s is a directory", path);
        return send_error(sock, write_error_code(errno), "cannot open %s: %s", path, strerror(errno));
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
    /* Frames as large as the protocol allows: the host handles each frame in Python, so four times
     * fewer of them cost it a quarter of the per-frame work. */
    unsigned char *buf = malloc(MAX_DATA_PAYLOAD);
    if (!buf) { close(fd); return send_error(sock, E_IO, "read %s: out of memory", path); }
    uint64_t sent = 0;
    for (;;) {
        size_t want = MAX_DATA_PAYLOAD;
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
