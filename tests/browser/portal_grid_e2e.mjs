// Browser driver for the Runners grid and the audit activity chart, run by
// tests/it/portal_grid.rs:
//
//   .tools/node/bin/node tests/browser/portal_grid_e2e.mjs      (cwd = repo root)
//
// Env: PORTAL_URL, PORTAL_USER, PORTAL_PASSWORD, SCREENSHOT_DIR (default target/portal-grid),
//      CHROMIUM (default /usr/bin/chromium), FILTER (text typed into the filter box),
//      GROUP_BY (a label key), OPEN_STATE (the state of the tile to open), RULE_CASES.
//
// Protocol on stdout, one JSON line each, in this order:
//   {"runners": BODY, "tiles": {NAME: STATE}, "counts": {STATE: N}}   the grid as drawn, and
//        the very /api/runners answer the page drew it from
//   {"groups": {TITLE: N}}                 tiles per group once grouped by GROUP_BY
//   {"filtered": {"tiles": N, "all": N, "rows": N}}  tiles and the count shown after FILTER,
//        and the table's rows for the same filter
//   {"detail": {"runner": NAME, "state": TEXT}}       the detail a click on a tile opened
//   {"activity": BODY, "bars": {SERIES: {"total": N, "bars": [[BUCKET, COUNT, HEIGHT]]}}}
//        the chart as drawn, and the /api/audit/activity answer it was drawn from
//   {"day": {"bucket_seconds": N, "buckets": N}}      the chart after "Last day"
//   {"rule": [[RUNNER, STATE]]}        the page's own rule applied to RULE_CASES (JSON: runners
//        as /api/runners gives them), the states no live runner of the test is in
//   {"done": true}
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
  process.stderr.write(`portal_grid_e2e: FAILED: ${err && err.stack ? err.stack : err}\n`);
  if (page) {
    try {
      process.stderr.write(`portal_grid_e2e: page url at failure: ${page.url()}\n`);
      await screenshot('99-failure.png');
    } catch (e) {
      process.stderr.write(`portal_grid_e2e: could not take 99-failure.png: ${e.message}\n`);
    }
  }
  if (consoleLog.length) process.stderr.write(`portal_grid_e2e: browser console:\n  ${consoleLog.join('\n  ')}\n`);
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

async function runnersGrid() {
  const runners = await answerTo('/api/runners', () => page.goto(`${new URL(page.url()).origin}/#/runners`));
  await page.locator('#runner-grid .tile').first().waitFor({ state: 'visible' });
  const drawn = await page.evaluate(() => ({
    tiles: Object.fromEntries([...document.querySelectorAll('#runner-grid .tile')]
      .map((t) => [t.getAttribute('data-runner'), t.getAttribute('data-state')])),
    counts: Object.fromEntries([...document.querySelectorAll('#runner-counts li')]
      .map((li) => [li.getAttribute('data-state'), Number(li.querySelector('.n').textContent)])),
  }));
  checkProblems('runners');
  await screenshot('01-runners-grid.png');
  say({ runners, ...drawn });
}

async function grouped(key) {
  await page.selectOption('#runner-group', key);
  await page.locator('#runner-grid .tile-group h3').first().waitFor({ state: 'visible' });
  const groups = await page.evaluate(() => Object.fromEntries([...document.querySelectorAll('#runner-grid .tile-group')]
    .map((g) => [g.getAttribute('data-group'), g.querySelectorAll('.tile').length])));
  await screenshot('02-runners-grouped.png');
  say({ groups });
}

async function filtered(text) {
  await page.fill('#runner-filter', text);
  await page.waitForFunction((n) => document.querySelectorAll('#runner-grid .tile').length !== n,
    await page.locator('#runner-grid .tile').count(), { timeout: 5_000 }).catch(() => {});
  const tiles = await page.locator('#runner-grid .tile').count();
  const all = Number(await page.locator('#runner-counts li[data-state="all"] .n').textContent());
  await screenshot('03-runners-filtered.png');
  await page.click('#runner-view-table');
  await page.locator('#runners tr.runner-row').first().waitFor({ state: 'visible' });
  const rows = await page.locator('#runners tr.runner-row').count();
  await screenshot('04-runners-table.png');
  await page.click('#runner-view-grid');
  await page.locator('#runner-grid').waitFor({ state: 'visible' });
  say({ filtered: { tiles, all, rows } });
}

async function detail(state) {
  await page.fill('#runner-filter', '');
  await page.locator(`#runner-grid .tile[data-state="${state}"]`).first().click();
  await page.locator('#runner-detail').waitFor({ state: 'visible' });
  const shown = await page.evaluate(() => ({
    runner: document.querySelector('#runner-detail').getAttribute('data-runner'),
    state: document.querySelector('#runner-detail-state').textContent.trim(),
  }));
  checkProblems('detail');
  await screenshot('05-runner-detail.png');
  say({ detail: shown });
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

async function activityChart() {
  const activity = await answerTo('/api/audit/activity', () => page.click('a[data-nav="audit"]'));
  await page.locator('#activity svg.activity-chart').first().waitFor({ state: 'visible' });
  checkProblems('audit');
  await screenshot('06-audit-activity.png');
  say({ activity, bars: await bars() });
  const day = await answerTo('/api/audit/activity', () => page.click('#activity-day'), 'bucket_seconds=900');
  await page.locator('#activity[data-range="day"] svg.activity-chart').first().waitFor({ state: 'visible' });
  await screenshot('07-audit-activity-day.png');
  say({ day: { bucket_seconds: day.bucket_seconds, buckets: day.buckets.length } });
}

async function run() {
  shotDir = path.resolve(env('SCREENSHOT_DIR', 'target/portal-grid'));
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
  await runnersGrid();
  await grouped(env('GROUP_BY'));
  await filtered(env('FILTER'));
  await detail(env('OPEN_STATE'));
  await activityChart();
  const cases = JSON.parse(env('RULE_CASES'));
  say({ rule: await page.evaluate((rs) => rs.map((r) => [r, runnerState(r)]), cases) });
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
