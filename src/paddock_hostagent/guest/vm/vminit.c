/*
 * paddock-vminit: the first program of a Paddock VM after the initramfs switched root.
 *
 * It forks the channel multiplexer, then execs the guest agent (paddock-guest --listen) as PID 1, so
 * the VM runs the same agent, with the same protocol, as a container. The host reaches the agent over
 * one virtio-serial port ("paddock.0"); the agent's protocol needs one connection per request, so both
 * ends multiplex connections over the port (the host side is drivers/vm/vmchannel.py):
 *
 *   frame: u32 channel, u8 kind, u32 length (little endian), payload
 *   host -> guest   HELLO (magic)   reset: every channel is closed, the guest answers READY
 *                   OPEN            connect a new channel to the agent's unix socket
 *                   DATA bytes      to that channel's connection
 *                   CLOSE           the host closed its end: close ours (the agent kills the command)
 *                   CONFIG text     "ip gateway hostname [mac [unix_time seed_hex]]": a restored or forked
 *                                   VM's own identity: eth0's address, route and MAC, the hostname,
 *                                   /etc/hosts and resolv.conf, the wall clock, and the kernel's random
 *                                   pool reseeded from the host's bytes (a restored VM's RNG state is
 *                                   otherwise its saved state's, the same in every sandbox)
 *   guest -> host   READY (magic)   the multiplexer is up (at start, and after every HELLO)
 *                   DATA, CLOSE     from the agent's side of a channel
 *                   OOM u32         the guest kernel's OOM kill count (/proc/vmstat oom_kill), sent
 *                                   after READY and whenever it changes (checked once a second)
 *
 * A HELLO is recognised by its magic anywhere in the stream while the guest is (re)synchronising (at
 * start, after a malformed frame or after the host end hung up), so a VM restored from a memory
 * snapshot with half a frame in flight finds the frame boundary again.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <linux/random.h>
#include <arpa/inet.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <net/route.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define AGENT "/run/paddock/paddock-guest"
#define AGENT_SOCKET "/run/paddock/guest.sock"
#define VOLUMES "/run/paddock/volumes" /* "<serial> <ro|rw> <mount path>" lines, written by /init */
#define PORT_NAME "paddock.0"
#define MAX_CHANNELS 512
#define MAX_PAYLOAD (1u << 20)
#define HEADER 9

enum { K_HELLO = 1, K_OPEN = 2, K_DATA = 3, K_CLOSE = 4, K_CONFIG = 5, K_READY = 6, K_OOM = 7 };
static const unsigned char MAGIC[16] = "paddock-vmchan-1";

struct channel {
    uint32_t id;
    int fd;
    unsigned char *out;
    size_t out_len, out_cap;
};

static struct channel channels[MAX_CHANNELS];
static int port = -1;

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = v; p[1] = v >> 8; p[2] = v >> 16; p[3] = v >> 24;
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int write_all(int fd, const unsigned char *data, size_t len) {
    while (len) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) { struct pollfd p = {fd, POLLOUT, 0}; poll(&p, 1, 100); continue; }
        if (n <= 0) return -1;
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

static void send_frame(uint32_t id, int kind, const unsigned char *payload, uint32_t len) {
    unsigned char header[HEADER];
    put_u32(header, id);
    header[4] = (unsigned char)kind;
    put_u32(header + 5, len);
    if (write_all(port, header, HEADER) == 0 && len) write_all(port, payload, len);
}

static struct channel *find(uint32_t id) {
    for (int i = 0; i < MAX_CHANNELS; i++)
        if (channels[i].fd >= 0 && channels[i].id == id) return &channels[i];
    return NULL;
}

static void drop(struct channel *ch) {
    shutdown(ch->fd, SHUT_RDWR);
    close(ch->fd);
    ch->fd = -1;
    free(ch->out);
    ch->out = NULL;
    ch->out_len = ch->out_cap = 0;
}

static void drop_all(void) {
    for (int i = 0; i < MAX_CHANNELS; i++)
        if (channels[i].fd >= 0) drop(&channels[i]);
}

static void open_channel(uint32_t id) {
    struct channel *slot = NULL;
    for (int i = 0; i < MAX_CHANNELS && !slot; i++)
        if (channels[i].fd < 0) slot = &channels[i];
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strcpy(addr.sun_path, AGENT_SOCKET);
    if (!slot || fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        if (fd >= 0) close(fd);
        send_frame(id, K_CLOSE, NULL, 0); /* the agent is not listening yet: the host retries */
        return;
    }
    slot->id = id;
    slot->fd = fd;
}

static void flush_channel(struct channel *ch) {
    while (ch->out_len) {
        ssize_t n = write(ch->fd, ch->out, ch->out_len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return;
        if (n <= 0) { send_frame(ch->id, K_CLOSE, NULL, 0); drop(ch); return; }
        memmove(ch->out, ch->out + n, ch->out_len - (size_t)n);
        ch->out_len -= (size_t)n;
    }
}

static void queue(struct channel *ch, const unsigned char *data, uint32_t len) {
    if (ch->out_len + len > ch->out_cap) {
        size_t cap = (ch->out_len + len) * 2;
        unsigned char *grown = realloc(ch->out, cap);
        if (!grown) { send_frame(ch->id, K_CLOSE, NULL, 0); drop(ch); return; }
        ch->out = grown;
        ch->out_cap = cap;
    }
    memcpy(ch->out + ch->out_len, data, len);
    ch->out_len += len;
    flush_channel(ch);
}

/* Bytes of host randomness mixed into the guest kernel's pool, then a reseed of its generator. */
static void reseed(const char *hex) {
    struct { struct rand_pool_info info; uint32_t words[16]; } entropy;
    size_t len = strlen(hex) / 2;
    if (len == 0 || len > sizeof entropy.words || strlen(hex) % 2) return;
    unsigned char *bytes = (unsigned char *)entropy.words;
    for (size_t i = 0; i < len; i++) {
        unsigned int byte;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1) return;
        bytes[i] = (unsigned char)byte;
    }
    entropy.info.entropy_count = (int)(len * 8);
    entropy.info.buf_size = (int)len;
    int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return;
    if (ioctl(fd, RNDADDENTROPY, &entropy.info) < 0) perror("RNDADDENTROPY");
    if (ioctl(fd, RNDRESEEDCRNG) < 0) perror("RNDRESEEDCRNG");
    close(fd);
}

static int valid_mac(const char *mac) {
    unsigned int b[6];
    char tail;
    return strlen(mac) == 17 &&
           sscanf(mac, "%2x:%2x:%2x:%2x:%2x:%2x%c", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &tail) == 6 &&
           !(b[0] & 1);
}

/* eth0's settings by ioctl, not by running ip(8): each process started costs tens of milliseconds
 * under TCG, and a restored create waits for this. */
static int set_interface(int fd, unsigned long request, struct ifreq *req, const char *what) {
    if (ioctl(fd, request, req) == 0) return 0;
    fprintf(stderr, "paddock-vminit: %s: %s\n", what, strerror(errno));
    return -1;
}

static void set_ipv4(struct sockaddr *into, struct in_addr address) {
    struct sockaddr_in *in = (struct sockaddr_in *)into;
    memset(in, 0, sizeof *in);
    in->sin_family = AF_INET;
    in->sin_addr = address;
}

static void add_route(int fd, struct in_addr destination, struct in_addr gateway, int host) {
    struct rtentry route;
    memset(&route, 0, sizeof route);
    set_ipv4(&route.rt_dst, destination);
    set_ipv4(&route.rt_genmask, (struct in_addr){host ? 0xffffffffu : 0});
    set_ipv4(&route.rt_gateway, gateway);
    route.rt_flags = RTF_UP | (host ? RTF_HOST : RTF_GATEWAY);
    static char eth0[] = "eth0";
    route.rt_dev = eth0;
    if (ioctl(fd, SIOCADDRT, &route) < 0 && errno != EEXIST) perror("paddock-vminit: SIOCADDRT");
}

/* CONFIG "ip gateway hostname [mac [unix_time seed_hex]]": a VM restored from a saved state or from its
 * fork source's memory takes its own identity. The host sends it before any request on the channel, and
 * frames are handled in order, so the agent's first answer comes after it is applied. */
static void configure(const unsigned char *payload, uint32_t len) {
    char text[512], ip[64], gw[64], host[256], mac[32] = "", when[32] = "", seed[160] = "";
    struct in_addr address, gateway;
    if (len >= sizeof text) return;
    memcpy(text, payload, len);
    text[len] = 0;
    if (sscanf(text, "%63s %63s %255s %31s %31s %159s", ip, gw, host, mac, when, seed) < 3) return;
    if (inet_pton(AF_INET, ip, &address) != 1 || inet_pton(AF_INET, gw, &gateway) != 1) return;
    if (when[0]) {
        /* the saved state's clock is hours or days old: take the host's */
        long long sec = 0, nsec = 0;
        if (sscanf(when, "%lld.%9lld", &sec, &nsec) >= 1 && sec > 0) {
            struct timespec now = {.tv_sec = (time_t)sec, .tv_nsec = (long)nsec};
            if (clock_settime(CLOCK_REALTIME, &now) < 0) perror("clock_settime");
        }
    }
    if (seed[0]) reseed(seed);
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        struct ifreq req;
        memset(&req, 0, sizeof req);
        strcpy(req.ifr_name, "eth0");
        /* down drops eth0's routes and neighbour cache: the gateway's MAC is the new veth's */
        if (set_interface(fd, SIOCGIFFLAGS, &req, "SIOCGIFFLAGS") == 0) {
            short flags = req.ifr_flags;
            req.ifr_flags = (short)(flags & ~IFF_UP);
            set_interface(fd, SIOCSIFFLAGS, &req, "eth0 down");
            unsigned int b[6];
            if (mac[0] && valid_mac(mac)) {
                sscanf(mac, "%2x:%2x:%2x:%2x:%2x:%2x", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5]);
                req.ifr_hwaddr.sa_family = ARPHRD_ETHER;
                for (int i = 0; i < 6; i++) req.ifr_hwaddr.sa_data[i] = (char)b[i];
                set_interface(fd, SIOCSIFHWADDR, &req, "eth0 MAC");
            }
            set_ipv4(&req.ifr_addr, address);
            set_interface(fd, SIOCSIFADDR, &req, "eth0 address");
            set_ipv4(&req.ifr_netmask, (struct in_addr){0xffffffffu});
            set_interface(fd, SIOCSIFNETMASK, &req, "eth0 netmask");
            req.ifr_flags = (short)(flags | IFF_UP);
            set_interface(fd, SIOCSIFFLAGS, &req, "eth0 up");
            add_route(fd, gateway, (struct in_addr){0}, 1);
            add_route(fd, (struct in_addr){0}, gateway, 0);
        }
        close(fd);
    }
    if (sethostname(host, strlen(host)) < 0) perror("sethostname");
    FILE *f = fopen("/etc/hostname", "w");
    if (f) { fprintf(f, "%s\n", host); fclose(f); }
    f = fopen("/etc/hosts", "w");
    if (f) { fprintf(f, "127.0.0.1 localhost\n%s %s\n", ip, host); fclose(f); }
    unlink("/etc/resolv.conf"); /* a symlink in some images (systemd-resolved's) */
    f = fopen("/etc/resolv.conf", "w");
    if (f) { fprintf(f, "nameserver %s\noptions timeout:2 attempts:2\n", gw); fclose(f); }
}

static long oom_reported = -1;
static time_t oom_checked;

/* Sends the OOM kill count when it changed (or when ``force``), at most one check a second. */
static void report_oom(int force) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (!force && now.tv_sec == oom_checked) return;
    oom_checked = now.tv_sec;
    FILE *f = fopen("/proc/vmstat", "r");
    if (!f) return;
    char line[128];
    long count = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "oom_kill %ld", &count) == 1) break;
    fclose(f);
    if (count < 0 || (!force && count == oom_reported)) return;
    unsigned char payload[4];
    put_u32(payload, (uint32_t)count);
    send_frame(0, K_OOM, payload, sizeof payload);
    oom_reported = count;
}

static int find_port(void) {
    for (int attempt = 0; attempt < 500; attempt++) {
        DIR *dir = opendir("/sys/class/virtio-ports");
        struct dirent *entry;
        while (dir && (entry = readdir(dir))) {
            if (entry->d_name[0] == '.') continue;
            char path[300], name[64] = {0};
            snprintf(path, sizeof path, "/sys/class/virtio-ports/%s/name", entry->d_name);
            FILE *f = fopen(path, "r");
            if (!f) continue;
            if (fgets(name, sizeof name, f)) name[strcspn(name, "\n")] = 0;
            fclose(f);
            if (!strcmp(name, PORT_NAME)) {
                snprintf(path, sizeof path, "/dev/%s", entry->d_name);
                closedir(dir);
                return open(path, O_RDWR | O_CLOEXEC);
            }
        }
        if (dir) closedir(dir);
        usleep(10000);
    }
    return -1;
}

static void multiplex(void) {
    static unsigned char in[HEADER + MAX_PAYLOAD];
    size_t in_len = 0;
    int syncing = 1;
    for (int i = 0; i < MAX_CHANNELS; i++) channels[i].fd = -1;
    port = find_port();
    if (port < 0) _exit(1);
    send_frame(0, K_READY, MAGIC, sizeof MAGIC);
    report_oom(1);
    struct pollfd fds[MAX_CHANNELS + 1];
    struct channel *owners[MAX_CHANNELS + 1];
    for (;;) {
        int n = 0;
        fds[n++] = (struct pollfd){port, POLLIN, 0};
        for (int i = 0; i < MAX_CHANNELS; i++) {
            if (channels[i].fd < 0) continue;
            owners[n] = &channels[i];
            fds[n++] = (struct pollfd){channels[i].fd, (short)(POLLIN | (channels[i].out_len ? POLLOUT : 0)), 0};
        }
        int ready = poll(fds, (nfds_t)n, 1000);
        report_oom(0);
        if (ready <= 0) continue;
        for (int i = 1; i < n; i++) {
            struct channel *ch = owners[i];
            if (ch->fd != fds[i].fd) continue;
            if (fds[i].revents & POLLOUT) flush_channel(ch);
            if (ch->fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            static unsigned char buf[65536];
            ssize_t got = read(ch->fd, buf, sizeof buf);
            if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            if (got <= 0) { send_frame(ch->id, K_CLOSE, NULL, 0); drop(ch); continue; }
            send_frame(ch->id, K_DATA, buf, (uint32_t)got);
        }
        if (fds[0].revents & POLLHUP && !(fds[0].revents & POLLIN)) {
            /* the host end hung up (agent restart, or a fork not yet connected): wait for its HELLO */
            drop_all();
            in_len = 0;
            syncing = 1;
            usleep(20000);
            continue;
        }
        if (!(fds[0].revents & POLLIN)) continue;
        ssize_t got = read(port, in + in_len, sizeof in - in_len);
        if (got <= 0) { usleep(10000); continue; }
        in_len += (size_t)got;
        for (;;) {
            if (syncing) {
                size_t i = 0, found = 0;
                for (; i + HEADER + sizeof MAGIC <= in_len; i++)
                    if (in[i + 4] == K_HELLO && get_u32(in + i + 5) == sizeof MAGIC &&
                        !memcmp(in + i + HEADER, MAGIC, sizeof MAGIC)) { found = 1; break; }
                if (!found) {
                    size_t keep = in_len < HEADER + sizeof MAGIC ? in_len : HEADER + sizeof MAGIC - 1;
                    memmove(in, in + in_len - keep, keep);
                    in_len = keep;
                    break;
                }
                memmove(in, in + i, in_len - i);
                in_len -= i;
                syncing = 0;
            }
            if (in_len < HEADER) break;
            uint32_t id = get_u32(in), len = get_u32(in + 5);
            int kind = in[4];
            if (len > MAX_PAYLOAD || kind < K_HELLO || kind > K_CONFIG) { drop_all(); syncing = 1; continue; }
            if (in_len < HEADER + len) break;
            unsigned char *payload = in + HEADER;
            struct channel *ch = find(id);
            switch (kind) {
            case K_HELLO: drop_all(); send_frame(0, K_READY, MAGIC, sizeof MAGIC); report_oom(1); break;
            case K_OPEN: if (ch) drop(ch); open_channel(id); break;
            case K_DATA: if (ch) queue(ch, payload, len); break;
            case K_CLOSE: if (ch) drop(ch); break;
            case K_CONFIG: configure(payload, len); break;
            }
            memmove(in, in + HEADER + len, in_len - HEADER - len);
            in_len -= HEADER + len;
        }
    }
}

/* The virtio-blk disk whose serial is ``serial`` (a volume's drive), as /dev/vdX; waits up to 5 s for
 * it to be probed. */
static int find_disk(const char *serial, char *dev, size_t size) {
    for (int tries = 0; tries < 500; tries++) {
        DIR *dir = opendir("/sys/block");
        struct dirent *entry;
        while (dir && (entry = readdir(dir)) != NULL) {
            if (strncmp(entry->d_name, "vd", 2) != 0) continue;
            char path[300], found[64] = "";
            snprintf(path, sizeof path, "/sys/block/%s/serial", entry->d_name);
            FILE *f = fopen(path, "r");
            if (!f) continue;
            if (fgets(found, sizeof found, f)) found[strcspn(found, "\n")] = 0;
            fclose(f);
            if (strcmp(found, serial) == 0) {
                snprintf(dev, size, "/dev/%s", entry->d_name);
                closedir(dir);
                return 0;
            }
        }
        if (dir) closedir(dir);
        usleep(10000);
    }
    errno = ENODEV;
    return -1;
}

/* mkdir -p inside this root (the VM's own: the host follows none of these paths). */
static int make_dirs(const char *path) {
    char buf[4200];
    if (strlen(path) >= sizeof buf) { errno = ENAMETOOLONG; return -1; }
    strcpy(buf, path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) < 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

/* The local volumes the host gave this VM (extra virtio-blk drives), mounted where the sandbox asked:
 * nosuid, nodev, and read-only for a read-only one (its drive is read-only too; the host replayed the
 * volume's log before giving it). A volume that cannot be mounted stops the VM: its create fails rather
 * than write the data onto the root disk. */
static void mount_volumes(void) {
    FILE *f = fopen(VOLUMES, "r");
    if (!f) return;
    char serial[64], mode[8], path[4200], dev[300];
    while (fscanf(f, "%63s %7s %4199s", serial, mode, path) == 3) {
        int ro = strcmp(mode, "ro") == 0;
        unsigned long flags = MS_NOSUID | MS_NODEV | (ro ? MS_RDONLY : 0);
        if (find_disk(serial, dev, sizeof dev) < 0 || make_dirs(path) < 0 ||
            mount(dev, path, "xfs", flags, NULL) < 0) {
            fprintf(stderr, "paddock: cannot mount volume %s at %s: %s\n", serial, path, strerror(errno));
            sync();
            reboot(RB_POWER_OFF);
            _exit(1);
        }
        unlink(dev); /* as the root disk's: no node for it */
    }
    fclose(f);
    unlink(VOLUMES);
}

int main(void) {
    mount_volumes();
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGPIPE, SIG_IGN);
        FILE *adj = fopen("/proc/self/oom_score_adj", "w"); /* the channel outlives any memory hog */
        if (adj) { fputs("-1000", adj); fclose(adj); }
        multiplex();
        _exit(0);
    }
    /* As a container's runtime does: kernel settings and the sysrq trigger read-only. */
    static const char *const readonly[] = {"/proc/sys", "/proc/sysrq-trigger"};
    for (size_t i = 0; i < sizeof readonly / sizeof readonly[0]; i++)
        if (mount(readonly[i], readonly[i], NULL, MS_BIND | MS_REC, NULL) < 0 ||
            mount(NULL, readonly[i], NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  NULL) < 0)
            perror(readonly[i]);
    /* The agent and every command it starts keep the container tier's capabilities (Docker's default
     * set less NET_RAW, and less MKNOD): no mount, raw sockets, modules, raw memory or device nodes,
     * sysctls or network configuration inside the VM. The multiplexer, forked above, keeps all (it
     * re-addresses a fork's eth0). */
    static const int keep[] = {CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID, CAP_KILL, CAP_SETGID,
                               CAP_SETUID, CAP_SETPCAP, CAP_NET_BIND_SERVICE, CAP_SYS_CHROOT, CAP_AUDIT_WRITE,
                               CAP_SETFCAP};
    for (int cap = 0; cap <= 63; cap++) {
        int kept = 0;
        for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) kept |= keep[i] == cap;
        if (!kept && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL) perror("PR_CAPBSET_DROP");
    }
    execl(AGENT, "paddock-guest", "--listen", AGENT_SOCKET, "--self-signal", (char *)NULL);
    perror("exec " AGENT);
    return 1;
}
