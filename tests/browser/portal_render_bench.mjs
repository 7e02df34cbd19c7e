// The Runners page's render time in headless Chromium, run by `BENCH_ONLY=portal scripts/bench`:
//
//   .tools/node/bin/node tests/browser/portal_render_bench.mjs      (cwd = repo root)
//
// Env: PORTAL_URL, PORTAL_USER, PORTAL_PASSWORD, CHROMIUM (default /usr/bin/chromium),
//      RUNS (measured loads, default 10), WARMUP (unrecorded loads first, default 2),
//      EXPECT_TILES (the tiles a load must draw; a load that draws another number fails).
//
// Logs in once; then each load opens a fresh tab in the same browser context (the session
// cookie kept, Chromium's HTTP cache as a returning person's) at PORTAL_URL#/runners and reads
// the page's own performance mark `runners-grid-drawn` (web/app.js: set once the frame with the
// grid laid out and painted is drawn). Its startTime is the render time: from navigation
// start to the grid on screen, through the page's HTML, scripts and styles, `/api/session`,
// `/api/runners` and drawing every tile.
//
// Stdout: one JSON line per measured load, {"run": N, "ms": T, "tiles": N}, then
// {"runs": N, "median_ms": T, "worst_ms": T, "best_ms": T, "states": "N breaker-open, N down, …"}
// (the counts the last load showed). Exit 1 on any failure.
import { chromium } from 'playwright-core';

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

async function login(context, url, user, password) {
  const page = await context.newPage();
  await page.goto(url, { waitUntil: 'load', timeout: 15_000 });
  await page.fill('#login-name', user);
  await page.fill('#login-password', password);
  await page.click('#login-submit');
  await page.locator('#top').waitFor({ state: 'visible' });
  await page.close();
}

// One load of the Runners page in a fresh tab: the mark's time and the tiles drawn.
async function load(context, url) {
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(`${url}#/runners`, { waitUntil: 'commit', timeout: 15_000 });
  const handle = await page.waitForFunction(
    () => performance.getEntriesByName('runners-grid-drawn', 'mark')[0]?.startTime,
    null, { timeout: 30_000, polling: 50 });
  const ms = await handle.jsonValue();
  const tiles = await page.locator('#runner-grid .tile').count();
  const states = await page.evaluate(() => [...document.querySelectorAll('#runner-counts li.count')]
    .map((li) => `${li.querySelector('.n').textContent} ${li.getAttribute('data-state')}`).join(', '));
  await page.close();
  if (errors.length) throw new Error(`the page threw: ${errors.join('; ')}`);
  return { ms, tiles, states };
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: true, args: CHROMIUM_ARGS, timeout: 30_000,
});
try {
  const url = env('PORTAL_URL');
  const runs = Number(env('RUNS', '10'));
  const warmup = Number(env('WARMUP', '2'));
  const expected = Number(env('EXPECT_TILES'));
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  await login(context, url, env('PORTAL_USER'), env('PORTAL_PASSWORD'));
  const times = [];
  let last = '';
  for (let i = 0; i < warmup + runs; i += 1) {
    const { ms, tiles, states } = await load(context, url);
    last = states;
    if (tiles !== expected) throw new Error(`load ${i} drew ${tiles} tiles, not ${expected}`);
    if (i >= warmup) {
      times.push(ms);
      say({ run: i - warmup + 1, ms: Math.round(ms * 10) / 10, tiles });
    }
  }
  const round = (x) => Math.round(x * 10) / 10;
  say({ runs, median_ms: round(median(times)), worst_ms: round(Math.max(...times)), best_ms: round(Math.min(...times)), states: last });
  await browser.close();
} catch (e) {
  process.stderr.write(`portal_render_bench: FAILED: ${e && e.stack ? e.stack : e}\n`);
  await browser.close();
  process.exit(1);
}
