// atomic_file.c: files that appear under their final name only when complete (temp + fsync +
// rename + directory fsync), and removal of leftover temporaries on exit or a fatal signal.
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// The cleanup registry is a fixed table so the signal handler can walk it without allocating.
#define MAX_CLEANUP 256
static char *cleanup_paths[MAX_CLEANUP];
static pthread_mutex_t cleanup_lock = PTHREAD_MUTEX_INITIALIZER;
static int cleanup_installed;

static void remove_registered(void) {
    for (int i = 0; i < MAX_CLEANUP; i++) {
        char *p = cleanup_paths[i];
        if (p) unlink(p);
    }
}

static void on_fatal_signal(int sig) {
    remove_registered();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_cleanup(void) {
    if (cleanup_installed) return;
    cleanup_installed = 1;
    atexit(remove_registered);
    int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        struct sigaction old;
        sigaction(sigs[i], NULL, &old);
        // Leave handlers a tool installed itself (the trainer's checkpoint-on-SIGTERM) alone.
        if (old.sa_handler == SIG_DFL) signal(sigs[i], on_fatal_signal);
    }
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
    int fd = open(tmp, O_RDONLY);
    int rc = fd < 0 || fsync(fd) != 0 ? neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot sync: %s", tmp, strerror(errno)) : 0;
    if (fd >= 0) close(fd);
    if (rc == 0 && rename(tmp, path) != 0)
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot rename into place: %s", path, strerror(errno));
    return rc == 0 ? neox_fsync_dir_of(path, err) : rc;
}

neox_atomic_file *neox_atomic_open(const char *path, neox_error *err) {
    char *tmp = neox_asprintf("%s.tmp.%ld", path, (long)getpid());
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return NULL;
    }
    neox_cleanup_register(tmp);
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
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: write failed: %s", af->tmp_path, strerror(saved));
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
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: write failed: %s", af->tmp_path, strerror(errno));
        neox_atomic_abort(af);
        return -1;
    }
    return neox_atomic_commit(af, err);
}
