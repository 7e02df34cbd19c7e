// What the portal's browser drivers with people share: headless Chromium started as this
// machine allows, one browser context per person with a virtual authenticator (the DevTools
// protocol's WebAuthn domain: ctap2, internal transport, resident keys, user verification)
// logged in with a password, a passkey registered on the Passkeys page, the steps a test
// writes one file at a time, and the end: 99-failure.png, the error and the browser's console
// on stderr, exit 1.
//
// A driver: `await drive(NAME, TIMEOUT_MS, async (h) => { … })`, where `h` holds `person`,
// `register`, `settle`, `text`, `shot` (and `shotDir`), `focus`, `steps` and `say`.
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';

const CHROMIUM_ARGS = [
  '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--disable-quic', '--disable-default-apps', '--disable-extensions',
  '--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1 , EXCLUDE localhost',
];

export const env = (name, fallback) => {
  const v = process.env[name] ?? fallback;
  if (v === undefined || v === '') throw new Error(`environment variable ${name} is not set`);
  return v;
};
export const say = (line) => process.stdout.write(`${JSON.stringify(line)}\n`);
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function drive(name, timeoutMs, run) {
  let browser = null;
  let lastPage = null;
  let finished = false;
  const consoleLog = [];
  const problems = [];
  const shotDir = path.resolve(env('SCREENSHOT_DIR', `target/${name}`));
  mkdirSync(shotDir, { recursive: true });

  const shot = (page, file) => page.screenshot({ path: path.join(shotDir, file), fullPage: true, timeout: 5_000 });

  const fail = async (err) => {
    if (finished) return;
    finished = true;
    process.stderr.write(`${name}: FAILED: ${err && err.stack ? err.stack : err}\n`);
    if (lastPage) {
      try {
        process.stderr.write(`${name}: page url at failure: ${lastPage.url()}\n`);
        await shot(lastPage, '99-failure.png');
      } catch (e) {
        process.stderr.write(`${name}: could not take 99-failure.png: ${e.message}\n`);
      }
    }
    if (consoleLog.length) process.stderr.write(`${name}: browser console:\n  ${consoleLog.join('\n  ')}\n`);
    if (browser) { try { await browser.close(); } catch { /* gone */ } }
    process.exit(1);
  };

  // Waits until `fn` (run in the page, with `arg`) returns something truthy. (The predicate
  // is handed to the page as a function: the portal's CSP allows no eval.)
  const settle = async (page, what, fn, timeout = 20_000, arg = null) => {
    lastPage = page;
    const h = await page.waitForFunction(fn, arg, { timeout, polling: 50 }).catch(async (e) => {
      const shown = await page.locator('#error').textContent().catch(() => '');
      throw new Error(`${what}: nothing happened within ${timeout} ms (page error: ${shown || 'none'})`, { cause: e });
    });
    return h.jsonValue();
  };

  const text = (page, sel) => page.evaluate((s) => {
    const n = document.querySelector(s);
    return n ? n.textContent.trim() : null;
  }, sel);

  // One person: a browser context of their own, a virtual authenticator, logged in.
  const person = async (url, who, password) => {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await context.newPage();
    page.setDefaultTimeout(10_000);
    page.on('console', (msg) => {
      const line = `[${who} ${msg.type()}] ${msg.text()}`;
      consoleLog.push(line);
      if (/Content Security Policy/i.test(msg.text())) problems.push(line);
    });
    page.on('pageerror', (e) => { consoleLog.push(`[${who} pageerror] ${e.message}`); problems.push(e.message); });
    page.on('response', (r) => {
      if (r.status() >= 400) consoleLog.push(`[${who} http ${r.status()}] ${r.request().method()} ${r.url()}`);
    });
    const cdp = await context.newCDPSession(page);
    await cdp.send('WebAuthn.enable');
    const { authenticatorId } = await cdp.send('WebAuthn.addVirtualAuthenticator', { options: {
      protocol: 'ctap2', transport: 'internal', hasResidentKey: true,
      hasUserVerification: true, isUserVerified: true, automaticPresenceSimulation: true,
    } });
    lastPage = page;
    await page.goto(url, { waitUntil: 'load', timeout: 15_000 });
    await page.locator('#login-name').waitFor({ state: 'visible' });
    await page.fill('#login-name', who);
    await page.fill('#login-password', password);
    await page.click('#login-submit');
    await page.locator('#whoami').filter({ hasText: /\S/ }).waitFor({ state: 'visible' });
    const signCount = async () => {
      const { credentials } = await cdp.send('WebAuthn.getCredentials', { authenticatorId });
      return credentials.map((c) => c.signCount).reduce((a, b) => a + b, 0);
    };
    return { name: who, page, cdp, authenticatorId, signCount };
  };

  // Registers a passkey on the Passkeys page; its credential id in base64url.
  const register = async (url, p) => {
    const { page } = p;
    lastPage = page;
    await page.goto(`${url}#/passkeys`);
    await page.locator('#passkey-name').waitFor({ state: 'visible' });
    await page.fill('#passkey-name', `${p.name}'s virtual authenticator`);
    await page.click('#passkey-register');
    const out = await settle(page, `${p.name} registering a passkey`, () => {
      const e = document.querySelector('#error');
      if (e && !e.hidden && e.textContent.trim()) return { error: e.textContent.trim() };
      return document.querySelectorAll('.passkey-row').length === 1;
    });
    if (out && out.error) throw new Error(`${p.name} registering a passkey: ${out.error}`);
    const creds = (await p.cdp.send('WebAuthn.getCredentials', { authenticatorId: p.authenticatorId })).credentials;
    if (creds.length !== 1) throw new Error(`${p.name}'s authenticator holds ${creds.length} credentials, expected 1`);
    // Leave the portal, so its live-update stream does not hold the server the test restarts.
    await page.goto('about:blank');
    // CDP gives the id in standard base64; the portal and the approvers file in base64url.
    return creds[0].credentialId.replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
  };

  // The test's steps: files 1, 2, … in `dir`, each a JSON order, read once it exists (the
  // test writes it under another name and renames it); `{"do": "done"}` ends them.
  const steps = async (dir, step) => {
    for (let n = 1; ; n++) {
      const file = path.join(dir, String(n));
      while (!existsSync(file)) await sleep(100);
      const order = JSON.parse(readFileSync(file, 'utf8'));
      if (order.do === 'done') return;
      await step(n, order);
      if (problems.length) throw new Error(`browser problems: ${problems.join('; ')}`);
    }
  };

  const overall = setTimeout(() => fail(new Error(`overall timeout of ${timeoutMs} ms`)), timeoutMs);
  try {
    browser = await chromium.launch({
      executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: true, args: CHROMIUM_ARGS, timeout: 30_000,
    });
    // The page a failure's screenshot shows, where a driver moves to another person.
    const focus = (page) => { lastPage = page; };
    await run({ person, register, settle, text, shot, shotDir, focus, steps, say, sleep, env });
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
}
