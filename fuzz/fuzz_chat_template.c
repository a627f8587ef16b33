/* fuzz_chat_template: libFuzzer target for the chat-template engine: compiles arbitrary bytes as
 * a template and, if that succeeds, renders it against a fixed small conversation (tools, tool
 * calls, parts, unicode) under small step/memory/output limits. Must never crash, leak or hang.
 * Run it with `scripts/fuzz SECONDS chat_template`: seeds are ../shared's chat templates, the
 * dictionary fuzz/chat_template.dict. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat/chat_template.h"
#include "core/alloc.h"

static const char CONTEXT[] =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"Be brief.\"},"
    "{\"role\": \"user\", \"content\": \"  Hi \\u00e9\\ud83d\\ude00 {{ x }}  \"},"
    "{\"role\": \"assistant\", \"content\": \"<think>\\nr\\n</think>\\n\\nok\", \"tool_calls\": ["
    "{\"id\": \"abc123XYZ\", \"type\": \"function\", \"function\": {\"name\": \"f\", "
    "\"arguments\": {\"a\": 1}}}]},"
    "{\"role\": \"tool\", \"content\": \"{\\\"r\\\": 2}\"},"
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"part\"}]}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
    "{\"type\": \"object\"}}}],"
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    "\"enable_thinking\": false, \"n\": 3, \"f\": 1.5, \"nul\": null}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *ctx;
    if (!ctx) ctx = json_loads(CONTEXT, 0, NULL);
    if (!ctx || size > 1 << 16) return 0;
    char *src = malloc(size + 1);
    if (!src) return 0;
    memcpy(src, data, size);
    src[size] = '\0';
    csd_chat_template *t = NULL;
    csd_err err = {0};
    if (csd_chat_template_create(&t, src, &err) != 0) {
        if (err.code == 0 || err.msg[0] == '\0' || t) __builtin_trap(); /* errors must explain */
    } else {
        struct tm now = {0};
        now.tm_year = 124;
        now.tm_mday = 1;
        csd_chat_render_opts o = {
            .max_output = 1 << 14, .max_memory = 4u << 20, .max_steps = 20000, .now = &now};
        char *out = NULL;
        int rc = csd_chat_template_render_opts(t, ctx, &o, &out, &err);
        if (rc == 0) {
            if (!out) __builtin_trap();
            csd_free(out);
        } else if (out || err.msg[0] == '\0') {
            __builtin_trap();
        }
        csd_chat_template_destroy(t);
    }
    free(src);
    return 0;
}
