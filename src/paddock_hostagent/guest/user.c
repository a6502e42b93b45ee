/* Running a command as another user of the sandbox (EXEC_AS, PROC START_AS).
 *
 * The name is resolved here, inside the sandbox, from the sandbox's own /etc/passwd and /etc/group
 * (fgetpwent/fgetgrent read the files directly: no NSS, which a static binary cannot load). A numeric
 * uid that has no entry runs with gid = uid, no supplementary groups and HOME=/, as `docker exec -u`
 * does. The child drops to it with setgroups, setgid, setuid, in that order, before chdir and exec. */
#include "guest.h"

#include <ctype.h>
#include <grp.h>
#include <pwd.h>

static int all_digits(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s)) return 0;
    return 1;
}

int resolve_user(const char *spec, struct run_as *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    int numeric = all_digits(spec);
    unsigned long uid = 0;
    if (numeric) {
        errno = 0;
        uid = strtoul(spec, NULL, 10);
        if (errno || uid > 0x7fffffffUL) {
            snprintf(err, err_len, "uid %s is out of range", spec);
            return -1;
        }
    }
    int found = 0;
    FILE *f = fopen("/etc/passwd", "re");
    if (f) {
        struct passwd *pw;
        while ((pw = fgetpwent(f)) != NULL) {
            if (numeric ? pw->pw_uid == (uid_t)uid : !strcmp(pw->pw_name, spec)) {
                out->uid = pw->pw_uid;
                out->gid = pw->pw_gid;
                snprintf(out->name, sizeof out->name, "%s", pw->pw_name);
                snprintf(out->home, sizeof out->home, "%s", pw->pw_dir && pw->pw_dir[0] ? pw->pw_dir : "/");
                found = 1;
                break;
            }
        }
        fclose(f);
    }
    if (!found) {
        if (!numeric) {
            snprintf(err, err_len, "no user named '%s' in the sandbox's /etc/passwd", spec);
            return -1;
        }
        out->uid = out->gid = (uid_t)uid;
        snprintf(out->name, sizeof out->name, "%s", spec);
        snprintf(out->home, sizeof out->home, "/");
        out->ngroups = 0;
        return 0;
    }
    out->groups[out->ngroups++] = out->gid;
    f = fopen("/etc/group", "re");
    if (f) {
        struct group *gr;
        while ((gr = fgetgrent(f)) != NULL && out->ngroups < RUN_AS_MAX_GROUPS) {
            if (gr->gr_gid == out->gid || !gr->gr_mem) continue;
            for (char **m = gr->gr_mem; *m; m++)
                if (!strcmp(*m, out->name)) { out->groups[out->ngroups++] = gr->gr_gid; break; }
        }
        fclose(f);
    }
    return 0;
}

/* Async-signal-safe (system calls only): called in a vfork()ed or fork()ed child. */
int apply_user(const struct run_as *as) {
    if (setgroups((size_t)as->ngroups, as->groups) < 0) return -1;
    if (setgid(as->gid) < 0) return -1;
    if (setuid(as->uid) < 0) return -1;
    return 0;
}

static int is_login_var(const char *var) {
    return !strncmp(var, "USER=", 5) || !strncmp(var, "LOGNAME=", 8);
}

/* Replaces USER and LOGNAME in the NULL-terminated, malloc'd ``*envp`` (``*envc`` entries), and sets
 * HOME to the account's unless the request holds one. The host sends HOME with a user only when the
 * image's ENV or the caller set it, which then wins, as under `docker run -u` (images.ImageConfig.command).
 * A host from before that sent its default HOME=/root with every user: a sandbox's guest outlives host
 * upgrades, not the other way round, so no older host talks to this guest. */
int user_env(char ***envp, uint32_t *envc, const struct run_as *as) {
    char **old = *envp;
    char **env = calloc((size_t)*envc + 4, sizeof(char *));
    if (!env) return -1;
    uint32_t n = 0;
    int has_home = 0;
    for (uint32_t i = 0; i < *envc; i++) {
        if (!old[i]) continue;
        if (is_login_var(old[i])) {
            free(old[i]);
            continue;
        }
        if (!strncmp(old[i], "HOME=", 5)) has_home = 1;
        env[n++] = old[i];
    }
    if (!has_home) {
        if (asprintf(&env[n], "HOME=%s", as->home) < 0) env[n] = NULL; else n++;
    }
    if (asprintf(&env[n], "USER=%s", as->name) < 0) env[n] = NULL; else n++;
    if (asprintf(&env[n], "LOGNAME=%s", as->name) < 0) env[n] = NULL; else n++;
    env[n] = NULL;
    free(old);
    *envp = env;
    *envc = n;
    return 0;
}
