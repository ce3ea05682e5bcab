// serve_http.c: neox-eval serve's HTTP front end on GNU libmicrohttpd: one polling thread (epoll)
// for every connection, routes (/v1/completions, /v1/chat/completions, /v1/models, /health),
// bounded request bodies, and requests handed to the engine with their connection
// suspended until the scheduler has the response. SIGTERM/SIGINT stop accepting, let queued
// requests finish and be answered, then return.
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "serve.h"

typedef struct http_server {
    neox_serve_engine *en;
    neox_serve_http_options o;
    pthread_mutex_t lock;    // the connections' hand-over between the HTTP and scheduler threads
    int active;              // requests received and not yet answered
    long long parsed;        // completions requests parsed and queued (the HTTP thread's own profile)
    double parse_seconds;    // ... and the time that took, tokenization included
} http_server;

// One request. The scheduler thread fills status/body and resumes the connection; the HTTP
// thread then sends them.
typedef struct request_state {
    http_server *srv;
    struct MHD_Connection *conn;
    char *body;
    size_t size;
    int too_large;
    int submitted, suspended, answered;
    int status;
    char *response;
} request_state;

static enum MHD_Result send_json(struct MHD_Connection *conn, int status, char *body) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer_with_free_callback(strlen(body), body, free);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result send_error(struct MHD_Connection *conn, const neox_serve_error *e) {
    return send_json(conn, e->http_status, neox_serve_error_body(e));
}

static enum MHD_Result send_error_of(struct MHD_Connection *conn, int status, const char *type, const char *fmt,
                                     const char *arg) {
    neox_serve_error e;
    neox_serve_error_set(&e, status, type, NULL, fmt, arg);
    return send_error(conn, &e);
}

// From the scheduler thread: the response is ready.
static void on_done(void *ctx, int status, char *body) {
    request_state *rs = ctx;
    http_server *srv = rs->srv;  // once resumed, the HTTP thread may answer and free rs at any moment
    pthread_mutex_lock(&srv->lock);
    rs->status = status;
    rs->response = body;
    rs->answered = 1;
    if (rs->suspended) MHD_resume_connection(rs->conn);
    pthread_mutex_unlock(&srv->lock);
}

// From the scheduler thread, while the request is being computed (its connection suspended, which
// the HTTP thread leaves alone): whether the client has closed its end. A peek that finds the end
// of the stream (or a reset) says so; pending bytes (a pipelined request) or none yet do not.
static int client_gone(void *ctx) {
    request_state *rs = ctx;
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(rs->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!info) return 0;
    char byte;
    ssize_t got = recv(info->connect_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

typedef int (*body_parser)(const char *, size_t, neox_serve_request *, neox_serve_error *);

// POST /v1/completions or /v1/chat/completions once the body is in: parse, submit and wait
// (suspended) for the answer.
static enum MHD_Result completions(request_state *rs, body_parser parse) {
    neox_serve_request req;
    neox_serve_error e;
    double start = neox_now();
    if (parse(rs->body ? rs->body : "", rs->size, &req, &e) != 0) return send_error(rs->conn, &e);
    if (neox_serve_submit(rs->srv->en, &req, on_done, client_gone, rs, &e) != 0) return send_error(rs->conn, &e);
    rs->srv->parse_seconds += neox_now() - start;  // only the HTTP thread runs this
    rs->srv->parsed++;
    rs->submitted = 1;
    pthread_mutex_lock(&rs->srv->lock);
    int answered = rs->answered;
    if (!answered) {
        MHD_suspend_connection(rs->conn);
        rs->suspended = 1;
    }
    pthread_mutex_unlock(&rs->srv->lock);
    if (answered) {
        char *body = rs->response;
        rs->response = NULL;
        return send_json(rs->conn, rs->status, body);
    }
    return MHD_YES;
}

static enum MHD_Result route(request_state *rs, const char *url, const char *method) {
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    const neox_serve_options *o = neox_serve_engine_options(rs->srv->en);
    if (!strcmp(url, "/health"))
        return get ? send_json(rs->conn, 200, neox_strdup("{\"status\":\"ok\"}"))
                   : send_error_of(rs->conn, 405, "invalid_request_error", "%s: use GET", url);
    if (!strcmp(url, "/v1/models"))
        return get ? send_json(rs->conn, 200, neox_serve_models_body(o))
                   : send_error_of(rs->conn, 405, "invalid_request_error", "%s: use GET", url);
    int chat = !strcmp(url, "/v1/chat/completions");
    if (chat || !strcmp(url, "/v1/completions")) {
        if (!post) return send_error_of(rs->conn, 405, "invalid_request_error", "%s: use POST", url);
        if (rs->too_large) {
            neox_serve_error e;
            neox_serve_error_set(&e, 413, "invalid_request_error", NULL, "the request body is larger than %zu bytes",
                                 rs->srv->o.max_body_bytes);
            return send_error(rs->conn, &e);
        }
        return completions(rs, chat ? neox_serve_parse_chat_request : neox_serve_parse_request);
    }
    return send_error_of(rs->conn, 404, "not_found_error", "%s: no such endpoint", url);
}

// Appends body bytes up to the limit; beyond it they are read and dropped (answered 413).
static void take_body(request_state *rs, const char *data, size_t n) {
    if (rs->too_large || rs->size + n > rs->srv->o.max_body_bytes) {
        rs->too_large = 1;
        free(rs->body);
        rs->body = NULL;
        rs->size = 0;
        return;
    }
    rs->body = neox_realloc(rs->body, rs->size + n + 1);
    memcpy(rs->body + rs->size, data, n);
    rs->size += n;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)version;
    http_server *srv = cls;
    request_state *rs = *state;
    if (!rs) {  // the headers are in; the body (if any) follows in later calls
        rs = neox_calloc(1, sizeof *rs);
        rs->srv = srv;
        rs->conn = conn;
        *state = rs;
        pthread_mutex_lock(&srv->lock);
        srv->active++;
        pthread_mutex_unlock(&srv->lock);
        return MHD_YES;
    }
    if (*upload_size) {
        take_body(rs, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (rs->submitted) {  // resumed: the scheduler has answered
        char *body = rs->response;
        rs->response = NULL;
        return body ? send_json(conn, rs->status, body) : MHD_NO;
    }
    return route(rs, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **state, enum MHD_RequestTerminationCode code) {
    (void)conn;
    (void)code;
    http_server *srv = cls;
    request_state *rs = *state;
    if (!rs) return;
    free(rs->body);
    free(rs->response);
    free(rs);
    *state = NULL;
    pthread_mutex_lock(&srv->lock);
    srv->active--;
    pthread_mutex_unlock(&srv->lock);
}

static void http_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = 0;
    neox_debug("http: %s", line);
}

// ---- listening and stopping ------------------------------------------------------------------------
static struct MHD_Daemon *listen_on(http_server *srv, neox_error *err) {
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)srv->o.port)};
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)srv->o.port)};
    const struct sockaddr *addr;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (inet_pton(AF_INET, srv->o.host, &a4.sin_addr) == 1) addr = (const struct sockaddr *)&a4;
    else if (inet_pton(AF_INET6, srv->o.host, &a6.sin6_addr) == 1) addr = (const struct sockaddr *)&a6, flags |= MHD_USE_IPv6;
    else return neox_fail(err, NEOX_EXIT_USAGE, "--host %s: not a numeric IPv4 or IPv6 address", srv->o.host), NULL;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, srv, MHD_OPTION_SOCK_ADDR, addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)srv->o.max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)(srv->o.connection_timeout > 0 ? srv->o.connection_timeout : 0), MHD_OPTION_EXTERNAL_LOGGER, http_log,
        NULL, MHD_OPTION_END);
    if (!d) neox_fail(err, NEOX_EXIT_FAILURE, "cannot listen on %s port %d (in use, or not an address of this machine)",
                      srv->o.host, srv->o.port);
    return d;
}

static int active_requests(http_server *srv) {
    pthread_mutex_lock(&srv->lock);
    int n = srv->active;
    pthread_mutex_unlock(&srv->lock);
    return n;
}

// Stops accepting, then waits for the queued requests and for their answers to be sent.
static void drain(http_server *srv, struct MHD_Daemon *d) {
    MHD_socket listener = MHD_quiesce_daemon(d);
    if (listener != MHD_INVALID_SOCKET) close(listener);
    neox_serve_close_queue(srv->en);
    while (neox_serve_pending(srv->en) > 0) usleep(10000);
    // Answers already queued go out within moments; a client that stopped reading is not waited for.
    for (int i = 0; i < 500 && active_requests(srv) > 0; i++) usleep(10000);
}

int neox_serve_http_run(neox_serve_engine *en, const neox_serve_http_options *o, void (*on_listening)(int port),
                        neox_error *err) {
    http_server srv = {.en = en, .o = *o};
    pthread_mutex_init(&srv.lock, NULL);
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);  // the HTTP thread started next inherits the mask
    struct MHD_Daemon *d = listen_on(&srv, err);
    if (!d) {
        pthread_mutex_destroy(&srv.lock);
        return -1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    if (on_listening) on_listening(info ? info->port : o->port);
    int sig;
    sigwait(&stop, &sig);
    neox_info("%s: finishing %d queued requests, then stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT",
              neox_serve_pending(en));
    drain(&srv, d);
    MHD_stop_daemon(d);
    neox_debug("serving: %lld completions requests parsed, tokenized and queued in %.3f s", srv.parsed,
               srv.parse_seconds);
    pthread_mutex_destroy(&srv.lock);
    return 0;
}
