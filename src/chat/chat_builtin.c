/* chat_builtin: chat templates we ship for models whose tokenizer_config.json has none.
 * Written for this project in the style of each family's published format (ChatML, Llama 3,
 * Llama 2 [INST] <<SYS>>, Mistral [INST], Gemma turns); they accept content as a string or as a
 * list of {type:"text"} parts. They use only the subset documented in docs/chat_templates.md. */
#include "chat/chat_template.h"

#include <string.h>

/* Shared macro: content as a string, or the concatenated text parts of a list. */
#define CONTENT_MACRO                                                                          \
    "{%- macro text(content) -%}"                                                              \
    "{%- if content is string -%}{{- content -}}"                                              \
    "{%- elif content is iterable -%}"                                                         \
    "{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}"  \
    "{%- endfor -%}"                                                                           \
    "{%- endif -%}"                                                                            \
    "{%- endmacro -%}\n"

static const char CHATML[] =
    CONTENT_MACRO
    "{%- for message in messages -%}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + text(message.content) + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n";

static const char LLAMA3[] =
    CONTENT_MACRO
    "{{- bos_token if bos_token is defined else '' -}}\n"
    "{%- for message in messages -%}\n"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' -}}\n"
    "{{- text(message.content) | trim -}}{{- '<|eot_id|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}\n";

static const char LLAMA2[] =
    CONTENT_MACRO
    "{%- set bos = bos_token if bos_token is defined else '' -%}\n"
    "{%- set eos = eos_token if eos_token is defined else '' -%}\n"
    "{%- if messages and messages[0].role == 'system' -%}\n"
    "{%- set system = '<<SYS>>\\n' + text(messages[0].content) | trim + '\\n<</SYS>>\\n\\n' -%}\n"
    "{%- set turns = messages[1:] -%}\n"
    "{%- else -%}{%- set system = '' -%}{%- set turns = messages -%}{%- endif -%}\n"
    "{%- for message in turns -%}\n"
    "{%- if (message.role == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}"
    "{%- endif -%}\n"
    "{%- set content = text(message.content) | trim -%}\n"
    "{%- if message.role == 'user' -%}\n"
    "{%- if loop.first -%}{%- set content = system + content -%}{%- endif -%}\n"
    "{{- bos + '[INST] ' + content + ' [/INST]' -}}\n"
    "{%- else -%}{{- ' ' + content + ' ' + eos -}}{%- endif -%}\n"
    "{%- endfor -%}\n";

static const char MISTRAL[] =
    CONTENT_MACRO
    "{%- set eos = eos_token if eos_token is defined else '' -%}\n"
    "{%- if messages and messages[0].role == 'system' -%}\n"
    "{%- set system = text(messages[0].content) -%}{%- set turns = messages[1:] -%}\n"
    "{%- else -%}{%- set system = '' -%}{%- set turns = messages -%}{%- endif -%}\n"
    "{{- bos_token if bos_token is defined else '' -}}\n"
    "{%- for message in turns -%}\n"
    "{%- if (message.role == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}"
    "{%- endif -%}\n"
    "{%- if message.role == 'user' -%}\n"
    "{%- if loop.last and system -%}"
    "{{- '[INST] ' + system + '\\n\\n' + text(message.content) + '[/INST]' -}}\n"
    "{%- else -%}{{- '[INST] ' + text(message.content) + '[/INST]' -}}{%- endif -%}\n"
    "{%- elif message.role == 'assistant' -%}{{- ' ' + text(message.content) + eos -}}\n"
    "{%- else -%}{{- raise_exception('Only user and assistant roles are supported after an "
    "optional system message') -}}{%- endif -%}\n"
    "{%- endfor -%}\n";

static const char GEMMA[] =
    CONTENT_MACRO
    "{{- bos_token if bos_token is defined else '' -}}\n"
    "{%- if messages and messages[0].role == 'system' -%}\n"
    "{%- set system = text(messages[0].content) + '\\n\\n' -%}{%- set turns = messages[1:] -%}\n"
    "{%- else -%}{%- set system = '' -%}{%- set turns = messages -%}{%- endif -%}\n"
    "{%- for message in turns -%}\n"
    "{%- if (message.role == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}"
    "{%- endif -%}\n"
    "{%- set role = 'model' if message.role == 'assistant' else message.role -%}\n"
    "{{- '<start_of_turn>' + role + '\\n' + (system if loop.first else '') -}}\n"
    "{{- text(message.content) | trim -}}{{- '<end_of_turn>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}\n";

const char *csd_chat_template_builtin(const char *name) {
    static const struct {
        const char *name;
        const char *text;
    } table[] = {{"chatml", CHATML}, {"llama3", LLAMA3}, {"llama2", LLAMA2},
                 {"mistral", MISTRAL}, {"gemma", GEMMA}};
    if (!name) return NULL;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(table[i].name, name) == 0) return table[i].text;
    return NULL;
}
