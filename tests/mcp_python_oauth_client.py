#!/usr/bin/env python3
"""Drive MCP's OAuth authorization with the official Python SDK (`mcp` 2.3.0,
`mcp.client.auth`), against a real authorization server (the test's oidc-provider).

Two grants:

  --grant client_credentials   a headless agent: ClientCredentialsOAuthProvider with a
                               pre-registered client id and secret (no browser)
  --grant authorization_code   an agent in a person's client: OAuthClientProvider with a
                               pre-registered client (or --register for dynamic client
                               registration); the person's login at the provider is automated
                               (--username/--password POSTed to the provider's login form),
                               standing in for the browser the SDK would open

Two modes:

  connect (default)  connect to --url (an MCP endpoint that speaks OAuth): the SDK gets the
                     401, reads the protected-resource metadata, discovers the authorization
                     server, obtains a token with the resource indicator, lists the tools and
                     calls --tool with --args. Prints ONE line of JSON like
                     tests/mcp_python_client.py, plus "token_claims".
  --probe            no MCP server is contacted. The SDK's auth flow runs for one request to
                     --url, and the two answers that would come from the MCP server are the
                     ones given here: --challenge (the WWW-Authenticate value of its 401) and
                     --resource-metadata (its RFC 9728 document, JSON). Everything else
                     (authorization server discovery, registration, login, token request) goes
                     to the real authorization server. Prints ONE line of JSON: every request
                     the SDK made, the scope and resource it asked for, the access token and
                     its (unverified) claims.

Exit codes: 0 on success, 2 on a usage error, 1 on any flow, connection or protocol failure
(message on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
from typing import Any
from urllib.parse import parse_qs, urljoin, urlparse

import httpx2
from mcp import Client
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken


class UsageError(Exception):
    """A failure that is the caller's fault (exit 2)."""


class MemoryStorage:
    """TokenStorage in memory: one run, one token. A pre-registered client starts stored."""

    def __init__(self, client_info: OAuthClientInformationFull | None) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info = client_info

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


class AutomatedLogin:
    """The person at the provider, scripted: follows the authorization URL's redirects with a
    cookie jar, fills in the provider's login form, and follows on until the provider
    redirects to our redirect URI, whose query (code, state, iss) the SDK then gets."""

    def __init__(self, redirect_uri: str, username: str, password: str) -> None:
        self.redirect_uri = redirect_uri
        self.username = username
        self.password = password
        self.result: AuthorizationCodeResult | None = None

    async def redirect_handler(self, authorization_url: str) -> None:
        async with httpx2.AsyncClient(follow_redirects=False, timeout=30.0) as browser:
            url = authorization_url
            for _ in range(20):  # bounded: a real login is a handful of hops
                if url.startswith(self.redirect_uri):
                    query = parse_qs(urlparse(url).query)
                    if "error" in query:
                        raise RuntimeError(f"authorization refused: {query}")
                    self.result = AuthorizationCodeResult(
                        code=query["code"][0],
                        state=query.get("state", [None])[0],
                        iss=query.get("iss", [None])[0],
                    )
                    return
                resp = await browser.get(url)
                if resp.status_code in (302, 303):
                    url = urljoin(url, resp.headers["location"])
                    continue
                if resp.status_code == 200 and 'name="password"' in resp.text:
                    form_action = urljoin(url, f"{urlparse(url).path}/login")
                    resp = await browser.post(
                        form_action, data={"login": self.username, "password": self.password}
                    )
                    if resp.status_code not in (302, 303):
                        raise RuntimeError(f"login at {form_action} answered HTTP {resp.status_code}")
                    url = urljoin(form_action, resp.headers["location"])
                    continue
                raise RuntimeError(f"unexpected HTTP {resp.status_code} at {url}: {resp.text[:300]}")
            raise RuntimeError("the provider never redirected back to the redirect URI")

    async def callback_handler(self) -> AuthorizationCodeResult:
        if self.result is None:
            raise RuntimeError("the login produced no authorization code")
        return self.result


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="the MCP endpoint, e.g. http://127.0.0.1:7700/mcp")
    p.add_argument("--grant", choices=["client_credentials", "authorization_code"], required=True)
    p.add_argument("--issuer", required=True, help="the authorization server's issuer URL")
    p.add_argument("--client-id", help="a pre-registered client id")
    p.add_argument("--client-secret", help="its secret (absent: a public client)")
    p.add_argument(
        "--auth-method",
        default="client_secret_basic",
        choices=["client_secret_basic", "client_secret_post", "none"],
    )
    p.add_argument("--register", action="store_true", help="dynamic client registration instead of --client-id")
    p.add_argument("--redirect-uri", default="http://127.0.0.1:33418/callback")
    p.add_argument("--username", help="authorization_code: the person who logs in at the provider")
    p.add_argument("--password", help="authorization_code: their password")
    p.add_argument("--scope", help="scope to ask for (default: what the metadata says)")
    p.add_argument("--tool", help="connect: the tool to call")
    p.add_argument("--args", default="{}", help="connect: tool arguments, a JSON object")
    p.add_argument("--probe", action="store_true", help="run the auth flow without an MCP server (see above)")
    p.add_argument("--challenge", help="probe: the WWW-Authenticate value of the server's 401")
    p.add_argument("--resource-metadata", help="probe: the server's RFC 9728 document, JSON")
    p.add_argument("--timeout", type=float, default=300.0)
    opts = p.parse_args(argv)
    if opts.grant == "client_credentials" and not (opts.client_id and opts.client_secret):
        raise UsageError("--grant client_credentials needs --client-id and --client-secret")
    if opts.grant == "authorization_code":
        if not (opts.username and opts.password):
            raise UsageError("--grant authorization_code needs --username and --password")
        if not (opts.client_id or opts.register):
            raise UsageError("--grant authorization_code needs --client-id or --register")
    if opts.probe and not (opts.challenge and opts.resource_metadata):
        raise UsageError("--probe needs --challenge and --resource-metadata")
    if not opts.probe and not opts.tool:
        raise UsageError("connect mode needs --tool")
    return opts


def make_auth(opts: argparse.Namespace) -> tuple[httpx2.Auth, MemoryStorage]:
    if opts.grant == "client_credentials":
        storage = MemoryStorage(None)
        auth = ClientCredentialsOAuthProvider(
            server_url=opts.url,
            storage=storage,
            client_id=opts.client_id,
            client_secret=opts.client_secret,
            token_endpoint_auth_method=opts.auth_method,
            scope=opts.scope,
            issuer=opts.issuer,
        )
        return auth, storage
    login = AutomatedLogin(opts.redirect_uri, opts.username, opts.password)
    client_info = None
    if not opts.register:
        client_info = OAuthClientInformationFull(
            client_id=opts.client_id,
            client_secret=opts.client_secret,
            redirect_uris=[opts.redirect_uri],
            token_endpoint_auth_method=opts.auth_method,
            grant_types=["authorization_code"],
        )
    storage = MemoryStorage(client_info)
    metadata = OAuthClientMetadata(
        client_name="emisar test agent",
        redirect_uris=[opts.redirect_uri],
        grant_types=["authorization_code"],
        response_types=["code"],
        scope=opts.scope,
    )
    auth = OAuthClientProvider(
        server_url=opts.url,
        client_metadata=metadata,
        storage=storage,
        redirect_handler=login.redirect_handler,
        callback_handler=login.callback_handler,
    )
    return auth, storage


def jwt_claims(token: str) -> Any:
    """The payload of a JWT, NOT verified: for the report only (the server verifies)."""
    try:
        payload = token.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return None


async def probe(opts: argparse.Namespace) -> dict[str, Any]:
    try:
        document = json.loads(opts.resource_metadata)
    except json.JSONDecodeError as e:
        raise UsageError(f"--resource-metadata is not JSON: {e}") from e
    auth, storage = make_auth(opts)
    original = httpx2.Request("POST", opts.url, headers={"mcp-protocol-version": "2025-11-25"})
    seen: list[dict[str, Any]] = []
    authorization: str | None = None
    prm_url = None
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=opts.timeout)) as http:
        flow = auth.async_auth_flow(original)
        outgoing = await flow.__anext__()
        first = True
        while True:
            if outgoing is original:
                if not first:
                    # The retry with the token: record it and let the flow finish normally.
                    authorization = outgoing.headers.get("authorization")
                    seen.append({"to": "mcp server", "method": "POST", "url": str(outgoing.url), "authorized": True})
                    response = httpx2.Response(200, json={}, request=outgoing)
                    try:
                        outgoing = await flow.asend(response)
                    except StopAsyncIteration:
                        break
                    raise RuntimeError(f"the SDK sent another request after the token: {outgoing.url}")
                first = False
                seen.append({"to": "mcp server", "method": "POST", "url": str(outgoing.url), "status": 401})
                response = httpx2.Response(401, headers={"WWW-Authenticate": opts.challenge}, request=outgoing)
            elif urlparse(str(outgoing.url)).netloc == urlparse(opts.url).netloc:
                # The MCP server's own metadata document, as it will serve it.
                prm_url = str(outgoing.url)
                seen.append({"to": "mcp server", "method": outgoing.method, "url": prm_url, "status": 200})
                response = httpx2.Response(200, json=document, request=outgoing)
            else:
                response = await http.send(outgoing)
                await response.aread()
                entry: dict[str, Any] = {
                    "to": "authorization server",
                    "method": outgoing.method,
                    "url": str(outgoing.url),
                    "status": response.status_code,
                }
                if outgoing.method == "POST":
                    form = parse_qs(outgoing.content.decode())
                    entry["form"] = {k: v[0] for k, v in form.items() if k not in ("client_secret", "code", "code_verifier")}
                seen.append(entry)
            try:
                outgoing = await flow.asend(response)
            except StopAsyncIteration:
                break
    if not authorization or not authorization.startswith("Bearer "):
        raise RuntimeError("the SDK never retried the request with a bearer token")
    token = authorization.removeprefix("Bearer ")
    client_info = storage.client_info
    return {
        "requests": seen,
        "resource_metadata_url": prm_url,
        "registered_client_id": client_info.client_id if (opts.register and client_info) else None,
        "access_token": token,
        "token_claims": jwt_claims(token),
        "token_scope": storage.tokens.scope if storage.tokens else None,
    }


async def connect(opts: argparse.Namespace) -> dict[str, Any]:
    try:
        arguments = json.loads(opts.args)
    except json.JSONDecodeError as e:
        raise UsageError(f"--args is not valid JSON: {e}") from e
    if not isinstance(arguments, dict):
        raise UsageError("--args must be a JSON object")
    auth, storage = make_auth(opts)
    timeout = httpx2.Timeout(30.0, read=opts.timeout)
    async with httpx2.AsyncClient(auth=auth, timeout=timeout) as http:
        async with Client(streamable_http_client(opts.url, http_client=http)) as client:
            names: list[str] = []
            cursor: str | None = None
            for _ in range(1000):  # bounded pagination
                page = await client.list_tools(cursor=cursor)
                names.extend(t.name for t in page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
            if opts.tool not in names:
                raise UsageError(f"tool {opts.tool!r} is not listed by the server; listed: {names}")
            result = await client.call_tool(opts.tool, arguments)
    text = [block.text for block in result.content if getattr(block, "type", None) == "text"]
    structured = result.structured_content
    token = storage.tokens.access_token if storage.tokens else None
    return {
        "tools": names,
        "is_error": bool(result.is_error),
        "structured_content": structured.model_dump(mode="json") if hasattr(structured, "model_dump") else structured,
        "text": text,
        "token_claims": jwt_claims(token) if token else None,
    }


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    msg = str(exc)
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def _find_usage_error(exc: BaseException) -> UsageError | None:
    if isinstance(exc, UsageError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for e in exc.exceptions:
            found = _find_usage_error(e)
            if found is not None:
                return found
    return None


def main(argv: list[str]) -> int:
    try:
        opts = parse_args(argv)
        out = asyncio.run(probe(opts) if opts.probe else connect(opts))
    except KeyboardInterrupt:
        raise
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure is reported with an exit code
        usage = _find_usage_error(exc)
        if usage is not None:
            print(f"mcp_python_oauth_client: {usage}", file=sys.stderr)
            return 2
        print(f"mcp_python_oauth_client: {_describe(exc)}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(out, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
