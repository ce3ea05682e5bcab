// chat_format.c: what a chat-formatted dataset needs of a tokenizer's folder — the chat template and
// special tokens of tokenizer_config.json, read as transformers' AutoTokenizer reads them — so that
// neox-preprocess renders conversations exactly as apply_chat_template does.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "tokenizer.h"

// A special token's text: a string, or an AddedToken object's "content".
static char *special_token(const json_t *config, const char *key) {
    const json_t *v = json_object_get(config, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? neox_strdup(json_string_value(v)) : NULL;
}

// tokenizer_config.json's chat_template: a string, or named templates of which "default" is the one
// apply_chat_template uses without a name.
static const char *config_template(const json_t *config, const char *path, neox_error *err) {
    const json_t *t = json_object_get(config, "chat_template");
    if (json_is_string(t)) return json_string_value(t);
    size_t i;
    const json_t *entry;
    if (json_is_array(t)) {
        json_array_foreach(t, i, entry) {
            const char *name = json_string_value(json_object_get(entry, "name"));
            const char *text = json_string_value(json_object_get(entry, "template"));
            if (name && text && !strcmp(name, "default")) return text;
        }
        neox_fail(err, NEOX_EXIT_USAGE, "%s: chat_template has no template named \"default\"", path);
        return NULL;
    }
    neox_fail(err, NEOX_EXIT_USAGE, "%s: %s", path,
              t ? "chat_template is neither a string nor a list of named templates"
                : "no chat_template (give the template with --chat-template)");
    return NULL;
}

static json_t *load_config(const char *path, neox_error *err) {
    if (access(path, F_OK) != 0) return json_object();
    json_error_t jerr;
    // Only strings are read; integers as reals, so transformers' "unset" model_max_length (1e30) loads.
    json_t *config = json_load_file(path, JSON_DECODE_INT_AS_REAL, &jerr);
    if (!config) neox_fail(err, NEOX_EXIT_FAILURE, "%s:%d: %s", path, jerr.line, jerr.text);
    else if (!json_is_object(config)) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: not a JSON object", path);
        json_decref(config);
        return NULL;
    }
    return config;
}

static int parse_template(neox_chat_format *fmt, const json_t *config, const char *config_path,
                          const char *template_file, neox_error *err) {
    if (template_file) {
        size_t size;
        char *source = neox_read_file(template_file, &size, err);
        if (!source) return -1;
        fmt->tmpl = neox_chat_template_parse(source, size, template_file, err);
        free(source);
        return fmt->tmpl ? 0 : -1;
    }
    const char *source = config_template(config, config_path, err);
    if (!source) return -1;
    char *name = neox_asprintf("chat_template of %s", config_path);
    fmt->tmpl = neox_chat_template_parse(source, strlen(source), name, err);
    free(name);
    return fmt->tmpl ? 0 : -1;
}

int neox_chat_format_load(neox_chat_format *fmt, const neox_tokenizer *tok, const char *vocab_file,
                          const char *template_file, neox_error *err) {
    memset(fmt, 0, sizeof *fmt);
    fmt->eos_id = -1;
    char *path = neox_path_beside(vocab_file, "tokenizer_config.json");
    json_t *config = load_config(path, err);
    int rc = config ? parse_template(fmt, config, path, template_file, err) : -1;
    if (rc == 0) {
        fmt->bos_token = special_token(config, "bos_token");
        fmt->eos_token = special_token(config, "eos_token");
        fmt->unk_token = special_token(config, "unk_token");
        fmt->pad_token = special_token(config, "pad_token");
        if (fmt->eos_token && (fmt->eos_id = neox_tokenizer_token_to_id(tok, fmt->eos_token)) < 0)
            rc = neox_fail(err, NEOX_EXIT_USAGE, "%s: eos_token '%s' is not a token of %s", path, fmt->eos_token,
                           vocab_file);
    }
    json_decref(config);
    free(path);
    if (rc != 0) neox_chat_format_free(fmt);
    return rc;
}

void neox_chat_format_free(neox_chat_format *fmt) {
    neox_chat_template_free(fmt->tmpl);
    free(fmt->bos_token);
    free(fmt->eos_token);
    free(fmt->unk_token);
    free(fmt->pad_token);
    memset(fmt, 0, sizeof *fmt);
    fmt->eos_id = -1;
}
