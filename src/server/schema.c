/*
 * schema.c — JSON Schema (a subset) and json_object to GBNF (kvfence/grammar.h), for
 * response_format. The grammar written is compact JSON: no whitespace between tokens, object
 * members in the schema's `properties` order, every listed property present (a required one
 * must be, an optional one may be: writing it always is within the schema). Numbers have at most
 * 15 integer digits (so that every integer is exact in a double, as JavaScript clients read it)
 * and 16 fraction digits and no exponent; the output is always valid against
 * the schema, and may be narrower than it, never wider.
 *
 * Supported keywords: type (one name or a list), properties, required (names must be listed in
 * properties), additionalProperties (false, or absent: no other member is written), items,
 * minItems, maxItems (≤ 64), enum, const, anyOf, minLength, maxLength (≤ 64) on strings, and the
 * annotations title, description, $schema, $id, examples, default, strict. Any other keyword is
 * refused by name (the caller answers 400 naming it); nothing is silently widened.
 *
 * Bounds: nesting at most KVF_SCHEMA_MAX_DEPTH, the grammar within KVF_GRAMMAR_MAX_BYTES.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kvfence/grammar.h"
#include "server_internal.h"

#define KVF_SCHEMA_MAX_DEPTH 16
#define KVF_SCHEMA_MAX_COUNT 64 /* maxItems, maxLength */

struct sg {
    char *out;
    size_t cap, n;
    unsigned n_rules;
    int err; /* 0, or -E2BIG / -EINVAL */
    char *msg;
    size_t msg_len;
};

static void put(struct sg *g, const char *fmt, ...)
{
    if (g->err) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(g->out + g->n, g->cap - g->n, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= g->cap - g->n) {
        g->err = -E2BIG;
        snprintf(g->msg, g->msg_len, "the schema's grammar exceeds %d bytes",
                 KVF_GRAMMAR_MAX_BYTES);
        return;
    }
    g->n += (size_t)k;
}

static int bad(struct sg *g, const char *fmt, ...)
{
    if (g->err) return g->err;
    g->err = -EINVAL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->msg, g->msg_len, fmt, ap);
    va_end(ap);
    return g->err;
}

/* A GBNF literal spelling bytes s[0..n). */
static void put_lit(struct sg *g, const char *s, size_t n)
{
    put(g, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            put(g, "\\%c", c);
        else if (c < 0x20 || c >= 0x7f)
            put(g, "\\x%02x", c);
        else
            put(g, "%c", c);
    }
    put(g, "\"");
}

/* A JSON value's compact text as a literal. */
static void put_json_lit(struct sg *g, json_t *v)
{
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) {
        g->err = -ENOMEM;
        return;
    }
    put_lit(g, t, strlen(t));
    free(t);
}

static const char *const annotations[] = {"title",    "description", "$schema", "$id",
                                          "examples", "default",     "strict",  "$comment"};
static const char *const known[] = {"type",  "properties", "required",  "additionalProperties",
                                    "items", "minItems",   "maxItems",  "enum",
                                    "const", "anyOf",      "minLength", "maxLength"};

static bool listed(const char *k, const char *const *l, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, l[i]) == 0) return true;
    return false;
}

static unsigned gen(struct sg *g, json_t *s, int depth);

static int count_kw(struct sg *g, json_t *s, const char *k, long long *out, long long dflt)
{
    json_t *v = json_object_get(s, k);
    *out = dflt;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) > KVF_SCHEMA_MAX_COUNT)
        return bad(g, "json_schema keyword '%s' must be an integer in [0, %d]", k,
                   KVF_SCHEMA_MAX_COUNT);
    *out = json_integer_value(v);
    return 0;
}

/* Writes `name ::= ( x ( sep x ( ... )? )? )?` for lo..hi (hi < 0: unbounded) repetitions of
 * rule x, each after the first preceded by the literal sep. */
static void put_repeat(struct sg *g, unsigned x, const char *sep, long long lo, long long hi)
{
    long long i = 0;
    for (; i < lo; i++) {
        if (i) put(g, " %s", sep);
        put(g, " r%u", x);
    }
    if (hi < 0) {
        if (lo == 0)
            put(g, " ( r%u ( %s r%u )* )?", x, sep, x);
        else
            put(g, " ( %s r%u )*", sep, x);
        return;
    }
    long long open = 0;
    for (; i < hi; i++, open++) {
        put(g, " (");
        if (i) put(g, " %s", sep);
        put(g, " r%u", x);
    }
    for (long long k = 0; k < open; k++)
        put(g, " )?");
}

/* The rule for schema s; returns its number (rule "r<n>"). Rules are written depth first, each
 * on its own line after its children's. */
static unsigned gen(struct sg *g, json_t *s, int depth)
{
    unsigned me = g->n_rules++;
    if (g->err) return me;
    if (depth > KVF_SCHEMA_MAX_DEPTH) {
        bad(g, "json_schema nests deeper than %d", KVF_SCHEMA_MAX_DEPTH);
        return me;
    }
    if (json_is_true(s)) { /* true: any value */
        put(g, "r%u ::= value\n", me);
        return me;
    }
    if (!json_is_object(s)) {
        bad(g, "json_schema: a schema must be an object");
        return me;
    }
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v)
    {
        if (!listed(k, known, sizeof known / sizeof known[0]) &&
            !listed(k, annotations, sizeof annotations / sizeof annotations[0])) {
            bad(g, "json_schema keyword '%s' is not supported", k);
            return me;
        }
    }
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    json_t *any = json_object_get(s, "anyOf"), *ty = json_object_get(s, "type");
    if (cn) {
        put(g, "r%u ::=", me);
        put(g, " ");
        put_json_lit(g, cn);
        put(g, "\n");
        return me;
    }
    if (en) {
        if (!json_is_array(en) || json_array_size(en) == 0) {
            bad(g, "json_schema keyword 'enum' must be a non-empty array");
            return me;
        }
        put(g, "r%u ::=", me);
        size_t i;
        json_array_foreach(en, i, v)
        {
            put(g, i ? " | " : " ");
            put_json_lit(g, v);
        }
        put(g, "\n");
        return me;
    }
    if (any) {
        if (!json_is_array(any) || json_array_size(any) == 0 ||
            json_array_size(any) > KVF_SCHEMA_MAX_COUNT) {
            bad(g, "json_schema keyword 'anyOf' must be a non-empty array");
            return me;
        }
        unsigned kids[KVF_SCHEMA_MAX_COUNT];
        size_t i;
        json_array_foreach(any, i, v) kids[i] = gen(g, v, depth + 1);
        put(g, "r%u ::=", me);
        for (i = 0; i < json_array_size(any); i++)
            put(g, i ? " | r%u" : " r%u", kids[i]);
        put(g, "\n");
        return me;
    }
    /* The types it may be: a list, or one name, or none (any JSON value). */
    const char *types[8];
    size_t nt = 0;
    if (json_is_string(ty)) {
        types[nt++] = json_string_value(ty);
    } else if (json_is_array(ty) && json_array_size(ty) >= 1 && json_array_size(ty) <= 7) {
        size_t i;
        json_array_foreach(ty, i, v)
        {
            if (!json_is_string(v)) break;
            types[nt++] = json_string_value(v);
        }
    } else if (ty) {
        bad(g, "json_schema keyword 'type' must be a type name or a list of them");
        return me;
    }
    if (nt == 0) {
        put(g, "r%u ::= value\n", me);
        return me;
    }
    unsigned alt[8];
    for (size_t t = 0; t < nt; t++) {
        const char *tn = types[t];
        if (strcmp(tn, "null") == 0 || strcmp(tn, "boolean") == 0 || strcmp(tn, "integer") == 0 ||
            strcmp(tn, "number") == 0) {
            alt[t] = UINT32_MAX;
            continue;
        }
        if (strcmp(tn, "string") == 0) {
            long long lo, hi;
            if (count_kw(g, s, "minLength", &lo, 0) < 0 || count_kw(g, s, "maxLength", &hi, -1) < 0)
                return me;
            if (hi >= 0 && lo > hi) {
                bad(g, "json_schema: minLength exceeds maxLength");
                return me;
            }
            unsigned r = alt[t] = g->n_rules++;
            put(g, "r%u ::= \"\\\"\"", r);
            if (lo == 0 && hi < 0) {
                put(g, " char*");
            } else {
                for (long long i = 0; i < lo; i++)
                    put(g, " char");
                for (long long i = lo; hi >= 0 && i < hi; i++)
                    put(g, " ( char");
                for (long long i = lo; hi >= 0 && i < hi; i++)
                    put(g, " )?");
                if (hi < 0) put(g, " char*");
            }
            put(g, " \"\\\"\"\n");
        } else if (strcmp(tn, "array") == 0) {
            long long lo, hi;
            if (count_kw(g, s, "minItems", &lo, 0) < 0 || count_kw(g, s, "maxItems", &hi, -1) < 0)
                return me;
            if (hi >= 0 && lo > hi) {
                bad(g, "json_schema: minItems exceeds maxItems");
                return me;
            }
            json_t *items = json_object_get(s, "items");
            unsigned x = items ? gen(g, items, depth + 1) : 0;
            if (!items) {
                x = g->n_rules++;
                put(g, "r%u ::= value\n", x);
            }
            unsigned r = alt[t] = g->n_rules++;
            put(g, "r%u ::= \"[\"", r);
            put_repeat(g, x, "\",\"", lo, hi);
            put(g, " \"]\"\n");
        } else if (strcmp(tn, "object") == 0) {
            json_t *props = json_object_get(s, "properties");
            json_t *req = json_object_get(s, "required");
            json_t *add = json_object_get(s, "additionalProperties");
            if (props && !json_is_object(props)) {
                bad(g, "json_schema keyword 'properties' must be an object");
                return me;
            }
            if (add && !json_is_false(add) && !(json_is_object(add) && !props)) {
                bad(g, "json_schema keyword 'additionalProperties' is supported as false only");
                return me;
            }
            if (req) {
                size_t i;
                json_t *q;
                if (!json_is_array(req)) {
                    bad(g, "json_schema keyword 'required' must be a list of names");
                    return me;
                }
                json_array_foreach(req, i, q)
                {
                    if (!json_is_string(q) || !props ||
                        !json_object_get(props, json_string_value(q))) {
                        bad(g, "json_schema keyword 'required' names a property not in "
                               "'properties'");
                        return me;
                    }
                }
            }
            if (!props || json_object_size(props) == 0) {
                /* No properties: any object when additional ones are allowed, else {}. */
                unsigned r = alt[t] = g->n_rules++;
                put(g, json_is_false(add) ? "r%u ::= \"{}\"\n" : "r%u ::= object\n", r);
                continue;
            }
            if (json_object_size(props) > KVF_SCHEMA_MAX_COUNT) {
                bad(g, "json_schema: more than %d properties", KVF_SCHEMA_MAX_COUNT);
                return me;
            }
            unsigned kids[KVF_SCHEMA_MAX_COUNT];
            size_t i = 0;
            json_object_foreach(props, k, v) kids[i++] = gen(g, v, depth + 1);
            unsigned r = alt[t] = g->n_rules++;
            put(g, "r%u ::= \"{\"", r);
            i = 0;
            json_object_foreach(props, k, v)
            {
                json_t *name = json_string(k);
                char *q = name ? json_dumps(name, JSON_ENCODE_ANY) : NULL;
                json_decref(name);
                if (!q) {
                    g->err = -ENOMEM;
                    return me;
                }
                char buf[8];
                snprintf(buf, sizeof buf, "%s", i ? "," : "");
                size_t ql = strlen(q);
                char *lit = malloc(ql + 3);
                if (!lit) {
                    free(q);
                    g->err = -ENOMEM;
                    return me;
                }
                snprintf(lit, ql + 3, "%s%s:", buf, q);
                put(g, " ");
                put_lit(g, lit, strlen(lit));
                put(g, " r%u", kids[i]);
                free(lit);
                free(q);
                i++;
            }
            put(g, " \"}\"\n");
        } else {
            bad(g, "json_schema type '%s' is not supported", tn);
            return me;
        }
    }
    put(g, "r%u ::=", me);
    for (size_t t = 0; t < nt; t++) {
        const char *tn = types[t];
        put(g, t ? " |" : "");
        if (strcmp(tn, "null") == 0)
            put(g, " \"null\"");
        else if (strcmp(tn, "boolean") == 0)
            put(g, " \"true\" | \"false\"");
        else if (strcmp(tn, "integer") == 0)
            put(g, " integer");
        else if (strcmp(tn, "number") == 0)
            put(g, " number");
        else
            put(g, " r%u", alt[t]);
    }
    put(g, "\n");
    return me;
}

/* The rules every JSON grammar shares: any value (json_object's), strings, numbers. */
static const char json_common[] =
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ( string \":\" value ( \",\" string \":\" value )* )? \"}\"\n"
    "array ::= \"[\" ( value ( \",\" value )* )? \"]\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" hex hex hex hex )\n"
    "hex ::= [0-9a-fA-F]\n"
    "number ::= integer ( \".\" digits )?\n";

int kvf__srv_json_grammar(json_t *schema, char *out, size_t cap, char *err, size_t err_len)
{
    struct sg g = {.out = out, .cap = cap, .msg = err, .msg_len = err_len};
    if (cap) out[0] = 0;
    if (!schema) {
        put(&g, "root ::= object\n");
    } else {
        unsigned r = gen(&g, schema, 0);
        put(&g, "root ::= r%u\n", r);
    }
    put(&g, "%s", json_common);
    /* Up to 16 digits, nested so that each count has one parse. */
    put(&g, "digits ::= [0-9]");
    for (int i = 1; i < 16; i++)
        put(&g, " ( [0-9]");
    for (int i = 1; i < 16; i++)
        put(&g, " )?");
    put(&g, "\ninteger ::= \"-\"? ( \"0\" | [1-9]");
    for (int i = 1; i < 15; i++)
        put(&g, " ( [0-9]");
    for (int i = 1; i < 15; i++)
        put(&g, " )?");
    put(&g, " )\n");
    if (g.err) return g.err;
    return (int)g.n;
}

int kvf_schema_to_grammar(const char *schema, size_t len, char *out, size_t cap, char *err,
                          size_t err_len)
{
    json_error_t je;
    json_t *s = NULL;
    if (schema) {
        s = json_loadb(schema, len, JSON_DECODE_ANY, &je);
        if (!s) {
            snprintf(err, err_len, "the schema is not JSON: %s", je.text);
            return -EINVAL;
        }
    }
    int rc = kvf__srv_json_grammar(s, out, cap, err, err_len);
    json_decref(s);
    return rc;
}
