// tensorboard.c: TensorBoard event files written natively. Each record is TFRecord-framed
//   u64 length | u32 masked_crc32c(length bytes) | data | u32 masked_crc32c(data)   (little-endian)
// around an Event protobuf (tensorflow/core/util/event.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
// A text summary (TensorBoard's text plugin) is a Value with a string tensor and the plugin's name:
//   Value { string tag = 1; TensorProto tensor = 8; SummaryMetadata metadata = 9; }
//   TensorProto { DataType dtype = 1 (DT_STRING = 7); TensorShapeProto tensor_shape = 2 (a scalar: empty);
//                 repeated bytes string_val = 8; }
//   SummaryMetadata { PluginData plugin_data = 1; }   PluginData { string plugin_name = 1 ("text"); }
// The file starts with the file_version event "brain.Event:2", as TensorFlow's writers do.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrics.h"
#include "metrics/internal.h"

enum { EVENT_WALL_TIME = 1, EVENT_STEP = 2, EVENT_FILE_VERSION = 3, EVENT_SUMMARY = 5 };
enum { SUMMARY_VALUE = 1 };
enum { VALUE_TAG = 1, VALUE_SIMPLE_VALUE = 2, VALUE_TENSOR = 8, VALUE_METADATA = 9 };
enum { TENSOR_DTYPE = 1, TENSOR_SHAPE = 2, TENSOR_STRING_VAL = 8, DT_STRING = 7 };
enum { METADATA_PLUGIN_DATA = 1, PLUGIN_NAME = 1 };

struct neox_tb_writer {
    FILE *fp;
    char *path;
    neox_pb event, summary, value;   // reused encoding buffers
};

static int write_record(neox_tb_writer *w, const uint8_t *data, size_t size, neox_error *err) {
    uint8_t header[12], footer[4];
    for (int i = 0; i < 8; i++) header[i] = (uint8_t)((uint64_t)size >> (8 * i));
    uint32_t len_crc = neox_crc32c_masked(header, 8), data_crc = neox_crc32c_masked(data, size);
    for (int i = 0; i < 4; i++) header[8 + i] = (uint8_t)(len_crc >> (8 * i));
    for (int i = 0; i < 4; i++) footer[i] = (uint8_t)(data_crc >> (8 * i));
    if (fwrite(header, 1, sizeof header, w->fp) != sizeof header || fwrite(data, 1, size, w->fp) != size ||
        fwrite(footer, 1, sizeof footer, w->fp) != sizeof footer)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: write failed: %s", w->path, strerror(errno));
    return 0;
}

// Encodes the event header fields into w->event (cleared first).
static void begin_event(neox_tb_writer *w, double wall_time, int64_t step) {
    w->event.len = 0;
    neox_pb_double_field(&w->event, EVENT_WALL_TIME, wall_time);
    if (step != 0) neox_pb_int64_field(&w->event, EVENT_STEP, step);   // proto3 omits defaults
}

static char *event_file_name(const char *dir) {
    static int opened;   // distinguishes writers opened by one process within the same second
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "localhost");
    host[sizeof host - 1] = '\0';
    for (char *p = host; *p; p++)
        if (*p == '/') *p = '_';
    return neox_asprintf("%s/events.out.tfevents.%010lld.%s.%ld.%d", dir, (long long)neox_wall_time(), host,
                         (long)getpid(), opened++);
}

neox_tb_writer *neox_tb_open(const char *dir, neox_error *err) {
    if (neox_mkdirs(dir, err) != 0) return NULL;
    neox_tb_writer *w = neox_calloc(1, sizeof *w);
    w->path = event_file_name(dir);
    int fd = neox_open_output(w->path, O_EXCL, err);
    w->fp = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!w->fp) {
        if (fd >= 0) {
            neox_fail(err, NEOX_EXIT_FAILURE, "cannot create %s: %s", w->path, strerror(errno));
            close(fd);
        }
        free(w->path);
        free(w);
        return NULL;
    }
    begin_event(w, neox_wall_time(), 0);
    static const char version[] = "brain.Event:2";
    neox_pb_bytes_field(&w->event, EVENT_FILE_VERSION, version, strlen(version));
    if (write_record(w, w->event.data, w->event.len, err) != 0 || neox_tb_flush(w, 0, err) != 0) {
        neox_tb_close(w, NULL);
        return NULL;
    }
    return w;
}

// Writes w->value (encoded by the caller) as the one value of an event's summary.
static int write_value(neox_tb_writer *w, int64_t step, double wall_time, neox_error *err) {
    w->summary.len = 0;
    neox_pb_bytes_field(&w->summary, SUMMARY_VALUE, w->value.data, w->value.len);
    begin_event(w, wall_time, step);
    neox_pb_bytes_field(&w->event, EVENT_SUMMARY, w->summary.data, w->summary.len);
    return write_record(w, w->event.data, w->event.len, err);
}

int neox_tb_scalar(neox_tb_writer *w, const char *tag, int64_t step, double value, double wall_time,
                   neox_error *err) {
    w->value.len = 0;
    neox_pb_bytes_field(&w->value, VALUE_TAG, tag, strlen(tag));
    neox_pb_float_field(&w->value, VALUE_SIMPLE_VALUE, (float)value);
    return write_value(w, step, wall_time, err);
}

int neox_tb_text(neox_tb_writer *w, const char *tag, int64_t step, const char *text, double wall_time,
                 neox_error *err) {
    neox_pb tensor = {0}, plugin = {0}, metadata = {0};
    neox_pb_int64_field(&tensor, TENSOR_DTYPE, DT_STRING);
    neox_pb_bytes_field(&tensor, TENSOR_SHAPE, "", 0);
    neox_pb_bytes_field(&tensor, TENSOR_STRING_VAL, text, strlen(text));
    static const char plugin_name[] = "text";
    neox_pb_bytes_field(&plugin, PLUGIN_NAME, plugin_name, strlen(plugin_name));
    neox_pb_bytes_field(&metadata, METADATA_PLUGIN_DATA, plugin.data, plugin.len);
    w->value.len = 0;
    neox_pb_bytes_field(&w->value, VALUE_TAG, tag, strlen(tag));
    neox_pb_bytes_field(&w->value, VALUE_TENSOR, tensor.data, tensor.len);
    neox_pb_bytes_field(&w->value, VALUE_METADATA, metadata.data, metadata.len);
    neox_pb_free(&tensor), neox_pb_free(&plugin), neox_pb_free(&metadata);
    return write_value(w, step, wall_time, err);
}

int neox_tb_flush(neox_tb_writer *w, int sync, neox_error *err) {
    if (fflush(w->fp) != 0 || (sync && fsync(fileno(w->fp)) != 0))
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: write failed: %s", w->path, strerror(errno));
    return 0;
}

int neox_tb_close(neox_tb_writer *w, neox_error *err) {
    if (!w) return 0;
    int rc = neox_tb_flush(w, 1, err);
    if (fclose(w->fp) != 0 && rc == 0)
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: close failed: %s", w->path, strerror(errno));
    neox_pb_free(&w->event);
    neox_pb_free(&w->summary);
    neox_pb_free(&w->value);
    free(w->path);
    free(w);
    return rc;
}

const char *neox_tb_path(const neox_tb_writer *w) { return w->path; }
