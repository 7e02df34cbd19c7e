#!/usr/bin/env python3
"""Drive an MCP server over Streamable HTTP with the official Python SDK (`mcp` 2.3.0).

An example client, and an independent, non-rmcp client for the Rust integration tests.
The Debian package installs it as /usr/share/doc/emisar/examples/mcp_python_client.py; run it
with the SDK in a virtual environment:

    python3 -m venv mcp-venv
    mcp-venv/bin/pip install mcp==2.3.0
    mcp-venv/bin/python /usr/share/doc/emisar/examples/mcp_python_client.py \
        --url https://emisar.example.internal/mcp --token TOKEN --tool traefik.ping --args '{}'

(A server certificate from a private CA: SSL_CERT_FILE=/path/ca.crt in its environment.)
In a source checkout (scripts/install-test-deps makes .tools/venv):

    .tools/venv/bin/python tests/mcp_python_client.py \
        --url http://127.0.0.1:PORT/mcp --token TOKEN --tool traefik.ping --args '{}'

It connects with `Authorization: Bearer TOKEN`, lists the tools (all pages), calls
TOOL with the JSON object ARGS and prints ONE line of JSON to stdout:

    {"tools": [...], "is_error": bool, "structured_content": {...} | null, "text": [...]}

Exit codes: 0 when the call completed (even with is_error true: the caller decides),
2 when TOOL is not listed or the arguments are not a JSON object, 1 on any connection
or protocol failure. Errors go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


class UsageError(Exception):
    """A failure that is the caller's fault (exit 2), not the server's."""


# The SDK turns a non-2xx HTTP answer into a generic JSON-RPC error and drops the
# status; remember the HTTP errors seen so the stderr message can name them (e.g. 401).
HTTP_ERRORS: list[str] = []


async def _record_http_error(response: httpx2.Response) -> None:
    if response.status_code >= 400:
        HTTP_ERRORS.append(f"HTTP {response.status_code} for {response.request.method} {response.request.url}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="MCP endpoint, e.g. http://127.0.0.1:8765/mcp")
    p.add_argument("--token", required=True, help="bearer token sent as the Authorization header")
    p.add_argument("--tool", required=True, help="tool to call; must appear in tools/list")
    p.add_argument("--args", default="{}", help="tool arguments as a JSON object (default {})")
    p.add_argument("--timeout", type=float, default=300.0, help="HTTP read timeout in seconds (default 300)")
    return p.parse_args(argv)


def _dump(value: Any) -> Any:
    """Make SDK/pydantic values JSON-serialisable."""
    if value is None:
        return None
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return value


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    try:
        arguments = json.loads(opts.args)
    except json.JSONDecodeError as e:
        raise UsageError(f"--args is not valid JSON: {e}") from e
    if not isinstance(arguments, dict):
        raise UsageError("--args must be a JSON object")

    headers = {"Authorization": f"Bearer {opts.token}"}
    timeout = httpx2.Timeout(30.0, read=opts.timeout)
    hooks = {"response": [_record_http_error]}
    async with httpx2.AsyncClient(headers=headers, timeout=timeout, event_hooks=hooks) as http:
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
    return {
        "tools": names,
        "is_error": bool(result.is_error),
        "structured_content": _dump(result.structured_content),
        "text": text,
    }


def _describe(exc: BaseException) -> str:
    """Flatten exception groups (anyio task groups wrap transport errors) into one message."""
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
    opts = parse_args(argv)
    try:
        out = asyncio.run(run(opts))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - report every failure on stderr with an exit code
        usage = _find_usage_error(exc)
        if usage is not None:
            print(f"mcp_python_client: {usage}", file=sys.stderr)
            return 2
        if isinstance(exc, SystemExit):
            raise
        seen = f" ({'; '.join(dict.fromkeys(HTTP_ERRORS))})" if HTTP_ERRORS else ""
        print(f"mcp_python_client: {opts.url}: {_describe(exc)}{seen}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(out, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
