"""What the runner asks a server on this host over HTTP, never through a proxy.

Whether it is up: a fresh server's GET /health must answer 200 before anything
is sent to it. What it runs with: GET /server_info, recorded with the run and
checked against the arm.
"""

from __future__ import annotations

import subprocess
import time

import requests

from serving_study.measure.run_failure import ArmFailed


class ServerNeverHealthy(RuntimeError):
    """The server did not answer GET /health with 200 in time."""


class ServerInfoUnreadable(ArmFailed):
    """The server answered GET /server_info with an error or no JSON object."""


def local_session() -> requests.Session:
    """A session for this host's own servers: never through a proxy.

    ``requests`` sends even 127.0.0.1 through ``HTTP_PROXY`` unless ``NO_PROXY``
    says otherwise; the load itself (``http1``) opens its sockets directly.
    """
    session = requests.Session()
    session.trust_env = False
    return session


def wait_until_healthy(
    base_url: str,
    timeout_s: float,
    *,
    process: subprocess.Popen | None = None,
    poll_s: float = 0.05,
) -> float:
    """Poll GET /health until it answers 200; return the seconds it took.

    Raises ServerNeverHealthy when `timeout_s` passes or when `process` (a
    subprocess.Popen of the server) exits first; the caller adds the log tail.
    """
    url = base_url.rstrip("/") + "/health"
    started = time.monotonic()
    deadline = started + timeout_s
    last_answer = "no answer yet"
    with local_session() as session:
        while True:
            if process is not None and process.poll() is not None:
                raise ServerNeverHealthy(
                    f"The server process exited with code {process.returncode} "
                    f"before {url} answered 200 (last: {last_answer})."
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServerNeverHealthy(
                    f"{url} did not answer 200 within {timeout_s:g} s "
                    f"(last: {last_answer})."
                )
            try:
                response = session.get(url, timeout=max(0.1, min(5.0, remaining)))
                if response.status_code == 200:
                    return time.monotonic() - started
                last_answer = f"HTTP {response.status_code}"
            except requests.RequestException as error:
                last_answer = f"{type(error).__name__}"
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def read_server_info(base_url: str) -> dict:
    """The server's own account of its settings (GET /server_info).

    Without it the runner cannot check which server it measures, so an error
    answer ends the run, naming the status and the start of the body."""
    url = f"{base_url}/server_info"
    with local_session() as session, session.get(url, timeout=30) as response:
        body = response.text
        if response.status_code != 200:
            raise ServerInfoUnreadable(
                f"the server answered GET /server_info with HTTP "
                f"{response.status_code} ({body[:200].strip()!r}); the runner "
                "needs it to check which server it measures"
            )
        try:
            info = response.json()
        except ValueError:
            info = None
        if not isinstance(info, dict):
            raise ServerInfoUnreadable(
                "the server's GET /server_info answer is not a JSON object "
                f"({body[:200].strip()!r})"
            )
        return info
