// Browser end-to-end driver for the portal on `emisar lab`, run by the Rust integration test
// (tests/it/lab.rs):
//
//   .tools/node/bin/node tests/browser/lab_e2e.mjs      (cwd = repo root)
//
// Env: PORTAL_URL, PORTAL_USER, PORTAL_PASSWORD, SCREENSHOT_DIR, CHROMIUM, and LAB_REQUESTS:
// a JSON array, in the order to approve them, of
//   {"tool": "...", "reason": "...", "diff": "MemoryMB 1024 → 4096" (optional),
//    "shows": ["text the preview must show", ...] (optional), "screenshot": "x.png"}
//
// Protocol on stdout, one line each, in this order:
//   READY                               logged in, approvals page open, live updates connected;
//                                       the test now makes the agent's calls
//   {"pending": N}                      every expected request is listed as pending (live)
//   {"executed": "<tool>"}              one per request: its detail page showed it pending (with
//                                       its reason, its plan diff and preview text when they are
//                                       expected), it
//                                       was approved there, and its result arrived live
//   {"done": true}
// Exit 0 on success. On any failure: screenshot lab-99-failure.png, the error and the browser's
// console on stderr, exit 1. The whole run is capped at 90 s.
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';

const OVERALL_TIMEOUT_MS = 90_000;
const APPEAR_TIMEOUT_MS = 30_000;
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
let finished = false;
const consoleLog = [];
const problems = [];   // CSP violations and uncaught page errors: each one fails the run

async function screenshot(name) {
  await page.screenshot({ path: path.join(shotDir, name), fullPage: true, timeout: 5_000 });
}

async function closeBrowser() {
  const b = browser;
  browser = null;
  if (b) {
    try { await b.close(); } catch { /* already gone */ }
  }
}

async function fail(err) {
  if (finished) return;
  finished = true;
  process.stderr.write(`lab_e2e: FAILED: ${err && err.stack ? err.stack : err}\n`);
  if (page) {
    try {
      process.stderr.write(`lab_e2e: page url at failure: ${page.url()}\n`);
      await screenshot('lab-99-failure.png');
    } catch (e) {
      process.stderr.write(`lab_e2e: could not take lab-99-failure.png: ${e.message}\n`);
    }
  }
  if (consoleLog.length) process.stderr.write(`lab_e2e: browser console:\n  ${consoleLog.join('\n  ')}\n`);
  await closeBrowser();
  process.exit(1);
}

function checkProblems(step) {
  if (problems.length) throw new Error(`${step}: browser reported problems:\n  ${problems.join('\n  ')}`);
}

// The ids of the pending rows per tool name, as the list shows them now.
async function pendingRows() {
  return page.evaluate(() => {
    const out = {};
    for (const row of document.querySelectorAll('.approval-row')) {
      const name = row.querySelector('td.tool a');
      if (name) out[name.textContent.trim()] = row.getAttribute('data-approval-id');
    }
    return out;
  });
}

async function run() {
  const url = env('PORTAL_URL');
  const requests = JSON.parse(env('LAB_REQUESTS'));
  shotDir = path.resolve(env('SCREENSHOT_DIR', 'target/lab-e2e'));
  mkdirSync(shotDir, { recursive: true });

  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: CHROMIUM_ARGS,
    timeout: 30_000,
  });
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  page = await context.newPage();
  page.setDefaultTimeout(10_000);
  page.on('console', (msg) => {
    const text = `[${msg.type()}] ${msg.text()}`;
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

  // 1. Log in; the pending list, live.
  const resp = await page.goto(url, { waitUntil: 'load', timeout: 15_000 });
  if (!resp || resp.status() !== 200) throw new Error(`GET ${url} gave ${resp ? resp.status() : 'no response'}`);
  await page.locator('#login-name').waitFor({ state: 'visible' });
  await page.fill('#login-name', env('PORTAL_USER'));
  await page.fill('#login-password', env('PORTAL_PASSWORD'));
  await page.click('#login-submit');
  await page.locator('#approvals, #empty').first().waitFor({ state: 'visible' });
  await page.locator('#live.live-live').waitFor({ state: 'visible' });
  checkProblems('login');
  say('READY');

  // 2. Both requests appear in the list, live.
  const tools = requests.map((r) => r.tool);
  await page.waitForFunction((wanted) => {
    const names = [...document.querySelectorAll('.approval-row td.tool a')].map((a) => a.textContent.trim());
    return wanted.every((t) => names.includes(t));
  }, tools, { timeout: APPEAR_TIMEOUT_MS, polling: 100 }).catch((e) => {
    throw new Error(`the pending list did not show all of ${tools.join(', ')} within ${APPEAR_TIMEOUT_MS} ms`, { cause: e });
  });
  const ids = await pendingRows();
  say({ pending: tools.filter((t) => ids[t]).length });
  await screenshot('lab-approvals.png');

  // 3. Each request: its detail (reason, plan diff), approve, the result arrives live.
  for (const r of requests) {
    const id = ids[r.tool];
    await page.evaluate((h) => { location.hash = h; }, `#/approvals/${id}`);
    await page.locator(`section.detail[data-approval-id="${id}"]`).waitFor({ state: 'visible' });
    const state = (await page.locator('#state').textContent()).trim();
    if (state !== 'pending') throw new Error(`${r.tool}: detail shows state ${JSON.stringify(state)}, expected pending`);
    const reason = (await page.locator('#reason').textContent()).trim();
    if (reason !== r.reason) throw new Error(`${r.tool}: #reason is ${JSON.stringify(reason)}, expected ${JSON.stringify(r.reason)}`);
    if (r.diff) {
      const lines = await page.locator('#preview ul.diff li').allTextContents();
      if (!lines.map((l) => l.trim()).includes(r.diff)) {
        throw new Error(`${r.tool}: the preview's plan diff shows ${JSON.stringify(lines)}, expected ${JSON.stringify(r.diff)}`);
      }
    }
    for (const text of r.shows || []) {
      const shown = (await page.locator('#preview').textContent()) || '';
      if (!shown.includes(text)) {
        throw new Error(`${r.tool}: the preview does not show ${JSON.stringify(text)}: ${JSON.stringify(shown.slice(0, 600))}`);
      }
    }
    checkProblems(`${r.tool} detail`);
    await screenshot(r.screenshot);
    await page.click('#approve');
    const outcome = await page.waitForFunction(() => {
      const s = document.querySelector('#state');
      const st = s ? s.textContent.trim() : '';
      const err = document.querySelector('#error');
      if (err && !err.hidden && err.textContent.trim()) return { error: err.textContent.trim(), state: st };
      if (['denied', 'expired', 'failed', 'unknown', 'withdrawn'].includes(st)) return { state: st };
      const result = document.querySelector('#result');
      if (st === 'executed' && result && result.textContent.trim()) return { state: st };
      return null;
    }, null, { timeout: EXECUTED_TIMEOUT_MS, polling: 100 }).then((h) => h.jsonValue());
    if (outcome.error) throw new Error(`${r.tool}: approving showed an error: ${outcome.error} (state ${outcome.state})`);
    if (outcome.state !== 'executed') throw new Error(`${r.tool}: ended in state ${outcome.state}, expected executed`);
    checkProblems(`${r.tool} executed`);
    say({ executed: r.tool });
  }
  say({ done: true });
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
