// tokenize_ref: runs the reference tokenizer (npm @huggingface/tokenizers) over a corpus so
// tests/e2e_tok_parity.sh can compare cascadia with it string by string.
// usage: node tokenize_ref.mjs DIR CORPUS OUT_PREFIX [--no-special]
//   CORPUS: one string per line, base64 of its bytes. Bytes are turned into the JS string the way
//   any UTF-8 reader does (TextDecoder: each invalid sequence -> U+FFFD; a BOM is kept).
//   Writes OUT_PREFIX.ids (ids per line), OUT_PREFIX.dec (base64 of decode(ids), cleanup off) and
//   OUT_PREFIX.rt ("1" when the reference's own decode(encode(s)) == s (NFC-normalized when the
//   tokenizer normalizes with NFC), else "0"; encode without special tokens for this check), and
//   OUT_PREFIX.want (base64 of that expected round-trip text).
import fs from "node:fs";
import path from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";

const [dir, corpusPath, outPrefix, ...flags] = process.argv.slice(2);
if (!dir || !corpusPath || !outPrefix) {
  console.error("usage: node tokenize_ref.mjs DIR CORPUS OUT_PREFIX [--no-special]");
  process.exit(2);
}
const addSpecial = !flags.includes("--no-special");
const tjson = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const cfgPath = path.join(dir, "tokenizer_config.json");
const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
const tok = new Tokenizer(tjson, cfg);
const usesNFC = JSON.stringify(tjson.normalizer ?? null).includes('"NFC"');
const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
const lines = fs.readFileSync(corpusPath, "utf8").split("\n");
if (lines.length && lines[lines.length - 1] === "") lines.pop();
const ids = [], dec = [], rt = [], wants = [];
const decodeIds = (v) => (v.length ? tok.decode(v, { clean_up_tokenization_spaces: false }) : "");
for (const line of lines) {
  const text = decoder.decode(Buffer.from(line, "base64"));
  const enc = tok.encode(text, { add_special_tokens: addSpecial }).ids;
  ids.push(enc.join(" "));
  dec.push(Buffer.from(decodeIds(enc), "utf8").toString("base64"));
  const plain = tok.encode(text, { add_special_tokens: false }).ids;
  const want = usesNFC ? text.normalize("NFC") : text;
  rt.push(decodeIds(plain) === want ? "1" : "0");
  wants.push(Buffer.from(want, "utf8").toString("base64"));
}
fs.writeFileSync(outPrefix + ".ids", ids.join("\n") + "\n");
fs.writeFileSync(outPrefix + ".dec", dec.join("\n") + "\n");
fs.writeFileSync(outPrefix + ".rt", rt.join("\n") + "\n");
fs.writeFileSync(outPrefix + ".want", wants.join("\n") + "\n");
console.error(`tokenize_ref: ${lines.length} strings, add_special_tokens=${addSpecial}`);
