// wandb.c: use_wandb without a W&B client in neox.c. GPT-NeoX logs to W&B from inside the run
// (wandb.init with wandb_project, wandb_team, wandb_group, wandb_run_name, against wandb_host);
// neox.c writes TensorBoard events only, and W&B's own command line uploads them: this file builds
// that command (`wandb sync --sync-tensorboard`) from the same keys, and the text the TensorBoard
// run carries about its W&B run (so the name and group travel with the events).
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

// Appends s to *buf (neox_realloc'ed), shell-quoted when it holds anything but safe characters.
static void append_word(char **buf, size_t *len, const char *s) {
    int plain = *s != '\0';
    for (const char *p = s; *p; p++)
        if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._/:=@%+-,", *p)) plain = 0;
    size_t need = *len + 4 * strlen(s) + 3;
    *buf = neox_realloc(*buf, need + 1);
    char *o = *buf + *len;
    if (plain) {
        o += sprintf(o, "%s", s);
    } else {
        *o++ = '\'';
        for (const char *p = s; *p; p++) o += *p == '\'' ? sprintf(o, "'\\''") : sprintf(o, "%c", *p);
        *o++ = '\'';
        *o = '\0';
    }
    *len = (size_t)(o - *buf);
}

static void append(char **buf, size_t *len, const char *literal, const char *value) {
    size_t n = strlen(literal);
    *buf = neox_realloc(*buf, *len + n + 1);
    memcpy(*buf + *len, literal, n + 1);
    *len += n;
    if (value) append_word(buf, len, value);
}

static int given(const char *s) { return s && *s; }

char *neox_wandb_sync_command(const neox_wandb_settings *w, const char *dir) {
    char *cmd = neox_strdup("");
    size_t len = 0;
    // wandb's environment variables: the server, and the run's name and group (sync has no options for them)
    if (given(w->host)) append(&cmd, &len, "WANDB_BASE_URL=", w->host), append(&cmd, &len, " ", NULL);
    if (given(w->group)) append(&cmd, &len, "WANDB_RUN_GROUP=", w->group), append(&cmd, &len, " ", NULL);
    if (given(w->run_name)) append(&cmd, &len, "WANDB_NAME=", w->run_name), append(&cmd, &len, " ", NULL);
    append(&cmd, &len, "wandb sync --sync-tensorboard", NULL);
    if (given(w->project)) append(&cmd, &len, " --project ", w->project);
    if (given(w->team)) append(&cmd, &len, " --entity ", w->team);
    append(&cmd, &len, " ", dir);
    return cmd;
}

// "| key | value |" rows of the W&B settings that are set.
static void append_row(char **buf, size_t *len, const char *key, const char *value) {
    if (!given(value)) return;
    char *row = neox_asprintf("| %s | %s |\n", key, value);
    append(buf, len, row, NULL);
    free(row);
}

char *neox_wandb_run_text(const neox_wandb_settings *w, const char *dir) {
    char *text = neox_strdup("");
    size_t len = 0;
    append(&text, &len, "| W&B | |\n|---|---|\n", NULL);
    append_row(&text, &len, "wandb_project", w->project);
    append_row(&text, &len, "wandb_team", w->team);
    append_row(&text, &len, "wandb_group", w->group);
    append_row(&text, &len, "wandb_run_name", w->run_name);
    append_row(&text, &len, "wandb_host", w->host);
    char *cmd = neox_wandb_sync_command(w, dir);
    append(&text, &len, "\nSync with: `", NULL);
    append(&text, &len, cmd, NULL);
    append(&text, &len, "`\n", NULL);
    free(cmd);
    return text;
}
