// atomic_file.c: the one owner of output temporaries. Every file a tool writes is created under an
// unpredictable temporary name beside its final path ("<path>.tmp.<pid>.<6 random>.<host>"),
// exclusively and without following a symlink planted there (O_CREAT|O_EXCL|O_NOFOLLOW), and
// appears under its final name only when complete (fsync + rename + directory fsync). Temporaries
// are removed on exit and on SIGINT/SIGTERM/SIGHUP; those a killed process left behind (its pid is
// no longer running on this host) are removed, with a notice, when a later run writes beside them.
#include "core.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define NAME_RANDOM 6          // random characters in a temporary's name
#define CREATE_ATTEMPTS 100    // name collisions tolerated before giving up

// The cleanup registry is a fixed table so the signal handler can walk it without allocating.
#define MAX_CLEANUP 256
static char *cleanup_paths[MAX_CLEANUP];
static pthread_mutex_t cleanup_lock = PTHREAD_MUTEX_INITIALIZER;
static int cleanup_installed;
static void (*stop_handler)(int);  // a tool's own handler for the stop signals, if it set one

// Files first, then directories (a private temporary directory is empty once its file is gone);
// unlink and rmdir are async-signal-safe, and each fails harmlessly on the other kind.
static void remove_registered(void) {
    for (int i = 0; i < MAX_CLEANUP; i++) {
        char *p = cleanup_paths[i];
        if (p) unlink(p);
    }
    for (int i = 0; i < MAX_CLEANUP; i++) {
        char *p = cleanup_paths[i];
        if (p) rmdir(p);
    }
}

static void on_fatal_signal(int sig) {
    remove_registered();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void set_handler(int sig, void (*fn)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(sig, &sa, NULL);
}

// SIGHUP is replaced whatever handler is there: MPI's transport libraries install one that
// swallows it, and a hang-up must end the tool like SIGTERM does.
static void install_cleanup(void) {
    if (cleanup_installed) return;
    cleanup_installed = 1;
    atexit(remove_registered);
    if (stop_handler) return;
    int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        struct sigaction old;
        sigaction(sigs[i], NULL, &old);
        if (old.sa_handler == SIG_DFL || sigs[i] == SIGHUP) set_handler(sigs[i], on_fatal_signal);
    }
}

void neox_set_stop_handler(void (*handler)(int)) {
    pthread_mutex_lock(&cleanup_lock);
    stop_handler = handler;
    int sigs[] = {SIGTERM, SIGUSR1, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) set_handler(sigs[i], handler);
    pthread_mutex_unlock(&cleanup_lock);
}

void neox_cleanup_register(const char *path) {
    pthread_mutex_lock(&cleanup_lock);
    install_cleanup();
    for (int i = 0; i < MAX_CLEANUP; i++)
        if (!cleanup_paths[i]) {
            cleanup_paths[i] = neox_strdup(path);
            break;
        }
    pthread_mutex_unlock(&cleanup_lock);
}

void neox_cleanup_unregister(const char *path) {
    pthread_mutex_lock(&cleanup_lock);
    for (int i = 0; i < MAX_CLEANUP; i++)
        if (cleanup_paths[i] && !strcmp(cleanup_paths[i], path)) {
            char *p = cleanup_paths[i];
            cleanup_paths[i] = NULL;
            free(p);
            break;
        }
    pthread_mutex_unlock(&cleanup_lock);
}

// ---- temporary names ----------------------------------------------------------------------------

static void host_name(char *buf, size_t size) {
    if (gethostname(buf, size) != 0) snprintf(buf, size, "localhost");
    buf[size - 1] = '\0';
    for (char *c = buf; *c; c++)
        if (*c == '/') *c = '_';
}

int neox_random_bytes(unsigned char *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = getrandom(buf + got, n - got, 0);
        if (k > 0) got += (size_t)k;
        else if (errno != EINTR) return -1;
    }
    return 0;
}

// NULL with errno set when fill finds no random bytes.
static char *temp_name(const char *path, neox_random_fill fill) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char raw[NAME_RANDOM];
    char rnd[NAME_RANDOM + 1], host[64];
    if (fill(raw, sizeof raw) != 0) return NULL;
    for (int i = 0; i < NAME_RANDOM; i++) rnd[i] = alphabet[raw[i] % (sizeof alphabet - 1)];
    rnd[NAME_RANDOM] = '\0';
    host_name(host, sizeof host);
    return neox_asprintf("%s.tmp.%ld.%s.%s", path, (long)getpid(), rnd, host);
}

// Whether name is a temporary (of any final name) made on this host by a process no longer
// running; *pid gets its process id.
static int is_stale_temporary(const char *name, const char *host, long *pid) {
    for (const char *at = strstr(name, ".tmp."); at; at = strstr(at + 1, ".tmp.")) {
        char *end;
        long p = strtol(at + 5, &end, 10);
        if (end == at + 5 || *end != '.' || p <= 0) continue;
        const char *rnd = end + 1;
        if (strspn(rnd, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") != NAME_RANDOM ||
            rnd[NAME_RANDOM] != '.' || strcmp(rnd + NAME_RANDOM + 1, host))
            continue;
        *pid = p;
        return p != (long)getpid() && kill((pid_t)p, 0) != 0 && errno == ESRCH;
    }
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

int neox_cleanup_stale(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    char host[64];
    host_name(host, sizeof host);
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long pid;
        if (!is_stale_temporary(e->d_name, host, &pid)) continue;
        char *path = neox_asprintf("%s/%s", dir, e->d_name);
        nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
        if (access(path, F_OK) != 0) {
            neox_notice("removed %s, a temporary left by process %ld (no longer running)", path, pid);
            removed++;
        }
        free(path);
    }
    closedir(d);
    return removed;
}

static void cleanup_stale_beside(const char *path) {
    char *copy = neox_strdup(path);
    neox_cleanup_stale(dirname(copy));
    free(copy);
}

int neox_temp_create_with(const char *path, neox_random_fill fill, char **tmp_out, neox_error *err) {
    cleanup_stale_beside(path);
    for (int attempt = 0; attempt < CREATE_ATTEMPTS; attempt++) {
        char *tmp = temp_name(path, fill);
        if (!tmp) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot create: no random bytes for a temporary name: %s",
                                   path, strerror(errno));
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd >= 0) {
            neox_cleanup_register(tmp);
            *tmp_out = tmp;
            return fd;
        }
        int e = errno;
        free(tmp);
        if (e != EEXIST) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot create: %s", path, strerror(e));
    }
    return neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot create: no free temporary name after %d tries", path,
                     CREATE_ATTEMPTS);
}

int neox_temp_create(const char *path, char **tmp_out, neox_error *err) {
    return neox_temp_create_with(path, neox_random_bytes, tmp_out, err);
}

static char *temp_dir_create(const char *path, mode_t mode, neox_error *err) {
    cleanup_stale_beside(path);
    for (int attempt = 0; attempt < CREATE_ATTEMPTS; attempt++) {
        char *tmp = temp_name(path, neox_random_bytes);
        if (!tmp) {
            neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot create directory: no random bytes for a temporary name: %s",
                      path, strerror(errno));
            return NULL;
        }
        if (mkdir(tmp, mode) == 0) return tmp;  // mkdir never follows a symlink at the name
        int e = errno;
        free(tmp);
        if (e != EEXIST) {
            neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot create directory: %s", path, strerror(e));
            return NULL;
        }
    }
    neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot create directory: no free temporary name", path);
    return NULL;
}

char *neox_temp_dir_create(const char *path, neox_error *err) { return temp_dir_create(path, 0777, err); }

// A library that creates its file by name (HDF5) cannot be handed a descriptor, and a name
// reopened in a directory others can write is a race (the file swapped for a symlink between
// our exclusive create and the library's open). Inside a directory of our own that nobody else
// can enter, the name is ours until we rename the file out.
int neox_private_temp_create(const char *path, char **tmp_file, neox_error *err) {
    char *dir = temp_dir_create(path, 0700, err);
    if (!dir) return -1;
    char *copy = neox_strdup(path);
    *tmp_file = neox_asprintf("%s/%s", dir, basename(copy));
    free(copy);
    neox_cleanup_register(dir);
    neox_cleanup_register(*tmp_file);
    free(dir);
    return 0;
}

void neox_private_temp_remove(const char *tmp_file) {
    char *dir = neox_strdup(tmp_file);
    char *slash = strrchr(dir, '/');
    *slash = '\0';
    unlink(tmp_file);
    rmdir(dir);
    neox_cleanup_unregister(tmp_file);
    neox_cleanup_unregister(dir);
    free(dir);
}

char *neox_scratch_dir_create(const char *name, neox_error *err) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    char *tmpl = neox_asprintf("%s/%s.XXXXXX", base, name);
    if (mkdtemp(tmpl)) return tmpl;  // mode 0700, a random name, created exclusively
    neox_fail(err, NEOX_EXIT_FAILURE, "cannot create a temporary directory in %s (TMPDIR): %s", base, strerror(errno));
    free(tmpl);
    return NULL;
}

void neox_remove_tree(const char *path) {
    if (path) nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

// ---- files written in place ----------------------------------------------------------------------

int neox_open_output(const char *path, int flags, neox_error *err) {
    int fd = open(path, flags | O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0) return fd;
    if (errno == ELOOP)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: is a symbolic link; refusing to write through it", path);
    return neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot open for writing: %s", path, strerror(errno));
}

// ---- publishing ---------------------------------------------------------------------------------

int neox_fsync_dir_of(const char *path, neox_error *err) {
    char *copy = neox_strdup(path);
    const char *dir = dirname(copy);
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    int rc = 0;
    if (fd < 0 || fsync(fd) != 0)
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot sync directory: %s", dir, strerror(errno));
    if (fd >= 0) close(fd);
    free(copy);
    return rc;
}

int neox_publish_file(const char *tmp, const char *path, neox_error *err) {
    int fd = open(tmp, O_RDONLY | O_NOFOLLOW);
    int rc = fd < 0 || fsync(fd) != 0 ? neox_fail(err, NEOX_EXIT_FAILURE, "%s: write failed: %s", path, strerror(errno)) : 0;
    if (fd >= 0) close(fd);
    if (rc == 0 && rename(tmp, path) != 0)
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot rename into place: %s", path, strerror(errno));
    return rc == 0 ? neox_fsync_dir_of(path, err) : rc;
}

neox_atomic_file *neox_atomic_open(const char *path, neox_error *err) {
    char *tmp;
    int fd = neox_temp_create(path, &tmp, err);
    if (fd < 0) return NULL;
    FILE *fp = fdopen(fd, "wb");
    if (!fp) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot create: %s", path, strerror(errno));
        close(fd);
        unlink(tmp);
        neox_cleanup_unregister(tmp);
        free(tmp);
        return NULL;
    }
    neox_atomic_file *af = neox_calloc(1, sizeof *af);
    af->fp = fp;
    af->path = neox_strdup(path);
    af->tmp_path = tmp;
    return af;
}

static void atomic_free(neox_atomic_file *af) {
    neox_cleanup_unregister(af->tmp_path);
    free(af->path);
    free(af->tmp_path);
    free(af);
}

void neox_atomic_abort(neox_atomic_file *af) {
    if (!af) return;
    if (af->fp) fclose(af->fp);
    unlink(af->tmp_path);
    atomic_free(af);
}

int neox_atomic_commit(neox_atomic_file *af, neox_error *err) {
    int failed = fflush(af->fp) != 0 || ferror(af->fp);
    int saved = errno;
    if (!failed && fsync(fileno(af->fp)) != 0) failed = 1, saved = errno;
    if (fclose(af->fp) != 0 && !failed) failed = 1, saved = errno;
    af->fp = NULL;
    if (failed) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: write failed: %s", af->path, strerror(saved));
        neox_atomic_abort(af);
        return -1;
    }
    if (rename(af->tmp_path, af->path) != 0) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot rename into place: %s", af->path, strerror(errno));
        neox_atomic_abort(af);
        return -1;
    }
    int rc = neox_fsync_dir_of(af->path, err);
    atomic_free(af);
    return rc;
}

int neox_atomic_write(const char *path, const void *data, size_t size, neox_error *err) {
    neox_atomic_file *af = neox_atomic_open(path, err);
    if (!af) return -1;
    if (size && fwrite(data, 1, size, af->fp) != size) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: write failed: %s", af->path, strerror(errno));
        neox_atomic_abort(af);
        return -1;
    }
    return neox_atomic_commit(af, err);
}
