// Browser driver for the passkey acceptance test (tests/it/passkey_browser.rs): headless
// Chromium with a virtual authenticator (the DevTools protocol's WebAuthn domain: ctap2,
// internal transport, resident keys, user verification) registers a passkey in the portal,
// then approves a request with it.
//
//   .tools/node/bin/node tests/browser/passkey_e2e.mjs      (cwd = repo root)
//
// Env: PORTAL_URL, PORTAL_USER, PORTAL_PASSWORD, GO_FILE (the test creates it once the server
//      runs with the approvers file that holds the new passkey), SCREENSHOT_DIR, CHROMIUM;
//      STEPS_DIR (optional: instead of GO_FILE, steps, below).
//
// Protocol on stdout, one line each:
//   {"registered": "<credential id>"}   the passkey is registered (the Passkeys page lists it)
//   {"approved": "<approval id>", "state": "executed"}  approved with the passkey, and it ran
// Exit 0 on success; on failure a screenshot 99-failure.png, the error and the console on
// stderr, exit 1. The whole run is capped at 90 s (150 s with STEPS_DIR).
//
// With STEPS_DIR, the test changes the stored request between steps: it writes the files
// 1, 2, … there, each holding `refuse`, `approve` or `done`. For each, the driver opens the
// pending request afresh, reads what the page says is signed, clicks "Approve with passkey"
// and reports, with the authenticator's signature count before and after the click:
//   {"step": N, "id": ID, "refused": "<#error>" | null, "state": S, "shown": {…}, "sign_count": [before, after]}
//   {"step": N, "id": ID, "approved": ID, "state": "executed", "shown": {…}, "sign_count": [before, after]}
// where `shown` is what the page showed before the click: `refused` (#statement-refused),
// `args`, `required`, `expires`, `runners` (the #signed box).
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';

const OVERALL_TIMEOUT_MS = process.env.STEPS_DIR ? 150_000 : 90_000;
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
const say = (line) => process.stdout.write(`${JSON.stringify(line)}\n`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let browser = null;
let page = null;
let shotDir = null;
const consoleLog = [];
const problems = [];
let finished = false;

async function screenshot(name) {
  await page.screenshot({ path: path.join(shotDir, name), fullPage: true, timeout: 5_000 });
}

async function fail(err) {
  if (finished) return;
  finished = true;
  process.stderr.write(`passkey_e2e: FAILED: ${err && err.stack ? err.stack : err}\n`);
  if (page) {
    try {
      process.stderr.write(`passkey_e2e: page url at failure: ${page.url()}\n`);
      await screenshot('99-failure.png');
    } catch (e) {
      process.stderr.write(`passkey_e2e: could not take 99-failure.png: ${e.message}\n`);
    }
  }
  if (consoleLog.length) process.stderr.write(`passkey_e2e: browser console:\n  ${consoleLog.join('\n  ')}\n`);
  if (browser) { try { await browser.close(); } catch { /* gone */ } }
  process.exit(1);
}

// Waits until `fn` (run in the page) returns something truthy; a shown `#error` ends the wait
// as a failure. (The predicate is handed to the page as a function: the portal's CSP allows no
// eval.)
async function settle(what, fn, timeout = 20_000) {
  const h = await page.waitForFunction(fn, null, { timeout, polling: 50 }).catch(async (e) => {
    const shown = await page.locator('#error').textContent().catch(() => '');
    throw new Error(`${what}: nothing happened within ${timeout} ms (page error: ${shown || 'none'})`, { cause: e });
  });
  const out = await h.jsonValue();
  if (out && typeof out === 'object' && out.error) throw new Error(`${what}: the page shows an error: ${out.error}`);
  return out;
}

async function run() {
  const url = env('PORTAL_URL');
  const go = process.env.STEPS_DIR ? null : env('GO_FILE');
  shotDir = path.resolve(env('SCREENSHOT_DIR', 'target/passkey-e2e'));
  mkdirSync(shotDir, { recursive: true });
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: true, args: CHROMIUM_ARGS, timeout: 30_000,
  });
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  page = await context.newPage();
  page.setDefaultTimeout(10_000);
  page.on('console', (msg) => {
    const text = `[${msg.type()}] ${msg.text()}`;
    consoleLog.push(text);
    if (/Content Security Policy/i.test(msg.text())) problems.push(text);
  });
  page.on('pageerror', (e) => { consoleLog.push(`[pageerror] ${e.message}`); problems.push(e.message); });
  page.on('response', (r) => {
    if (r.status() >= 400) consoleLog.push(`[http ${r.status()}] ${r.request().method()} ${r.url()}`);
  });

  // The virtual authenticator: a platform passkey that verifies the user (as a fingerprint would).
  const cdp = await context.newCDPSession(page);
  await cdp.send('WebAuthn.enable');
  const { authenticatorId } = await cdp.send('WebAuthn.addVirtualAuthenticator', { options: {
    protocol: 'ctap2', transport: 'internal', hasResidentKey: true,
    hasUserVerification: true, isUserVerified: true, automaticPresenceSimulation: true,
  } });

  // 1. Log in, register a passkey on the Passkeys page.
  await page.goto(url, { waitUntil: 'load', timeout: 15_000 });
  await page.locator('#login-name').waitFor({ state: 'visible' });
  await page.fill('#login-name', env('PORTAL_USER'));
  await page.fill('#login-password', env('PORTAL_PASSWORD'));
  await page.click('#login-submit');
  await page.locator('#whoami').filter({ hasText: /\S/ }).waitFor({ state: 'visible' });
  await page.goto(`${url}#/passkeys`);
  await page.locator('#passkey-name').waitFor({ state: 'visible' });
  await page.fill('#passkey-name', 'chromium virtual authenticator');
  await page.click('#passkey-register');
  await settle('registering a passkey', () => {
    const e = document.querySelector('#error');
    if (e && !e.hidden && e.textContent.trim()) return { error: e.textContent.trim() };
    return document.querySelectorAll('.passkey-row').length === 1;
  });
  const creds = (await cdp.send('WebAuthn.getCredentials', { authenticatorId })).credentials;
  if (creds.length !== 1) throw new Error(`the authenticator holds ${creds.length} credentials, expected 1`);
  if (problems.length) throw new Error(`browser problems: ${problems.join('; ')}`);
  await screenshot('01-registered.png');
  // Leave the portal, so its live-update stream does not hold the server the test restarts.
  await page.goto('about:blank');
  // CDP gives the id in standard base64; the portal and the approvers file in base64url.
  say({ registered: creds[0].credentialId.replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '') });

  if (process.env.STEPS_DIR) {
    await steps(url, process.env.STEPS_DIR, cdp, authenticatorId);
    return;
  }

  // 2. The test restarts the server with an approvers file that holds the passkey, starts the
  // runner that requires signatures, and makes the agent's call; then it creates GO_FILE.
  while (!existsSync(go)) await sleep(100);
  await page.goto(`${url}#/approvals`);
  const id = await settle('a pending request', () => {
    const row = document.querySelector('.approval-row');
    return row && row.getAttribute('data-approval-id');
  }, 30_000);
  await page.goto(`${url}#/approvals/${id}`);
  await page.locator('#statement-sha256').waitFor({ state: 'visible' });
  // What changes comes before what is signed, which comes before the buttons.
  const order = await page.evaluate(() => {
    const at = (sel) => { const n = document.querySelector(sel); return n ? n.getBoundingClientRect().top : -1; };
    return [at('#changes'), at('#statement'), at('#approve-passkey')];
  });
  if (!(order[0] >= 0 && order[0] < order[1] && order[1] < order[2])) {
    throw new Error(`the page order is not changes < statement < button: ${JSON.stringify(order)}`);
  }
  await screenshot('02-statement.png');
  await page.click('#approve-passkey');
  const state = await settle('approving with the passkey', () => {
    const e = document.querySelector('#error');
    if (e && !e.hidden && e.textContent.trim()) return { error: e.textContent.trim() };
    const s = document.querySelector('#state');
    const state = s ? s.textContent.trim() : '';
    if (['denied', 'expired', 'failed', 'unknown', 'withdrawn'].includes(state)) return state;
    return state === 'executed' && document.querySelector('#result') ? state : null;
  }, 30_000);
  if (state !== 'executed') throw new Error(`the approval ended in state ${state}`);
  if (problems.length) throw new Error(`browser problems: ${problems.join('; ')}`);
  await screenshot('03-executed.png');
  say({ approved: id, state });
}

// The steps of STEPS_DIR (see the top of this file).
async function steps(url, dir, cdp, authenticatorId) {
  const signCount = async () => {
    const { credentials } = await cdp.send('WebAuthn.getCredentials', { authenticatorId });
    return credentials.map((c) => c.signCount).reduce((a, b) => a + b, 0);
  };
  const text = (sel) => page.evaluate((s) => {
    const n = document.querySelector(s);
    return n ? n.textContent.trim() : null;
  }, sel);
  let id = null;
  for (let n = 1; ; n++) {
    const file = path.join(dir, String(n));
    while (!existsSync(file)) await sleep(100);
    const action = readFileSync(file, 'utf8').trim();
    if (action === 'done') return;
    if (!['refuse', 'approve'].includes(action)) throw new Error(`step ${n}: unknown action ${action}`);
    // A fresh load each step: the page fetches the request as the database now holds it.
    await page.goto('about:blank');
    if (!id) {
      await page.goto(`${url}#/approvals`);
      id = await settle('a pending request', () => {
        const row = document.querySelector('.approval-row');
        return row && row.getAttribute('data-approval-id');
      }, 30_000);
      await page.goto('about:blank');
    }
    await page.goto(`${url}#/approvals/${id}`);
    await page.locator('#signed').waitFor({ state: 'visible' });
    const shown = {
      refused: await text('#statement-refused'),
      args: await text('#signed-args'),
      required: await text('#signed-required'),
      expires: await text('#signed-expires'),
      runners: await text('#signed-runners'),
    };
    await screenshot(`1${n}-step-${action}.png`);
    const before = await signCount();
    await page.click('#approve-passkey');
    // Until the page shows an error, or the request leaves `pending`.
    const out = await settle(`step ${n} (${action})`, () => {
      const e = document.querySelector('#error');
      if (e && !e.hidden && e.textContent.trim()) return { message: e.textContent.trim() };
      const s = document.querySelector('#state');
      const state = s ? s.textContent.trim() : '';
      if (['denied', 'expired', 'failed', 'unknown', 'withdrawn'].includes(state)) return { state };
      return state === 'executed' && document.querySelector('#result') ? { state } : null;
    }, 30_000);
    // A signature the page should not have asked for would show here, whatever the page says.
    await sleep(300);
    const after = await signCount();
    const state = await text('#state');
    await screenshot(`1${n}-step-${action}-after.png`);
    if (action === 'refuse') {
      say({ step: n, id, refused: out.message ?? null, state, shown, sign_count: [before, after] });
    } else {
      if (out.message) throw new Error(`step ${n}: approving with the passkey: the page shows an error: ${out.message}`);
      say({ step: n, id, approved: id, state, shown, sign_count: [before, after] });
    }
  }
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
  await browser.close();
  process.exit(0);
}
