/* tool_request: the `tools` and `tool_choice` of a chat request, validated, and what the answer
 * does with them (docs/api.md, "Tool calls"):
 *   - auto (tool_choice absent or "auto", with tools): the template shows the tools, the model
 *     decides, and the calls it writes are split out of the answer (tool_calls.h);
 *   - a named function ({"type": "function", "function": {"name": ...}}), or "required" with one
 *     tool: the answer is that function's arguments, constrained to its parameters schema;
 *   - "required" with several tools: the answer is {"name": one of them, "arguments": valid
 *     against that tool's parameters}, constrained by a union of the tools built here;
 *   - "none", or no tools: plain text.
 * Part of openai_request.c's parsing (pure, fuzzed with it). */
#ifndef CSD_HTTP_TOOL_REQUEST_H
#define CSD_HTTP_TOOL_REQUEST_H

#include <jansson.h>

#include "openai_request.h"

/* Tools per request (OpenAI's limit) and bytes per function name. */
#define CSD_HTTP_MAX_TOOLS 128
#define CSD_HTTP_MAX_TOOL_NAME 256

/* Reads root's "tools" and "tool_choice" into r (tools, tool_choice, tool_mode, tool_name and, for
 * the forced modes, json_object and json_schema). Returns 0 or CSD_EINVAL with e set. */
int csd_http_parse_tools(const json_t *root, csd_http_req *r, csd_http_error *e);

/* The tool_calls of an assistant message in the history, as the template gets them: a copy in
 * which each function's "arguments" string that holds a JSON object is that object (as vLLM
 * hands them on: templates write arguments with tojson). NULL when out of memory. */
json_t *csd_http_history_calls(const json_t *tool_calls);

#endif
