// Browser end-to-end driver for the emisar portal, run by the Rust integration test:
//
//   .tools/node/bin/node tests/browser/portal_e2e.mjs      (cwd = repo root)
//
// Env: PORTAL_URL, PORTAL_USER, PORTAL_PASSWORD, EXPECT_TOOL, EXPECT_REASON_SUBSTRING,
//      SCREENSHOT_DIR (default target/portal-e2e), CHROMIUM (default /usr/bin/chromium),
//      LOGIN_VIA (`password`, the default: the portal's own form; `oidc`: the portal's
//      "Sign in with …" button, then the OpenID provider's login form, with PORTAL_USER and
//      PORTAL_PASSWORD as the person's credentials there), EXPECT_WHOAMI (optional: text the
//      signed-in header must contain).
//
// Protocol on stdout, one line each, in this order:
//   READY                              logged in, approvals page open, live updates connected;
//                                      the test now starts the agent's call that needs approval
//   {"appeared_ms": N}                 the pending row showed up live (no reload), N ms after READY
//   {"done": true, "state": "executed"}  approved in the portal and the result arrived live
// Exit 0 on success. On any failure: screenshot 99-failure.png, the error and the browser's
// console on stderr, exit 1. The whole run is capped at 60 s.
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';

const OVERALL_TIMEOUT_MS = 60_000;
const APPEAR_TIMEOUT_MS = 20_000;
const EXECUTED_TIMEOUT_MS = 30_000;

// Keep Chromium off the network: every hostname except loopback fails to resolve.
const CHROMIUM_ARGS = [
  '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--disable-quic', '--disable-default-apps', '--disable-extensions',
  '--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1 , EXCLUDE localhost',
];

const env = (name, fallback) => {
  const v = process.env[name] ?? fallback;
  if (v === undefined || v === '') throw new Error(`environment variable ${name} is not set`);
  return v;
};

const say = (line) => process.stdout.write(`${typeof line === 'string' ? line : JSON.stringify(line)}\n`);

let browser = null;
let page = null;
let shotDir = null;
const consoleLog = [];   // everything the page said, printed on failure
const problems = [];     // CSP violations and uncaught page errors: each one fails the run

async function screenshot(name) {
  await page.screenshot({ path: path.join(shotDir, name), fullPage: true, timeout: 5_000 });
}

let finished = false;   // set once by the success path or the first failure

async function fail(err) {
  if (finished) return;
  finished = true;
  process.stderr.write(`portal_e2e: FAILED: ${err && err.stack ? err.stack : err}\n`);
  if (page) {
    try {
      process.stderr.write(`portal_e2e: page url at failure: ${page.url()}\n`);
      await screenshot('99-failure.png');
    } catch (e) {
      process.stderr.write(`portal_e2e: could not take 99-failure.png: ${e.message}\n`);
    }
  }
  if (consoleLog.length) process.stderr.write(`portal_e2e: browser console:\n  ${consoleLog.join('\n  ')}\n`);
  await closeBrowser();
  process.exit(1);
}

async function closeBrowser() {
  const b = browser;
  browser = null;
  if (b) {
    try { await b.close(); } catch { /* already gone */ }
  }
}

function checkProblems(step) {
  if (problems.length) throw new Error(`${step}: browser reported problems:\n  ${problems.join('\n  ')}`);
}

// The portal's "Sign in with …" button, the provider's own login form, and back: the
// provider redirects the browser to emisar's callback, which opens the session and sends the
// browser on to the portal.
async function signInWithProvider(url, user, password) {
  await page.locator('#login-oidc').waitFor({ state: 'visible' });
  await screenshot('01-login.png');
  await page.click('#login-oidc');
  const portal = new URL(url).origin;
  // The provider's login form (on its own origin).
  await page.locator('#login').waitFor({ state: 'visible', timeout: 15_000 });
  if (new URL(page.url()).origin === portal) throw new Error(`the sign-in stayed on emisar: ${page.url()}`);
  await screenshot('01b-provider-login.png');
  await page.fill('#login', user);
  await page.fill('#password', password);
  await page.click('#submit');
  // Back at the portal, signed in; or a refusal (the provider's or emisar's) to report.
  const outcome = await Promise.race([
    page.locator('#whoami').filter({ hasText: /\S/ }).waitFor({ state: 'visible', timeout: 20_000 }).then(() => null),
    page.locator('#error').waitFor({ state: 'visible', timeout: 20_000 })
      .then(async () => (await page.locator('#error').textContent()).trim()),
  ]);
  if (outcome) throw new Error(`sign-in refused at ${page.url()}: ${outcome}`);
  if (new URL(page.url()).origin !== portal) throw new Error(`signed in, but the browser is at ${page.url()}`);
}

async function run() {
  const url = env('PORTAL_URL');
  const user = env('PORTAL_USER');
  const password = env('PORTAL_PASSWORD');
  const tool = env('EXPECT_TOOL');
  const reasonPart = env('EXPECT_REASON_SUBSTRING');
  shotDir = path.resolve(env('SCREENSHOT_DIR', 'target/portal-e2e'));
  mkdirSync(shotDir, { recursive: true });

  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: CHROMIUM_ARGS,
    timeout: 30_000,
  });
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  page.setDefaultTimeout(10_000);
  page.on('console', (msg) => {
    const where = msg.location() && msg.location().url;
    const text = `[${msg.type()}] ${msg.text()}${where ? ` (${where})` : ''}`;
    consoleLog.push(text);
    if (/Content Security Policy/i.test(msg.text())) problems.push(text);
  });
  page.on('pageerror', (e) => {
    consoleLog.push(`[pageerror] ${e.message}`);
    problems.push(`uncaught exception: ${e.message}`);
  });
  page.on('response', (r) => {
    if (r.status() >= 400) consoleLog.push(`[http ${r.status()}] ${r.request().method()} ${r.url()}`);
  });
  page.on('requestfailed', (r) => {
    // An EventSource torn down by the browser at exit is not interesting.
    if (!r.url().endsWith('/api/events')) consoleLog.push(`[requestfailed] ${r.method()} ${r.url()} ${r.failure()?.errorText}`);
  });

  // 1. Login page, log in, empty approvals list with live updates connected.
  const resp = await page.goto(url, { waitUntil: 'load', timeout: 15_000 });
  if (!resp || resp.status() !== 200) throw new Error(`GET ${url} gave ${resp ? resp.status() : 'no response'}`);
  if (env('LOGIN_VIA', 'password') === 'oidc') {
    await signInWithProvider(url, user, password);
  } else {
    await page.locator('#login-name').waitFor({ state: 'visible' });
    await screenshot('01-login.png');
    await page.fill('#login-name', user);
    await page.fill('#login-password', password);
    await page.click('#login-submit');
    const loginError = await page.waitForFunction(() => {
      const err = document.querySelector('#error');
      if (err && !err.hidden && err.textContent.trim()) return { error: err.textContent.trim() };
      return !document.querySelector('#top').hidden && { error: null };
    }).then((h) => h.jsonValue());
    if (loginError.error) throw new Error(`login refused: ${loginError.error}`);
  }
  const whoami = (await page.locator('#whoami').textContent()).trim();
  const expectWhoami = process.env.EXPECT_WHOAMI;
  if (expectWhoami && !whoami.includes(expectWhoami)) {
    throw new Error(`the header says ${JSON.stringify(whoami)}, expected it to contain ${JSON.stringify(expectWhoami)}`);
  }
  await page.locator('#approvals, #empty').first().waitFor({ state: 'visible' });
  await page.locator('#live.live-live').waitFor({ state: 'visible' });
  const before = new Set(await page.locator('.approval-row').evaluateAll(
    (rows) => rows.map((r) => r.getAttribute('data-approval-id'))));
  // A marker that a reload or navigation away would wipe out.
  await page.evaluate(() => { window.__noReload = true; });
  checkProblems('login');
  await screenshot('02-approvals-empty.png');
  say('READY');
  const readyAt = Date.now();

  // 2. The new pending request appears live (SSE), without a reload.
  const escaped = tool.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const rowsForTool = page.locator('.approval-row').filter({
    has: page.locator('td.tool a', { hasText: new RegExp(`^${escaped}$`) }),
  });
  const handle = await page.waitForFunction(
    ({ ids, t }) => {
      for (const row of document.querySelectorAll('.approval-row')) {
        const id = row.getAttribute('data-approval-id');
        const name = row.querySelector('td.tool a');
        if (!ids.includes(id) && name && name.textContent.trim() === t) return id;
      }
      return null;
    },
    { ids: [...before], t: tool },
    { timeout: APPEAR_TIMEOUT_MS, polling: 50 },
  ).catch((e) => {
    throw new Error(`no new .approval-row for ${tool} appeared within ${APPEAR_TIMEOUT_MS} ms of READY`, { cause: e });
  });
  const appearedMs = Date.now() - readyAt;
  const id = await handle.jsonValue();
  if (!(await page.evaluate(() => window.__noReload === true))) throw new Error('the page reloaded while waiting');
  say({ appeared_ms: appearedMs });
  await screenshot('03-pending.png');

  // 3. Detail page: the reason is shown literally, as text.
  await rowsForTool.and(page.locator(`[data-approval-id="${id}"]`)).locator('td.tool a').click();
  await page.locator(`section.detail[data-approval-id="${id}"]`).waitFor({ state: 'visible' });
  const reason = page.locator('#reason');
  const reasonText = await reason.textContent();
  if (!reasonText.includes(reasonPart)) {
    throw new Error(`#reason does not contain ${JSON.stringify(reasonPart)}: ${JSON.stringify(reasonText)}`);
  }
  const scripts = await reason.locator('script').count();
  if (scripts !== 0) throw new Error(`#reason contains ${scripts} <script> element(s)`);
  if (await page.evaluate(() => typeof window.__xss !== 'undefined')) throw new Error('window.__xss is set: the reason ran as script');
  const state = (await page.locator('#state').textContent()).trim();
  if (state !== 'pending') throw new Error(`detail shows state ${JSON.stringify(state)}, expected pending`);
  checkProblems('detail');
  await screenshot('04-detail.png');

  // 4. Approve with a note; the execution result arrives live, the note kept with the yes.
  const approveNote = 'checked the preview <b>not bold</b>';
  await page.fill('#note', approveNote);
  await page.click('#approve');
  const outcome = await page.waitForFunction(() => {
    const s = document.querySelector('#state');
    const state = s ? s.textContent.trim() : '';
    const result = document.querySelector('#result');
    const err = document.querySelector('#error');
    if (err && !err.hidden && err.textContent.trim()) return { error: err.textContent.trim(), state };
    if (['denied', 'expired', 'failed', 'unknown', 'withdrawn'].includes(state)) return { state };
    if (state === 'executed' && result && result.textContent.trim()) return { state };
    return null;
  }, null, { timeout: EXECUTED_TIMEOUT_MS, polling: 50 }).then((h) => h.jsonValue(), async (e) => {
    const shown = (await page.locator('#state').textContent().catch(() => '?')).trim();
    throw new Error(`#state did not reach executed with a #result within ${EXECUTED_TIMEOUT_MS} ms (shows ${shown})`, { cause: e });
  });
  if (outcome.error) throw new Error(`approving showed an error: ${outcome.error} (state ${outcome.state})`);
  if (outcome.state !== 'executed') throw new Error(`approval ended in state ${outcome.state}, expected executed`);
  if (await page.evaluate(() => typeof window.__xss !== 'undefined')) throw new Error('window.__xss is set');
  const kept = (await page.locator('#approvers .approver-note').textContent().catch(() => null));
  if (kept !== approveNote) throw new Error(`the approver's note shows as ${JSON.stringify(kept)}, expected ${JSON.stringify(approveNote)}`);
  checkProblems('executed');
  await screenshot('05-executed.png');

  // 5. The audit view shows the newest checkpoint signed for the log, and offers its file.
  const origin = process.env.EXPECT_CHECKPOINT_ORIGIN;
  if (origin) {
    await page.click('a[data-nav="audit"]');
    await page.locator('#checkpoint-size').waitFor({ state: 'visible', timeout: APPEAR_TIMEOUT_MS });
    const shown = await page.evaluate(() => {
      const text = (id) => document.getElementById(id).textContent.trim();
      return {
        origin: text('checkpoint-origin'),
        size: Number(text('checkpoint-size')),
        root: text('checkpoint-root'),
        witnesses: text('checkpoint-witnesses'),
        download: document.getElementById('checkpoint-download').getAttribute('href'),
      };
    });
    if (shown.origin !== origin) throw new Error(`the checkpoint shows log ${JSON.stringify(shown.origin)}, expected ${JSON.stringify(origin)}`);
    checkProblems('audit');
    await screenshot('06-audit-checkpoint.png');
    say({ checkpoint: shown });
  }
  say({ done: true, state: 'executed' });
}

const overall = setTimeout(() => fail(new Error(`overall timeout of ${OVERALL_TIMEOUT_MS} ms`)), OVERALL_TIMEOUT_MS);
try {
  await run();
} catch (e) {
  clearTimeout(overall);
  await fail(e);
}
clearTimeout(overall);
if (!finished) {
  finished = true;
  await closeBrowser();
  process.exit(0);
}
