"""Requests to the server on this host never go through a proxy.

A shell or a cluster often exports HTTP_PROXY; ``requests`` would send even
127.0.0.1 through it. Here every proxy variable points at a port where nothing
listens, so a request that went through it would fail.
"""

import asyncio
import http.server
import json
import threading

import pytest
import requests
from test_client import FakeServer, read_log, run_against, write_workload

from serving_study.measure.chat_requests import load_requests
from serving_study.measure.server_queries import read_server_info, wait_until_healthy

BOGUS_PROXY = "http://127.0.0.1:9"  # discard: nothing listens there
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


@pytest.fixture
def bogus_proxy(monkeypatch):
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, BOGUS_PROXY)
        monkeypatch.setenv(name.lower(), BOGUS_PROXY)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


class ServerInfo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the name http.server calls)
        body = json.dumps({"pid": 1234}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *arguments):
        pass


@pytest.fixture
def local_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ServerInfo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_proxy_is_really_in_force(bogus_proxy, local_server):
    with pytest.raises(requests.exceptions.ProxyError):
        requests.get(f"{local_server}/server_info", timeout=10)


def test_health_and_server_info_bypass_the_proxy(bogus_proxy, local_server):
    wait_until_healthy(local_server, timeout_s=10)
    assert read_server_info(local_server) == {"pid": 1234}


def test_the_load_bypasses_the_proxy(bogus_proxy, tmp_path):
    chat_requests = load_requests(write_workload(tmp_path))
    out_path = tmp_path / "requests.jsonl"
    asyncio.run(
        run_against(
            FakeServer(),
            chat_requests,
            out_path,
            concurrency=2,
            measured_requests=4,
            warmup_requests=0,
        )
    )
    records = read_log(out_path)
    assert [record["status"] for record in records] == [200] * 4
