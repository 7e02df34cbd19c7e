// emisar portal: a small single-page app over the same-origin /api JSON endpoints.
//
// Routes (location.hash): #/login, #/approvals[?state=S], #/approvals/<id>,
// #/audit[?filters], #/runners, #/passkeys, #/grants[?status=S], #/grants/<id> (a grant or a
// break-glass window: signed with a passkey, revoked), #/break-glass (the windows, those owed a
// review first). Unknown routes fall back to #/approvals.
//
// Invariant: text that comes from the server (agent reasons, args, notes, errors...) only
// ever reaches the page through textContent, text nodes or setAttribute on inert
// attributes. Nothing here uses innerHTML, and the page runs under a CSP without
// 'unsafe-inline', so there is no inline script or style either.
'use strict';

const STATES = ['pending', 'approved', 'denied', 'expired', 'executing', 'executed',
  'failed', 'halted', 'aborted', 'unknown', 'withdrawn'];
// Audit filters, in form order: [query name, label, placeholder].
const AUDIT_FILTERS = [
  ['tool', 'Tool', 'linux.systemctl_restart'],
  ['runner', 'Runner', 'hvn05'],
  ['actor', 'Actor', 'agent:deploy-bot'],
  ['kind', 'Kind', ''],
  ['outcome', 'Outcome', ''],
  ['call_id', 'Call id', ''],
  ['approval_id', 'Approval id', ''],
  ['since', 'Since', '2026-11-30T19:00:00Z'],
  ['until', 'Until', '2026-11-30T20:00:00Z'],
  ['limit', 'Limit', '100'],
];
const AUDIT_FIELDS = ['seq', 'id', 'at', 'actor', 'kind', 'tool', 'runner', 'args', 'reason',
  'call_id', 'approval_id', 'outcome', 'result_digest', 'detail', 'prev_hash', 'hash'];

const app = {
  session: null,        // {user, role, roles, csrf, display_name} while logged in
  events: null,         // the EventSource while logged in
  afterLogin: null,     // hash to return to once logged in
  renderSeq: 0,         // bumped by every render; a slower, older render must not win
  refreshTimer: null,   // coalesces bursts of SSE events into one refresh
  detail: { id: null, note: '', error: '' },  // survives live re-renders of one approval
  activityRange: 'hour', // the audit chart's window: a key of ACTIVITY_RANGES
};

// ------------------------------------------------------------------ DOM helpers

// el('a', {href: '#/x', class: 'c'}, 'text', childNode): children become text nodes.
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value == null || value === false) continue;
    if (key === 'class') node.className = value;
    else if (key === 'dataset') Object.assign(node.dataset, value);
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child == null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const $ = (sel) => document.querySelector(sel);

function pretty(value) {
  if (value === undefined) return '';
  return typeof value === 'string' ? value : JSON.stringify(value, null, 2);
}

function pre(value, props) {
  return el('pre', Object.assign({ class: 'json' }, props), pretty(value));
}

// A class-name-safe token from server data (risk, state, breaker), or a fallback.
function token(value, fallback = 'unknown') {
  return typeof value === 'string' && /^[a-z][a-z0-9-]*$/.test(value) ? value : fallback;
}

function badge(kind, value, props) {
  return el('span', Object.assign({ class: `badge ${kind}-${token(value)}` }, props), value ?? '—');
}

function relText(iso) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return '—';
  const diff = t - Date.now();
  const s = Math.round(Math.abs(diff) / 1000);
  let text;
  if (s < 60) text = `${s}s`;
  else if (s < 3600) text = `${Math.floor(s / 60)}m`;
  else if (s < 86400) text = `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  else text = `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
  return diff < 0 ? `${text} ago` : `in ${text}`;
}

// A <time> showing "3m ago" / "in 12m", kept current by the ticker below.
function relTime(iso) {
  if (!iso) return el('span', { class: 'muted' }, '—');
  return el('time', { datetime: iso, title: iso, 'data-rel': iso }, relText(iso));
}

function absTime(iso) {
  if (!iso) return el('span', { class: 'muted' }, '—');
  return el('span', {}, el('time', { datetime: iso }, iso), ' ', el('span', { class: 'muted' }, `(${relText(iso)})`));
}

function tickTimes() {
  for (const node of document.querySelectorAll('time[data-rel]')) {
    node.textContent = relText(node.getAttribute('data-rel'));
  }
}

function errorBox(message) {
  return el('div', { id: 'error', class: 'error', role: 'alert', hidden: !message }, message || '');
}

function showError(message) {
  const box = $('#error');
  if (!box) return;
  box.textContent = message || '';
  box.hidden = !message;
}

// ------------------------------------------------------------------ API

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// JSON request to the portal API. State-changing requests carry the CSRF token.
async function api(method, path, body) {
  return (await apiText(method, path, body)).data;
}

// The same, with the answer's text beside its value: the statement check before a passkey
// signs reads the numbers as the server wrote them (web/statement.js).
async function apiText(method, path, body) {
  const headers = { Accept: 'application/json' };
  const init = { method, headers, credentials: 'same-origin', cache: 'no-store' };
  if (method !== 'GET') {
    headers['Content-Type'] = 'application/json';
    if (app.session) headers['X-CSRF-Token'] = app.session.csrf;
    init.body = JSON.stringify(body ?? {});
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, `cannot reach the server (${e.message})`);
  }
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!res.ok) {
    const message = data && typeof data.error === 'string' ? data.error : `HTTP ${res.status}`;
    if (res.status === 401 && path !== '/api/login') loggedOut();
    throw new ApiError(res.status, message);
  }
  return { data, text };
}

const enc = encodeURIComponent;

// ------------------------------------------------------------------ session + live events

function loggedIn(session) {
  app.session = {
    user: session.user, role: session.role, roles: session.roles || [session.role],
    csrf: session.csrf, display_name: session.display_name || null,
  };
  // A person from the OpenID provider is shown by name; the audit log names them by identity.
  const name = session.display_name || session.user;
  const roles = session.role === 'none' ? 'no role' : (session.roles || [session.role]).join(', ');
  $('#whoami').textContent = `${name} (${roles})`;
  if (session.display_name) $('#whoami').setAttribute('title', session.user);
  $('#top').hidden = false;
  // Live updates are about approvals, which a person with no role may not see.
  if (session.role !== 'none') {
    openEvents();
    refreshUnreviewed();
    if (!app.unreviewedTimer) app.unreviewedTimer = setInterval(refreshUnreviewed, 60000);
  }
}

function loggedOut() {
  if (!app.session) return;
  app.session = null;
  closeEvents();
  clearInterval(app.unreviewedTimer);
  app.unreviewedTimer = null;
  setUnreviewed(0);
  $('#top').hidden = true;
  $('#whoami').textContent = '';
  const here = location.hash;
  if (!here.startsWith('#/login')) app.afterLogin = here;
  location.hash = '#/login';
}

function setLive(state) {
  const live = $('#live');
  live.textContent = state;
  live.className = `live live-${state}`;
}

function openEvents() {
  closeEvents();
  const es = new EventSource('/api/events');
  app.events = es;
  setLive('connecting');
  // Fires on the first connection and on every reconnect: anything that happened while
  // the stream was down is picked up by re-fetching the view.
  es.onopen = () => {
    setLive('live');
    scheduleRefresh(null);
  };
  es.onerror = () => {
    if (app.events !== es) return;
    setLive('reconnecting');
    if (es.readyState === EventSource.CLOSED) {
      // The browser gave up (e.g. a 401 after the session expired): ask why, then retry.
      setTimeout(async () => {
        if (app.events !== es) return;
        try {
          await api('GET', '/api/session');
          if (app.events === es) openEvents();
        } catch { /* a 401 already logged us out; otherwise try again on the next view */ }
      }, 3000);
    }
  };
  es.addEventListener('approval', (ev) => {
    let data = null;
    try { data = JSON.parse(ev.data); } catch { return; }
    scheduleRefresh(data && typeof data.id === 'string' ? data.id : null);
  });
  // The server dropped some events for this (slow) stream: refresh whatever is shown.
  es.addEventListener('resync', () => scheduleRefresh(null));
}

function closeEvents() {
  if (app.events) app.events.close();
  app.events = null;
  if ($('#live')) setLive('offline');
}

// Re-fetch the approvals view when an approval changed (id null = anything may have changed).
// The route is checked again when the timer fires: a refresh scheduled on the approvals page
// must not re-render the page the person moved to meanwhile (it would drop what they typed
// there, such as a passkey's name).
function scheduleRefresh(id) {
  const wanted = (route) => route.page === 'approvals' && !(route.id && id && route.id !== id);
  if (!wanted(parseHash())) return;
  if (app.refreshTimer) return;
  app.refreshTimer = setTimeout(() => {
    app.refreshTimer = null;
    if (wanted(parseHash())) render({ quiet: true });
  }, 50);
}

// ------------------------------------------------------------------ routing

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, '');
  const q = raw.indexOf('?');
  const path = (q < 0 ? raw : raw.slice(0, q)).split('/').filter(Boolean).map(decodeURIComponent);
  const query = new URLSearchParams(q < 0 ? '' : raw.slice(q + 1));
  const page = ['login', 'approvals', 'audit', 'runners', 'passkeys', 'grants', 'break-glass'].includes(path[0]) ? path[0] : null;
  return { page, id: (page === 'approvals' || page === 'grants') && path[1] ? path[1] : null, query };
}

async function render(opts = {}) {
  const seq = ++app.renderSeq;
  const route = parseHash();
  if (route.page !== 'runners') runnersEarly = null;
  if (!route.page) {
    location.replace('#/approvals');
    return;
  }
  if (!app.session && route.page !== 'login') {
    app.afterLogin = location.hash;
    location.replace('#/login');
    return;
  }
  if (app.session && route.page === 'login') {
    location.replace('#/approvals');
    return;
  }
  for (const a of document.querySelectorAll('[data-nav]')) {
    a.classList.toggle('active', a.getAttribute('data-nav') === route.page);
  }
  if (route.page !== 'approvals' || route.id !== app.detail.id) {
    app.detail = { id: route.id, note: '', error: '' };
  }
  const view = $('#view');
  if (!opts.quiet) view.replaceChildren(el('p', { class: 'muted' }, 'Loading…'));
  let node;
  try {
    if (route.page === 'login') node = await viewLogin();
    else if (app.session.role === 'none') node = viewNoRole();
    else if (route.page === 'approvals' && route.id) node = await viewApproval(route.id);
    else if (route.page === 'approvals') node = await viewApprovals(route.query);
    else if (route.page === 'audit') node = await viewAudit(route.query);
    else if (route.page === 'passkeys') node = await viewPasskeys();
    else if (route.page === 'grants' && route.id) node = await viewGrant(route.id);
    else if (route.page === 'grants') node = await viewGrants(route.query);
    else if (route.page === 'break-glass') node = await viewBreakGlass();
    else node = await viewRunners();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return;
    node = el('section', {}, el('h1', {}, 'Something went wrong'), errorBox(e.message));
  }
  if (seq !== app.renderSeq) return;   // a newer render started meanwhile
  const focused = document.activeElement && ['note', 'runner-filter'].includes(document.activeElement.id)
    ? document.activeElement.id : null;
  view.replaceChildren(node);
  if ($('#runner-grid')) markDrawn('runners-grid-drawn');
  const again = focused && $(`#${focused}`);
  if (again) {
    again.focus();
    if (focused === 'runner-filter') again.setSelectionRange(again.value.length, again.value.length);
  }
}

// Sets the performance mark `name` once per page load, after the frame that lays out and
// paints what is in the DOM now: a task queued from an animation frame callback runs once
// that frame is drawn. `BENCH_ONLY=portal scripts/bench` reads `runners-grid-drawn`, the
// time from navigation start to the Runners grid on screen.
function markDrawn(name) {
  if (performance.getEntriesByName(name, 'mark').length) return;
  requestAnimationFrame(() => setTimeout(() => {
    if (!performance.getEntriesByName(name, 'mark').length) performance.mark(name);
  }, 0));
}

// ------------------------------------------------------------------ login

// What the login page offers: password login, "Sign in with <provider>", or both.
async function loginOptions() {
  try {
    return await api('GET', '/api/login/options');
  } catch {
    return { local_login: true, oidc: null };
  }
}

async function viewLogin() {
  const options = await loginOptions();
  const next = app.afterLogin && !app.afterLogin.startsWith('#/login') ? app.afterLogin : '#/approvals';
  const parts = [el('h1', {}, 'emisar'), el('p', { class: 'muted' }, 'Sign in to review agent requests.')];
  const oidc = options && options.oidc;
  if (oidc && oidc.available) {
    // The provider sends the browser back to this path (a hash route needs the page first).
    const href = `${oidc.url}?return_to=${enc(`/${next}`)}`;
    parts.push(el('a', { id: 'login-oidc', class: 'button', href }, `Sign in with ${oidc.name}`));
  } else if (oidc) {
    parts.push(el('p', { id: 'login-oidc-unavailable', class: 'error', role: 'status' },
      `Signing in with ${oidc.name} is not possible right now: ${oidc.problem}`));
  }
  if (options && options.local_login === false) {
    parts.push(el('p', { id: 'login-local-off', class: 'muted' }, 'Password login is switched off on this server.'));
    return el('section', { class: 'login-wrap' }, parts);
  }
  return el('section', { class: 'login-wrap' }, parts, passwordForm(next, Boolean(oidc)));
}

function passwordForm(next, afterProvider) {
  const name = el('input', { id: 'login-name', name: 'name', autocomplete: 'username', required: true });
  const password = el('input', {
    id: 'login-password', name: 'password', type: 'password', autocomplete: 'current-password', required: true,
  });
  const submit = el('button', { id: 'login-submit', type: 'submit' }, 'Log in');
  const form = el('form', { class: 'login', onsubmit: async (ev) => {
    ev.preventDefault();
    submit.disabled = true;
    showError('');
    try {
      const session = await api('POST', '/api/login', { name: name.value, password: password.value });
      loggedIn(session);
      app.afterLogin = null;
      location.hash = next;
    } catch (e) {
      showError(e.message);
      password.value = '';
      password.focus();
    } finally {
      submit.disabled = false;
    }
  } },
  afterProvider ? el('p', { class: 'muted' }, 'Or with a local account:') : '',
  el('label', {}, 'Name', name),
  el('label', {}, 'Password', password),
  errorBox(''),
  submit);
  setTimeout(() => name.focus(), 0);
  return form;
}

// A person the provider signed in whose groups map to no role: nothing to show them.
function viewNoRole() {
  const s = app.session;
  return el('section', { id: 'no-role', class: 'login-wrap' },
    el('h1', {}, 'No role'),
    el('p', {}, `You are signed in as ${s.display_name || s.user} (${s.user}), but none of your groups `
      + 'at the sign-in provider is mapped to a role in emisar, so there is nothing you may see or decide.'),
    el('p', { class: 'muted' }, 'Ask an administrator to add you to a group mapped to approver, auditor or admin, then sign in again.'));
}

// ------------------------------------------------------------------ approvals list

async function viewApprovals(query) {
  const state = query.get('state') ?? 'pending';
  const url = state ? `/api/approvals?state=${enc(state)}` : '/api/approvals';
  const data = await api('GET', url);
  const approvals = (data && data.approvals) || [];

  const select = el('select', { id: 'state-filter', onchange: () => {
    location.hash = `#/approvals?state=${enc(select.value)}`;
  } },
  el('option', { value: '' }, 'all (history)'),
  STATES.map((s) => el('option', { value: s }, s)));
  select.value = state;

  const head = el('div', { class: 'view-head' },
    el('h1', {}, state === 'pending' ? 'Pending approvals' : state ? `Approvals: ${state}` : 'All approvals'),
    el('label', { class: 'inline' }, 'Show ', select));

  if (approvals.length === 0) {
    return el('section', {}, head, el('p', { id: 'empty', class: 'empty' },
      state === 'pending' ? 'Nothing is waiting for approval.' : 'No approvals match.'));
  }
  const rows = approvals.map((a) => {
    const href = `#/approvals/${enc(a.id)}`;
    return el('tr', { class: 'approval-row', 'data-approval-id': a.id, onclick: (ev) => {
      if (ev.target.closest('a')) return;
      location.hash = href;
    } },
    el('td', { class: 'tool' }, el('a', { href }, a.tool), ' ', badge('risk', a.risk)),
    el('td', {}, (a.runners || []).join(', ')),
    el('td', {}, a.requester),
    el('td', { class: 'reason-cell', title: a.reason || '' }, a.reason || ''),
    el('td', {}, relTime(a.created_at)),
    el('td', {}, a.state === 'pending' ? relTime(a.expires_at) : el('span', { class: 'muted' }, '—')),
    el('td', {}, badge('state', a.state)));
  });
  return el('section', {}, head,
    el('table', { class: 'list', id: 'approvals' },
      el('thead', {}, el('tr', {}, ['Tool', 'Runners', 'Requester', 'Reason', 'Age', 'Expires', 'State']
        .map((h) => el('th', {}, h)))),
      el('tbody', {}, rows)));
}

// ------------------------------------------------------------------ approval detail

// One line of a preview's `diff` array: a string, or {field, from, to}-like objects.
function diffLine(item) {
  if (typeof item === 'string') return item;
  if (item && typeof item === 'object') {
    const name = item.field ?? item.path ?? item.key ?? item.name;
    const from = 'from' in item ? item.from : 'old' in item ? item.old : item.before;
    const to = 'to' in item ? item.to : 'new' in item ? item.new : item.after;
    if (name !== undefined && (from !== undefined || to !== undefined)) {
      const show = (v) => (v === undefined ? '∅' : typeof v === 'string' ? v : JSON.stringify(v));
      return `${typeof name === 'string' ? name : JSON.stringify(name)} ${show(from)} → ${show(to)}`;
    }
  }
  return JSON.stringify(item);
}

function runnerOutput(runner, r, extra) {
  const box = el('div', { class: 'runner-out', 'data-runner': runner });
  box.append(el('h3', {}, runner, ' ', r && r.ok ? badge('ok', 'ok') : badge('ok', 'failed'), extra || ''));
  if (!r) return box;
  const diff = r.output && Array.isArray(r.output.diff) ? r.output.diff : null;
  if (diff) {
    box.append(diff.length
      ? el('ul', { class: 'diff' }, diff.map((d) => el('li', {}, diffLine(d))))
      : el('p', { class: 'muted' }, 'No changes.'));
  }
  if (r.error != null) box.append(pre(r.error, { class: 'json err' }));
  if (r.output !== undefined && r.output !== null) {
    if (diff) box.append(el('details', {}, el('summary', {}, 'Full output'), pre(r.output)));
    else box.append(pre(r.output));
  }
  return box;
}

function hasKeys(value) {
  return value != null && typeof value === 'object' && Object.values(value).some(
    (v) => v != null && typeof v === 'object' && Object.keys(v).length > 0);
}

function field(label, ...value) {
  return [el('dt', {}, label), el('dd', {}, ...value)];
}

async function viewApproval(id) {
  const { data: a, text: answer } = await apiText('GET', `/api/approvals/${enc(id)}`);
  const d = app.detail;
  const approvers = a.approvals || [];

  // What will change comes first: the preview's diff per runner, then the arguments (and
  // the values the preview captured, which the execution uses beside them).
  const changes = el('div', { class: 'changes', id: 'changes' }, el('h2', {}, 'What will change'));
  if (a.preview) {
    changes.append(el('div', { class: 'runner-outs', id: 'preview' },
      Object.entries(a.preview).map(([runner, r]) => runnerOutput(runner, r))));
  } else if (a.no_preview_reason) {
    // The pack's word on why this write has nothing to show, in place of a preview.
    changes.append(el('p', { class: 'muted', id: 'no-preview' }, 'No preview: ',
      el('span', { id: 'no-preview-reason' }, a.no_preview_reason), ' The arguments below are what runs.'));
  } else {
    changes.append(el('p', { class: 'muted', id: 'no-preview' }, 'This request has no preview: the arguments below are what runs.'));
  }
  changes.append(el('h3', {}, 'Arguments'), pre(a.args, { id: 'args' }));
  // What the preview captured, per runner: the execution fills these in beside the
  // arguments (e.g. the index Nomad's check-and-set holds the job to), so they are approved too.
  if (hasKeys(a.execution_vars)) {
    changes.append(el('h3', {}, 'Preview values'), pre(a.execution_vars, { id: 'execution-vars' }));
  }

  const list = el('dl', { class: 'fields' },
    field('State', el('span', { id: 'state', class: `badge state-${token(a.state)}` }, a.state)),
    field('Risk', badge('risk', a.risk)),
    field('Runners', (a.runners || []).join(', ') || '—'),
    a.plan ? field('Rollout', planList(a.plan.waves, a.plan.pause_secs, 'plan')) : [],
    field('Requester', a.requester),
    a.on_behalf_of != null ? field('On behalf of', el('span', { id: 'on-behalf-of' }, a.on_behalf_of)) : [],
    field('Reason', el('div', { id: 'reason', class: 'reason' }, a.reason ?? '')),
    field('Created', absTime(a.created_at)),
    field('Expires', absTime(a.expires_at)),
    field('Updated', absTime(a.updated_at)),
    field('Approvals', `${approvers.length} of ${a.required_approvals ?? 1} required`,
      // Each yes with its note: why they said yes is what an auditor asks.
      approvers.length ? el('ul', { class: 'approvers', id: 'approvers' },
        approvers.map((x) => el('li', {}, x.user, ' ', el('span', { class: 'muted' }, relText(x.at)),
          x.note != null ? el('div', { class: 'reason approver-note' }, x.note) : ''))) : ''),
    a.decided_by != null ? field('Decided by', a.decided_by) : [],
    // The request's own note: why it was denied, or why its execution failed.
    a.outcome_note != null ? field(a.state === 'denied' ? 'Denial note' : 'Outcome note',
      el('div', { id: 'decision-note', class: 'reason' }, a.outcome_note)) : []);

  const section = el('section', { class: 'detail', 'data-approval-id': a.id },
    el('p', { class: 'crumbs' }, el('a', { href: '#/approvals' }, '← Approvals'), ' · ',
      el('a', { href: `#/audit?approval_id=${enc(a.id)}` }, 'audit trail')),
    el('h1', {}, el('span', { id: 'tool' }, a.tool)),
    a.tool_description ? el('p', { class: 'desc' }, a.tool_description) : '',
    errorBox(d.error),
    changes,
    list);

  if (a.state === 'pending') section.append(await decisionForm(a, id, answer));
  if (a.plan && (a.result || a.state === 'halted')) section.append(rolloutPanel(a));
  if (a.state === 'halted') section.append(await haltPanel(a, id, answer));

  if (a.result) {
    const res = a.result;
    section.append(el('h2', {}, 'Result'),
      el('div', { class: 'runner-outs', id: 'result' },
        el('p', { class: 'muted' }, `call ${res.call_id ?? '—'}`,
          res.runner_chosen_by_server ? ' · runner chosen by the server' : ''),
        (res.results || []).map((r) => runnerOutput(r.runner, r,
          r.duration_ms != null ? el('span', { class: 'muted' }, ` ${r.duration_ms} ms`) : ''))));
  }
  return section;
}

// A rollout's waves in order (the first is the canary), and the pause between them.
function planList(waves, pause, id) {
  return el('div', { id },
    el('ol', { class: 'waves' }, (waves || []).map((w, i) => el('li', { 'data-wave': String(i + 1) },
      i === 0 && waves.length > 1 ? el('span', { class: 'muted' }, 'canary: ') : '', w.join(', ')))),
    el('p', { class: 'muted small' }, waves && waves.length > 1
      ? `Each wave runs after every runner of the one before passed its health gate, then a pause of ${pause} s; the first failure halts the rest.`
      : 'One wave.'));
}

// The statement a signature covers, as the server sent it: its lines (`key value` after the
// version line) and its text.
function statementBox(st) {
  const lines = String(st.text || '').split('\n').filter((l) => l !== '');
  const rows = [];
  for (const line of lines.slice(1)) {
    const at = line.indexOf(' ');
    if (at > 0) rows.push(field(line.slice(0, at), el('span', { class: 'mono' }, line.slice(at + 1))));
    else rows.push(field(line, ''));
  }
  return el('div', { class: 'statement', id: 'statement' },
    el('h3', {}, 'The statement'),
    el('p', { class: 'muted small' }, lines[0] || ''),
    el('dl', { class: 'fields' }, rows),
    el('details', {}, el('summary', {}, 'Statement text'), pre(st.text, { id: 'statement-text' })));
}

// Checks the statement of request `id` against the request the page shows (`answer`, the
// API's answer as text), on this browser's clock: `{ok: what is signed}` or `{error: why
// not, naming the field}`. Nothing the server computed is trusted (web/statement.js).
async function checkStatement(id, answer) {
  if (typeof emisarStatement === 'undefined') return { error: 'the statement check (statement.js) did not load' };
  try {
    return { ok: await emisarStatement.checkBeforeSigning(id, answer, Date.now()) };
  } catch (e) {
    if (e instanceof emisarStatement.Refusal) return { error: e.message };
    return { error: `the statement could not be checked (${e.message})` };
  }
}

// What a passkey signs, read back from the statement once every line of it was recomputed
// from what the page shows: the arguments the runners receive (a secret as its commitment),
// each runner with the preview values it will execute with, the count of people, the expiry.
// Or, when a line does not match, which one and why: then no passkey is asked.
function signedBox(checked) {
  if (checked.error) {
    return el('div', { class: 'statement refused', id: 'signed' },
      el('h3', {}, 'What you sign'),
      el('p', { class: 'error', id: 'statement-refused', role: 'alert' },
        'This statement does not match the request shown, so no passkey will sign it: ', checked.error));
  }
  const s = checked.ok;
  return el('div', { class: 'statement', id: 'signed' },
    el('h3', {}, 'What you sign'),
    el('p', { class: 'muted small' }, 'Each line of the statement, recomputed in this browser from the request above.'),
    el('dl', { class: 'fields' },
      field('Tool', el('span', { class: 'mono', id: 'signed-tool' }, s.tool)),
      field('Arguments', pre(s.args, { id: 'signed-args' }),
        s.args.includes('"commit:sha256:') ? el('p', { class: 'muted small' }, 'A secret is signed as its salted commitment (commit:sha256:…).') : ''),
      field('Runners', el('ul', { class: 'signed-runners', id: 'signed-runners' },
        s.runners.map((r) => el('li', { 'data-runner': r.name }, el('strong', {}, r.name), ' ',
          r.preview === null ? el('span', { class: 'muted' }, 'no preview values')
            : ['preview values ', el('span', { class: 'mono' }, r.preview)])))),
      field('Rollout', planList(s.waves, s.pause, 'signed-plan')),
      field('Approvals required', el('span', { id: 'signed-required' }, String(s.required))),
      field('Expires', el('span', { id: 'signed-expires', class: 'mono' }, s.expires), ' ', el('span', { class: 'muted' }, relTime(s.expires))),
      field('Requester', el('span', { class: 'mono' }, s.requester)),
      field('SHA-256', el('span', { id: 'statement-sha256', class: 'mono' }, s.sha256))));
}

async function decisionForm(a, id, answer) {
  const d = app.detail;
  // The statement is checked as the page shows it, so the person reads what is signed (or
  // why it will not be), and again at the click, on the clock of that moment.
  const checked = a.statement ? await checkStatement(id, answer) : null;
  // The server keeps the note with an approval as with a denial.
  const note = el('textarea', {
    id: 'note', rows: 3, placeholder: 'Note (kept with your decision; required to deny)',
    oninput: () => { d.note = note.value; },
  });
  note.value = d.note;
  // A request with a statement runs only with people's signatures: the server refuses an
  // unsigned approval of it, so the page offers only the signed one.
  const approve = a.statement ? null : el('button', { id: 'approve', type: 'button', class: 'approve' }, 'Approve');
  const withPasskey = a.statement
    ? el('button', { id: 'approve-passkey', type: 'button', class: 'approve' }, 'Approve with passkey')
    : null;
  const deny = el('button', { id: 'deny', type: 'button', class: 'deny' }, 'Deny');
  const buttons = [approve, withPasskey, deny].filter(Boolean);
  const decide = async (verb, signed) => {
    const text = note.value.trim();
    if (verb === 'deny' && !text) {
      d.error = 'a note is required to deny';
      showError(d.error);
      note.focus();
      return;
    }
    for (const b of buttons) b.disabled = true;
    d.error = '';
    showError('');
    try {
      const body = verb === 'deny' || text ? { note: text } : {};
      if (signed) {
        const now = await checkStatement(id, answer);
        if (now.error) throw new Error(`${now.error}: not signed`);
        body.signature = await passkeySignature(now.ok.challenge);
      }
      await api('POST', `/api/approvals/${enc(id)}/${verb}`, body);
      d.note = '';
    } catch (e) {
      d.error = e.message;
    }
    render({ quiet: true });
  };
  if (approve) approve.addEventListener('click', () => decide('approve', false));
  if (withPasskey) withPasskey.addEventListener('click', () => decide('approve', true));
  deny.addEventListener('click', () => decide('deny', false));
  return el('div', { class: 'decide' }, el('h2', {}, 'Decision'),
    a.statement ? el('div', { class: 'signing' }, signedBox(checked), statementBox(a.statement)) : '',
    el('div', { class: 'buttons' }, buttons),
    el('label', { for: 'note' }, 'Note'), note);
}

// ------------------------------------------------------------------ rollouts

// What became of each runner of a rollout, from the request's outcome: `ok` (ran, and its
// wave's gate passed or it was the last), `gate-failed` or `write-failed` (the runner where it
// halted), `failed`, `not-run` (a later wave, never called), or `waiting` (no outcome yet, or
// running again under people's decision).
function runnerOutcomes(a) {
  const res = a.result || {};
  const halt = res.halt || null;
  const byRunner = new Map((res.results || []).map((r) => [r.runner, r]));
  // While a decision people took runs, its runners' old outcomes no longer hold.
  const rerun = new Set(a.state === 'executing' && a.decision && a.decision.taken ? a.decision.runners || [] : []);
  const outcome = (runner) => {
    if (rerun.has(runner)) return 'waiting';
    const r = byRunner.get(runner);
    // A runner whose gate failed has `error_kind: gate_failed` (its write ran), wherever it
    // halted or not (a resume leaves it so).
    if (r && r.error_kind === 'gate_failed') return 'gate-failed';
    if (halt && halt.runner === runner) return r && r.ok === false ? 'write-failed' : 'gate-failed';
    if (halt && (halt.not_run || []).includes(runner)) return 'not-run';
    if (!r) return 'waiting';
    if (r.error_kind === 'not_run') return 'not-run';
    return r.ok ? 'ok' : 'failed';
  };
  return new Map(a.plan.waves.flat().map((runner) => [runner, outcome(runner)]));
}

const OUTCOME_TEXT = {
  ok: 'ran ok', 'gate-failed': 'gate failed', 'write-failed': 'write failed', failed: 'failed',
  'not-run': 'not run', waiting: 'waiting',
};

// The plan drawn wave by wave, left to right: a column per wave (the first the canary), a
// tile per runner coloured by its outcome, an arrow where the next wave waits on the gate.
function rolloutDrawing(waves, outcomes, haltedWave) {
  const col = 200;
  const tile = { w: 156, h: 42, gap: 10 };
  const top = 36;
  const tallest = Math.max(...waves.map((w) => w.length));
  const width = waves.length * col;
  const height = top + tallest * (tile.h + tile.gap) + 26;
  const drawing = svg('svg', {
    id: 'rollout-drawing', class: 'rollout-drawing', width, height, viewBox: `0 0 ${width} ${height}`,
    role: 'img', 'aria-label': 'The rollout, wave by wave',
  });
  waves.forEach((wave, i) => {
    const x = i * col + 10;
    const halted = haltedWave === i + 1;
    drawing.append(svg('text', { x, y: 16, class: `wave-title${halted ? ' wave-halted' : ''}` },
      `wave ${i + 1}${i === 0 && waves.length > 1 ? ' · canary' : ''}${halted ? ' · halted' : ''}`));
    if (i + 1 < waves.length) {
      const y = top + tile.h / 2;
      drawing.append(svg('line', { x1: x + tile.w + 2, y1: y, x2: x + col - 14, y2: y, class: 'wave-arrow' }),
        svg('polygon', { points: `${x + col - 14},${y - 4} ${x + col - 8},${y} ${x + col - 14},${y + 4}`, class: 'wave-arrow-head' }));
    }
    wave.forEach((runner, j) => {
      const y = top + j * (tile.h + tile.gap);
      const outcome = outcomes.get(runner) || 'waiting';
      drawing.append(svg('g', { class: `rollout-runner outcome-tile-${outcome}`, 'data-runner': runner, 'data-outcome': outcome },
        svg('title', {}, `${runner}: ${OUTCOME_TEXT[outcome]}`),
        svg('rect', { x, y, width: tile.w, height: tile.h, rx: 5 }),
        svg('text', { x: x + 10, y: y + 18, class: 'runner-name' }, runner),
        svg('text', { x: x + 10, y: y + 34, class: 'runner-outcome' }, OUTCOME_TEXT[outcome])));
    });
  });
  return drawing;
}

// A rollout's outcome: the drawing, and beside it the same as a list a screen reader reads.
function rolloutPanel(a) {
  const outcomes = runnerOutcomes(a);
  const halt = a.result && a.result.halt;
  const used = [...new Set(outcomes.values())];
  // A decision people took on a halt: what, and who signed it.
  const taken = a.decision && a.decision.taken ? a.decision : null;
  return el('div', { class: 'rollout', id: 'rollout' },
    el('h2', {}, 'Rollout'),
    taken ? el('p', { id: 'decision-taken' }, `After the halt, ${(taken.votes || []).map((v) => v.user).join(', ')} decided to `,
      `${taken.choice} (${(taken.runners || []).join(', ') || 'no runner'}).`) : '',
    rolloutDrawing(a.plan.waves, outcomes, halt && a.state !== 'executing' ? halt.wave : null),
    el('ul', { class: 'rollout-legend' }, used.map((o) => el('li', {},
      el('span', { class: `swatch outcome-tile-${o}` }), OUTCOME_TEXT[o]))),
    el('ol', { class: 'waves', id: 'rollout-list' }, a.plan.waves.map((w, i) => el('li', { 'data-wave': String(i + 1) },
      w.map((r, j) => [j ? ', ' : '', el('span', { 'data-runner': r, 'data-outcome': outcomes.get(r) }, `${r} (${OUTCOME_TEXT[outcomes.get(r)]})`)])))));
}

// A halted rollout: where it stopped and why, and people's way on: a decision to resume,
// retry or abort, which a passkey signs once this page has checked it.
async function haltPanel(a, id, answer) {
  const halt = (a.result && a.result.halt) || null;
  const where = halt
    ? el('dl', { class: 'fields', id: 'halt' },
      field('Halted in', el('span', { id: 'halt-wave' }, `wave ${halt.wave} of ${a.plan ? a.plan.waves.length : '?'}`)),
      field('Runner', el('span', { id: 'halt-runner', class: 'mono' }, halt.runner ?? 'none (the wave could not start)')),
      field('Why', el('div', { id: 'halt-why', class: 'reason' }, a.outcome_note ?? '')),
      field('Not run', el('span', { id: 'halt-not-run', class: 'mono' }, (halt.not_run || []).join(', ') || 'none')))
    : el('p', { class: 'error', id: 'halt' }, 'The request does not say where its rollout halted.');
  const box = el('div', { class: 'decide', id: 'halted' }, el('h2', {}, 'Halted: what next'), where,
    el('p', { class: 'muted small' },
      'Resume runs the runners not run, in their waves; retry runs the failed runner again, then the rest; abort runs nothing more. ',
      'Each is a decision people sign with their passkeys, as many as the request needed (one to abort).'));
  const d = app.detail;
  const buttons = ['resume', 'retry', 'abort'].map((choice) => el('button', {
    id: `decision-${choice}`, type: 'button', class: choice === 'abort' ? 'deny' : 'approve',
    onclick: async () => {
      for (const b of buttons) b.disabled = true;
      d.error = '';
      try {
        await api('POST', `/api/approvals/${enc(id)}/decision`, { choice });
      } catch (e) {
        d.error = `${choice}: ${e.message}`;
      }
      render({ quiet: true });
    },
  }, choice[0].toUpperCase() + choice.slice(1)));
  box.append(el('div', { class: 'buttons', id: 'decision-buttons' }, buttons));
  const pending = a.decision && !a.decision.taken ? a.decision : null;
  if (pending) box.append(await pendingDecision(a, pending, id, answer));
  return box;
}

// Checks the decision request `id` carries against the halt the page shows (web/statement.js):
// `{ok: what is signed}` or `{error: why not, naming the field}`.
async function checkDecision(id, choice, answer) {
  if (typeof emisarStatement === 'undefined') return { error: 'the decision check (statement.js) did not load' };
  try {
    return { ok: await emisarStatement.checkDecisionBeforeSigning(id, choice, answer, Date.now()) };
  } catch (e) {
    if (e instanceof emisarStatement.Refusal) return { error: e.message };
    return { error: `the decision could not be checked (${e.message})` };
  }
}

// The decision waiting for votes: who proposed it and who signed, what is signed (checked
// here, or why not), its text, and the passkey step.
async function pendingDecision(a, pending, id, answer) {
  const d = app.detail;
  const votes = pending.votes || [];
  const checked = await checkDecision(id, pending.choice, answer);
  const mine = app.session && votes.some((v) => v.user === app.session.user);
  // Where the runners check no signatures (the request has no statement), a vote carries
  // none: the server refuses a signed one there, as the terminal's vote does.
  const signs = Boolean(a.statement);
  const what = checked.error
    ? el('p', { class: 'error', id: 'decision-refused', role: 'alert' },
      'This decision does not match the halt shown, so this page will not sign it or vote for it: ', checked.error)
    : el('dl', { class: 'fields', id: 'decision-signed' },
      field('Choice', el('strong', { id: 'decision-choice' }, checked.ok.choice)),
      field('Runners it lets run', el('span', { id: 'decision-runners', class: 'mono' }, checked.ok.runners.join(', ') || 'none'),
        ' ', el('span', { class: 'muted' }, 'each in its wave of the signed plan')),
      field('Halted in', `wave ${checked.ok.halted} (failed: ${checked.ok.failed ?? 'none'})`),
      field('Expires', el('span', { class: 'mono', id: 'decision-expires' }, checked.ok.expires), ' ', el('span', { class: 'muted' }, relTime(checked.ok.expires))),
      field('SHA-256', el('span', { class: 'mono', id: 'decision-sha256' }, checked.ok.sha256)));
  const note = el('textarea', { id: 'decision-vote-note', rows: 2, placeholder: 'Note (kept with your vote)' });
  const sign = el('button', { id: signs ? 'decision-sign' : 'decision-vote', type: 'button', class: 'approve', disabled: mine },
    signs ? 'Sign with passkey' : 'Vote for it');
  sign.addEventListener('click', async () => {
    sign.disabled = true;
    d.error = '';
    showError('');
    try {
      // Checked again at the click, on the clock of that moment; the challenge is computed here.
      const now = await checkDecision(id, pending.choice, answer);
      if (now.error) throw new Error(`${now.error}: not ${signs ? 'signed' : 'voted for'}`);
      const body = { decision_id: now.ok.id };
      if (signs) body.signature = await passkeySignature(now.ok.challenge);
      if (note.value.trim()) body.note = note.value.trim();
      await api('POST', `/api/approvals/${enc(id)}/decision/vote`, body);
    } catch (e) {
      d.error = e.message;
    }
    render({ quiet: true });
  });
  return el('div', { class: 'statement', id: 'decision', 'data-decision-id': pending.id },
    el('h3', {}, `Decision: ${pending.choice}`, ' ', el('span', { class: 'muted small' }, `proposed by ${pending.proposed_by}`)),
    el('p', { id: 'decision-votes' }, `${votes.length} of ${pending.required} people ${signs ? 'signed' : 'voted for it'}`,
      votes.length ? [': ', el('span', { id: 'decision-voters' }, votes.map((v) => v.user).join(', '))] : ''),
    what,
    el('details', { open: true }, el('summary', {}, 'Decision text (what the passkey signs)'), pre(pending.text, { id: 'decision-text' })),
    mine ? el('p', { class: 'muted', id: 'decision-mine' }, `You ${signs ? 'signed' : 'voted for'} this decision; another person must add theirs.`)
      // Offered even when refused: the click checks again and says why nothing is signed.
      : el('div', { class: 'buttons' }, sign),
    mine ? '' : note);
}

// ------------------------------------------------------------------ grants and break-glass

const GRANT_STATUSES = ['requested', 'active', 'revoked', 'expired'];

async function viewGrants(query) {
  const status = query.get('status') ?? '';
  const data = await api('GET', status ? `/api/grants?status=${enc(status)}` : '/api/grants');
  const grants = (data && data.grants) || [];
  const select = el('select', { id: 'grant-status-filter', onchange: () => {
    location.hash = select.value ? `#/grants?status=${enc(select.value)}` : '#/grants';
  } }, el('option', { value: '' }, 'all'), GRANT_STATUSES.map((s) => el('option', { value: s }, s)));
  select.value = status;
  const head = el('div', { class: 'view-head' }, el('h1', {}, 'Grants'),
    el('label', { class: 'inline' }, 'Show ', select));
  const intro = el('p', { class: 'muted' },
    'A grant lets an agent run the writes it bounds, without a new round of people each, until it is '
    + 'spent, expires or is revoked. Each runner checks its signatures and counts its calls itself.');
  if (grants.length === 0) {
    return el('section', {}, head, intro, el('p', { id: 'no-grants', class: 'empty' }, 'No grants match.'));
  }
  const rows = grants.map((g) => {
    const href = `#/grants/${enc(g.grant_id)}`;
    const runners = g.runners && (g.runners.names ? g.runners.names.join(', ') : `labels ${g.runners.labels}`);
    return el('tr', { class: 'grant-row', 'data-grant-id': g.grant_id, onclick: (ev) => {
      if (ev.target.closest('a')) return;
      location.hash = href;
    } },
    el('td', { class: 'tool' }, el('a', { href }, g.grant_id.slice(0, 8)),
      g.break_glass ? [' ', el('span', { class: 'badge break-glass' }, 'break-glass')] : ''),
    el('td', {}, g.agent),
    el('td', { class: 'mono' }, (g.tools || []).join(', ')),
    el('td', {}, runners || ''),
    el('td', {}, `${g.calls_used} of ${g.calls}`),
    el('td', { class: 'reason-cell', title: g.reason || '' }, g.reason || ''),
    el('td', {}, g.status === 'requested' || g.status === 'active' ? relTime(g.expires_at) : el('span', { class: 'muted' }, '—')),
    el('td', {}, badge('state', g.status)));
  });
  return el('section', {}, head, intro,
    el('table', { class: 'list', id: 'grants' },
      el('thead', {}, el('tr', {}, ['Grant', 'Agent', 'Tools', 'Runners', 'Calls used', 'Reason', 'Expires', 'Status']
        .map((h) => el('th', {}, h)))),
      el('tbody', {}, rows)));
}

// Checks grant `id` as the API answered it (`answer`, as text) on this browser's clock:
// `{ok: the grant read from its own text}` or `{error: why not, naming the line}`.
async function checkGrant(id, answer) {
  if (typeof emisarStatement === 'undefined') return { error: 'the statement check (statement.js) did not load' };
  try {
    return { ok: await emisarStatement.checkGrantBeforeSigning(id, answer, Date.now()) };
  } catch (e) {
    if (e instanceof emisarStatement.Refusal) return { error: e.message };
    return { error: `the grant could not be checked (${e.message})` };
  }
}

// The grant in words, every line read from the text people sign (never from the API's other
// fields), with what a reader cannot see made visible.
function grantWords(checked, signing) {
  const title = signing ? 'What you sign' : 'The grant, in words';
  if (checked.error) {
    return el('div', { class: 'statement refused', id: 'grant-signed' },
      el('h3', {}, title),
      el('p', { class: 'error', id: 'grant-refused', role: 'alert' },
        signing ? 'This grant\'s text does not hold, so no passkey will sign it: ' : 'This grant\'s text does not hold: ',
        checked.error));
  }
  const g = checked.ok;
  return el('div', { class: 'statement', id: 'grant-signed' },
    el('h3', {}, title),
    el('p', { class: 'muted small' }, 'Each line read in this browser from the grant\'s own text, the bytes a signature covers.'),
    el('dl', { class: 'fields', id: 'grant-words' },
      g.words.map(([label, text]) => field(label, el('span', { class: 'mono', 'data-line': label }, emisarStatement.visible(text)),
        label === 'expires' ? [' ', el('span', { class: 'muted' }, relTime(text))] : ''))),
    el('dl', { class: 'fields' },
      field('SHA-256', el('span', { id: 'grant-sha256', class: 'mono' }, g.sha256))));
}

async function viewGrant(id) {
  const { data: g, text: answer } = await apiText('GET', `/api/grants/${enc(id)}`);
  const checked = await checkGrant(id, answer);
  const signing = g.status === 'requested';
  const section = el('section', { class: 'detail', 'data-grant-id': g.grant_id },
    el('p', { class: 'crumbs' }, el('a', { href: '#/grants' }, '← Grants'),
      g.break_glass ? [' · ', el('a', { href: '#/break-glass' }, 'Break-glass windows')] : ''),
    el('h1', {}, g.break_glass ? el('span', { class: 'badge break-glass', id: 'break-glass-banner' }, 'BREAK-GLASS window') : 'Grant',
      ' ', el('span', { id: 'grant-status', class: `badge state-${token(g.status)}` }, g.status)),
    errorBox(''));

  section.append(grantWords(checked, signing));
  const perRunner = Object.entries(g.runners_used || {});
  section.append(el('h2', {}, 'Use'),
    el('dl', { class: 'fields' },
      field('Calls', el('span', { id: 'grant-calls' }, `${g.calls_used} used of ${g.calls}, ${g.calls_left} left`),
        el('span', { class: 'muted' }, ' (counted from the audit log)')),
      perRunner.length ? field('Per runner', el('ul', { id: 'grant-runners-used' },
        perRunner.map(([r, u]) => el('li', { 'data-runner': r }, `${r}: ${u.used} used, ${u.left} left`)))) : [],
      field('Asked by', g.requested_by, ' ', el('span', { class: 'muted' }, relText(g.requested_at))),
      g.on_behalf_of != null ? field('On behalf of', g.on_behalf_of) : [],
      field('Signed by', el('span', { id: 'grant-signed-by' }, (g.signed_by || []).join(', ') || 'nobody yet'),
        ` (${(g.signed_by || []).length} of ${g.required})`),
      g.revoked_at ? field('Revoked', el('span', { id: 'grant-revoked' }, `by ${g.revoked_by} ${relText(g.revoked_at)}: `),
        el('span', { class: 'reason' }, g.revoke_reason || '')) : []));

  if (signing) section.append(grantSignForm(id, answer, checked));
  if (g.status === 'requested' || g.status === 'active') section.append(grantRevokeForm(id, g));
  if (g.break_glass && (g.status === 'revoked' || g.status === 'expired')) section.append(await reviewPanel(id, g.text));
  section.append(el('details', {}, el('summary', {}, 'Grant text'), pre(g.text, { id: 'grant-text' })),
    el('p', { class: 'muted small' }, 'In the terminal: ', el('span', { class: 'mono' }, `emisar grants show ${g.grant_id}`)));
  return section;
}

function grantSignForm(id, answer, checked) {
  const note = el('textarea', { id: 'grant-note', rows: 2, placeholder: 'Note (kept with your signature)' });
  const sign = el('button', { id: 'grant-sign-passkey', type: 'button', class: 'approve', disabled: checked.error ? true : null },
    'Sign with passkey');
  sign.addEventListener('click', async () => {
    sign.disabled = true;
    showError('');
    try {
      // Checked again at the click, on the clock of that moment, from the answer shown.
      const now = await checkGrant(id, answer);
      if (now.error) throw new Error(`${now.error}: not signed`);
      const body = { signature: await passkeySignature(now.ok.challenge) };
      if (note.value.trim()) body.note = note.value.trim();
      await api('POST', `/api/grants/${enc(id)}/approve`, body);
      render({ quiet: true });
    } catch (e) {
      showError(e.message);
      sign.disabled = false;
    }
  });
  return el('div', { class: 'decide' }, el('h2', {}, 'Sign'),
    el('p', { class: 'muted small' }, 'Your passkey signs the text above; runners check the signatures against their own approvers file.'),
    el('div', { class: 'buttons' }, sign), el('label', { for: 'grant-note' }, 'Note'), note);
}

function grantRevokeForm(id, g) {
  const reason = el('input', { id: 'revoke-reason', placeholder: 'why it ends now', maxlength: 2000 });
  const revoke = el('button', { id: 'grant-revoke', type: 'button', class: 'deny' }, g.break_glass ? 'Close the window' : 'Revoke');
  revoke.addEventListener('click', async () => {
    if (!reason.value.trim()) {
      showError('a reason is required to revoke');
      reason.focus();
      return;
    }
    revoke.disabled = true;
    showError('');
    try {
      await api('POST', `/api/grants/${enc(id)}/revoke`, { reason: reason.value.trim() });
      render({ quiet: true });
    } catch (e) {
      showError(e.message);
      revoke.disabled = false;
    }
  });
  return el('div', { class: 'decide' }, el('h2', {}, g.break_glass ? 'Close' : 'Revoke'),
    el('p', { class: 'muted small' }, 'Nothing runs under it on the server from now on; each runner is told, and refuses it within the bound the operator guide states.'),
    el('label', { for: 'revoke-reason' }, 'Reason'), reason, el('div', { class: 'buttons' }, revoke));
}

// A window's state as the log tells it (src/server/break_glass/ledger.rs `State`): every
// state but `reviewed` is owed a review.
// A closed break-glass window's review: as signed (the log's `break_glass.reviewed`), or the
// one proposed, which each person reads and signs with a passkey, or a note to propose one.
// What a passkey signs is built or read here and must bind this window (web/statement.js
// `checkReviewBeforeSigning`).
async function reviewPanel(id, windowText) {
  const { window: w, review } = await api('GET', `/api/break-glass/${enc(id)}`);
  const box = el('div', { class: 'decide', id: 'review' }, el('h2', {}, 'Review'));
  if (w.review) {
    box.append(el('p', { id: 'review-done' }, `Reviewed by ${w.review.signed_by.join(', ')} `, relTime(w.review.at)),
      el('div', { class: 'reason', id: 'review-note' }, emisarStatement.visible(w.review.note)));
    return box;
  }
  if (w.review_refused) {
    box.append(el('p', { class: 'error', id: 'review-event-refused' }, 'A review in the audit log does not count: ', emisarStatement.visible(w.review_refused)));
  }
  box.append(el('p', { class: 'muted small' }, `${w.calls.length} call${w.calls.length === 1 ? '' : 's'} ran in this window `
    + `(the audit log's grant.used events). It stays unreviewed until ${w.required} people sign a review with a note.`),
  w.calls.length ? el('ul', { id: 'window-calls' }, w.calls.map((c) => el('li', {},
    el('span', { class: 'mono' }, c.tool || '?'), ` on ${c.runners.join(', ')} by ${c.actor} `, relTime(c.at)))) : '');
  const proposed = review && review.text;
  const note = proposed ? null : el('textarea', { id: 'review-note-input', rows: 3, placeholder: 'What was done inside the window, and why (required)' });
  if (proposed) {
    box.append(el('p', {}, `Proposed by ${review.proposed_by}, signed by ${review.votes.length}:`));
  }
  let shown = null;
  if (proposed) {
    try {
      shown = await emisarStatement.checkReviewBeforeSigning(id, windowText, proposed, null, Date.now(), w.closed && w.closed[0]);
      box.append(el('div', { class: 'reason', id: 'review-proposed' }, emisarStatement.visible(shown.note)));
    } catch (e) {
      box.append(el('p', { class: 'error', id: 'review-refused', role: 'alert' }, 'This review does not hold, so no passkey will sign it: ', e.message));
    }
  } else {
    box.append(el('label', { for: 'review-note-input' }, 'Note'), note);
  }
  const sign = el('button', { id: 'review-sign', type: 'button', class: 'approve', disabled: proposed && !shown ? true : null },
    proposed ? 'Sign this review with passkey' : 'Propose and sign a review with passkey');
  sign.addEventListener('click', async () => {
    sign.disabled = true;
    showError('');
    try {
      // Built or read again at the click, on the clock of that moment.
      const r = await emisarStatement.checkReviewBeforeSigning(id, windowText, proposed, note && note.value.trim(), Date.now(), w.closed && w.closed[0]);
      const signature = await passkeySignature(r.challenge);
      await api('POST', `/api/break-glass/${enc(id)}/review`, { text: r.text, signature });
      render({ quiet: true });
    } catch (e) {
      showError(e.message);
      sign.disabled = false;
    }
  });
  box.append(el('div', { class: 'buttons' }, sign));
  return box;
}

const WINDOW_STATES = { requested: 'requested', open: 'open', 'closed-unreviewed': 'closed, unreviewed', reviewed: 'reviewed' };

async function viewBreakGlass() {
  const data = await api('GET', '/api/break-glass');
  const windows = ((data && data.windows) || []).slice().reverse();
  const unreviewed = windows.filter((w) => w.state !== 'reviewed');
  setUnreviewed(unreviewed.length);
  const head = el('div', { class: 'view-head' }, el('h1', {}, 'Break-glass windows'));
  const intro = el('p', { class: 'muted' },
    'Two people open a window for named runners, for at most an hour. Every call in it is flagged, witnessed and '
    + 'announced, and the window stays unreviewed until people sign a review with a note, on its page once it is '
    + 'closed or in the terminal (', el('span', { class: 'mono' }, 'emisar break-glass review ID --note … --ssh-key …'), ').');
  const summary = el('p', { id: 'unreviewed-summary', class: unreviewed.length ? 'error' : 'muted' },
    unreviewed.length ? `${unreviewed.length} window${unreviewed.length === 1 ? '' : 's'} not reviewed yet.` : 'Every window is reviewed.');
  const rows = windows.map((w) => el('tr', { class: `window-row window-${token(w.state)}`, 'data-window-id': w.id },
    el('td', { class: 'tool' }, el('a', { href: `#/grants/${enc(w.id)}` }, w.id.slice(0, 8))),
    el('td', {}, el('span', { class: `badge window-state-${token(w.state)}`, 'data-state': w.state }, WINDOW_STATES[w.state] || w.state)),
    el('td', {}, w.runners.join(', ')),
    el('td', {}, w.agent),
    el('td', { class: 'reason-cell', title: w.reason }, w.reason),
    el('td', {}, w.opened_by, ' ', el('span', { class: 'muted' }, relText(w.opened_at))),
    el('td', {}, w.signed_by.join(', ')),
    el('td', { class: 'window-calls' }, String(w.calls.length)),
    el('td', {}, w.review ? [w.review.signed_by.join(', '), el('div', { class: 'reason' }, w.review.note)] : el('span', { class: 'muted' }, '—'))));
  const table = windows.length
    ? el('table', { class: 'list', id: 'windows' },
      el('thead', {}, el('tr', {}, ['Window', 'State', 'Runners', 'Agent', 'Reason', 'Opened', 'Signed by', 'Calls', 'Review']
        .map((h) => el('th', {}, h)))),
      el('tbody', {}, rows))
    : el('p', { class: 'empty', id: 'no-windows' }, 'No break-glass window was ever opened.');
  return el('section', {}, head, intro, errorBox(''), summary, table, openWindowForm());
}

function openWindowForm() {
  const runners = el('input', { id: 'window-runners', placeholder: 'edge-1,edge-2', required: true });
  const agent = el('input', { id: 'window-agent', placeholder: 'agent:ops-bot', required: true });
  const minutes = el('input', { id: 'window-minutes', type: 'number', min: 1, max: 60, value: 30, required: true });
  const reason = el('input', { id: 'window-reason', placeholder: 'INC-42: …', required: true, maxlength: 1000 });
  const go = el('button', { id: 'window-open', type: 'submit', class: 'deny' }, 'Ask to open a window');
  return el('form', { class: 'filters', id: 'window-form', onsubmit: async (ev) => {
    ev.preventDefault();
    go.disabled = true;
    showError('');
    try {
      const g = await api('POST', '/api/break-glass', {
        runners: runners.value.split(',').map((r) => r.trim()).filter(Boolean),
        agent: agent.value.trim(),
        ttl_secs: Number(minutes.value) * 60,
        reason: reason.value.trim(),
      });
      location.hash = `#/grants/${enc(g.grant_id)}`;
    } catch (e) {
      showError(e.message);
      go.disabled = false;
    }
  } }, el('h2', {}, 'Open a window'),
  el('p', { class: 'muted small' }, 'It runs nothing until two other people sign it on its page.'),
  el('label', {}, 'Runners', runners), el('label', {}, 'Agent', agent),
  el('label', {}, 'Minutes', minutes), el('label', {}, 'Reason', reason),
  el('div', { class: 'buttons' }, go));
}

// The header's count of break-glass windows owed a review (every state but reviewed).
function setUnreviewed(n) {
  const badgeEl = $('#unreviewed-count');
  if (!badgeEl) return;
  badgeEl.textContent = n ? String(n) : '';
  badgeEl.hidden = !n;
}

async function refreshUnreviewed() {
  try {
    const data = await api('GET', '/api/break-glass?unreviewed=true');
    setUnreviewed(((data && data.windows) || []).length);
  } catch {
    // The count is a hint; the page itself says what failed.
  }
}

// ------------------------------------------------------------------ passkeys

function b64u(buffer) {
  const bytes = new Uint8Array(buffer);
  let bin = '';
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

function fromB64u(text) {
  const b64 = String(text).replace(/-/g, '+').replace(/_/g, '/');
  const bin = atob(b64 + '='.repeat((4 - (b64.length % 4)) % 4));
  return Uint8Array.from(bin, (c) => c.charCodeAt(0));
}

function webauthnAvailable() {
  return typeof window.PublicKeyCredential === 'function' && navigator.credentials;
}

// Asks the browser for an assertion over `challenge` (the SHA-256 of the statement's text,
// computed by the check in this browser) with one of the person's passkeys, user
// verification required: the signature the approve route carries.
async function passkeySignature(challenge) {
  if (!webauthnAvailable()) throw new Error('this browser offers no passkeys (WebAuthn)');
  const mine = await api('GET', '/api/passkeys');
  const keys = (mine && mine.passkeys) || [];
  if (!keys.length) throw new Error('you have no passkey yet: register one under Passkeys');
  if (!mine.webauthn) throw new Error('the server has no passkey relying party configured');
  let cred;
  try {
    cred = await navigator.credentials.get({ publicKey: {
      challenge,
      rpId: mine.webauthn.rp_id,
      userVerification: 'required',
      timeout: 120000,
      allowCredentials: keys.map((k) => ({ type: 'public-key', id: fromB64u(k.credential_id) })),
    } });
  } catch (e) {
    throw new Error(`the passkey did not sign (${e.name || 'error'}: ${e.message})`);
  }
  if (!cred) throw new Error('the passkey did not sign');
  const r = cred.response;
  return {
    kind: 'webauthn',
    signer: app.session.user,
    credential_id: b64u(cred.rawId),
    authenticator_data: b64u(r.authenticatorData),
    client_data_json: b64u(r.clientDataJSON),
    signature: b64u(r.signature),
  };
}

async function registerPasskey(name) {
  if (!webauthnAvailable()) throw new Error('this browser offers no passkeys (WebAuthn)');
  const { publicKey: o } = await api('POST', '/api/passkeys/register/start', {});
  let cred;
  try {
    cred = await navigator.credentials.create({ publicKey: {
      rp: o.rp,
      user: { id: fromB64u(o.user.id), name: o.user.name, displayName: o.user.displayName },
      challenge: fromB64u(o.challenge),
      pubKeyCredParams: o.pubKeyCredParams,
      timeout: o.timeout,
      excludeCredentials: (o.excludeCredentials || []).map((c) => ({ type: c.type, id: fromB64u(c.id) })),
      authenticatorSelection: o.authenticatorSelection,
      attestation: o.attestation,
    } });
  } catch (e) {
    throw new Error(`no passkey was created (${e.name || 'error'}: ${e.message})`);
  }
  if (!cred) throw new Error('no passkey was created');
  return api('POST', '/api/passkeys/register/finish', {
    name,
    credential_id: b64u(cred.rawId),
    attestation_object: b64u(cred.response.attestationObject),
    client_data_json: b64u(cred.response.clientDataJSON),
  });
}

async function viewPasskeys() {
  const data = await api('GET', '/api/passkeys');
  const keys = (data && data.passkeys) || [];
  const head = el('div', { class: 'view-head' }, el('h1', {}, 'Passkeys'));
  const intro = el('p', { class: 'muted' },
    'A passkey signs the exact statement of what an approval lets run; runners that require signed '
    + 'approvals check it against their own approvers file, which lists the keys below.');
  const rp = data && data.webauthn
    ? el('p', { class: 'small', id: 'relying-party' }, 'Relying party: ', el('span', { class: 'mono' }, data.webauthn.rp_id),
      ' · origins: ', el('span', { class: 'mono' }, (data.webauthn.origins || []).join(', ')))
    : el('p', { class: 'error', role: 'status' }, 'This server has no passkey relying party: set [webauthn] or public_url.');

  const name = el('input', { id: 'passkey-name', name: 'name', placeholder: 'laptop', maxlength: 64, required: true });
  const add = el('button', { id: 'passkey-register', type: 'submit' }, 'Register a passkey');
  const form = el('form', { class: 'filters', id: 'passkey-form', onsubmit: async (ev) => {
    ev.preventDefault();
    add.disabled = true;
    showError('');
    try {
      await registerPasskey(name.value.trim());
      render({ quiet: true });
    } catch (e) {
      showError(e.message);
      add.disabled = false;
    }
  } }, el('label', {}, 'Name', name), el('div', { class: 'buttons' }, add));

  const rows = keys.map((k) => el('tr', { class: 'passkey-row', 'data-passkey-id': k.id },
    el('td', {}, el('strong', {}, k.name)),
    el('td', {}, k.alg),
    el('td', {}, relTime(k.created_at)),
    el('td', {}, relTime(k.last_used_at)),
    el('td', {}, el('details', {}, el('summary', {}, 'approvers file entry'),
      pre(`{ id = "${k.credential_id}", alg = "${k.alg}", public_key = "${k.public_key}" }`))),
    el('td', {}, el('button', { type: 'button', class: 'secondary', onclick: async () => {
      showError('');
      try {
        await api('DELETE', `/api/passkeys/${enc(k.id)}`);
        render({ quiet: true });
      } catch (e) {
        showError(e.message);
      }
    } }, 'Remove'))));
  const table = keys.length
    ? el('table', { class: 'list', id: 'passkeys' },
      el('thead', {}, el('tr', {}, ['Name', 'Algorithm', 'Registered', 'Last used', 'Public key', '']
        .map((h) => el('th', {}, h)))),
      el('tbody', {}, rows))
    : el('p', { class: 'empty', id: 'no-passkeys' }, 'You have no passkey yet.');
  return el('section', {}, head, intro, rp, errorBox(''),
    webauthnAvailable() ? form : el('p', { class: 'error' }, 'This browser offers no passkeys (WebAuthn).'),
    table);
}

// ------------------------------------------------------------------ audit

function auditQuery(query, { keepCursor }) {
  const out = new URLSearchParams();
  for (const [name] of AUDIT_FILTERS) {
    const v = query.get(name);
    if (v) out.set(name, v);
  }
  if (keepCursor && query.get('cursor')) out.set('cursor', query.get('cursor'));
  return out;
}

async function viewAudit(query) {
  const inputs = AUDIT_FILTERS.map(([name, label, placeholder]) => {
    const input = el('input', { name, id: `f-${name}`, placeholder: placeholder || null,
      inputmode: name === 'limit' ? 'numeric' : null });
    input.value = query.get(name) || '';
    return el('label', {}, label, input);
  });
  const form = el('form', { class: 'filters', id: 'audit-filters', onsubmit: (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [name] of AUDIT_FILTERS) {
      const v = form.elements[name].value.trim();
      if (v) q.set(name, v);
    }
    const s = q.toString();
    const next = s ? `#/audit?${s}` : '#/audit';
    if (location.hash === next) render(); else location.hash = next;
  } },
  inputs,
  el('div', { class: 'buttons' },
    el('button', { type: 'submit' }, 'Search'),
    el('a', { class: 'button secondary', href: '#/audit' }, 'Clear')));

  const filters = auditQuery(query, { keepCursor: false });
  const exportQs = new URLSearchParams(filters);
  exportQs.delete('limit');
  const exportLink = el('a', {
    id: 'export', class: 'button secondary', href: `/api/audit/export${exportQs.toString() ? `?${exportQs}` : ''}`,
    download: 'audit.ndjson',
  }, 'Export NDJSON');
  const head = el('div', { class: 'view-head' }, el('h1', {}, 'Audit log'), exportLink);

  let data;
  let checkpoint;
  let activity;
  try {
    const qs = auditQuery(query, { keepCursor: true }).toString();
    [data, checkpoint, activity] = await Promise.all([
      api('GET', `/api/audit${qs ? `?${qs}` : ''}`),
      checkpointPanel(),
      activityPanel(),
    ]);
  } catch (e) {
    if (e.status === 401) throw e;
    return el('section', {}, head, form, errorBox(e.message));
  }
  const events = (data && data.events) || [];
  const table = el('table', { class: 'list audit', id: 'audit' },
    el('thead', {}, el('tr', {}, ['Seq', 'At', 'Actor', 'Kind', 'Tool', 'Runner', 'Outcome', 'Reason']
      .map((h) => el('th', {}, h)))));
  const body = el('tbody');
  for (const ev of events) {
    const detail = el('tr', { class: 'event-detail', hidden: true },
      el('td', { colspan: 8 }, auditDetail(ev)));
    const row = el('tr', { class: 'event-row', 'data-seq': ev.seq, onclick: () => {
      detail.hidden = !detail.hidden;
      row.classList.toggle('open', !detail.hidden);
    } },
    el('td', {}, ev.seq),
    el('td', {}, relTime(ev.at)),
    el('td', {}, ev.actor ?? ''),
    el('td', {}, ev.kind ?? ''),
    el('td', {}, ev.tool ?? ''),
    el('td', {}, ev.runner ?? ''),
    el('td', {}, ev.outcome != null ? badge('outcome', ev.outcome) : ''),
    el('td', { class: 'reason-cell', title: ev.reason || '' }, ev.reason ?? ''));
    body.append(row, detail);
  }
  table.append(body);

  const pager = el('p', { class: 'pager' });
  if (query.get('cursor')) {
    const first = filters.toString();
    pager.append(el('a', { href: first ? `#/audit?${first}` : '#/audit' }, '« first page'), ' ');
  }
  if (data && data.next_cursor != null) {
    const next = new URLSearchParams(filters);
    next.set('cursor', String(data.next_cursor));
    pager.append(el('a', { id: 'next-page', href: `#/audit?${next}` }, 'next page »'));
  }
  return el('section', {}, head, activity, checkpoint, form, errorBox(''),
    events.length ? table : el('p', { class: 'empty' }, 'No events match.'), pager);
}

// ------------------------------------------------------------------ audit activity chart

// The windows the chart offers: [buckets, bucket_seconds] for GET /api/audit/activity.
const ACTIVITY_RANGES = {
  hour: { buckets: 60, seconds: 60, label: 'Last hour', per: 'minute' },
  day: { buckets: 96, seconds: 900, label: 'Last day', per: '15 minutes' },
};
// Each series its own small chart: [field of a bucket, title].
const ACTIVITY_SERIES = [
  ['events', 'All events'],
  ['calls', 'Calls'],
  ['refusals', 'Refusals'],
  ['approvals', 'Approvals'],
];
const SVG_NS = 'http://www.w3.org/2000/svg';
const CHART = { width: 720, height: 56 };

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function clockText(iso) {
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toISOString().slice(11, 16);
}

// One series as bars: a bar per bucket with events in it, its height to scale with the
// fullest bucket of the window; each bar says its time and count on hover.
function seriesChart(activity, field, title) {
  const counts = activity.buckets.map((b) => b[field] || 0);
  const max = Math.max(0, ...counts);
  const total = counts.reduce((a, b) => a + b, 0);
  const slot = CHART.width / Math.max(1, counts.length);
  const chart = svg('svg', {
    class: `activity-chart series-${field}`, 'data-series': field, 'data-total': total, 'data-max': max,
    viewBox: `0 0 ${CHART.width} ${CHART.height}`, preserveAspectRatio: 'none',
    role: 'img', 'aria-label': `${title}: ${total} in the window`,
  }, svg('line', { class: 'axis', x1: 0, y1: CHART.height - 0.5, x2: CHART.width, y2: CHART.height - 0.5 }));
  counts.forEach((count, i) => {
    if (!count) return;
    const h = Math.max(1, (count / max) * (CHART.height - 2));
    const start = activity.buckets[i].start;
    chart.append(svg('rect', {
      class: `bar bar-${field}`, 'data-bucket': i, 'data-count': count,
      x: (i * slot + slot * 0.1).toFixed(2), width: (slot * 0.8).toFixed(2),
      y: (CHART.height - 1 - h).toFixed(2), height: h.toFixed(2),
    }, svg('title', {}, `${clockText(start)} UTC: ${count} ${title.toLowerCase()}`)));
  });
  return el('div', { class: 'activity-row' },
    el('div', { class: 'activity-label' }, el('span', { class: `swatch swatch-${field}` }), title,
      el('strong', { class: 'activity-total', 'data-series': field }, total),
      el('span', { class: 'muted small' }, max ? ` max ${max}` : '')),
    chart);
}

// The panel above the audit table: the window's events, calls, refusals and approvals per
// bucket, as counted by the store (one request), with a choice of the last hour or day.
async function activityPanel() {
  const range = ACTIVITY_RANGES[app.activityRange] ? app.activityRange : 'hour';
  const { buckets, seconds, label, per } = ACTIVITY_RANGES[range];
  const box = el('div', { class: 'activity', id: 'activity', 'data-range': range });
  const choose = (name) => el('button', {
    type: 'button', id: `activity-${name}`, class: name === range ? '' : 'secondary',
    'aria-pressed': String(name === range),
    onclick: async () => {
      app.activityRange = name;
      box.replaceWith(await activityPanel());
    },
  }, ACTIVITY_RANGES[name].label);
  const head = el('div', { class: 'view-head' },
    el('h2', {}, 'Activity ', el('span', { class: 'muted small' }, `${label.toLowerCase()}, per ${per}`)),
    el('span', { class: 'buttons' }, Object.keys(ACTIVITY_RANGES).map(choose)));
  let activity;
  try {
    activity = await api('GET', `/api/audit/activity?buckets=${buckets}&bucket_seconds=${seconds}`);
  } catch (e) {
    if (e.status === 401) throw e;
    box.append(head, el('p', { class: 'muted' }, `Activity: ${e.message}`));
    return box;
  }
  box.append(head,
    ...ACTIVITY_SERIES.map(([field, title]) => seriesChart(activity, field, title)),
    el('p', { class: 'muted small activity-axis' },
      el('span', {}, `${clockText(activity.start)} UTC`), el('span', {}, `${clockText(activity.end)} UTC`)));
  return box;
}

// The newest checkpoint of the log (a C2SP signed note: origin, tree size, root hash, then the
// log key's signature and the witnesses' cosignatures), parsed for people and offered as the
// file an auditor keeps for `emisar audit verify --checkpoint`. The signatures are not checked
// here: the page is served by the server the checkpoint vouches for (docs/auditor-guide.md).
async function checkpointPanel() {
  const box = (...children) => el('div', { class: 'checkpoint', id: 'checkpoint' }, ...children);
  let res;
  try {
    res = await fetch('/api/audit/checkpoint', { credentials: 'same-origin', cache: 'no-store' });
  } catch (e) {
    return box(el('p', { class: 'muted' }, `Checkpoint: cannot reach the server (${e.message}).`));
  }
  if (res.status === 401) throw new ApiError(401, 'signed out');
  if (res.status === 404) {
    return box(el('p', { class: 'muted', id: 'checkpoint-none' },
      'No signed checkpoint yet. With [transparency] in emisar.toml the server signs one every ',
      'second or so and witnesses cosign it (docs/operator-guide.md, "Witnesses"); without it the ',
      'log is a hash chain only.'));
  }
  const text = await res.text();
  if (!res.ok) {
    let message = `HTTP ${res.status}`;
    try { message = JSON.parse(text).error || message; } catch { /* not JSON */ }
    return box(el('p', { class: 'muted' }, `Checkpoint: ${message}`));
  }
  const split = text.indexOf('\n\n');
  const [origin = '', size = '', root = ''] = text.slice(0, split).split('\n');
  const signers = text.slice(split + 2).split('\n')
    .filter((l) => l.startsWith('\u2014 '))
    .map((l) => l.slice(2).split(' ')[0]);
  const witnesses = signers.filter((name) => name !== origin);
  return box(
    el('div', { class: 'view-head' }, el('h2', {}, 'Newest checkpoint'),
      el('a', { id: 'checkpoint-download', class: 'button secondary', href: '/api/audit/checkpoint',
        download: 'checkpoint.txt' }, 'Download checkpoint')),
    el('dl', { class: 'fields' },
      field('Log', el('span', { id: 'checkpoint-origin' }, origin)),
      field('Events', el('span', { id: 'checkpoint-size' }, size)),
      field('Root hash', el('span', { id: 'checkpoint-root', class: 'mono' }, root)),
      field('Cosigned by', el('span', { id: 'checkpoint-witnesses' },
        witnesses.length ? witnesses.join(', ') : 'no witness yet'))));
}

function auditDetail(ev) {
  return el('dl', { class: 'fields' }, AUDIT_FIELDS.map((name) => {
    const v = ev[name];
    let value;
    if (v == null) value = el('span', { class: 'muted' }, 'null');
    else if (typeof v === 'object') value = pre(v);
    else if (name === 'approval_id') value = el('a', { href: `#/approvals/${enc(v)}` }, v);
    else value = el('span', { class: name.endsWith('hash') || name === 'result_digest' ? 'mono' : null }, String(v));
    return field(name, value);
  }));
}

// ------------------------------------------------------------------ runners

// A runner's state at a glance, from the fields GET /api/runners gives (worst first): its
// breaker open (calls refused), its last probe or heartbeat failed (down), its breaker
// half-open (one trial call let through: degraded), never probed nor called (never seen),
// else up.
const RUNNER_STATES = [
  ['breaker-open', 'breaker open'],
  ['down', 'down'],
  ['degraded', 'degraded'],
  ['never-seen', 'never seen'],
  ['up', 'up'],
];

function runnerState(r) {
  if (r.breaker === 'open') return 'breaker-open';
  if (r.heartbeat_ok === false) return 'down';
  if (r.breaker === 'half-open') return 'degraded';
  if (r.heartbeat_ok == null && r.last_call == null) return 'never-seen';
  return 'up';
}

const stateLabel = (state) => (RUNNER_STATES.find(([s]) => s === state) || [state, state])[1];

// What the Runners page remembers across its quiet 15 s refreshes.
app.runners = { view: 'grid', filter: '', group: '', sort: 'name', selected: null, redraw: () => {} };

function labelText(r) {
  return Object.entries(r.labels || {}).map(([k, v]) => `${k}=${v}`).join(' ');
}

// The text the filter box searches: name, labels, state and URL.
function runnerHaystack(r) {
  return `${r.name} ${labelText(r)} ${stateLabel(runnerState(r))} ${r.url ?? ''}`.toLowerCase();
}

// The runners the filter box's words all match (every runner when it is empty).
function filterRunners(runners, filter) {
  const words = filter.toLowerCase().split(/\s+/).filter(Boolean);
  if (!words.length) return runners;
  return runners.filter((r) => {
    const hay = runnerHaystack(r);
    return words.every((w) => hay.includes(w));
  });
}

// One collator for every comparison: `localeCompare` builds one per call, most of the
// sorting time with 1,000 runners.
const byName = new Intl.Collator().compare;

function sortRunners(runners, sort) {
  const rank = new Map(runners.map((r) => [r, RUNNER_STATES.findIndex(([s]) => s === runnerState(r))]));
  return [...runners].sort((a, b) =>
    (sort === 'state' ? rank.get(a) - rank.get(b) : 0) || byName(a.name, b.name));
}

// [group title, runners] in title order; one group of all when no label is chosen.
function groupRunners(runners, key) {
  if (!key) return [['', runners]];
  const groups = new Map();
  for (const r of runners) {
    const value = (r.labels || {})[key];
    const title = value == null ? `no ${key}` : `${key}=${value}`;
    if (!groups.has(title)) groups.set(title, []);
    groups.get(title).push(r);
  }
  return [...groups.entries()].sort(([a], [b]) => a.localeCompare(b));
}

function runnerCounts(runners) {
  const counts = Object.fromEntries(RUNNER_STATES.map(([s]) => [s, 0]));
  for (const r of runners) counts[runnerState(r)] += 1;
  return el('ul', { class: 'runner-counts', id: 'runner-counts' },
    el('li', { 'data-state': 'all' }, el('strong', { class: 'n' }, runners.length), ' runners'),
    RUNNER_STATES.map(([state, label]) => el('li', { class: 'count', 'data-state': state },
      el('span', { class: `swatch tile-${state}` }), ' ', el('strong', { class: 'n' }, counts[state]), ` ${label}`)));
}

function runnerTile(r) {
  const state = runnerState(r);
  const labels = labelText(r);
  return el('button', {
    type: 'button', class: `tile tile-${state}${app.runners.selected === r.name ? ' selected' : ''}`,
    'data-runner': r.name, 'data-state': state,
    title: `${r.name} — ${stateLabel(state)}${labels ? ` — ${labels}` : ''}`,
    onclick: () => {
      app.runners.selected = app.runners.selected === r.name ? null : r.name;
      app.runners.redraw();
    },
  });
}

function runnerGrid(runners) {
  const groups = groupRunners(runners, app.runners.group);
  return el('div', { class: 'runner-grid', id: 'runner-grid' }, groups.map(([title, members]) =>
    el('div', { class: 'tile-group', 'data-group': title },
      title ? el('h3', {}, title, el('span', { class: 'muted small' }, ` ${members.length}`)) : '',
      el('div', { class: 'tiles' }, members.map(runnerTile)))));
}

// Everything the table says of one runner, for the tile that was clicked.
function runnerDetail(r) {
  const state = runnerState(r);
  return el('div', { class: 'runner-detail', id: 'runner-detail', 'data-runner': r.name },
    el('div', { class: 'view-head' }, el('h2', {}, r.name),
      el('button', { type: 'button', class: 'secondary', id: 'runner-detail-close', onclick: () => {
        app.runners.selected = null;
        app.runners.redraw();
      } }, 'Close')),
    el('dl', { class: 'fields' },
      field('State', el('span', { class: `badge tile-${state}`, id: 'runner-detail-state' }, stateLabel(state))),
      field('URL', r.url ?? '—'),
      field('Origin', r.origin ?? '—'),
      field('Labels', labelText(r) || '—'),
      field('Packs', r.packs == null ? 'all' : r.packs.join(', ')),
      field('Breaker', badge('breaker', r.breaker),
        r.breaker_open_since ? el('span', { class: 'small' }, ' since ', relTime(r.breaker_open_since)) : ''),
      field('Last heartbeat', relTime(r.last_heartbeat),
        r.heartbeat_ok === false ? el('span', { class: 'small bad' }, ' failed') : ''),
      field('Last call', relTime(r.last_call)),
      r.last_error != null ? field('Last error', el('span', { class: 'mono' }, r.last_error)) : ''));
}

function runnerTable(runners) {
  const rows = runners.map((r) => el('tr', { class: 'runner-row', 'data-runner': r.name, 'data-state': runnerState(r) },
    el('td', {}, el('strong', {}, r.name), el('div', { class: 'muted small' }, r.url ?? '')),
    el('td', {}, el('span', { class: `badge tile-${runnerState(r)}` }, stateLabel(runnerState(r)))),
    el('td', {}, Object.entries(r.labels || {}).map(([k, v]) => el('span', { class: 'chip' }, `${k}=${v}`))),
    el('td', {}, r.packs == null ? el('span', { class: 'muted' }, 'all') : r.packs.join(', ')),
    el('td', {}, badge('breaker', r.breaker),
      r.breaker_open_since ? el('div', { class: 'small' }, 'since ', relTime(r.breaker_open_since)) : ''),
    el('td', {}, relTime(r.last_heartbeat),
      r.heartbeat_ok === false ? el('div', { class: 'small bad' }, 'heartbeat failed') : ''),
    el('td', {}, relTime(r.last_call)),
    el('td', { class: 'reason-cell', title: r.last_error || '' }, r.last_error ?? '')));
  return el('table', { class: 'list', id: 'runners' },
    el('thead', {}, el('tr', {}, ['Runner', 'State', 'Labels', 'Packs', 'Breaker', 'Last heartbeat', 'Last call',
      'Last error'].map((h) => el('th', {}, h)))),
    el('tbody', {}, rows));
}

// The controls: filter box, group by label, sort, and grid or table. Changing one re-renders
// from the runners already read (no request).
function runnerControls(runners, redraw) {
  const keys = [...new Set(runners.flatMap((r) => Object.keys(r.labels || {})))].sort();
  const filter = el('input', { id: 'runner-filter', type: 'search', placeholder: 'filter: name, label=value, state',
    'aria-label': 'Filter runners', oninput: () => { app.runners.filter = filter.value; redraw(); } });
  filter.value = app.runners.filter;
  const select = (id, label, options, key) => {
    const node = el('select', { id, onchange: () => { app.runners[key] = node.value; redraw(); } },
      options.map(([value, text]) => el('option', { value }, text)));
    node.value = app.runners[key];
    return el('label', {}, label, node);
  };
  const viewButton = (view, text) => el('button', {
    type: 'button', id: `runner-view-${view}`, class: app.runners.view === view ? '' : 'secondary',
    'aria-pressed': String(app.runners.view === view),
    onclick: () => { app.runners.view = view; redraw(); },
  }, text);
  return el('div', { class: 'runner-controls' }, filter,
    select('runner-group', 'Group by', [['', 'nothing'], ...keys.map((k) => [k, k])], 'group'),
    select('runner-sort', 'Sort by', [['name', 'name'], ['state', 'state']], 'sort'),
    el('span', { class: 'buttons' }, viewButton('grid', 'Grid'), viewButton('table', 'Table')));
}

// The Runners page's data asked for beside the session when the page is opened on it, so the
// two requests overlap instead of one waiting for the other. A plain fetch: a refusal (no
// session yet) is not the sign-out `api` makes of a 401; the page then asks again.
let runnersEarly = null;

function fetchRunnersEarly() {
  runnersEarly = fetch('/api/runners', { headers: { Accept: 'application/json' }, credentials: 'same-origin', cache: 'no-store' })
    .then((res) => (res.ok ? res.json() : null))
    .catch(() => null);
}

async function runnersData() {
  const early = runnersEarly;
  runnersEarly = null;
  return (early && await early) || api('GET', '/api/runners');
}

async function viewRunners() {
  const data = await runnersData();
  const runners = (data && data.runners) || [];
  const head = el('div', { class: 'view-head' }, el('h1', {}, 'Runners'));
  if (!runners.length) return el('section', {}, head, el('p', { class: 'empty' }, 'No runners configured.'));
  // A label no runner has any more groups nothing.
  if (!runners.some((r) => app.runners.group in (r.labels || {}))) app.runners.group = '';
  const body = el('div', { id: 'runner-body' });
  const redraw = () => {
    const shown = sortRunners(filterRunners(runners, app.runners.filter), app.runners.sort);
    const selected = runners.find((r) => r.name === app.runners.selected);
    body.replaceChildren(
      runnerCounts(shown),
      selected ? runnerDetail(selected) : '',
      shown.length ? (app.runners.view === 'table' ? runnerTable(shown) : runnerGrid(shown))
        : el('p', { class: 'empty' }, 'No runner matches the filter.'));
    for (const b of document.querySelectorAll('#runner-view-grid, #runner-view-table')) {
      const on = b.id === `runner-view-${app.runners.view}`;
      b.className = on ? '' : 'secondary';
      b.setAttribute('aria-pressed', String(on));
    }
  };
  app.runners.redraw = redraw;
  const section = el('section', {}, head, runnerControls(runners, redraw), body);
  redraw();
  return section;
}

// ------------------------------------------------------------------ boot

async function boot() {
  $('#logout').addEventListener('click', async () => {
    try { await api('POST', '/api/logout', {}); } catch { /* logged out either way */ }
    loggedOut();
    app.afterLogin = null;
  });
  window.addEventListener('hashchange', () => render());
  setInterval(() => {
    tickTimes();
    if (app.session && parseHash().page === 'runners') render({ quiet: true });
  }, 15000);
  if (parseHash().page === 'runners') fetchRunnersEarly();
  try {
    loggedIn(await api('GET', '/api/session'));
  } catch {
    app.session = null;
  }
  render();
}

boot();
