// emisar portal: the check a page makes before a passkey signs an approval statement.
//
// What people see must be what they sign. The approvals API sends, beside the request it
// shows (`args`, `runners`, `required_approvals`, `preview`), the statement a signature
// covers (`statement.text`) and the arguments its `args` digest covers (`statement.args`).
// Nothing the server computed is trusted here: every line of the statement is recomputed from
// what the page shows (digests with WebCrypto), and the passkey's challenge is the SHA-256 of
// the statement's text computed here, never `statement.challenge`. The specification is
// `check_before_signing` in src/cli/approvals.rs (the terminal's check) and
// src/protocol/approval/statement.rs (the text's format); this file follows both line by line.
//
// The same for people's decision on a halted rollout (`checkDecisionBeforeSigning`, below):
// `check_decision_before_signing` in src/cli/approvals.rs, and the text's format in
// src/protocol/approval/decision.rs; a refusal names `approval`, `choice`, `statement`,
// `runners`, `decision` or `expires`.
//
// The same for a grant people sign (`checkGrantBeforeSigning`, below): `check_before_signing`
// in src/cli/grants.rs, and the text's format in src/protocol/approval/grant.rs; the grants
// and break-glass pages show a grant only as this reads it from its own text.
//
// Pure: no DOM. The page loads it before app.js (it sets `emisarStatement`); Node loads it with
// require() for tests/it/portal_statement.rs, which holds it to the Rust implementation.
//
// Invariant: every refusal names the statement's field (`approval`, `tool`, `args`, `runner`,
// `runner NAME preview`, `wave`, `pause`, `required`, `expires`) and the rule it broke; a value whose canonical
// JSON this page cannot write exactly as the server does (a number that is not a safe whole
// number, a non-ASCII object key, a lone surrogate) is refused, never guessed.
'use strict';

(function (exported) {
  const VERSION_LINE = 'emisar-approval/v2';
  // A secret param's value in the signed arguments, and in the arguments the request shows.
  const COMMIT_PREFIX = 'commit:sha256:';
  const SEALED_PREFIX = 'hmac-sha256:';
  // src/protocol/approval/mod.rs: DEFAULT_MAX_LIFETIME_SECS and CLOCK_SKEW_SECS.
  const DEFAULT_MAX_LIFETIME_SECS = 21 * 60;
  const CLOCK_SKEW_SECS = 60;
  const TERMINAL = 'approve it in the terminal (`emisar approvals approve ID`)';

  // A refusal: its message names the field and the rule.
  class Refusal extends Error {}

  // A number whose source text is not a whole number this page can write back byte for byte
  // (`1.0`, `1e3`, `-0`, beyond 2^53): kept as its source text, refused where it is hashed.
  class InexactNumber {
    constructor(source) { this.source = source; }
    toJSON() { return Number(this.source); }
    toString() { return this.source; }
  }

  const utf8 = new TextEncoder();
  const WHOLE = /^-?(0|[1-9][0-9]*)$/;

  // JSON.parse that keeps every number it cannot be sure of as an InexactNumber. Browsers
  // without the reviver's source text (JSON.parse source text access) lose `1.0` → 1, which
  // is still safe: the digests below would then differ, and the statement is refused.
  function parseExact(text) {
    return JSON.parse(text, function (key, value, context) {
      if (typeof value !== 'number') return value;
      const source = context && typeof context.source === 'string' ? context.source : null;
      if (source !== null && (!WHOLE.test(source) || source === '-0')) return new InexactNumber(source);
      if (!Number.isSafeInteger(value) || Object.is(value, -0)) return new InexactNumber(source ?? String(value));
      return value;
    });
  }

  // src/digest.rs `canonical_json`: object keys sorted, no whitespace, serde_json's escaping
  // (which JSON.stringify shares for every well-formed string). `field` names the statement
  // line the value belongs to, for the refusal.
  function canonicalJson(value, field, at = '') {
    const where = at ? `\`${field}\`: \`${at}\`` : `\`${field}\``;
    if (value === null || typeof value === 'boolean') return JSON.stringify(value);
    if (value instanceof InexactNumber) {
      throw new Refusal(`${where} is the number ${value.source}, which this page cannot hash exactly as the server does (only whole numbers up to 2^53 are checked here): ${TERMINAL}`);
    }
    if (typeof value === 'number') {
      if (!Number.isSafeInteger(value) || Object.is(value, -0)) {
        throw new Refusal(`${where} is the number ${value}, which this page cannot hash exactly as the server does (only whole numbers up to 2^53 are checked here): ${TERMINAL}`);
      }
      return JSON.stringify(value);
    }
    if (typeof value === 'string') {
      // A lone surrogate has no UTF-8 form: the server could not have hashed it.
      if (/\p{Cs}/u.test(value)) throw new Refusal(`${where} holds a lone UTF-16 surrogate, which has no UTF-8 form`);
      return JSON.stringify(value);
    }
    if (Array.isArray(value)) {
      return `[${value.map((v, i) => canonicalJson(v, field, `${at}[${i}]`)).join(',')}]`;
    }
    if (typeof value === 'object') {
      const keys = Object.keys(value);
      for (const k of keys) {
        // The server sorts keys by their UTF-8 bytes, JavaScript by UTF-16 units: the same
        // order for ASCII, which every param and preview value name is.
        if (!/^[\x00-\x7f]*$/.test(k)) {
          throw new Refusal(`${where} has the key ${JSON.stringify(k)}, which is not ASCII: this page sorts only ASCII keys as the server does; ${TERMINAL}`);
        }
      }
      keys.sort();
      const path = (k) => (at ? `${at}.${k}` : k);
      return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k], field, path(k))}`).join(',')}}`;
    }
    throw new Refusal(`${where} is not JSON`);
  }

  function hex(bytes) {
    return Array.from(new Uint8Array(bytes), (b) => b.toString(16).padStart(2, '0')).join('');
  }

  async function sha256(text) {
    if (!globalThis.crypto || !globalThis.crypto.subtle) {
      throw new Refusal(`this page has no WebCrypto (it is not served over HTTPS), so it cannot check what it would sign: ${TERMINAL}`);
    }
    return new Uint8Array(await globalThis.crypto.subtle.digest('SHA-256', utf8.encode(text)));
  }

  // Byte order of the UTF-8 forms, as Rust orders Strings (the statement's runners).
  function byteOrder(a, b) {
    const x = utf8.encode(a);
    const y = utf8.encode(b);
    for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i] - y[i];
    return x.length - y.length;
  }

  // src/protocol/approval/statement.rs `parse_utc`: `YYYY-MM-DDTHH:MM:SSZ` → Unix seconds, or
  // null for anything else (a day the month lacks, a time before 1970 included).
  function parseUtc(t) {
    const m = /^([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})Z$/.exec(t);
    if (!m) return null;
    const [y, mo, d, hh, mm, ss] = m.slice(1).map(Number);
    const leap = (y % 4 === 0 && y % 100 !== 0) || y % 400 === 0;
    const days = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    if (mo < 1 || mo > 12 || d < 1 || d > days[mo - 1] || hh > 23 || mm > 59 || ss > 59) return null;
    // Days from the civil date, as the Rust does it (Date.UTC reads years 0 to 99 as 19xx).
    const [y2, m2] = mo <= 2 ? [y - 1, mo + 9] : [y, mo - 3];
    const era = Math.floor(y2 / 400);
    const yoe = y2 - era * 400;
    const doy = Math.floor((153 * m2 + 2) / 5) + d - 1;
    const doe = yoe * 365 + Math.floor(yoe / 4) - Math.floor(yoe / 100) + doy;
    const secs = (era * 146097 + doe - 719468) * 86400 + hh * 3600 + mm * 60 + ss;
    return secs >= 0 ? secs : null;
  }

  const statementError = (msg) => new Refusal(`the statement: ${msg}`);

  function checkWord(field, v) {
    if (v.length === 0 || utf8.encode(v).length > 512) throw statementError(`\`${field}\` must be 1 to 512 bytes`);
    if (/[\p{White_Space}\p{Cc}]/u.test(v)) throw statementError(`\`${field}\` must hold no whitespace or control character`);
  }

  function stripSha256(field, v) {
    if (!v.startsWith('sha256:')) throw statementError(`\`${field}\` must be \`sha256:HEX\``);
    const d = v.slice('sha256:'.length);
    if (!/^[0-9a-f]{64}$/.test(d)) throw statementError(`\`${field}\` must be a SHA-256 in lowercase hex`);
    return d;
  }

  // src/protocol/approval/statement.rs `Statement::parse`: only the text `Statement::text`
  // would write (the same bytes) is read.
  function parseStatement(text) {
    if (typeof text !== 'string') throw new Refusal('the request has no statement');
    if (utf8.encode(text).length > 64 * 1024) throw statementError('longer than 64 KiB');
    if (!text.endsWith('\n')) throw statementError('must end with a newline');
    const lines = text.slice(0, -1).split('\n');
    if (lines[0] !== VERSION_LINE) throw statementError(`the first line must be \`${VERSION_LINE}\``);
    const fields = lines.slice(1).map((line) => {
      const at = line.indexOf(' ');
      if (at < 0) throw statementError('every line after the first is `key value`');
      return [line.slice(0, at), line.slice(at + 1)];
    });
    let i = 0;
    const take = (key) => {
      if (i >= fields.length) throw statementError(`\`${key}\` is missing`);
      const [k, v] = fields[i++];
      if (k !== key) throw statementError(`expected \`${key}\`, found \`${k}\``);
      return v;
    };
    const st = { runners: new Map() };
    st.approval = take('approval');
    st.tool = take('tool');
    st.pack = stripSha256('pack', take('pack'));
    st.args = stripSha256('args', take('args'));
    while (i < fields.length && fields[i][0] === 'runner') {
      const parts = fields[i++][1].split(' ');
      if (parts.length !== 3 || parts[1] !== 'preview') {
        throw statementError('a runner line is `runner NAME preview none|sha256:HEX`');
      }
      const [name, , preview] = parts;
      if (st.runners.has(name)) throw statementError(`runner \`${name}\` is named twice`);
      st.runners.set(name, preview === 'none' ? null : stripSha256('runner preview', preview));
    }
    // The rollout: `wave N A,B` lines in order, then `pause S`.
    st.waves = [];
    while (i < fields.length && fields[i][0] === 'wave') {
      const v = fields[i++][1];
      const at = v.indexOf(' ');
      if (at < 0) throw statementError('a wave line is `wave N RUNNER,RUNNER…`');
      const want = String(st.waves.length + 1);
      if (v.slice(0, at) !== want) throw statementError(`expected \`wave ${want}\`, found \`wave ${v.slice(0, at)}\``);
      st.waves.push(v.slice(at + 1).split(','));
    }
    const pause = take('pause');
    if (!/^[0-9]+$/.test(pause) || Number(pause) > 0xffffffff) {
      throw statementError('`pause` must be a whole number of seconds');
    }
    st.pause = Number(pause);
    const required = take('required');
    if (!/^[0-9]+$/.test(required) || Number(required) > 0xffffffff) {
      throw statementError('`required` must be a whole number');
    }
    st.required = Number(required);
    st.policy = stripSha256('policy', take('policy'));
    st.requester = take('requester');
    st.expires = take('expires');
    if (i < fields.length) throw statementError('a line follows `expires`');
    // `Statement::text`'s checks, then its bytes: anything but the canonical form is refused.
    checkWord('approval', st.approval);
    checkWord('tool', st.tool);
    checkWord('requester', st.requester);
    checkWord('expires', st.expires);
    st.expiresUnix = parseUtc(st.expires);
    if (st.expiresUnix === null) throw statementError('`expires` must be UTC as YYYY-MM-DDTHH:MM:SSZ');
    if (st.runners.size === 0) throw statementError('`runner`: a statement names at least one runner');
    for (const name of st.runners.keys()) checkWord('runner', name);
    checkPlan(st);
    if (st.required === 0) throw statementError('`required` must be at least 1');
    const runnerLines = [...st.runners.keys()].sort(byteOrder)
      .map((name) => `runner ${name} preview ${st.runners.get(name) === null ? 'none' : `sha256:${st.runners.get(name)}`}\n`);
    const canonical = `${VERSION_LINE}\napproval ${st.approval}\ntool ${st.tool}\npack sha256:${st.pack}\n`
      + `args sha256:${st.args}\n${runnerLines.join('')}`
      + st.waves.map((w, n) => `wave ${n + 1} ${w.join(',')}\n`).join('')
      + `pause ${st.pause}\nrequired ${st.required}\npolicy sha256:${st.policy}\n`
      + `requester ${st.requester}\nexpires ${st.expires}\n`;
    if (canonical !== text) throw statementError('not in canonical form (runners sorted, one space between words)');
    return st;
  }

  // src/protocol/approval/statement.rs `Plan::check`: at least one wave, none empty, each
  // sorted, every runner in exactly one wave and no other name.
  function checkPlan(st) {
    if (st.waves.length === 0 || st.waves.length > 1000) throw statementError('`wave`: a plan has 1 to 1000 waves');
    const seen = new Set();
    st.waves.forEach((wave, i) => {
      const n = i + 1;
      if (wave.length === 0 || wave.some((r) => r === '')) throw statementError(`\`wave ${n}\` names no runner`);
      const sorted = [...wave].sort(byteOrder);
      if (sorted.some((r, j) => r !== wave[j])) throw statementError(`\`wave ${n}\`: its runners must be sorted`);
      for (const r of wave) {
        if (!st.runners.has(r)) throw statementError(`\`wave ${n}\` names \`${r}\`, which no \`runner\` line names`);
        if (seen.has(r)) throw statementError(`runner \`${r}\` is in two waves`);
        seen.add(r);
      }
    });
    for (const r of st.runners.keys()) {
      if (!seen.has(r)) throw statementError(`runner \`${r}\` is in no wave`);
    }
  }

  // src/protocol/approval/mod.rs `issued_millis`: the request time in a UUIDv7 approval id.
  function issuedMillis(id) {
    if (typeof id !== 'string' || id.length !== 36) return null;
    if ([8, 13, 18, 23].some((i) => id[i] !== '-') || id[14] !== '7') return null;
    if (!/^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/.test(id)) return null;
    return parseInt(id.slice(0, 8) + id.slice(9, 13), 16);
  }

  // src/protocol/approval/mod.rs `check_lifetime`.
  function checkLifetime(id, expires, now, maxLifetime) {
    const issuedMs = issuedMillis(id);
    if (issuedMs === null) {
      throw new Refusal(`\`approval\`: \`${id}\` is not a UUIDv7, whose time says when it was requested`);
    }
    const issued = Math.floor(issuedMs / 1000);
    if (issued > now + CLOCK_SKEW_SECS) {
      throw new Refusal(`\`approval\`: requested at ${issued} (unix seconds), after this clock's ${now}: an approval from the future is refused`);
    }
    if (now >= expires) throw new Refusal(`\`expires\`: the approval expired at ${expires} (unix seconds)`);
    const lives = Math.max(0, expires - issued);
    if (lives > maxLifetime) {
      throw new Refusal(`\`expires\`: the approval lives ${lives} s from its request to its expiry, more than the ${maxLifetime} s allowed here (the server's default approval_ttl_secs and approved_start_within_secs, and a minute; a server set for longer approvals is approved in the terminal with --max-lifetime)`);
    }
  }

  const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v) && !(v instanceof InexactNumber);
  const show = (v) => (v === undefined ? 'nothing' : v instanceof InexactNumber ? v.source : JSON.stringify(v));

  // The check (src/cli/approvals.rs `check_before_signing`), over the approvals API's answer
  // for request `id` as text (`GET /api/approvals/ID`), at `nowMs` (milliseconds since the
  // epoch). Returns what is signed, as the page shows it, and the passkey's challenge; throws
  // a Refusal naming the field.
  async function checkBeforeSigning(id, responseText, nowMs, maxLifetime = DEFAULT_MAX_LIFETIME_SECS) {
    let request;
    try {
      request = parseExact(responseText);
    } catch {
      throw new Refusal('the server\'s answer is not JSON');
    }
    if (!isObject(request) || !isObject(request.statement)) throw new Refusal('the request has no statement');
    const text = request.statement.text;
    const st = parseStatement(text);
    if (st.approval !== id) throw new Refusal(`\`approval\`: the statement names approval ${st.approval}, not ${id}`);
    if (request.tool !== st.tool) {
      throw new Refusal(`\`tool\`: the statement names \`${st.tool}\`, the request shows ${show(request.tool)}`);
    }

    // The arguments: the statement's digest is of these, and these are the ones shown.
    const signed = request.statement.args;
    if (!isObject(signed)) throw new Refusal('`args`: the server sent no arguments for the statement\'s digest');
    const signedJson = canonicalJson(signed, 'args');
    if (hex(await sha256(signedJson)) !== st.args) {
      throw new Refusal('`args`: the statement\'s digest is not the digest of the arguments shown');
    }
    const shown = request.args;
    if (!isObject(shown)) throw new Refusal('`args`: the request shows no arguments');
    const signedKeys = Object.keys(signed);
    if (Object.keys(shown).length !== signedKeys.length) {
      throw new Refusal('`args`: the statement covers other arguments than the request shows');
    }
    for (const k of signedKeys) {
      const v = signed[k];
      const has = Object.prototype.hasOwnProperty.call(shown, k);
      const s = has ? shown[k] : undefined;
      let same;
      if (typeof v === 'string' && v.startsWith(COMMIT_PREFIX) && typeof s === 'string') {
        // A secret param: signed as its salted commitment, shown sealed.
        same = s.startsWith(SEALED_PREFIX);
      } else {
        same = has && canonicalJson(s, 'args', k) === canonicalJson(v, 'args', k);
      }
      if (!same) {
        throw new Refusal(`\`args\`: \`${k}\` is ${show(v)} in the statement and ${has ? show(s) : 'absent'} in the request shown`);
      }
    }

    // The runners, and the preview values each sealed.
    if (!Array.isArray(request.runners) || request.runners.some((r) => typeof r !== 'string')) {
      throw new Refusal('`runner`: the request shows no runners');
    }
    const listed = [...st.runners.keys()].sort();
    const wanted = [...request.runners].sort();
    if (listed.length !== wanted.length || listed.some((r, i) => r !== wanted[i])) {
      throw new Refusal(`\`runner\`: the statement names ${JSON.stringify(listed)}, the request shows ${JSON.stringify(wanted)}`);
    }
    const preview = isObject(request.preview) ? request.preview : {};
    for (const r of Object.keys(preview)) {
      if (!st.runners.has(r)) {
        throw new Refusal(`\`runner ${r} preview\`: the request shows a preview for a runner the statement does not name`);
      }
    }
    const runners = [];
    for (const [runner, digest] of st.runners) {
      const field = `runner ${runner} preview`;
      const answer = preview[runner];
      const sealed = isObject(answer) && typeof answer.sealed_vars === 'string' ? answer.sealed_vars : null;
      let values = null;
      if (sealed !== null) {
        let vars;
        try {
          vars = parseExact(sealed);
        } catch {
          throw new Refusal(`\`${field}\`: the sealed values are not JSON`);
        }
        values = canonicalJson(vars, field);
      }
      const computed = values === null ? null : hex(await sha256(values));
      if (computed !== digest) {
        throw new Refusal(`\`${field}\`: the statement's digest is not the digest of the preview values shown`);
      }
      runners.push({ name: runner, preview: values });
    }

    // The rollout: the plan signed is the plan the request shows.
    const plan = request.plan;
    const samePlan = isObject(plan) && Array.isArray(plan.waves) && plan.pause_secs === st.pause
      && plan.waves.length === st.waves.length
      && plan.waves.every((w, n) => Array.isArray(w) && w.length === st.waves[n].length
        && w.every((r, j) => r === st.waves[n][j]));
    if (!samePlan) {
      throw new Refusal(`\`wave\`: the statement's rollout is ${JSON.stringify({ waves: st.waves, pause_secs: st.pause })}, the request shows ${show(plan)}`);
    }

    if (request.requester !== st.requester) {
      throw new Refusal(`\`requester\`: the statement says \`${st.requester}\`, the request shows ${show(request.requester)}`);
    }
    if (request.required_approvals !== st.required) {
      throw new Refusal(`\`required\`: the statement says ${st.required}, the request shows ${show(request.required_approvals)}`);
    }
    checkLifetime(id, st.expiresUnix, Math.floor(nowMs / 1000), maxLifetime);

    // The challenge is computed here from the text just checked.
    const challenge = await sha256(text);
    return {
      text,
      challenge,
      sha256: hex(challenge),
      tool: st.tool,
      args: signedJson,
      runners,
      waves: st.waves,
      pause: st.pause,
      required: st.required,
      expires: st.expires,
      requester: st.requester,
    };
  }

  // ---------------------------------------------------------------- rollout decisions
  //
  // People's decision on a halted rollout (resume, retry or abort) is signed like a statement:
  // src/protocol/approval/decision.rs is the text's format, and `check_decision_before_signing`
  // in src/cli/approvals.rs the terminal's check, which this follows line by line.

  const DECISION_VERSION_LINE = 'emisar-rollout-decision/v1';
  const MAX_WAVES = 1000;
  const CHOICES = ['resume', 'retry', 'abort'];
  const decisionError = (msg) => new Refusal(`the server's decision: rollout decision: ${msg}`);

  // `Decision::check`'s rule for a one-word field: no whitespace, control character or comma.
  function checkDecisionWord(field, v) {
    if (v.length === 0 || utf8.encode(v).length > 512 || /[\p{White_Space}\p{Cc},]/u.test(v)) {
      throw decisionError(`\`${field}\` must be 1 to 512 bytes without whitespace, a control character or a comma`);
    }
  }

  // src/protocol/approval/decision.rs `Decision::parse`: only the text `Decision::text` would
  // write (the same bytes) is read.
  function parseDecision(text) {
    if (typeof text !== 'string') throw new Refusal('the request has no decision to sign');
    if (utf8.encode(text).length > 64 * 1024) throw decisionError('longer than 64 KiB');
    if (!text.endsWith('\n')) throw decisionError('must end with a newline');
    const lines = text.slice(0, -1).split('\n');
    if (lines[0] !== DECISION_VERSION_LINE) throw decisionError(`the first line must be \`${DECISION_VERSION_LINE}\``);
    let i = 1;
    const take = (key) => {
      if (i >= lines.length) throw decisionError(`\`${key}\` is missing`);
      const line = lines[i++];
      const at = line.indexOf(' ');
      if (at < 0) throw decisionError('every line after the first is `key value`');
      const k = line.slice(0, at);
      if (k !== key) throw decisionError(`expected \`${key}\`, found \`${k}\``);
      return line.slice(at + 1);
    };
    const d = {};
    d.id = take('decision');
    d.approval = take('approval');
    const statement = take('statement');
    if (!statement.startsWith('sha256:')) throw decisionError('`statement` must be `sha256:HEX`');
    d.statement = statement.slice('sha256:'.length);
    // Rust's u32 parse: digits, an optional `+`, at most 2^32 - 1.
    const halted = take('halted');
    if (!/^\+?[0-9]+$/.test(halted) || Number(halted) > 0xffffffff) throw decisionError('`halted` must be a wave number');
    d.halted = Number(halted);
    d.choice = take('choice');
    if (!CHOICES.includes(d.choice)) throw decisionError(`\`choice\` must be resume, retry or abort, not \`${d.choice}\``);
    const runners = take('runners');
    d.runners = runners === '-' ? [] : runners.split(',');
    d.expires = take('expires');
    if (i < lines.length) throw decisionError('a line follows `expires`');
    // `Decision::check`, in its order, then the bytes.
    checkDecisionWord('decision', d.id);
    checkDecisionWord('approval', d.approval);
    d.expiresUnix = parseUtc(d.expires);
    if (d.expiresUnix === null) throw decisionError('`expires` must be YYYY-MM-DDTHH:MM:SSZ');
    if (!/^[0-9a-f]{64}$/.test(d.statement)) throw decisionError('`statement` must be a SHA-256 in lowercase hex');
    if (d.halted === 0 || d.halted > MAX_WAVES) throw decisionError(`\`halted\` must be a wave, 1 to ${MAX_WAVES}`);
    for (const r of d.runners) checkDecisionWord('runners', r);
    if (d.runners.some((r, j) => j > 0 && byteOrder(d.runners[j - 1], r) >= 0)) {
      throw decisionError('`runners` must be sorted, each once');
    }
    if (d.choice === 'abort' && d.runners.length) throw decisionError('`runners`: an abort lets no runner run: `-`');
    if (d.choice !== 'abort' && !d.runners.length) throw decisionError(`\`runners\`: a ${d.choice} names the runners it lets run`);
    const canonical = `${DECISION_VERSION_LINE}\ndecision ${d.id}\napproval ${d.approval}\nstatement sha256:${d.statement}\n`
      + `halted ${d.halted}\nchoice ${d.choice}\nrunners ${d.runners.length ? d.runners.join(',') : '-'}\nexpires ${d.expires}\n`;
    if (canonical !== text) throw decisionError('not in canonical form');
    return d;
  }

  // The request's halt (`result.halt`), as `server::approvals::Halt` reads it, or null.
  function haltOf(request) {
    const h = isObject(request.result) ? request.result.halt : undefined;
    if (!isObject(h)) return null;
    const wave = h.wave;
    const runner = h.runner === undefined ? null : h.runner;
    if (typeof wave !== 'number' || !Number.isInteger(wave) || wave < 0 || wave > 0xffffffff) return null;
    if (runner !== null && typeof runner !== 'string') return null;
    if (!Array.isArray(h.not_run) || h.not_run.some((r) => typeof r !== 'string')) return null;
    return { wave, runner, not_run: h.not_run };
  }

  // src/server/approvals/halted.rs `runners_for`: what the halt leaves, plus the failed one
  // for a retry, sorted, each once.
  function runnersFor(halt, choice) {
    if (choice === 'abort') return [];
    const runners = choice === 'retry' && halt.runner !== null ? [halt.runner, ...halt.not_run] : [...halt.not_run];
    return [...new Set(runners)].sort(byteOrder);
  }

  // The check (src/cli/approvals.rs `check_decision_before_signing`) of the decision the
  // request `id` carries (the approvals API's answer as text), for `choice`, at `nowMs`.
  // Returns what is signed and the passkey's challenge, computed here (SHA-256 of the
  // decision's text), never the server's; throws a Refusal naming the field.
  async function checkDecisionBeforeSigning(id, choice, responseText, nowMs, maxLifetime = DEFAULT_MAX_LIFETIME_SECS) {
    let request;
    try {
      request = parseExact(responseText);
    } catch {
      throw new Refusal('the server\'s answer is not JSON');
    }
    if (!isObject(request) || !isObject(request.decision)) throw new Refusal('the request has no decision to sign');
    const text = request.decision.text;
    const d = parseDecision(text);
    if (d.approval !== id) throw new Refusal(`\`approval\`: the decision is about approval ${d.approval}, not ${id}`);
    if (d.choice !== choice) throw new Refusal(`\`choice\`: the decision is a ${d.choice}, not a ${choice}`);
    const statement = isObject(request.statement) && typeof request.statement.text === 'string' ? request.statement.text : '';
    if (hex(await sha256(statement)) !== d.statement) {
      throw new Refusal('`statement`: the decision binds another statement than the request\'s');
    }
    const halt = haltOf(request);
    if (halt === null) throw new Refusal('`runners`: the request does not show where its rollout halted');
    const wanted = runnersFor(halt, choice);
    const same = d.runners.length === wanted.length && d.runners.every((r, j) => r === wanted[j]);
    if (!same || d.halted !== halt.wave) {
      const list = (names) => `[${names.map((n) => JSON.stringify(n)).join(', ')}]`;
      throw new Refusal(`\`runners\`: the decision lets ${list(d.runners)} run after wave ${d.halted}, and the request's halt (wave ${halt.wave}, failed ${halt.runner === null ? 'none' : JSON.stringify(halt.runner)}, not run ${list(halt.not_run)}) gives ${list(wanted)}`);
    }
    try {
      checkLifetime(d.id, d.expiresUnix, Math.floor(nowMs / 1000), maxLifetime);
    } catch (e) {
      if (e instanceof Refusal) throw new Refusal(e.message.replaceAll('`approval`', '`decision`'));
      throw e;
    }
    const challenge = await sha256(text);
    return {
      text,
      challenge,
      sha256: hex(challenge),
      id: d.id,
      choice: d.choice,
      runners: d.runners,
      halted: halt.wave,
      failed: halt.runner,
      expires: d.expires,
    };
  }

  // ---------------------------------------------------------------- grants
  //
  // The check before a passkey signs a grant (src/cli/grants.rs `check_before_signing`, the
  // terminal's), and the grant read back from its own text (src/protocol/approval/grant.rs
  // `Grant::parse`): what the page shows of a grant is what this reads from the text a
  // signature covers, never the API's other fields. Where this page cannot read a line
  // exactly as the Rust does (a glob beyond `*`, a number beyond 2^53), it refuses and says
  // to sign in the terminal.
  const GRANT_VERSION_LINE = 'emisar-grant/v1';
  // grant.rs DEFAULT_MAX_LIFETIME_SECS (the runners' default max_grant_lifetime_secs) and
  // its bounds; mod.rs MAX_SIGNATURES.
  const GRANT_MAX_LIFETIME_SECS = 3600;
  const GRANT_MAX_CALLS = 1000;
  const GRANT_MAX_TOOLS = 64;
  const GRANT_MAX_ARGS = 32;
  const GRANT_MAX_VALUES = 64;
  const GRANT_MAX_REASON = 1024;
  const MAX_SIGNATURES = 32;
  const GRANT_TERMINAL = 'sign it in the terminal (`emisar grants approve ID --ssh-key PATH`)';
  // src/util/input.rs `is_identifier`, and a selector's pair (src/selector.rs).
  const IDENTIFIER = /^[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}$/;
  const LABEL = /^[A-Za-z0-9][A-Za-z0-9_.@-]{0,62}$/;

  const grantError = (msg) => new Refusal(`the grant: ${msg}`);

  // grant.rs `word`: 1 to 128 bytes, no whitespace, control character or comma.
  function grantWord(field, v) {
    if (v.length === 0 || utf8.encode(v).length > 128 || /[\p{White_Space}\p{Cc},]/u.test(v)) {
      throw grantError(`\`${field}\` must be 1 to 128 bytes without whitespace, a control character or a comma`);
    }
  }

  function sortedOnce(items) {
    return items.every((v, i) => i === 0 || byteOrder(items[i - 1], v) < 0);
  }

  const WHOLE_TEXT = /^(0|-?[1-9][0-9]*)$/;

  // A whole number as the Rust writes it, or a refusal naming `field`.
  function wholeNumber(field, text, min, max) {
    if (!WHOLE_TEXT.test(text)) throw grantError(`\`${field}\` must be a whole number`);
    const n = Number(text);
    if (!Number.isSafeInteger(n)) {
      throw grantError(`\`${field}\` is ${text}, beyond what this page checks exactly (2^53): ${GRANT_TERMINAL}`);
    }
    if (n < min || n > max) throw grantError(`\`${field}\` must be ${min} to ${max}`);
    return n;
  }

  // grant.rs `Constraint::parse` and `check`: `in [...]` (strings, whole numbers, booleans,
  // sorted by their JSON text, each once) or `range MIN..MAX`.
  function parseConstraint(name, text) {
    if (text.startsWith('in ')) {
      let values;
      try {
        values = parseExact(text.slice(3));
      } catch {
        throw grantError(`\`arg ${name}\`: \`in\` takes a JSON array`);
      }
      if (!Array.isArray(values)) throw grantError(`\`arg ${name}\`: \`in\` takes a JSON array`);
      if (values.length === 0 || values.length > GRANT_MAX_VALUES) {
        throw grantError(`\`arg ${name}\`: \`in\` lists 1 to ${GRANT_MAX_VALUES} values`);
      }
      const texts = values.map((v, i) => {
        if (v instanceof InexactNumber) {
          throw grantError(`\`arg ${name}\`: \`in\` value ${i} is the number ${v.source}, which this page cannot check exactly: ${GRANT_TERMINAL}`);
        }
        if (typeof v !== 'string' && typeof v !== 'boolean' && typeof v !== 'number') {
          throw grantError(`\`arg ${name}\`: \`in\` takes strings, whole numbers and booleans, not ${JSON.stringify(v)}`);
        }
        if (typeof v === 'string' && /\p{Cs}/u.test(v)) {
          throw grantError(`\`arg ${name}\`: \`in\` value ${i} holds a lone UTF-16 surrogate, which has no UTF-8 form`);
        }
        return JSON.stringify(v);
      });
      if (!sortedOnce(texts)) throw grantError(`\`arg ${name}\`: \`in\` values are sorted by their JSON text, each once`);
      return { in: values, text: `in [${texts.join(',')}]` };
    }
    if (text.startsWith('range ')) {
      const ends = text.slice(6).split('..');
      if (ends.length !== 2) throw grantError(`\`arg ${name}\`: \`range\` is MIN..MAX`);
      const [min, max] = ends.map((e) => {
        if (!WHOLE_TEXT.test(e)) throw grantError(`\`arg ${name}\`: a range's ends are whole numbers, not ${JSON.stringify(e)}`);
        const n = Number(e);
        if (!Number.isSafeInteger(n)) {
          throw grantError(`\`arg ${name}\`: a range's end ${e} is beyond what this page checks exactly (2^53): ${GRANT_TERMINAL}`);
        }
        return n;
      });
      if (min > max) throw grantError(`\`arg ${name}\`: a range's MIN (${min}) is at most its MAX (${max})`);
      return { min, max, text: `range ${min}..${max}` };
    }
    throw grantError(`\`arg ${name}\`: \`in [...]\` or \`range MIN..MAX\``);
  }

  // grant.rs `Grant::parse`: only the text `Grant::text` would write (the same bytes) is
  // read. Returns the grant's fields; throws a Refusal naming the line.
  function parseGrant(text) {
    if (typeof text !== 'string') throw new Refusal('the grant has no text');
    if (utf8.encode(text).length > 64 * 1024) throw grantError('longer than 64 KiB');
    if (!text.endsWith('\n')) throw grantError('must end with a newline');
    const lines = text.slice(0, -1).split('\n');
    if (lines[0] !== GRANT_VERSION_LINE) throw grantError(`the first line must be \`${GRANT_VERSION_LINE}\``);
    const fields = lines.slice(1).map((line) => {
      const at = line.indexOf(' ');
      if (at < 0) throw grantError('every line after the first is `key value`');
      return [line.slice(0, at), line.slice(at + 1)];
    });
    let i = 0;
    const take = (key) => {
      if (i >= fields.length) throw grantError(`\`${key}\` is missing`);
      const [k, v] = fields[i++];
      if (k !== key) throw grantError(`expected \`${key}\`, found \`${k}\``);
      return v;
    };
    const repeated = (key) => {
      const out = [];
      while (i < fields.length && fields[i][0] === key) out.push(fields[i++][1]);
      return out;
    };
    const g = {};
    g.id = take('grant');
    g.agent = take('agent');
    const bg = repeated('break_glass');
    if (bg.length > 1 || (bg.length === 1 && bg[0] !== 'true')) {
      throw grantError('`break_glass` is given once, as `break_glass true`');
    }
    g.breakGlass = bg.length === 1;
    g.tools = repeated('tool');
    const runners = take('runners');
    const sp = runners.indexOf(' ');
    const how = sp < 0 ? '' : runners.slice(0, sp);
    const which = runners.slice(sp + 1);
    if (how === 'names') {
      g.runners = { names: which.split(',') };
    } else if (how === 'labels') {
      const pairs = which.split(',');
      if (pairs.length > 16) throw grantError('`runners labels`: a selector has at most 16 key=value pairs');
      g.runners = { labels: pairs.map((p, n) => {
        const eq = p.indexOf('=');
        const [k, v] = eq < 0 ? [p, null] : [p.slice(0, eq), p.slice(eq + 1)];
        if (v === null || !LABEL.test(k) || !LABEL.test(v)) {
          throw grantError(`\`runners labels\`: selector pair ${n + 1}: key and value must each be 1 to 63 letters, digits or \`_ . @ -\`, starting with a letter or digit`);
        }
        return [k, v];
      }) };
    } else {
      throw grantError('`runners` is `names a,b` or `labels key=value,…`');
    }
    g.args = new Map();
    for (const arg of repeated('arg')) {
      const at = arg.indexOf(' ');
      if (at < 0) throw grantError('`arg` is `NAME in [...]` or `NAME range MIN..MAX`');
      const name = arg.slice(0, at);
      if (g.args.has(name)) throw grantError(`\`arg ${name}\` is given twice`);
      g.args.set(name, parseConstraint(name, arg.slice(at + 1)));
    }
    g.calls = wholeNumber('calls', take('calls'), 1, GRANT_MAX_CALLS);
    g.callsPerRunner = wholeNumber('calls_per_runner', take('calls_per_runner'), 1, g.calls);
    g.required = wholeNumber('required', take('required'), 1, MAX_SIGNATURES);
    const reason = take('reason');
    try {
      g.reason = JSON.parse(reason);
    } catch {
      g.reason = null;
    }
    if (typeof g.reason !== 'string' || /\p{Cs}/u.test(g.reason)) throw grantError('`reason` must be a JSON string');
    g.expires = take('expires');
    if (i < fields.length) throw grantError('a line follows `expires`');

    // `Grant::check`, then its bytes.
    grantWord('grant', g.id);
    grantWord('agent', g.agent);
    if (g.tools.length === 0 || g.tools.length > GRANT_MAX_TOOLS) throw grantError(`\`tool\`: name 1 to ${GRANT_MAX_TOOLS} tools`);
    for (const tool of g.tools) {
      grantWord('tool', tool);
      // A glob of this page's own reading: `*` alone, never `**`, `?` or `[…]` (the Rust's
      // glob reads more; this page refuses rather than guess what it matches).
      if (!/^[A-Za-z0-9_.@*-]+$/.test(tool) || tool.includes('**')) {
        throw grantError(`\`tool\` \`${tool}\` is a pattern this page does not read (only names and \`*\`): ${GRANT_TERMINAL}`);
      }
    }
    if (!sortedOnce(g.tools)) throw grantError('`tool` lines are sorted, each once');
    if (g.runners.names) {
      for (const name of g.runners.names) grantWord('runners', name);
      if (!sortedOnce(g.runners.names)) throw grantError('`runners names` are sorted, each once');
    }
    if (g.breakGlass) {
      if (!g.runners.names) throw grantError('a break-glass window names its runners (`runners names a,b`), never a selector');
      if (g.required < 2) throw grantError('a break-glass window needs two people at least (`required` 2 or more)');
    }
    if (g.args.size > GRANT_MAX_ARGS) throw grantError(`at most ${GRANT_MAX_ARGS} \`arg\` lines`);
    for (const name of g.args.keys()) {
      if (!IDENTIFIER.test(name)) throw grantError(`\`arg\`: ${JSON.stringify(name)} is not an argument name`);
    }
    if (g.reason.trim() === '' || utf8.encode(JSON.stringify(g.reason)).length > GRANT_MAX_REASON) {
      throw grantError(`\`reason\` says why, in at most ${GRANT_MAX_REASON} bytes`);
    }
    g.expiresUnix = parseUtc(g.expires);
    if (g.expiresUnix === null) throw grantError('`expires` must be YYYY-MM-DDTHH:MM:SSZ');
    const runnersLine = g.runners.names
      ? `names ${g.runners.names.join(',')}`
      : `labels ${g.runners.labels.map(([k, v]) => `${k}=${v}`).join(',')}`;
    const argNames = [...g.args.keys()].sort(byteOrder);
    const canonical = `${GRANT_VERSION_LINE}\ngrant ${g.id}\nagent ${g.agent}\n`
      + (g.breakGlass ? 'break_glass true\n' : '')
      + g.tools.map((t) => `tool ${t}\n`).join('')
      + `runners ${runnersLine}\n`
      + argNames.map((n) => `arg ${n} ${g.args.get(n).text}\n`).join('')
      + `calls ${g.calls}\ncalls_per_runner ${g.callsPerRunner}\nrequired ${g.required}\n`
      + `reason ${JSON.stringify(g.reason)}\nexpires ${g.expires}\n`;
    if (canonical !== text) throw grantError('not in canonical form');
    return g;
  }

  // What people read before they sign, line by line as the terminal shows it (src/cli/
  // grants.rs `in_words`): [label, text] pairs.
  function grantInWords(g) {
    const runners = g.runners.names
      ? `only ${g.runners.names.join(', ')}`
      : `those whose labels match ${g.runners.labels.map(([k, v]) => `${k}=${v}`).join(',')}`;
    const args = g.args.size === 0
      ? 'any (the runners\' own allowlists still hold)'
      : [...g.args.keys()].sort(byteOrder).map((name) => {
        const c = g.args.get(name);
        return c.in ? `${name} one of ${c.in.map((v) => JSON.stringify(v)).join(', ')}` : `${name} from ${c.min} to ${c.max}`;
      }).join('; ');
    return [
      ['grant', g.id],
      ['for', g.agent],
      ...(g.breakGlass ? [['break-glass', 'yes: every call in it is flagged, witnessed and announced, and runs only where the runner\'s approvers file says break_glass = true']] : []),
      ['tools', g.tools.join(', ')],
      ['runners', runners],
      ['arguments', args],
      ['calls', `at most ${g.calls} in all, ${g.callsPerRunner} on one runner`],
      ['expires', g.expires],
      ['needs', `${g.required} people's signatures`],
      ['reason', g.reason],
    ];
  }

  // The check before a passkey signs grant `id` (src/cli/grants.rs `check_before_signing`),
  // over the grants API's answer as text (`GET /api/grants/ID`), at `nowMs`: the text is a
  // grant's, in canonical form, of this id, asked for no later than this clock allows, not
  // expired, living no longer than `maxLifetime` seconds. Returns the grant read from its
  // text, in words, and the passkey's challenge (the SHA-256 of the text, computed here).
  async function checkGrantBeforeSigning(id, responseText, nowMs, maxLifetime = GRANT_MAX_LIFETIME_SECS) {
    let shown;
    try {
      shown = JSON.parse(responseText);
    } catch {
      throw new Refusal('the server\'s answer is not JSON');
    }
    if (!isObject(shown) || typeof shown.text !== 'string') throw new Refusal('the server\'s answer has no `text`');
    const text = shown.text;
    const g = parseGrant(text);
    if (g.id !== id) throw new Refusal(`\`grant\`: the text is of grant ${g.id}, not ${id}`);
    const now = Math.floor(nowMs / 1000);
    const issuedMs = issuedMillis(g.id);
    if (issuedMs === null) throw new Refusal(`\`grant\`: \`${g.id}\` is not a UUIDv7, whose time says when it was asked for`);
    const issued = Math.floor(issuedMs / 1000);
    if (issued > now + CLOCK_SKEW_SECS) {
      throw new Refusal(`\`grant\`: asked for at ${issued} (unix seconds), after this clock's ${now}: a grant from the future is refused`);
    }
    if (now >= g.expiresUnix) throw new Refusal(`\`expires\`: the grant expired at ${g.expires}`);
    const lives = Math.max(0, g.expiresUnix - issued);
    if (lives > maxLifetime) {
      throw new Refusal(`\`expires\`: the grant lives ${lives} s from its request to its expiry, more than the ${maxLifetime} s allowed here (max_grant_lifetime_secs' default); a longer grant is signed in the terminal with --max-lifetime`);
    }
    const challenge = await sha256(text);
    return { text, challenge, sha256: hex(challenge), grant: g, words: grantInWords(g) };
  }

  // Text shown in a grant's words, with what a reader cannot see made visible: format and
  // control characters and every space but the plain one, as \u{…} (U+200B in `consul\u200b`
  // is another unit than `consul`, and must not look like it).
  function visible(text) {
    return String(text).replace(/[\p{Cf}\p{Cc}\p{Zl}\p{Zp}\p{Mn}\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]/gu,
      (c) => `\\u{${c.codePointAt(0).toString(16)}}`);
  }

  // ---------------------------------------------------------------- reviews
  //
  // The review of a break-glass window people sign after the incident (src/protocol/approval/
  // review.rs `Review::text`, `Review::parse` and `check`): proposed here from a note, or read
  // from the review someone proposed. Either way it must bind the window the page shows: its id
  // and the SHA-256 of its grant text, both computed here from the window's text.
  const REVIEW_VERSION_LINE = 'emisar-review/v1';
  const MAX_NOTE = 4096;

  const reviewError = (msg) => new Refusal(`the review: ${msg}`);

  // What shows nothing on a screen (review.rs `is_invisible`): whitespace, controls, and
  // invisible formatting or filler characters (zero-width spaces and joiners, bidirectional
  // marks, overrides and isolates, invisible operators, soft hyphen, variation selectors, Hangul
  // fillers, tags, the Braille blank).
  const INVISIBLE = /^[\s\p{Cc}\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f\u2800\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb\u{1bca0}-\u{1bca3}\u{1d173}-\u{1d17a}\u{e0000}-\u{e007f}\u{e0100}-\u{e01ef}\u0085\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$/u;

  function checkNote(note) {
    if (typeof note !== 'string' || note.trim() === '') {
      throw reviewError('`note` is required: say what was done inside the window and why');
    }
    if (INVISIBLE.test(note)) {
      throw reviewError('`note` has no visible character (only spaces, controls or invisible formatting such as U+200B): say what was done inside the window and why');
    }
    if (/\p{Cs}/u.test(note)) throw reviewError('`note` holds a lone UTF-16 surrogate, which has no UTF-8 form');
    const bytes = utf8.encode(note).length;
    if (bytes > MAX_NOTE) throw reviewError(`\`note\` is ${bytes} bytes, more than the ${MAX_NOTE} allowed`);
  }

  const reviewText = (r) => `${REVIEW_VERSION_LINE}\nwindow ${r.window}\ngrant sha256:${r.grant}\n`
    + `note ${JSON.stringify(r.note)}\nreviewed ${r.reviewed}\n`;

  // `Review::parse`: only the text `Review::text` would write.
  function parseReview(text) {
    if (typeof text !== 'string') throw reviewError('no text');
    if (!text.endsWith('\n')) throw reviewError('must end with a newline');
    const lines = text.slice(0, -1).split('\n');
    if (lines[0] !== REVIEW_VERSION_LINE) throw reviewError(`the first line must be \`${REVIEW_VERSION_LINE}\``);
    const keys = ['window', 'grant', 'note', 'reviewed'];
    if (lines.length !== keys.length + 1) throw reviewError('a review has the lines window, grant, note and reviewed');
    const r = {};
    keys.forEach((key, i) => {
      const line = lines[i + 1];
      const at = line.indexOf(' ');
      if (at < 0 || line.slice(0, at) !== key) throw reviewError(`expected \`${key}\`, found \`${line.slice(0, Math.max(at, 0))}\``);
      r[key] = line.slice(at + 1);
    });
    if (!r.grant.startsWith('sha256:') || !/^[0-9a-f]{64}$/.test(r.grant.slice(7))) {
      throw reviewError('`grant` must be `sha256:` and a SHA-256 in lowercase hex');
    }
    r.grant = r.grant.slice(7);
    try {
      r.note = JSON.parse(r.note);
    } catch {
      throw reviewError('`note` must be a JSON string');
    }
    checkNote(r.note);
    if (parseUtc(r.reviewed) === null) throw reviewError('`reviewed` must be UTC as YYYY-MM-DDTHH:MM:SSZ');
    if (reviewText(r) !== text) throw reviewError('not in canonical form');
    return r;
  }

  // The review a passkey signs for window `id`, whose grant text is `windowText`: the one
  // proposed (`proposedText`), or, with none, a new one with `note` at `nowMs`. It binds this
  // window (its id, and the SHA-256 of its text computed here), was proposed no earlier than
  // the window closed and not in this clock's future. The window closed at its expiry (from
  // its text) or at `closedAt` (the API's `closed[0]`, when it was revoked or expired in the
  // log), whichever is first: a review signed while the window was open is refused, naming
  // `reviewed`. Returns the review's text, note, time and the passkey's challenge.
  async function checkReviewBeforeSigning(id, windowText, proposedText, note, nowMs, closedAt) {
    const g = parseGrant(windowText);
    if (g.id !== id) throw new Refusal(`\`window\`: the text is of grant ${g.id}, not ${id}`);
    if (!g.breakGlass) throw new Refusal(`\`window\`: grant ${id} is not a break-glass window`);
    const grant = hex(await sha256(windowText));
    const now = Math.floor(nowMs / 1000);
    let r;
    if (proposedText) {
      r = parseReview(proposedText);
    } else {
      checkNote(note);
      r = { window: id, grant, note, reviewed: new Date(now * 1000).toISOString().replace(/\.\d{3}Z$/, 'Z') };
    }
    if (r.window !== id) throw reviewError(`\`window\`: the review is of window ${r.window}, not ${id}`);
    if (r.grant !== grant) throw reviewError('`grant`: the review binds another grant text than the window\'s (sha256 differs)');
    const reviewed = parseUtc(r.reviewed);
    const opened = Math.floor((issuedMillis(id) ?? 0) / 1000);
    if (reviewed < opened) throw reviewError(`\`reviewed\`: ${r.reviewed} is before the window was asked for`);
    let closed = g.expiresUnix;
    if (closedAt !== undefined && closedAt !== null) {
      const at = typeof closedAt === 'string' ? parseUtc(`${closedAt.slice(0, 19)}Z`) : null;
      if (at === null) throw reviewError(`\`closed\`: ${String(closedAt)} is not a UTC time`);
      closed = Math.min(closed, at);
    }
    if (reviewed < closed) {
      throw reviewError(`\`reviewed\`: ${r.reviewed} is before the window closed (at ${closed}, unix seconds): a review is signed after the window, of what ran inside it`);
    }
    if (reviewed > now + CLOCK_SKEW_SECS) throw reviewError(`\`reviewed\`: ${r.reviewed} is in the future of this clock`);
    const text = reviewText(r);
    const challenge = await sha256(text);
    return { text, challenge, sha256: hex(challenge), note: r.note, reviewed: r.reviewed, grantSha256: grant };
  }

  const api = {
    checkBeforeSigning, parseStatement, parseExact, canonicalJson, Refusal, InexactNumber,
    checkDecisionBeforeSigning, parseDecision, runnersFor,
    checkGrantBeforeSigning, parseGrant, grantInWords, visible, checkReviewBeforeSigning, parseReview,
    DEFAULT_MAX_LIFETIME_SECS, GRANT_MAX_LIFETIME_SECS,
  };
  if (typeof module === 'object' && module && module.exports) module.exports = api;
  else exported.emisarStatement = Object.freeze(api);
}(globalThis));
