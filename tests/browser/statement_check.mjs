// Runs the portal's statement check (web/statement.js, the very file the page loads) over
// cases the Rust side wrote, for tests/it/portal_statement.rs.
//
//   .tools/node/bin/node tests/browser/statement_check.mjs CASES.json      (cwd = repo root)
//
// CASES.json: [{"id": ID, "response": "<GET /api/approvals/ID answer as text>", "now_ms": N}]
// Prints one JSON array, per case {"ok": {sha256, tool, args, runners, required, expires}} or
// {"error": "<the refusal's message>"}; anything thrown that is not a refusal is reported as
// {"crash": "<stack>"}. A case with `"choice": "resume"|"retry"|"abort"` checks the request's
// rollout decision instead (checkDecisionBeforeSigning): {"ok": {sha256, id, choice, runners,
// halted, failed, expires, challenge_is_the_text_hash}}. A case with `"grant": true` checks a
// grant (`GET /api/grants/ID`'s answer) before a passkey signs it (checkGrantBeforeSigning):
// {"ok": {sha256, words: {label: text}, visible: [text as shown], challenge_is_the_text_hash}}.
// A case with `"review": true` checks the review of break-glass window `id` whose grant text
// is `window_text` (checkReviewBeforeSigning): the one `proposed`, or a new one with `note`,
// the window closed at `closed_at` (the API's `closed[0]`) if given, else at its expiry:
// {"ok": {text, sha256, note, reviewed, challenge_is_the_text_hash}}.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(import.meta.url);
const statement = require(path.resolve('web/statement.js'));

const cases = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const out = [];
for (const c of cases) {
  try {
    if (c.review) {
      const r = await statement.checkReviewBeforeSigning(c.id, c.window_text, c.proposed ?? null, c.note ?? null, c.now_ms, c.closed_at ?? null);
      out.push({ ok: {
        text: r.text, sha256: r.sha256, note: r.note, reviewed: r.reviewed,
        challenge_is_the_text_hash: Buffer.from(r.challenge).toString('hex') === r.sha256,
      } });
      continue;
    }
    if (c.grant) {
      const g = await statement.checkGrantBeforeSigning(c.id, c.response, c.now_ms);
      out.push({ ok: {
        sha256: g.sha256, words: Object.fromEntries(g.words), visible: g.words.map(([, t]) => statement.visible(t)),
        challenge_is_the_text_hash: Buffer.from(g.challenge).toString('hex') === g.sha256 && g.text === JSON.parse(c.response).text,
      } });
      continue;
    }
    if (c.choice !== undefined) {
      const d = await statement.checkDecisionBeforeSigning(c.id, c.choice, c.response, c.now_ms);
      out.push({ ok: {
        sha256: d.sha256, id: d.id, choice: d.choice, runners: d.runners, halted: d.halted, failed: d.failed, expires: d.expires,
        challenge_is_the_text_hash: Buffer.from(d.challenge).toString('hex') === d.sha256 && d.text === JSON.parse(c.response).decision.text,
      } });
      continue;
    }
    const s = await statement.checkBeforeSigning(c.id, c.response, c.now_ms);
    out.push({ ok: {
      sha256: s.sha256, tool: s.tool, args: s.args, runners: s.runners, required: s.required, expires: s.expires,
      challenge_is_the_text_hash: Buffer.from(s.challenge).toString('hex') === s.sha256 && s.text === JSON.parse(c.response).statement.text,
    } });
  } catch (e) {
    out.push(e instanceof statement.Refusal ? { error: e.message } : { crash: String(e && e.stack) });
  }
}
process.stdout.write(`${JSON.stringify(out)}\n`);
