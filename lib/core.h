// core.h: what every part of neox.c shares — errors and exit codes, logging with the MPI rank,
// monotonic timers, the progress bar, atomic file writes, checked allocation and the common
// command-line conventions (--help, --version).
#ifndef NEOX_CORE_H
#define NEOX_CORE_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define NEOX_VERSION "0.1.0"

// ---------------------------------------------------------------------------------------------
// Errors: two vocabularies for two kinds of failure (docs/design.md, "Errors").
// A failure of the user's world (a file, a config, the environment, a measurement) is an error:
// library functions never exit for one; they return -1 and fill a neox_error, whose status is the
// exit code a tool should use (1 runtime failure, 2 usage or configuration error). Tools report it
// with neox_die_error(), which prints "<prog>: error: <message>".
// A broken invariant (what no input can cause: a caller's misuse, a schema that does not match its
// table) is a bug: neox_assert(cond, ...) or neox_bug(...) print "<prog>: internal error: <message>
// (a bug in neox.c; please report) at FILE:LINE" and abort, leaving a core dump rather than an error
// a script might retry.
enum { NEOX_EXIT_OK = 0, NEOX_EXIT_FAILURE = 1, NEOX_EXIT_USAGE = 2 };

typedef struct neox_error {
    int status;          // NEOX_EXIT_FAILURE or NEOX_EXIT_USAGE once set; 0 while clear
    char message[2048];
} neox_error;

// Sets err (when not NULL) and returns -1, so callers can write `return neox_fail(err, ...)`.
int neox_fail(neox_error *err, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// Prepends context to an existing message: "<context>: <old message>".
int neox_fail_context(neox_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void neox_error_clear(neox_error *err);

void neox_set_progname(const char *argv0);
const char *neox_progname(void);
// Prints "<prog>: error: <message>" and exits through the exit hook: for tools, and in the library only
// where no error can be returned (out of memory, a failed collective, which ends the whole job).
_Noreturn void neox_die(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
_Noreturn void neox_die_error(const neox_error *err);
// A function neox_die() calls, after printing, before it exits: the parallel layer installs one
// that aborts every MPI rank, so a failure on one rank ends the job instead of hanging it.
void neox_set_exit_hook(void (*hook)(int status));
// Exits through the exit hook (what neox_die and neox_usage_error end with).
_Noreturn void neox_exit(int status);

#define neox_bug(...) neox_bug_at(__FILE__, __LINE__, __VA_ARGS__)
#define neox_assert(cond, ...) ((cond) ? (void)0 : neox_bug_at(__FILE__, __LINE__, __VA_ARGS__))
_Noreturn void neox_bug_at(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// ---------------------------------------------------------------------------------------------
// Logging. Messages go to stderr as "<prog>: <level>: ..." and, when more than one rank runs,
// carry "[rank R]" so interleaved output from mpiexec stays readable. NEOX_LOG_LEVEL=debug|info|
// warning|error sets the threshold (default info).
typedef enum { NEOX_LOG_DEBUG, NEOX_LOG_INFO, NEOX_LOG_NOTICE, NEOX_LOG_WARNING, NEOX_LOG_ERROR } neox_log_level;

void neox_log_set_rank(int rank, int world_size);
// Tags messages with the rank the launcher (mpiexec/PMI, Open MPI, SLURM) announces, before MPI
// is initialised; the parallel layer later sets the MPI rank itself.
void neox_log_from_launcher(void);
int neox_launcher_rank(void);        // 0 when not launched by an MPI launcher
int neox_launcher_world_size(void);  // 1 when not launched by an MPI launcher
void neox_log(neox_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void neox_vlog(neox_log_level level, const char *fmt, va_list ap);
#define neox_info(...) neox_log(NEOX_LOG_INFO, __VA_ARGS__)
#define neox_notice(...) neox_log(NEOX_LOG_NOTICE, __VA_ARGS__)
#define neox_warn(...) neox_log(NEOX_LOG_WARNING, __VA_ARGS__)
#define neox_debug(...) neox_log(NEOX_LOG_DEBUG, __VA_ARGS__)

// ---------------------------------------------------------------------------------------------
// Time. neox_now() is CLOCK_MONOTONIC in seconds; a neox_timer accumulates start/stop intervals.
double neox_now(void);

typedef struct neox_timer {
    double started;   // neox_now() at start, or < 0 when stopped
    double elapsed;   // seconds accumulated over completed intervals
    long count;       // completed intervals
} neox_timer;

void neox_timer_reset(neox_timer *t);
void neox_timer_start(neox_timer *t);
double neox_timer_stop(neox_timer *t);  // returns the interval just ended
double neox_timer_seconds(const neox_timer *t);  // accumulated, including a running interval

// Formats seconds as "1h02m03s", "4m05s" or "6.7s" into buf (at least 16 bytes).
const char *neox_format_duration(double seconds, char *buf, size_t size);
// Formats a count with SI suffix ("1.23M") into buf (at least 16 bytes).
const char *neox_format_count(double value, char *buf, size_t size);
// Formats a byte count as "1.23MB" (SI) into buf (at least 16 bytes).
const char *neox_format_bytes(double bytes, char *buf, size_t size);

// ---------------------------------------------------------------------------------------------
// Progress. On a terminal the line is redrawn in place (at most 10 times a second); otherwise a
// plain line is printed every NEOX_PROGRESS_SECONDS (default 10) seconds, so batch logs stay
// short. Each line shows done/total, the rate and, when the total is known, the ETA.
typedef struct neox_progress neox_progress;

// total <= 0 means unknown. unit names what is counted ("docs", "tokens", "steps").
neox_progress *neox_progress_start(const char *label, double total, const char *unit);
// done is the running total; extra (may be NULL) is appended to the line, e.g. "12.3 MB/s".
void neox_progress_update(neox_progress *p, double done, const char *extra);
void neox_progress_set_total(neox_progress *p, double total);
// Prints the final line (always, also off a terminal) and frees p.
void neox_progress_finish(neox_progress *p, double done, const char *extra);
// Disables all progress output (for --quiet and for ranks other than 0).
void neox_progress_set_enabled(int enabled);

// ---------------------------------------------------------------------------------------------
// Atomic files (lib/core/atomic_file.c, the one owner of output temporaries). Content is written
// to a temporary "<path>.tmp.<pid>.<6 random>.<host>" created exclusively without following
// symlinks (O_CREAT|O_EXCL|O_NOFOLLOW; a name taken is retried with other random characters),
// then fsync'ed and renamed over path, and the directory is fsync'ed, so a reader never sees a
// half-written file under the final name. Errors name the final path. Temporaries still open are
// removed on exit and on SIGINT/SIGTERM/SIGHUP; creating one first removes (with a notice) the
// temporaries beside it that processes no longer running on this host left behind.
typedef struct neox_atomic_file {
    FILE *fp;            // write through this
    char *path;          // final name
    char *tmp_path;      // temporary name
} neox_atomic_file;

neox_atomic_file *neox_atomic_open(const char *path, neox_error *err);
int neox_atomic_commit(neox_atomic_file *af, neox_error *err);  // closes and frees af
void neox_atomic_abort(neox_atomic_file *af);                   // removes the temporary; frees af
// Writes a whole buffer atomically.
int neox_atomic_write(const char *path, const void *data, size_t size, neox_error *err);
// Creates a temporary for path (as above, registered for cleanup); returns its descriptor (open
// for writing) and *tmp (malloc'ed), or -1 + err naming path.
int neox_temp_create(const char *path, char **tmp, neox_error *err);
// The same with the random characters drawn from fill (tests force name collisions with it); fill
// returns 0, or -1 with errno set when it has no random bytes to give.
typedef int (*neox_random_fill)(unsigned char *buf, size_t n);
int neox_temp_create_with(const char *path, neox_random_fill fill, char **tmp, neox_error *err);
int neox_random_bytes(unsigned char *buf, size_t n);  // from the kernel's random source
// Creates a temporary directory for path (mkdir is exclusive and follows no symlink); malloc'ed.
char *neox_temp_dir_create(const char *path, neox_error *err);
// A temporary for a file that a library creates by name (HDF5's H5Fcreate): *tmp_file (malloc'ed,
// not yet existing) inside a fresh directory beside path that only this user may enter (mode
// 0700), so no symlink can be planted at the name between our check and the library's open; the
// library should still create it exclusively. Both are registered for cleanup. Publish the file
// with neox_publish_file, then call neox_private_temp_remove (it also removes an unpublished file).
int neox_private_temp_create(const char *path, char **tmp_file, neox_error *err);
void neox_private_temp_remove(const char *tmp_file);
// A private scratch directory "$TMPDIR/NAME.XXXXXX" (/tmp when TMPDIR is unset; mkdtemp: a random
// name, mode 0700); malloc'ed, or NULL + err naming the directory it could not be made in.
char *neox_scratch_dir_create(const char *name, neox_error *err);
// Removes the temporaries in dir left by processes no longer running on this host (files or
// whole directories), each named in a notice; returns how many.
int neox_cleanup_stale(const char *dir);
// Opens (creating it if missing) an output written in place rather than renamed into place: an
// appended log, a file created exclusively under a fresh name. flags adds O_APPEND, O_EXCL or
// O_TRUNC; a symlink at path is never followed (an error naming path); returns the descriptor or
// -1 + err naming path.
int neox_open_output(const char *path, int flags, neox_error *err);
// Removes a file or a directory tree (not following symlinks); NULL does nothing.
void neox_remove_tree(const char *path);
// Registers/unregisters an arbitrary temporary path for removal on exit or fatal signal.
void neox_cleanup_register(const char *path);
void neox_cleanup_unregister(const char *path);
// A tool's own handler for SIGTERM, SIGUSR1 and SIGHUP (the trainer's checkpoint-and-stop),
// installed over any other (MPI's transport libraries install one that swallows SIGHUP); the
// temporaries are then removed at exit instead of in the signal handler.
void neox_set_stop_handler(void (*handler)(int));
// Publishes a finished temporary file written by other means (HDF5, a library): fsyncs tmp,
// renames it to path and fsyncs the directory. On failure tmp is left for the caller to remove.
int neox_publish_file(const char *tmp, const char *path, neox_error *err);
// fsync()s the directory holding path (after a rename).
int neox_fsync_dir_of(const char *path, neox_error *err);
// The size and zlib CRC-32 of a whole file (lib/core/file_crc.c), streamed through a bounded
// buffer: what a checkpoint manifest and a sample-index cache's identity record. -1 + err naming path.
int neox_file_crc32(const char *path, uint64_t *bytes, uint32_t *crc32, neox_error *err);

// ---------------------------------------------------------------------------------------------
// Allocation. These never return NULL: on failure the process exits with a message naming the size.
void *neox_malloc(size_t size);
void *neox_calloc(size_t count, size_t size);
void *neox_realloc(void *ptr, size_t size);
void *neox_aligned_alloc(size_t alignment, size_t size);  // free with free()
// The most resident memory (bytes) this process has held so far: getrusage's ru_maxrss (Linux's
// VmHWM of /proc/self/status).
size_t neox_peak_rss_bytes(void);
char *neox_strdup(const char *s);
char *neox_strndup(const char *s, size_t n);
char *neox_asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// The path of `name` in the directory of `file` (a file's companions: tokenizer_config.json beside
// a tokenizer.json); name itself when file has no directory part. Malloc'ed.
char *neox_path_beside(const char *file, const char *name);
// Names what this thread is reading (a file, and what in it) in the out-of-memory message, until
// restored with the returned previous value: "out of memory allocating N bytes while reading WHAT".
const char *neox_alloc_reading(const char *what);

// Reads a whole file into a NUL-terminated buffer (size excludes the NUL). NULL + err on failure.
char *neox_read_file(const char *path, size_t *size, neox_error *err);

// ---------------------------------------------------------------------------------------------
// MT19937, the generator numpy's RandomState and Python's random.Random share (lib/core/mt19937.c).
enum { NEOX_MT19937_N = 624 };
typedef struct neox_mt19937 {
    uint32_t key[NEOX_MT19937_N];
    int pos;
} neox_mt19937;
void neox_mt19937_seed(neox_mt19937 *g, uint32_t seed);                             // init_genrand
void neox_mt19937_seed_by_array(neox_mt19937 *g, const uint32_t *key, int len);    // init_by_array
uint32_t neox_mt19937_next(neox_mt19937 *g);

// ---------------------------------------------------------------------------------------------
// Command line. Every tool answers --help (usage text to stdout, exit 0) and --version (tool name,
// neox.c version, backends and library versions, exit 0: lib/version.h).
// Prints "Try '<prog> --help' for more information." after a usage error and exits 2.
_Noreturn void neox_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// An option's value as a whole number in [min, max] (or any number in [min, max]; finite); anything
// else is a usage error naming the option and the text.
int64_t neox_option_int(const char *option, const char *text, int64_t min, int64_t max);
double neox_option_number(const char *option, const char *text, double min, double max);

// ---------------------------------------------------------------------------------------------
// Profiling ranges (lib/core/trace.c, written by trace_file.c): the one API every layer marks what
// it does with, for `profile` (docs/metrics.md, "Profiling a run"). While a capture is on, each
// range (push ... pop, nested, per thread) and each collective (reported once done) is kept as a
// Chrome trace event and passed to the sink (the CUDA build's NVTX ranges); while none is on, a
// range costs one test of neox_trace_on.
enum { NEOX_TRACE_NAME = 40 };
// A range; a collective (blocking: its whole call; non-blocking: its issue); a wait for a
// non-blocking one (whose count differs between ranks: a request found complete is not waited for).
enum { NEOX_TRACE_RANGE, NEOX_TRACE_COLLECTIVE, NEOX_TRACE_WAIT };
typedef struct neox_trace_event {
    char name[NEOX_TRACE_NAME];   // the range's, or the collective's operation
    char group[16];               // a collective's communicator ("data", "model", ...)
    double start, seconds;        // from the capture's start
    double bytes;                 // a collective's payload; -1 for a range
    int tid, depth;               // the thread's track; the ranges open around it on that track
    int kind;                     // NEOX_TRACE_RANGE, _COLLECTIVE or _WAIT
} neox_trace_event;
// Where ranges go besides the trace: push/pop a named range, and the device profiler's capture
// turned on (1) or off (0) with the trace's. Any member may be NULL.
typedef struct neox_trace_sink {
    void (*push)(const char *name);
    void (*pop)(void);
    void (*capture)(int on);
} neox_trace_sink;
// Written by the thread that starts and stops a capture, read by any (a helper thread's collectives):
// atomic, which costs a plain load where it is read.
extern _Atomic int neox_trace_on;
void neox_trace_set_sink(const neox_trace_sink *sink);  // NULL: none
// Starts a capture (the events of an earlier one are dropped), its time 0 at origin (neox_now()).
void neox_trace_start(double origin);
void neox_trace_stop(void);
void neox_trace_push_named(const char *name);
void neox_trace_pushf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void neox_trace_pop_range(void);
// A collective done (or, with wait set, a wait for a non-blocking one): it began at start (neox_now())
// and took seconds; bytes its payload (-1: not known).
void neox_trace_complete_at(const char *op, const char *group, double start, double seconds, double bytes, int wait);
#define neox_range_push(name) \
    do {                        \
        if (neox_trace_on) neox_trace_push_named(name); \
    } while (0)
#define neox_range_pushf(...) \
    do {                        \
        if (neox_trace_on) neox_trace_pushf(__VA_ARGS__); \
    } while (0)
#define neox_range_pop()      \
    do {                        \
        if (neox_trace_on) neox_trace_pop_range(); \
    } while (0)
// The events captured so far (valid until the next start or free).
const neox_trace_event *neox_trace_events(size_t *count);
// The capture as path, a Chrome trace-event JSON file with pid = rank; -1 + err naming path.
int neox_trace_write(const char *path, int rank, neox_error *err);
void neox_trace_free(void);

// ---------------------------------------------------------------------------------------------
// Half-open ranges [lo, hi) (lib/core/ranges.c).
// The overlap of [a_lo, a_hi) and [b_lo, b_hi) into [*lo, *hi) (empty: *lo == *hi); 1 when non-empty.
int neox_overlap(size_t a_lo, size_t a_hi, size_t b_lo, size_t b_hi, size_t *lo, size_t *hi);
// Part `part` of n items cut evenly into `parts`: [n * part / parts, n * (part + 1) / parts), the
// flat layout's data-parallel share.
void neox_even_share(size_t n, int part, int parts, size_t *lo, size_t *hi);

#endif
