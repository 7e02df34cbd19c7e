// Browser driver for the grants and break-glass portal test (tests/it/grants_browser.rs):
// alice and bob, each in a headless Chromium context of their own with a virtual
// authenticator, register passkeys, then, step by step as the test says, read a grant as the
// page shows it (every line read from the text people sign), sign it with their passkeys,
// revoke it, and read the list of break-glass windows.
//
//   .tools/node/bin/node tests/browser/grants_e2e.mjs      (cwd = repo root)
//
// Env: PORTAL_URL, ALICE_PASSWORD, BOB_PASSWORD, STEPS_DIR, SCREENSHOT_DIR, CHROMIUM.
//
// Protocol on stdout, one JSON line each:
//   {"registered": {"alice": CREDENTIAL_ID, "bob": CREDENTIAL_ID}}
// then, for each step file 1, 2, … in STEPS_DIR (JSON {"do": …, "who": …, "id": …}), one answer:
//   look     `who` finds grant `id` in the Grants list and opens it (look-N.png); with
//            "try": true, clicks "Sign with passkey" if the page lets them
//            {"step", "listed", "shown": {refused, words: {label: text}, sha256, status, sign_disabled, banner},
//             "sign_count": [before, after]}
//   sign     `who` signs grant `id` with the passkey (sign-N.png)
//            {"step", "status", "signed_by", "error", "sign_count": [before, after]}
//   revoke   `who` revokes grant `id` with `reason` (revoke-N.png)
//            {"step", "status", "revoked", "error"}
//   review   `who` opens closed window `id` and signs its review with the passkey: proposes one
//            with `note`, or signs the one proposed (until it shows `until`: `proposed`, with
//            `votes` signatures, or `done`) unless the page refuses it (review-N.png)
//            {"step", "refused", "error", "proposed", "done", "sign_count": [before, after]}
//   windows  `who` opens the break-glass page (windows-N.png)
//            {"step", "rows": [{id, state}], "summary", "count"}
//   done     exit 0
import { drive, env } from './people.mjs';

await drive('grants-e2e', 200_000, async (h) => {
  const url = env('PORTAL_URL');
  const people = {
    alice: await h.person(url, 'alice', env('ALICE_PASSWORD')),
    bob: await h.person(url, 'bob', env('BOB_PASSWORD')),
  };
  h.say({ registered: { alice: await h.register(url, people.alice), bob: await h.register(url, people.bob) } });

  // Opens `hash` afresh (the page fetches what the database now holds) and waits for `ready`.
  const open = async (p, hash, ready) => {
    h.focus(p.page);
    await p.page.goto('about:blank');
    await p.page.goto(`${url}${hash}`);
    await p.page.locator(ready).first().waitFor({ state: 'visible' });
  };
  const shown = (page) => page.evaluate(() => {
    const t = (s) => { const n = document.querySelector(s); return n ? n.textContent.trim() : null; };
    const words = {};
    for (const n of document.querySelectorAll('#grant-words [data-line]')) words[n.getAttribute('data-line')] = n.textContent;
    const button = document.querySelector('#grant-sign-passkey');
    return {
      refused: t('#grant-refused'), words, sha256: t('#grant-sha256'), status: t('#grant-status'),
      sign_disabled: button ? button.disabled : null, banner: t('#break-glass-banner'),
    };
  });
  const outcome = (p, what, done) => h.settle(p.page, what, (want) => {
    const e = document.querySelector('#error');
    if (e && !e.hidden && e.textContent.trim()) return { error: e.textContent.trim() };
    const s = document.querySelector('#grant-status');
    return s && want.includes(s.textContent.trim()) ? { status: s.textContent.trim() } : null;
  }, 30_000, done);

  await h.steps(env('STEPS_DIR'), async (n, order) => {
    const p = people[order.who];
    if (!p) throw new Error(`step ${n}: nobody called ${order.who}`);
    const shot = (name) => h.shot(p.page, `${name}-${n}.png`);
    if (order.do === 'look') {
      await open(p, '#/grants', '#grants, #no-grants');
      const listed = await p.page.locator(`.grant-row[data-grant-id="${order.id}"]`).count() === 1;
      await open(p, `#/grants/${order.id}`, '#grant-signed');
      await shot('look');
      const seen = await shown(p.page);
      // With `try`, the person clicks "Sign with passkey" if the page lets them: a signature
      // the page should not have asked for shows in the authenticator's count.
      const before = await p.signCount();
      if (order.try && seen.sign_disabled === false) {
        await p.page.click('#grant-sign-passkey');
        await h.sleep(1000);
      }
      h.say({ step: n, listed, shown: seen, sign_count: [before, await p.signCount()] });
    } else if (order.do === 'sign') {
      await open(p, `#/grants/${order.id}`, '#grant-sign-passkey');
      const before = await p.signCount();
      await p.page.click('#grant-sign-passkey');
      // Until the page shows an error, or the person among those who signed.
      const out = await h.settle(p.page, `${p.name} signing grant ${order.id}`, (who) => {
        const e = document.querySelector('#error');
        if (e && !e.hidden && e.textContent.trim()) return { error: e.textContent.trim() };
        const s = document.querySelector('#grant-signed-by');
        return s && s.textContent.split(', ').includes(who) ? { ok: true } : null;
      }, 30_000, p.name);
      await h.sleep(300);
      await shot('sign');
      h.say({
        step: n, status: await h.text(p.page, '#grant-status'), signed_by: await h.text(p.page, '#grant-signed-by'),
        error: out.error ?? null, sign_count: [before, await p.signCount()],
      });
    } else if (order.do === 'revoke') {
      await open(p, `#/grants/${order.id}`, '#grant-revoke');
      await p.page.fill('#revoke-reason', order.reason);
      await p.page.click('#grant-revoke');
      const out = await outcome(p, `${p.name} revoking grant ${order.id}`, ['revoked']);
      await shot('revoke');
      h.say({ step: n, status: out.status ?? null, revoked: await h.text(p.page, '#grant-revoked'), error: out.error ?? null });
    } else if (order.do === 'review') {
      // Propose a review with `note`, or sign the one proposed; `until` is `proposed` or `done`.
      await open(p, `#/grants/${order.id}`, '#review');
      const refused = await h.text(p.page, '#review-refused');
      const before = await p.signCount();
      let error = null;
      if (refused === null) {
        if (order.note) await p.page.fill('#review-note-input', order.note);
        await p.page.click('#review-sign');
        const out = await h.settle(p.page, `${p.name} signing the review of ${order.id}`, ([until, votes]) => {
          const e = document.querySelector('#error');
          if (e && !e.hidden && e.textContent.trim()) return { error: e.textContent.trim() };
          if (until === 'done') return document.querySelector('#review-done') ? { ok: true } : null;
          const p = document.querySelector('#review p:not(.muted)');
          return document.querySelector('#review-proposed') && p && p.textContent.includes(`signed by ${votes}`) ? { ok: true } : null;
        }, 30_000, [order.until, order.votes ?? 1]);
        error = out.error ?? null;
      }
      await h.sleep(300);
      await shot('review');
      h.say({
        step: n, refused, error, proposed: await h.text(p.page, '#review-proposed'), done: await h.text(p.page, '#review-done'),
        sign_count: [before, await p.signCount()],
      });
    } else if (order.do === 'windows') {
      await open(p, '#/break-glass', '#windows, #no-windows');
      // The header's count is set as the page draws.
      await h.sleep(200);
      const out = await p.page.evaluate(() => ({
        rows: [...document.querySelectorAll('.window-row')].map((r) => ({
          id: r.getAttribute('data-window-id'), state: r.querySelector('[data-state]').getAttribute('data-state'),
        })),
        summary: document.querySelector('#unreviewed-summary').textContent.trim(),
        count: document.querySelector('#unreviewed-count').hidden ? null : document.querySelector('#unreviewed-count').textContent,
      }));
      await shot('windows');
      h.say({ step: n, ...out });
    } else {
      throw new Error(`step ${n}: unknown order ${JSON.stringify(order)}`);
    }
  });
});
