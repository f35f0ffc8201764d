/*
 * kvfence/template.h — renders a model's chat template (tokenizer.chat_template, a Jinja
 * template) over a conversation.
 *
 * The interpreter takes the subset of Jinja that chat templates use: text, {{ expr }},
 * {% if/elif/else %}, {% for x in xs %} (with loop.index0, index, first, last, length,
 * revindex), {% set x = ... %} and {% set ns.attr = ... %}, comments, whitespace control
 * ({%- -%}) and the lstrip_blocks / trim_blocks behaviour of the reference (@huggingface/jinja);
 * expressions with literals, lists, attribute and index access, slices, + - * / % ~, comparisons,
 * and/or/not, in / not in, x if c else y, tests (defined, none, string, number, boolean, true,
 * false, mapping, sequence), filters (trim, length, tojson, upper, lower, string, join, first,
 * last), string methods (startswith, endswith, split, strip, lstrip, rstrip, upper, lower,
 * replace), namespace() and raise_exception(). Anything else is refused by name.
 *
 * Safety: there is no file, network or environment access. Work is bounded: output at most
 * KVF_TEMPLATE_MAX_OUT bytes, at most KVF_TEMPLATE_MAX_STEPS loop iterations and expression
 * evaluations, nesting at most KVF_TEMPLATE_MAX_DEPTH deep (so no deep recursion), and memory
 * within KVF_TEMPLATE_MAX_MEM; past any bound rendering stops with an error.
 *
 * Variables the template sees: messages (a list of {role, content}), add_generation_prompt,
 * bos_token and eos_token (empty strings when NULL). Anything else (tools, ...) is undefined.
 */
#ifndef KVFENCE_TEMPLATE_H
#define KVFENCE_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#define KVF_TEMPLATE_MAX_OUT (4u << 20)
#define KVF_TEMPLATE_MAX_STEPS 1000000u
#define KVF_TEMPLATE_MAX_DEPTH 64u
#define KVF_TEMPLATE_MAX_MEM (64u << 20)

/* One message of a conversation; both strings borrowed, NUL-terminated, UTF-8. */
struct kvf_chat_msg {
    const char *role;
    const char *content;
};

/* Renders tmpl over msgs[0..n). On success returns the output's length and sets *out to a
 * malloc'd NUL-terminated string (the caller frees it). On failure returns -EINVAL (a syntax
 * error, something unsupported, raise_exception, a type error), -E2BIG (a work or output bound
 * reached) or -ENOMEM, leaves *out NULL, and writes a one-line explanation to err. */
int kvf_template_render(const char *tmpl, const struct kvf_chat_msg *msgs, size_t n,
                        bool add_generation_prompt, const char *bos, const char *eos, char **out,
                        char *err, size_t err_len);

#endif /* KVFENCE_TEMPLATE_H */
