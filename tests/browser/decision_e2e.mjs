// Browser driver for the halted-rollout test (tests/it/decision_browser.rs): headless Chromium
// with two people, alice and bob, each in a browser context of their own with a virtual
// authenticator (the DevTools protocol's WebAuthn domain), register passkeys in the portal;
// then, step by step as the test says, they approve a rollout with them, read where it halted
// (the drawing of its waves), propose a retry, refuse to sign a decision the server tampered
// with, and sign the retry until the rollout completes.
//
//   .tools/node/bin/node tests/browser/decision_e2e.mjs      (cwd = repo root)
//
// Env: PORTAL_URL, ALICE_PASSWORD, BOB_PASSWORD, STEPS_DIR, SCREENSHOT_DIR, CHROMIUM; UNSIGNED=1
//      where the runners check no signatures: nobody registers a passkey ({"registered": null}),
//      people approve and vote without one.
//
// Protocol on stdout, one JSON line each:
//   {"registered": {"alice": CREDENTIAL_ID, "bob": CREDENTIAL_ID}}
// then, for each step file 1, 2, … the test writes in STEPS_DIR (JSON {"do": …, "id": …,
// "who": …}), one answer:
//   approve  `who` (a list) approve request `id`, with their passkeys where people sign
//            {"step", "approved": [users]}
//   halted   alice reads the halted page (01-halted.png; halted-rollout.png: the drawing, the halt)
//            {"step", "state", "drawing": [[runner, outcome]…], "halt", "buttons"}
//   propose  alice clicks `choice` (02-decision.png; decision-before-signing.png)
//            {"step", "decision": {id, text, choice, runners, sha256, votes, refused}}
//   refuse   `who` clicks "Sign with passkey" on a decision the page must refuse (03-refused.png)
//            {"step", "shown_refused", "error", "state", "sign_count": [before, after]}
//   sign     `who` signs (or votes for) the pending decision; with "until": STATE, waits for the
//            request to reach it (04-completed.png; completed-rollout.png)
//            {"step", "shown", "votes", "state", "drawing", "taken", "sign_count": [before, after]}
//   done     exit 0
// On failure: 99-failure.png, the error and the console on stderr, exit 1; the whole run is
// capped at 200 s.
import path from 'node:path';
import { drive, env, say, sleep } from './people.mjs';

// The shared driver (tests/browser/people.mjs), set as the run starts.
let h = null;
const screenshot = (page, name) => h.shot(page, name);
const settle = (...args) => h.settle(...args);
const text = (...args) => h.text(...args);

// A screenshot of the part of the page from `first`'s top to `last`'s bottom (for the docs).
async function part(page, name, first, last) {
  const box = await page.evaluate(([a, b]) => {
    const r = (s) => document.querySelector(s).getBoundingClientRect();
    const top = r(a).top + window.scrollY - 12;
    const bottom = r(b).bottom + window.scrollY + 12;
    const outer = document.querySelector('section.detail').getBoundingClientRect();
    return { x: outer.left, y: top, width: outer.width, height: bottom - top };
  }, [first, last]);
  await page.screenshot({ path: path.join(h.shotDir, name), fullPage: true, clip: box, timeout: 5_000 });
}

// The page's error box, or null.
const pageError = () => {
  const e = document.querySelector('#error');
  return e && !e.hidden && e.textContent.trim() ? e.textContent.trim() : null;
};

// Opens request `id` afresh (the page fetches it as the database now holds it).
async function open(url, p, id, ready = '#state') {
  h.focus(p.page);
  await p.page.goto('about:blank');
  await p.page.goto(`${url}#/approvals/${id}`);
  await p.page.locator(ready).waitFor({ state: 'visible' });
}

// Reloads request `id` until its state is `want` (a state that cannot become it fails).
async function untilState(url, p, id, want, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    await open(url, p, id);
    const state = await text(p.page, '#state');
    if (state === want) return state;
    if (['denied', 'expired', 'failed', 'aborted', 'withdrawn'].includes(state) || Date.now() > deadline) {
      throw new Error(`request ${id} is ${state}, not ${want}`);
    }
    await sleep(300);
  }
}

async function approve(url, p, id) {
  const button = process.env.UNSIGNED === '1' ? '#approve' : '#approve-passkey';
  await open(url, p, id, button);
  const refused = await text(p.page, '#statement-refused');
  if (refused) throw new Error(`${p.name}: the page refuses the statement: ${refused}`);
  await p.page.click(button);
  const out = await settle(p.page, `${p.name} approving with the passkey`, (who) => {
    const e = document.querySelector('#error');
    if (e && !e.hidden && e.textContent.trim()) return { error: e.textContent.trim() };
    const list = document.querySelector('#approvers');
    const s = document.querySelector('#state');
    return (list && list.textContent.includes(who)) || (s && s.textContent.trim() !== 'pending') ? { ok: true } : null;
  }, 30_000, p.name);
  if (out.error) throw new Error(`${p.name} approving: ${out.error}`);
}

// What the halted page shows: the drawing (each runner's outcome), the halt, the buttons.
async function halted(p) {
  return p.page.evaluate(() => {
    const t = (s) => { const n = document.querySelector(s); return n ? n.textContent.trim() : null; };
    return {
      state: t('#state'),
      drawing: [...document.querySelectorAll('#rollout-drawing [data-runner]')]
        .map((g) => [g.getAttribute('data-runner'), g.getAttribute('data-outcome')]),
      halt: { wave: t('#halt-wave'), runner: t('#halt-runner'), why: t('#halt-why'), not_run: t('#halt-not-run') },
      buttons: [...document.querySelectorAll('#decision-buttons button')].map((b) => b.textContent.trim()),
    };
  });
}

async function decisionShown(p) {
  return p.page.evaluate(() => {
    const t = (s) => { const n = document.querySelector(s); return n ? n.textContent.trim() : null; };
    const box = document.querySelector('#decision');
    return {
      id: box ? box.getAttribute('data-decision-id') : null,
      text: t('#decision-text'),
      choice: t('#decision-choice'),
      runners: t('#decision-runners'),
      sha256: t('#decision-sha256'),
      votes: t('#decision-votes'),
      refused: t('#decision-refused'),
    };
  });
}

async function step(url, n, order, people) {
  const p = people[order.who || 'alice'];
  const id = order.id;
  if (order.do === 'approve') {
    for (const who of order.who) await approve(url, people[who], id);
    say({ step: n, approved: order.who });
  } else if (order.do === 'halted') {
    await untilState(url, p, id, 'halted');
    await p.page.locator('#rollout-drawing').waitFor({ state: 'visible' });
    await screenshot(p.page, '01-halted.png');
    await part(p.page, 'halted-rollout.png', '#rollout', '#halted');
    say({ step: n, ...(await halted(p)) });
  } else if (order.do === 'propose') {
    await open(url, p, id, `#decision-${order.choice}`);
    await p.page.click(`#decision-${order.choice}`);
    await settle(p.page, `proposing ${order.choice}`, () => {
      const e = document.querySelector('#error');
      if (e && !e.hidden && e.textContent.trim()) return { error: e.textContent.trim() };
      return document.querySelector('#decision-text') ? { ok: true } : null;
    });
    const error = await p.page.evaluate(pageError);
    if (error) throw new Error(`proposing ${order.choice}: ${error}`);
    await screenshot(p.page, '02-decision.png');
    await part(p.page, 'decision-before-signing.png', '#halted', '#halted');
    say({ step: n, decision: await decisionShown(p) });
  } else if (order.do === 'refuse' || order.do === 'sign') {
    const button = process.env.UNSIGNED === '1' ? '#decision-vote' : '#decision-sign';
    await open(url, p, id, button);
    const shown = await decisionShown(p);
    const before = await p.signCount();
    await p.page.click(button);
    const out = await settle(p.page, `${p.name} signing the decision`, () => {
      const e = document.querySelector('#error');
      if (e && !e.hidden && e.textContent.trim()) return { error: e.textContent.trim() };
      const mine = document.querySelector('#decision-mine');
      const s = document.querySelector('#state');
      return mine || (s && s.textContent.trim() !== 'halted') ? { ok: true } : null;
    }, 30_000);
    // A signature the page should not have asked for would show here, whatever the page says.
    await sleep(300);
    const after = await p.signCount();
    if (order.do === 'refuse') {
      await screenshot(p.page, '03-refused.png');
      say({ step: n, shown_refused: shown.refused, error: out.error ?? null, state: await text(p.page, '#state'), sign_count: [before, after] });
      return;
    }
    if (out.error) throw new Error(`${p.name} signing the decision: the page shows an error: ${out.error}`);
    const votes = await text(p.page, '#decision-votes');
    let state = await text(p.page, '#state');
    if (order.until) {
      state = await untilState(url, p, id, order.until);
      await p.page.locator('#rollout-drawing').waitFor({ state: 'visible' });
      await screenshot(p.page, '04-completed.png');
      await part(p.page, 'completed-rollout.png', '#rollout', '#rollout');
    }
    say({ step: n, shown, votes, state, drawing: (await halted(p)).drawing, taken: await text(p.page, '#decision-taken'), sign_count: [before, after] });
  } else {
    throw new Error(`step ${n}: unknown order ${JSON.stringify(order)}`);
  }
}

await drive('decision-e2e', 200_000, async (harness) => {
  h = harness;
  const url = env('PORTAL_URL');
  const people = {
    alice: await h.person(url, 'alice', env('ALICE_PASSWORD')),
    bob: await h.person(url, 'bob', env('BOB_PASSWORD')),
  };
  if (process.env.UNSIGNED === '1') say({ registered: null });
  else say({ registered: { alice: await h.register(url, people.alice), bob: await h.register(url, people.bob) } });
  await h.steps(env('STEPS_DIR'), (n, order) => step(url, n, order, people));
});
