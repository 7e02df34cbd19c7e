// Browser driver for the Runners grid with a fleet of 1,000 runners and the audit charts,
// run by tests/it/portal_fleet.rs:
//
//   .tools/node/bin/node tests/browser/portal_fleet_e2e.mjs      (cwd = repo root)
//
// Env: PORTAL_URL, PORTAL_USER, PORTAL_PASSWORD, SCREENSHOT_DIR (default target/portal-fleet),
//      CHROMIUM (default /usr/bin/chromium), FILTER (text typed into the filter box).
//
// Protocol on stdout, one JSON line each, in this order:
//   {"runners": BODY, "tiles": {NAME: STATE}, "counts": {STATE: N}}   the grid as drawn, and
//        the very /api/runners answer the page drew it from
//   {"filtered": {"tiles": {NAME: STATE}, "all": N}}  the tiles and the count shown after FILTER
//   {"activity": BODY, "bars": {SERIES: {"total": N, "bars": [[BUCKET, COUNT, HEIGHT]]}}}
//        the charts as drawn, and the /api/audit/activity answer they were drawn from
//   {"done": true}
// Screenshots: 01-runners-1000.png, 02-runners-filtered.png, 03-audit-charts.png.
// Exit 0 on success. On any failure: screenshot 99-failure.png, the error and the browser's
// console on stderr, exit 1. The whole run is capped at 60 s.
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';

const OVERALL_TIMEOUT_MS = 60_000;

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
  process.stderr.write(`portal_fleet_e2e: FAILED: ${err && err.stack ? err.stack : err}\n`);
  if (page) {
    try {
      process.stderr.write(`portal_fleet_e2e: page url at failure: ${page.url()}\n`);
      await screenshot('99-failure.png');
    } catch (e) {
      process.stderr.write(`portal_fleet_e2e: could not take 99-failure.png: ${e.message}\n`);
    }
  }
  if (consoleLog.length) process.stderr.write(`portal_fleet_e2e: browser console:\n  ${consoleLog.join('\n  ')}\n`);
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

async function login(url, user, password) {
  const resp = await page.goto(url, { waitUntil: 'load', timeout: 15_000 });
  if (!resp || resp.status() !== 200) throw new Error(`GET ${url} gave ${resp ? resp.status() : 'no response'}`);
  await page.locator('#login-name').waitFor({ state: 'visible' });
  await page.fill('#login-name', user);
  await page.fill('#login-password', password);
  await page.click('#login-submit');
  await page.locator('#top').waitFor({ state: 'visible' });
}

// The JSON body of the next answer to `pathname` (with `search` in its query) after `action`.
async function answerTo(pathname, action, search = '') {
  const [res] = await Promise.all([
    page.waitForResponse((r) => {
      const u = new URL(r.url());
      return u.pathname === pathname && u.search.includes(search);
    }),
    action(),
  ]);
  if (res.status() !== 200) throw new Error(`${pathname} answered ${res.status()}`);
  return res.json();
}

// The tiles drawn now, and the counts at the top.
async function drawn() {
  return page.evaluate(() => ({
    tiles: Object.fromEntries([...document.querySelectorAll('#runner-grid .tile')]
      .map((t) => [t.getAttribute('data-runner'), t.getAttribute('data-state')])),
    counts: Object.fromEntries([...document.querySelectorAll('#runner-counts li')]
      .map((li) => [li.getAttribute('data-state'), Number(li.querySelector('.n').textContent)])),
  }));
}

async function runnersGrid() {
  const runners = await answerTo('/api/runners', () => page.goto(`${new URL(page.url()).origin}/#/runners`));
  await page.locator('#runner-grid .tile').first().waitFor({ state: 'visible' });
  const grid = await drawn();
  checkProblems('runners');
  await screenshot('01-runners-1000.png');
  say({ runners, ...grid });
  return Object.keys(grid.tiles).length;
}

async function filtered(text, before) {
  await page.fill('#runner-filter', text);
  await page.waitForFunction((n) => document.querySelectorAll('#runner-grid .tile').length !== n,
    before, { timeout: 5_000 });
  const { tiles, counts } = await drawn();
  await screenshot('02-runners-filtered.png');
  say({ filtered: { tiles, all: counts.all } });
}

// Every bar of every series as drawn: [bucket, count, height].
async function bars() {
  return page.evaluate(() => Object.fromEntries([...document.querySelectorAll('#activity svg.activity-chart')]
    .map((svg) => [svg.getAttribute('data-series'), {
      total: Number(svg.getAttribute('data-total')),
      bars: [...svg.querySelectorAll('rect.bar')].map((r) => [Number(r.getAttribute('data-bucket')),
        Number(r.getAttribute('data-count')), Number(r.getAttribute('height'))]),
    }])));
}

async function activityCharts() {
  const activity = await answerTo('/api/audit/activity', () => page.click('a[data-nav="audit"]'));
  await page.locator('#activity svg.activity-chart').first().waitFor({ state: 'visible' });
  checkProblems('audit');
  await page.locator('#activity').screenshot({ path: path.join(shotDir, '03-audit-charts.png'), timeout: 5_000 });
  say({ activity, bars: await bars() });
}

async function run() {
  shotDir = path.resolve(env('SCREENSHOT_DIR', 'target/portal-fleet'));
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
    const text = `[${msg.type()}] ${msg.text()}`;
    consoleLog.push(text);
    if (/Content Security Policy/i.test(msg.text())) problems.push(text);
  });
  page.on('pageerror', (e) => {
    consoleLog.push(`[pageerror] ${e.message}`);
    problems.push(`uncaught exception: ${e.message}`);
  });
  await login(env('PORTAL_URL'), env('PORTAL_USER'), env('PORTAL_PASSWORD'));
  const all = await runnersGrid();
  await filtered(env('FILTER'), all);
  await activityCharts();
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
