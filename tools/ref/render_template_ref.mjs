// render_template_ref: renders chat templates with @huggingface/jinja, the reference our C engine
// (src/chat/) must match byte for byte. Test-only.
//
//   node render_template_ref.mjs TEMPLATE_FILE CONTEXT_JSON_FILE   -> rendered text on stdout
//   node render_template_ref.mjs --batch CASES_JSON_FILE           -> JSON array on stdout
//
// CASES_JSON_FILE: [{"template": "...", "context": {...}}, ...]; each result is
// {"ok": true, "out": "..."} or {"ok": false, "error": "..."}.
// CSD_FIXED_NOW=2024-07-26T10:05:00 (local time) fixes the clock seen by strftime_now().
import { readFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";

const fixed = process.env.CSD_FIXED_NOW;
if (fixed) {
	const RealDate = Date;
	const t = new RealDate(fixed).getTime();
	globalThis.Date = class extends RealDate {
		constructor(...args) {
			if (args.length === 0) super(t);
			else super(...args);
		}
		static now() {
			return t;
		}
	};
}

function render(template, context) {
	try {
		return { ok: true, out: new Template(template).render(context) };
	} catch (e) {
		return { ok: false, error: String(e && e.message ? e.message : e) };
	}
}

const args = process.argv.slice(2);
if (args[0] === "--batch" && args.length === 2) {
	const cases = JSON.parse(readFileSync(args[1], "utf8"));
	const results = cases.map((c) => render(c.template, c.context));
	process.stdout.write(JSON.stringify(results));
} else if (args.length === 2) {
	const r = render(readFileSync(args[0], "utf8"), JSON.parse(readFileSync(args[1], "utf8")));
	if (!r.ok) {
		process.stderr.write(`error: ${r.error}\n`);
		process.exit(1);
	}
	process.stdout.write(r.out);
} else {
	process.stderr.write("usage: render_template_ref.mjs TEMPLATE CONTEXT.json | --batch CASES.json\n");
	process.exit(2);
}
