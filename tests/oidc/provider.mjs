// A real OpenID Connect provider (npm `oidc-provider`, a certified implementation) for the
// integration tests. The test that starts it gives it users, clients and resource servers as
// one JSON object on stdin; the script binds 127.0.0.1 on a free port, prints ONE line of JSON
// on stdout, `{"issuer": "http://127.0.0.1:PORT", "kids": [...]}`, and serves until it is
// killed. Everything else it says goes to stderr.
//
// What the test configures (every key optional except `users` and `clients`):
//
//   users:               [{ sub, username, password, claims: {...}, token_claims: {...} }]
//                        `claims` become ID token / userinfo claims (filtered by the granted
//                        scopes, see `claims`); `token_claims` are added to every access token
//                        issued for that person (e.g. the name the agent acts for).
//   clients:             oidc-provider client metadata, as is (client_id, client_secret,
//                        redirect_uris, grant_types, token_endpoint_auth_method, ...).
//   client_token_claims: { client_id: {...} } added to every access token that client gets
//                        (e.g. the agent name of a headless client-credentials agent).
//   resources:           { "<resource indicator>": { scope: "mcp:tools", ttl: 300 } }: the
//                        resource servers (RFC 8707) access tokens can be issued for; such
//                        tokens are JWTs (RFC 9068) with `aud` = the indicator. Any other
//                        `resource` is refused with invalid_target.
//   claims:              scope → claim names, merged over the defaults below.
//   extra_jwks:          private JWKs the test owns, published in the JWKS next to the
//                        provider's own RSA key. The provider never signs with them (its
//                        clients use RS256); the test signs adversarial tokens with them, so
//                        those tokens carry a trusted signature and fail on the check under
//                        test (issuer, audience, expiry, nonce) rather than on the key.
//   ttl:                 { IdToken: s, AccessToken: s, ClientCredentials: s, Session: s }.
//   registration:        true enables dynamic client registration (RFC 7591) at /reg.
//   port:                the loopback port to bind (default: a free one). A test that needs
//                        the issuer URL before the provider runs (to start emisar while the
//                        provider is still down) picks the port.
//
// People log in at /interaction/:uid with a plain HTML form (login + password), which a real
// browser fills in and which a test can also POST directly; consent is granted automatically
// (every client here is first-party). devInteractions is off: it accepts any name without a
// password, and the tests need wrong passwords and unknown people to be refused.
//
// Clients may register a `backchannel_logout_uri` (with `backchannel_logout_session_required`):
// when a person signs out at /session/end, the provider posts a logout token there
// (OpenID Connect Back-Channel Logout 1.0). The sign-out page is a plain form (`xsrf` hidden
// field, `#logout-yes` button) that a test can POST to /session/end/confirm.
//
// Test-only controls:
//   POST /__test/rotate-keys     puts a fresh RSA signing key in front of the old one (which
//                                stays published, as a real provider does during a rotation)
//                                and answers `{"kids": [...]}`. The provider object is rebuilt
//                                around the new key set; sessions, grants and codes live in
//                                oidc-provider's in-process memory store, which it shares.
//   POST /__test/set-claims      `{"sub": ..., "claims": {...}}` replaces a person's claims
//                                (e.g. their groups), as an administrator at a real provider
//                                would; the next tokens carry the new ones.
//   POST /__test/next-id-token   `{"set": {...}, "unset": [...], "sign_with": kid | null}`
//                                alters the ID token of the NEXT token response (one only): the
//                                claims are edited, then the token is either left with its
//                                original signature (sign_with null: a tampered token) or
//                                re-signed with one of `extra_jwks` (a token whose signature is
//                                trusted and whose edited claim is the one under test). This
//                                stands in for a token endpoint that answers with a bad token.

import { createPrivateKey, generateKeyPairSync, randomBytes, sign } from 'node:crypto';
import http from 'node:http';

import Provider from 'oidc-provider';

const MAX_BODY = 64 * 1024;

function fail(message) {
  process.stderr.write(`oidc provider: ${message}\n`);
  process.exit(2);
}

async function readAll(stream, limit) {
  const chunks = [];
  let size = 0;
  for await (const chunk of stream) {
    size += chunk.length;
    if (size > limit) throw new Error(`body larger than ${limit} bytes`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString('utf8');
}

function newRsaKey() {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const jwk = privateKey.export({ format: 'jwk' });
  return { ...jwk, kid: `rsa-${randomBytes(6).toString('hex')}`, alg: 'RS256', use: 'sig' };
}

function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

const config = JSON.parse(await readAll(process.stdin, 1024 * 1024) || '{}');
if (!Array.isArray(config.users)) fail('config.users must be an array');
if (!Array.isArray(config.clients)) fail('config.clients must be an array');
const users = new Map();
for (const u of config.users) {
  if (typeof u.sub !== 'string' || typeof u.username !== 'string' || typeof u.password !== 'string') {
    fail('each user needs string sub, username and password');
  }
  users.set(u.sub, u);
}
const byUsername = new Map(config.users.map((u) => [u.username, u]));
const resources = config.resources ?? {};
const clientTokenClaims = config.client_token_claims ?? {};
const cookieKeys = [randomBytes(32).toString('hex')];

let keys = [newRsaKey()];
const extraJwks = config.extra_jwks ?? [];

function publicKids() {
  return [...keys, ...extraJwks].map((k) => k.kid);
}

function buildProvider(issuer) {
  const provider = new Provider(issuer, {
    clients: config.clients,
    jwks: { keys: [...keys, ...extraJwks] },
    cookies: { keys: cookieKeys },
    claims: {
      openid: ['sub'],
      profile: ['preferred_username', 'name'],
      email: ['email', 'email_verified'],
      groups: ['groups'],
      ...(config.claims ?? {}),
    },
    // Resource scopes are listed too: dynamic registration (which the MCP SDKs use) refuses a
    // client whose `scope` metadata names a scope the server does not list.
    scopes: [
      'openid',
      'offline_access',
      ...new Set(Object.values(resources).flatMap((rs) => (rs.scope ?? 'mcp:tools').split(' '))),
    ],
    // Scope claims go into the ID token itself, as Keycloak, Okta and Dex put `groups` there;
    // the relying party under test reads roles from the ID token, not from userinfo.
    conformIdTokenClaims: false,
    // OAuth 2.1: every client, confidential or public, must use PKCE.
    pkce: { required: () => true },
    features: {
      backchannelLogout: { enabled: true },
      rpInitiatedLogout: { enabled: true, logoutSource },
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      introspection: { enabled: true },
      registration: { enabled: config.registration === true },
      resourceIndicators: {
        enabled: true,
        // Without a `resource` parameter no resource-bound token is issued.
        defaultResource: () => undefined,
        useGrantedResource: () => true,
        getResourceServerInfo(ctx, indicator) {
          const rs = resources[indicator];
          if (!rs) throw new Provider.errors.InvalidTarget(`unknown resource ${indicator}`);
          return {
            scope: rs.scope ?? 'mcp:tools',
            audience: indicator,
            accessTokenTTL: rs.ttl ?? 300,
            accessTokenFormat: 'jwt',
            jwt: { sign: { alg: 'RS256' } },
          };
        },
      },
    },
    // oidc-provider refuses outgoing requests (the back-channel logout) to loopback and other
    // special-use addresses, a guard against SSRF. Every relying party of this test provider
    // is on loopback, so its requests go out through the plain global fetch.
    fetch(url, options) {
      const { dispatcher, ...rest } = options;
      return globalThis.fetch(url, rest);
    },
    extraTokenClaims(ctx, token) {
      const extra = { ...(clientTokenClaims[token.clientId] ?? {}) };
      const user = token.accountId ? users.get(token.accountId) : undefined;
      return { ...extra, ...(user?.token_claims ?? {}) };
    },
    async findAccount(ctx, sub) {
      const user = users.get(sub);
      if (!user) return undefined;
      return { accountId: sub, claims: async () => ({ sub, ...(user.claims ?? {}) }) };
    },
    ttl: {
      AccessToken: (ctx, token) => token.resourceServer?.accessTokenTTL ?? 300,
      AuthorizationCode: 60,
      ClientCredentials: (ctx, token) => token.resourceServer?.accessTokenTTL ?? 300,
      Grant: 3600,
      IdToken: 3600,
      Interaction: 600,
      Session: 3600,
      ...(config.ttl ?? {}),
    },
    renderError(ctx, out) {
      ctx.type = 'html';
      ctx.body = `<!doctype html><title>error</title><h1>${escapeHtml(out.error)}</h1>`
        + `<p id="error">${escapeHtml(out.error_description ?? '')}</p>`;
    },
  });
  for (const event of ['server_error', 'grant.error', 'authorization.error', 'introspection.error']) {
    provider.on(event, (ctx, err) => {
      process.stderr.write(`oidc provider: ${event}: ${err?.message} ${err?.error_description ?? ''}\n`);
    });
  }
  return provider;
}

function loginPage(uid, details, error) {
  const hint = details.params.login_hint ?? '';
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in to the test provider</title></head>
<body>
<h1>Test provider</h1>
<p>Signing in to <span id="client">${escapeHtml(details.params.client_id)}</span></p>
${error ? `<p id="error" role="alert">${escapeHtml(error)}</p>` : ''}
<form method="post" action="/interaction/${escapeHtml(uid)}/login">
  <label>Username <input id="login" name="login" autocomplete="username" value="${escapeHtml(hint)}"></label>
  <label>Password <input id="password" name="password" type="password" autocomplete="current-password"></label>
  <button id="submit" type="submit">Sign in</button>
</form>
</body></html>`;
}

async function logoutSource(ctx, form) {
  ctx.body = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign out of the test provider</title></head>
<body>
<h1>Sign out?</h1>
${form}
<button id="logout-yes" type="submit" form="op.logoutForm" name="logout" value="yes">Sign out</button>
</body></html>`;
}

// The ID token edit asked for by /__test/next-id-token, applied to one token response.
let idTokenEdit = null;

function b64url(value) {
  return Buffer.from(JSON.stringify(value)).toString('base64url');
}

function editIdToken(token, edit) {
  const [header, payload, signature] = token.split('.');
  const claims = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8'));
  Object.assign(claims, edit.set ?? {});
  for (const name of edit.unset ?? []) delete claims[name];
  if (!edit.sign_with) return `${header}.${b64url(claims)}.${signature}`;
  const jwk = extraJwks.find((k) => k.kid === edit.sign_with);
  if (!jwk) throw new Error(`sign_with: no extra_jwks key has kid ${edit.sign_with}`);
  if (jwk.kty !== 'OKP' || jwk.crv !== 'Ed25519') throw new Error('sign_with: only Ed25519 test keys');
  const input = `${b64url({ alg: 'EdDSA', kid: jwk.kid, typ: 'JWT' })}.${b64url(claims)}`;
  const sig = sign(null, Buffer.from(input), createPrivateKey({ key: jwk, format: 'jwk' }));
  return `${input}.${sig.toString('base64url')}`;
}

// Rewrites the body of one token response (Koa ends it with the whole JSON text).
function alterTokenResponse(res, edit) {
  const end = res.end.bind(res);
  const chunks = [];
  res.write = (chunk) => {
    if (chunk) chunks.push(Buffer.from(chunk));
    return true;
  };
  res.end = (chunk, ...rest) => {
    if (chunk && typeof chunk !== 'function') chunks.push(Buffer.from(chunk));
    let body = Buffer.concat(chunks).toString('utf8');
    try {
      const json = JSON.parse(body);
      if (json.id_token) {
        json.id_token = editIdToken(json.id_token, edit);
        body = JSON.stringify(json);
      }
    } catch (err) {
      process.stderr.write(`oidc provider: next-id-token: ${err.stack ?? err}\n`);
    }
    if (!res.headersSent) res.setHeader('content-length', Buffer.byteLength(body));
    return end(body, ...rest.filter((r) => typeof r === 'function'));
  };
}

async function autoConsent(provider, req, res, details) {
  const { prompt: { details: missing }, params, session } = details;
  let grant = details.grantId ? await provider.Grant.find(details.grantId) : undefined;
  if (!grant) grant = new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
  if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
  if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
  for (const [indicator, scopes] of Object.entries(missing.missingResourceScopes ?? {})) {
    grant.addResourceScope(indicator, scopes.join(' '));
  }
  const grantId = await grant.save();
  await provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
}

async function interaction(provider, req, res, url) {
  const m = url.pathname.match(/^\/interaction\/([^/]+)(\/login)?$/);
  const details = await provider.interactionDetails(req, res);
  if (!m || details.uid !== m[1]) {
    res.writeHead(400, { 'content-type': 'text/plain' }).end('interaction does not match its cookie');
    return;
  }
  const uid = m[1];
  if (req.method === 'GET' && details.prompt.name === 'consent') {
    await autoConsent(provider, req, res, details);
    return;
  }
  if (req.method === 'GET' && details.prompt.name === 'login') {
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' }).end(loginPage(uid, details));
    return;
  }
  if (req.method === 'POST' && m[2] === '/login') {
    const form = new URLSearchParams(await readAll(req, MAX_BODY));
    const user = byUsername.get(form.get('login') ?? '');
    if (!user || user.password !== form.get('password')) {
      res.writeHead(401, { 'content-type': 'text/html; charset=utf-8' })
        .end(loginPage(uid, details, 'Unknown user or wrong password.'));
      return;
    }
    await provider.interactionFinished(
      req,
      res,
      { login: { accountId: user.sub } },
      { mergeWithLastSubmission: false },
    );
    return;
  }
  res.writeHead(405, { 'content-type': 'text/plain' }).end(`no ${req.method} for prompt ${details.prompt.name}`);
}

let provider;
let handle;
function install(issuer) {
  provider = buildProvider(issuer);
  handle = provider.callback();
}

const server = http.createServer(async (req, res) => {
  const url = new URL(req.url, 'http://placeholder');
  try {
    if (url.pathname === '/__test/rotate-keys' && req.method === 'POST') {
      keys = [newRsaKey(), ...keys];
      install(provider.issuer);
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ kids: publicKids() }));
      return;
    }
    if (url.pathname === '/__test/set-claims' && req.method === 'POST') {
      const { sub, claims } = JSON.parse(await readAll(req, MAX_BODY));
      const user = users.get(sub);
      if (!user) {
        res.writeHead(404, { 'content-type': 'text/plain' }).end(`no user ${sub}`);
        return;
      }
      user.claims = claims;
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      return;
    }
    if (url.pathname === '/__test/next-id-token' && req.method === 'POST') {
      idTokenEdit = JSON.parse(await readAll(req, MAX_BODY));
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      return;
    }
    if (url.pathname === '/token' && req.method === 'POST' && idTokenEdit) {
      const edit = idTokenEdit;
      idTokenEdit = null;
      alterTokenResponse(res, edit);
    }
    if (url.pathname.startsWith('/interaction/')) {
      await interaction(provider, req, res, url);
      return;
    }
    handle(req, res);
  } catch (err) {
    process.stderr.write(`oidc provider: ${req.method} ${url.pathname}: ${err.stack ?? err}\n`);
    if (!res.headersSent) res.writeHead(500, { 'content-type': 'text/plain' });
    res.end(String(err.message ?? err));
  }
});

server.listen(Number(config.port ?? 0), '127.0.0.1', () => {
  const { port } = server.address();
  install(`http://127.0.0.1:${port}`);
  process.stdout.write(`${JSON.stringify({ issuer: provider.issuer, kids: publicKids() })}\n`);
});

for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => server.close(() => process.exit(0)));
}
