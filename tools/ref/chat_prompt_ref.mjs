// chat_prompt_ref: the reference chat prompt for a model directory: renders its chat_template with
// @huggingface/jinja (add_generation_prompt) and tokenizes with @huggingface/tokenizers, as
// transformers' apply_chat_template(tokenize=True) does. tests/e2e_api.sh compares the server's
// usage.prompt_tokens with it. Test-only.
//   node chat_prompt_ref.mjs MODEL_DIR MESSAGES_JSON [TOOLS_JSON [EXTRA_JSON]]  -> {"text", "ids"}
// EXTRA_JSON: more template variables (chat_template_kwargs); TOOLS_JSON may be "null".
import fs from "node:fs";
import path from "node:path";
import { Template } from "@huggingface/jinja";
import { Tokenizer } from "@huggingface/tokenizers";

const [dir, messagesJson, toolsJson, extraJson] = process.argv.slice(2);
const tools = toolsJson ? JSON.parse(toolsJson) : null;
const tjson = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const cfg = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
const tokenText = (t) => (t && typeof t === "object" ? t.content : t);
const text = new Template(cfg.chat_template).render({
  messages: JSON.parse(messagesJson),
  ...(tools ? { tools } : {}),
  ...(extraJson ? JSON.parse(extraJson) : {}),
  add_generation_prompt: true,
  bos_token: tokenText(cfg.bos_token) ?? "",
  eos_token: tokenText(cfg.eos_token) ?? "",
});
const tok = new Tokenizer(tjson, cfg);
// the template writes any BOS itself: no special tokens added (transformers does the same)
const ids = tok.encode(text, { add_special_tokens: false }).ids;
console.log(JSON.stringify({ text, ids }));
