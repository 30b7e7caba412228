"""An API server over HTTPS, in-process, for the publishing tests: a self-signed certificate made
by ``openssl req -x509`` at test time, a service account directory (token, ca.crt), and a store of
NodeResourceTopology objects by name that records every request it is sent.

Knobs: ``conflicts`` (that many PUTs answered 409 first), ``get_delay_s`` (every GET waits),
``get_answer`` (every GET answered with this status, document and headers instead).
"""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TOKEN = "t0ken-of-the-numa-pin-account"
PREFIX = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"


def make_cert(directory: Path, name: str = "server") -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (IP SAN) and its key: (cert, key)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def account_dir(directory: Path, ca: Path) -> Path:
    """A service account directory: the token and ``ca`` as ca.crt."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(TOKEN + "\n")
    (directory / "ca.crt").write_bytes(ca.read_bytes())
    return directory


class Request:
    def __init__(self, method: str, path: str, auth: str | None, body: Any) -> None:
        self.method, self.path, self.auth, self.body = method, path, auth, body

    def __repr__(self) -> str:
        return f"{self.method} {self.path}"


class FakeApiServer:
    def __init__(self, cert: Path, key: Path) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[Request] = []
        self.conflicts = 0
        self.get_delay_s = 0.0
        self.get_answer: tuple[int, Any, dict[str, str]] | None = None
        self._version = 100
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda request, address: None  # type: ignore[method-assign]  # clients that hang up
        self.httpd.api = self  # type: ignore[attr-defined]
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def env(self) -> dict[str, str]:
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.port)}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def methods(self) -> list[str]:
        return [r.method for r in self.requests]

    def answer(self, method: str, path: str, auth: str | None, body: Any) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(Request(method, path, auth, body))
        if auth != f"Bearer {TOKEN}":
            return 401, {"kind": "Status", "message": "Unauthorized"}
        if method == "GET" and self.get_delay_s:
            time.sleep(self.get_delay_s)
        with self._lock:
            if path == PREFIX and method == "POST":
                name = body["metadata"]["name"]
                if name in self.objects:
                    return 409, {"kind": "Status", "message": "AlreadyExists"}
                return 201, self._store(name, body)
            if not path.startswith(PREFIX + "/"):
                return 404, {"kind": "Status", "message": "no such path"}
            name = path[len(PREFIX) + 1:]
            current = self.objects.get(name)
            if method == "GET":
                return (200, current) if current is not None else (404, {"kind": "Status", "message": "NotFound"})
            if method == "PUT":
                if current is None:
                    return 404, {"kind": "Status", "message": "NotFound"}
                if self.conflicts > 0:
                    self.conflicts -= 1
                    self._version += 1  # someone else wrote in between
                    current["metadata"]["resourceVersion"] = str(self._version)
                    return 409, {"kind": "Status", "message": "Conflict"}
                if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                    return 409, {"kind": "Status", "message": "Conflict: stale resourceVersion"}
                return 200, self._store(name, body)
            if method == "DELETE":
                self.objects.pop(name, None)
                return 200, {"kind": "Status"}
        return 405, {"kind": "Status", "message": "MethodNotAllowed"}

    def _store(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        stored = json.loads(json.dumps(body))
        stored["metadata"]["resourceVersion"] = str(self._version)
        self.objects[name] = stored
        return stored


class _Handler(BaseHTTPRequestHandler):
    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        api: FakeApiServer = self.server.api  # type: ignore[attr-defined]
        headers: dict[str, str] = {}
        if self.command == "GET" and api.get_answer is not None:
            api.requests.append(Request("GET", self.path, self.headers.get("Authorization"), None))
            status, doc, headers = api.get_answer
        else:
            status, doc = api.answer(self.command, self.path, self.headers.get("Authorization"), body)
        data = json.dumps(doc).encode()
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the base class's name)
        pass
