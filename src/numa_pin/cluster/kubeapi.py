"""A small client of the Kubernetes API server, as a pod's service account (standard library only).

What numa-pin asks of the API server is one object per node (its ``NodeResourceTopology``):
get, create, replace. That needs no client library: :class:`ApiServer` speaks HTTPS with
:mod:`http.client` and :mod:`ssl`, and is bounded so the API server can never hold or flood the
caller:

* the account: the token and the CA bundle are files of the service account directory (a
  parameter: :data:`DEFAULT_SERVICEACCOUNT_DIR` is the kubelet's default mount); the token is
  read again for every request (kubelet rotates projected tokens); the address is
  ``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT`` of the environment given;
* TLS is verified against that CA, host name (or IP) included; nothing else is trusted;
* every request has a deadline (connect, send and the whole answer), answers larger than
  ``max_response`` bytes are refused, and a redirect is an error, never followed.

Errors are :class:`~numa_pin.errors.KubeApiError`; an HTTP status other than 2xx is an answer
(the caller decides what 404 or 409 means), not an error.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import time
from collections.abc import Mapping
from typing import Any

from numa_pin.base.boundedio import UnsafeInput, json_loads_bounded, read_regular_file
from numa_pin.errors import KubeApiError

DEFAULT_SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_FILE, CA_FILE = "token", "ca.crt"
HOST_ENV, PORT_ENV = "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"
DEFAULT_TIMEOUT_S = 10.0
#: the largest answer read: one NodeResourceTopology of a large node is tens of KiB
DEFAULT_MAX_RESPONSE = 4 << 20
#: a bound token is about 1 KiB; a CA bundle a few
TOKEN_LIMIT, CA_LIMIT = 64 << 10, 1 << 20
_CHUNK = 64 << 10


class Answer:
    """One answer: the HTTP status and the JSON document (None when the body was empty)."""

    __slots__ = ("status", "doc")

    def __init__(self, status: int, doc: Any) -> None:
        self.status = status
        self.doc = doc

    def __repr__(self) -> str:
        return f"Answer({self.status}, {self.doc!r})"


class ApiServer:
    """The API server at ``host:port``, authenticated by the token file, verified by the CA file."""

    def __init__(self, host: str, port: int, token_path: str, ca_path: str, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S, max_response: int = DEFAULT_MAX_RESPONSE) -> None:
        self.host, self.port = host, port
        self.token_path, self.ca_path = token_path, ca_path
        self.timeout_s, self.max_response = timeout_s, max_response
        self._context: ssl.SSLContext | None = None

    @classmethod
    def in_cluster(cls, env: Mapping[str, str], serviceaccount_dir: str = DEFAULT_SERVICEACCOUNT_DIR,
                   **kwargs: Any) -> ApiServer:
        """The API server a pod reaches with its service account. Raises KubeApiError when the
        environment does not name it or the account's files are missing (no token mounted)."""
        host, port = env.get(HOST_ENV), env.get(PORT_ENV) or "443"
        if not host:
            raise KubeApiError(f"{HOST_ENV} is not set: not running in a pod")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise KubeApiError(f"{PORT_ENV}={port!r} is not a port")
        token, ca = os.path.join(serviceaccount_dir, TOKEN_FILE), os.path.join(serviceaccount_dir, CA_FILE)
        for path in (token, ca):
            if not os.path.isfile(path):
                raise KubeApiError("missing: is the service account token mounted "
                                   "(automountServiceAccountToken)?", path=path)
        return cls(host.strip("[]"), int(port), token, ca, **kwargs)

    @property
    def base(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}"

    def context(self) -> ssl.SSLContext:
        """TLS verified against the account's CA only, host name included (made once)."""

        if self._context is None:
            try:
                pem = read_regular_file(self.ca_path, CA_LIMIT).decode("ascii")
                context = ssl.create_default_context(cadata=pem)
            except (OSError, UnsafeInput, UnicodeDecodeError, ssl.SSLError) as exc:
                raise KubeApiError(f"cannot load the CA: {exc}", path=self.ca_path) from exc
            self._context = context
        return self._context

    def token(self) -> str:
        try:
            token = read_regular_file(self.token_path, TOKEN_LIMIT).decode("ascii").strip()
        except (OSError, UnsafeInput, UnicodeDecodeError) as exc:
            raise KubeApiError(f"cannot read the token: {exc}", path=self.token_path) from exc
        if not token or any(c.isspace() for c in token):
            raise KubeApiError("the token is empty or not one word", path=self.token_path)
        return token

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Answer:
        """``method path`` with ``body`` as JSON; the answer, whatever its status, as long as it
        came within the deadline and the size limit. A 3xx is refused (never followed).

        Raises:
            KubeApiError: the account's files, the connection, TLS, the deadline, the size, a
                redirect, or an answer that is not JSON.
        """

        url = self.base + path
        deadline = time.monotonic() + self.timeout_s
        headers = {"Authorization": f"Bearer {self.token()}", "Accept": "application/json",
                   "User-Agent": "numa-pin"}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s, context=self.context())
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = self._read(response, deadline, url)
        except (OSError, http.client.HTTPException) as exc:  # ssl.SSLError and TimeoutError are OSErrors
            raise KubeApiError(f"{method}: {type(exc).__name__}: {exc}", path=url) from exc
        finally:
            conn.close()
        if 300 <= response.status < 400:
            raise KubeApiError(f"{method}: redirected ({response.status}) to "
                               f"{response.getheader('Location', '?')}; not followed", path=url,
                               status=response.status)
        try:
            doc = json_loads_bounded(raw) if raw.strip() else None
        except ValueError as exc:
            raise KubeApiError(f"{method}: answer {response.status} is not JSON: {exc}", path=url,
                               status=response.status) from exc
        return Answer(response.status, doc)

    def _read(self, response: http.client.HTTPResponse, deadline: float, url: str) -> bytes:
        """The body, in chunks, within the deadline and the size limit."""
        declared = response.getheader("Content-Length")
        if declared and declared.isdigit() and int(declared) > self.max_response:
            raise KubeApiError(f"answer of {declared} bytes exceeds {self.max_response}", path=url,
                               status=response.status)
        parts: list[bytes] = []
        size = 0
        while True:
            if time.monotonic() > deadline:
                raise KubeApiError(f"no whole answer within {self.timeout_s:g}s", path=url, status=response.status)
            chunk = response.read1(_CHUNK)
            if not chunk:
                return b"".join(parts)
            size += len(chunk)
            if size > self.max_response:
                raise KubeApiError(f"answer exceeds {self.max_response} bytes", path=url, status=response.status)
            parts.append(chunk)


__all__ = ["DEFAULT_SERVICEACCOUNT_DIR", "Answer", "ApiServer"]
