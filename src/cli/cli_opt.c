/* cli_opt.c — the one option parser and help writer of every command, driven by its table
 * (struct kvf_cli_spec in cli.h). Work is bounded by the table and argv: each word is looked up
 * in at most n_opts rows, each row reads at most two environment variables. */
#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"

#define MAX_OPTS   64 /* rows of one spec: the seen[] of kvf_cli_parse */
#define HELP_WIDTH 80
#define HELP_COL   24 /* where an option's text starts */

static void *field(void *opts, const struct kvf_cli_opt *o)
{
    return (char *)opts + o->off;
}

static bool is_help(const char *a)
{
    return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0;
}

static const struct kvf_cli_opt *find(const struct kvf_cli_spec *s, const char *a)
{
    for (size_t i = 0; i < s->n_opts; i++)
        if (strcmp(a, s->opts[i].name) == 0 ||
            (s->opts[i].alias && strcmp(a, s->opts[i].alias) == 0))
            return &s->opts[i];
    return NULL;
}

/* Stores v (the option written as `given`) into its field. 0, or -1 (printed). */
static int set_value(const struct kvf_cli_spec *s, const struct kvf_cli_opt *o, const char *given,
                     const char *v, void *opts)
{
    void *dst = field(opts, o);
    int bad = 0;
    switch (o->kind) {
    case KVF_CLI_FLAG:
        *(bool *)dst = true;
        break;
    case KVF_CLI_STR:
        *(const char **)dst = v;
        break;
    case KVF_CLI_U32:
        bad = kvf_cli_parse_u32(v, (uint32_t)o->lo, (uint32_t)o->hi, dst);
        break;
    case KVF_CLI_U64:
        bad = kvf_cli_parse_u64(v, o->lo, o->hi, dst);
        break;
    case KVF_CLI_FLOAT:
        bad = kvf_cli_parse_float(v, o->flo, o->fhi, dst);
        break;
    case KVF_CLI_SIZE:
        bad = kvf_cli_parse_size(v, dst);
        break;
    case KVF_CLI_ADDR: {
        struct kvf_cli_addr *a = dst;
        if (kvf_cli_parse_addr(v, a->host, sizeof a->host, &a->port, true) < 0) {
            fprintf(stderr, "kvfence %s: %s wants HOST:PORT, not '%s'\n", s->name, given, v);
            return -1;
        }
        a->text = v;
        break;
    }
    case KVF_CLI_ADDRS:
        return kvf_cli_parse_addrs(s->name, o->name, v, dst);
    case KVF_CLI_FN:
        bad = o->fn(v, dst);
        break;
    }
    if (bad) {
        if (o->bad)
            fprintf(stderr, "kvfence %s: %s\n", s->name, o->bad);
        else
            fprintf(stderr, "kvfence %s: bad value '%s' for %s\n", s->name, v, given);
        return -1;
    }
    return 0;
}

/* A flag from the environment: on with 1/true/yes, left as it is with 0/false/no. */
static int set_flag_env(const struct kvf_cli_spec *s, const struct kvf_cli_opt *o, const char *var,
                        const char *v, void *opts)
{
    if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes")) {
        *(bool *)field(opts, o) = true;
        return 0;
    }
    if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no")) return 0;
    fprintf(stderr, "kvfence %s: %s=%s: want 1/true/yes or 0/false/no\n", s->name, var, v);
    return -1;
}

static int set_env(const struct kvf_cli_spec *s, const struct kvf_cli_opt *o, void *opts,
                   bool *seen)
{
    const char *alt = o->env_alt ? getenv(o->env_alt) : NULL;
    const char *v = o->env ? getenv(o->env) : NULL;
    if (alt && *alt) {
        if ((o->kind == KVF_CLI_FLAG ? set_flag_env(s, o, o->env_alt, alt, opts)
                                     : set_value(s, o, o->name, alt, opts)) < 0)
            return -1;
        *seen = true;
    }
    if (v) {
        if ((o->kind == KVF_CLI_FLAG ? set_flag_env(s, o, o->env, v, opts)
                                     : set_value(s, o, o->name, v, opts)) < 0)
            return -1;
        *seen = true;
    }
    return 0;
}

/* "A", "A and B", "A, B and C": every required option (and the positional), in table order. */
static void say_required(const struct kvf_cli_spec *s)
{
    const char *names[MAX_OPTS + 1];
    size_t n = 0;
    if (s->positional && s->positional_required) names[n++] = s->positional;
    for (size_t i = 0; i < s->n_opts; i++)
        if (s->opts[i].flags & KVF_CLI_REQUIRED) names[n++] = s->opts[i].name;
    fprintf(stderr, "kvfence %s: ", s->name);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, "%s%s", i == 0 ? "" : i + 1 == n ? " and " : ", ", names[i]);
    fprintf(stderr, " %s required\n", n == 1 ? "is" : "are");
}

static int stop(int *exit_status, int status)
{
    *exit_status = status;
    return -1;
}

int kvf_cli_parse(const struct kvf_cli_spec *s, int argc, char **argv, void *opts, int *exit_status)
{
    bool seen[MAX_OPTS] = {false}, positional_seen = false, help = false;
#if defined(KVF_TEST_BUILD)
    char why[256];
    if (!kvf_cli_spec_check(s, why, sizeof why)) {
        fprintf(stderr, "kvfence %s: option table: %s\n", s->name, why);
        abort();
    }
#endif
    for (size_t i = 0; i < s->n_opts; i++)
        if (s->opts[i].def && set_value(s, &s->opts[i], s->opts[i].name, s->opts[i].def, opts) < 0)
            return stop(exit_status, 2); /* kvf_cli_spec_check refuses such a table */
    for (int i = 1; i < argc; i++)
        help = help || is_help(argv[i]);
    for (size_t i = 0; i < s->n_opts && !help; i++)
        if (set_env(s, &s->opts[i], opts, &seen[i]) < 0) return stop(exit_status, 2);

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (is_help(a)) {
            kvf_cli_help(s, stdout);
            return stop(exit_status, 0);
        }
        const struct kvf_cli_opt *o = find(s, a);
        if (!o && s->positional && a[0] != '-') {
            if (positional_seen) {
                fprintf(stderr, "kvfence %s: unexpected argument '%s'\n", s->name, a);
                kvf_cli_help(s, stderr);
                return stop(exit_status, 2);
            }
            *(const char **)((char *)opts + s->positional_off) = a;
            positional_seen = true;
            continue;
        }
        if (!o) {
            fprintf(stderr, "kvfence %s: unknown option '%s'\n", s->name, a);
            kvf_cli_help(s, stderr);
            return stop(exit_status, 2);
        }
        if (o->kind != KVF_CLI_FLAG && i + 1 >= argc) {
            fprintf(stderr, "kvfence %s: %s needs a value\n", s->name, a);
            return stop(exit_status, 2);
        }
        if (set_value(s, o, a, o->kind == KVF_CLI_FLAG ? NULL : argv[++i], opts) < 0)
            return stop(exit_status, 2);
        seen[o - s->opts] = true;
    }

    bool missing = s->positional && s->positional_required && !positional_seen;
    for (size_t i = 0; i < s->n_opts; i++)
        missing = missing || ((s->opts[i].flags & KVF_CLI_REQUIRED) && !seen[i]);
    if (missing) {
        say_required(s);
        kvf_cli_help(s, stderr);
        return stop(exit_status, 2);
    }
    return 0;
}

/* ---- the help ---- */

/* Writes text wrapped at HELP_WIDTH, every line but the first indented by HELP_COL; the first
 * starts at column `col`. Words are never split. Returns the column after the last word. */
static size_t wrap(FILE *f, size_t col, const char *text)
{
    const char *p = text;
    while (*p) {
        while (*p == ' ')
            p++;
        size_t len = strcspn(p, " ");
        if (!len) break;
        if (col > HELP_COL && col + 1 + len > HELP_WIDTH) {
            fprintf(f, "\n%*s", HELP_COL, "");
            col = HELP_COL;
        } else if (col > HELP_COL) {
            fputc(' ', f);
            col++;
        }
        fwrite(p, 1, len, f);
        col += len;
        p += len;
    }
    return col;
}

static void help_opt(FILE *f, const struct kvf_cli_opt *o)
{
    char head[96];
    int n = snprintf(head, sizeof head, "  %s%s%s", o->name, o->metavar ? " " : "",
                     o->metavar ? o->metavar : "");
    fputs(head, f);
    size_t col = (size_t)n;
    if (col + 2 > HELP_COL) {
        fprintf(f, "\n%*s", HELP_COL, "");
    } else {
        fprintf(f, "%*s", (int)(HELP_COL - col), "");
    }
    col = wrap(f, HELP_COL, o->help);
    /* The facts the table knows, in one bracket: default, older name, environment variable. */
    char facts[256];
    size_t k = 0;
    facts[0] = 0;
#define FACT(...) k += (size_t)snprintf(facts + k, sizeof facts - k, __VA_ARGS__)
    if (o->def) FACT("%sdefault %s", k ? "; " : "", o->def);
    if (o->alias) FACT("%salso %s", k ? "; " : "", o->alias);
    if (o->env) FACT("%senv %s", k ? "; " : "", o->env);
    if (o->env_alt) FACT(" or %s", o->env_alt);
    if (o->flags & KVF_CLI_REQUIRED) FACT("%srequired", k ? "; " : "");
#undef FACT
    if (k) {
        char b[260];
        size_t n_b = (size_t)snprintf(b, sizeof b, "[%s]", facts);
        /* Whole on this line or the next, where it fits: a variable's name is never split
         * from its "env". */
        if (col + 1 + n_b > HELP_WIDTH && HELP_COL + n_b <= HELP_WIDTH) {
            fprintf(f, "\n%*s%s", HELP_COL, "", b);
        } else {
            wrap(f, col, b);
        }
    }
    fputc('\n', f);
}

void kvf_cli_help(const struct kvf_cli_spec *s, FILE *f)
{
    fprintf(f, "usage: kvfence %s", s->name);
    if (s->positional) fprintf(f, s->positional_required ? " %s" : " [%s]", s->positional);
    for (size_t i = 0; i < s->n_opts; i++)
        if (s->opts[i].flags & KVF_CLI_REQUIRED)
            fprintf(f, " %s %s", s->opts[i].name, s->opts[i].metavar ? s->opts[i].metavar : "");
    fprintf(f, " [options]\n\n%s\noptions:\n", s->about);
    for (size_t i = 0; i < s->n_opts; i++)
        help_opt(f, &s->opts[i]);
    fprintf(f, "  --help, -h            this help\n");
    if (s->after) fprintf(f, "\n%s", s->after);
}

/* ---- the table's own check ---- */

bool kvf_cli_spec_check(const struct kvf_cli_spec *s, char *why, size_t why_len)
{
    static const size_t field_size[] = {[KVF_CLI_FLAG] = sizeof(bool),
                                        [KVF_CLI_STR] = sizeof(const char *),
                                        [KVF_CLI_U32] = sizeof(uint32_t),
                                        [KVF_CLI_U64] = sizeof(uint64_t),
                                        [KVF_CLI_FLOAT] = sizeof(float),
                                        [KVF_CLI_SIZE] = sizeof(uint64_t),
                                        [KVF_CLI_ADDR] = sizeof(struct kvf_cli_addr),
                                        [KVF_CLI_ADDRS] = sizeof(struct kvf_cli_addrs),
                                        [KVF_CLI_FN] = 1};
    if (s->n_opts > MAX_OPTS) {
        snprintf(why, why_len, "%zu rows, more than %d", s->n_opts, MAX_OPTS);
        return false;
    }
    for (size_t i = 0; i < s->n_opts; i++) {
        const struct kvf_cli_opt *o = &s->opts[i];
        char env[96] = "KVFENCE_";
        size_t k = strlen(env);
        for (const char *c = o->name + 2; *c && k + 1 < sizeof env; c++)
            env[k++] = *c == '-' ? '_' : (char)toupper((unsigned char)*c);
        env[k] = 0;
#define REFUSE(...) return snprintf(why, why_len, __VA_ARGS__), false
        if (strncmp(o->name, "--", 2) != 0 || !o->help)
            REFUSE("%s: a name with --, and help", o->name);
        if (o->alias && strncmp(o->alias, "--", 2) != 0) REFUSE("%s: alias %s", o->name, o->alias);
        if ((o->kind == KVF_CLI_FLAG) != (o->metavar == NULL))
            REFUSE("%s: a metavar for every option with a value, none for a flag", o->name);
        if (o->env && strcmp(o->env, env) != 0) REFUSE("%s: env %s, not %s", o->name, o->env, env);
        if (o->env_alt && !o->env) REFUSE("%s: env_alt without env", o->name);
        if (o->off + field_size[o->kind] > s->opts_size)
            REFUSE("%s: field beyond the struct", o->name);
        if ((o->kind == KVF_CLI_FN) != (o->fn != NULL))
            REFUSE("%s: fn with KVF_CLI_FN only", o->name);
        if (o->kind == KVF_CLI_U32 && (o->lo > o->hi || o->hi > UINT32_MAX))
            REFUSE("%s: bounds", o->name);
        if (o->kind == KVF_CLI_FLOAT && !(o->flo <= o->fhi)) REFUSE("%s: bounds", o->name);
        if (o->def && o->kind == KVF_CLI_FLAG) REFUSE("%s: a flag's default is off", o->name);
        for (size_t j = 0; j < i; j++) {
            const struct kvf_cli_opt *p = &s->opts[j];
            if (!strcmp(p->name, o->name) || (p->alias && !strcmp(p->alias, o->name)) ||
                (o->alias &&
                 (!strcmp(p->name, o->alias) || (p->alias && !strcmp(p->alias, o->alias)))))
                REFUSE("%s: named twice", o->name);
        }
        if (o->def) {
            /* The default must parse: into scratch, never into a caller's struct. */
            union {
                uint64_t u64;
                float f;
                struct kvf_cli_addr addr;
                struct kvf_cli_addrs addrs;
                char fn[1024];
            } scratch;
            struct kvf_cli_opt t = *o;
            t.off = 0;
            struct kvf_cli_spec ts = *s;
            ts.name = "(default)";
            memset(&scratch, 0, sizeof scratch);
            if (field_size[o->kind] > sizeof scratch ||
                set_value(&ts, &t, o->name, o->def, &scratch) < 0)
                REFUSE("%s: default '%s' does not parse", o->name, o->def);
        }
#undef REFUSE
    }
    return true;
}
