"""A small webhook receiver: verifies Standard Webhooks signatures and logs what arrives.

    python scripts/webhook_receiver.py [--port 0] [--secret-file PATH] [--log PATH] [--quiet]

Listens on 127.0.0.1 and prints ``listening on http://127.0.0.1:PORT`` first. The secret
(``whsec_…``) is read from ``--secret-file`` on every request, so it can be written after the
endpoint is registered (and rotated while the receiver runs). Each request is appended to
``--log`` as one JSON line: arrival time, ``webhook-id``, type, whether a signature verified, and
the body. Answers 204, or 401 when a secret is known and no signature matches. It is the
receiving side written from the specification alone: it imports nothing from Manta.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TOLERANCE_SECONDS = 5 * 60  # refuse replays of old messages, as the specification advises


def verify(secret: str, msg_id: str, timestamp: str, body: bytes, header: str) -> bool:
    """True if any ``v1,`` signature in ``header`` is the HMAC-SHA256 of ``id.timestamp.body``
    under the base64-decoded secret, and the timestamp is recent."""
    try:
        if abs(time.time() - int(timestamp)) > TOLERANCE_SECONDS:
            return False
        key = base64.b64decode(secret.removeprefix("whsec_"))
    except ValueError:
        return False
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    for entry in header.split():
        version, _, signature = entry.partition(",")
        if version == "v1" and hmac.compare_digest(signature, expected):
            return True
    return False


def make_handler(secret_file: Path | None, log_path: Path | None, quiet: bool):
    lock = threading.Lock()
    log = open(log_path, "a", buffering=1) if log_path else None  # noqa: SIM115

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver would

        def do_POST(self):
            received_at = time.time()
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            secret = ""
            if secret_file and secret_file.exists():
                secret = secret_file.read_text().strip()
            msg_id = self.headers.get("webhook-id", "")
            verified = bool(secret) and verify(
                secret,
                msg_id,
                self.headers.get("webhook-timestamp", ""),
                body,
                self.headers.get("webhook-signature", ""),
            )
            try:
                event_type = json.loads(body).get("type", "?")
            except ValueError:
                event_type = "?"
            status = 401 if secret and not verified else 204
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            entry = {
                "received_at": received_at,
                "id": msg_id,
                "type": event_type,
                "verified": verified,
                "signatures": len(self.headers.get("webhook-signature", "").split()),
                "body": body.decode("utf-8", errors="replace"),
            }
            with lock:
                if log:
                    log.write(json.dumps(entry) + "\n")
                if not quiet:
                    mark = "verified" if verified else "NOT VERIFIED"
                    print(f"  <- {event_type:<24} {msg_id}  signature {mark}", flush=True)

        def log_message(self, *args):
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--secret-file", type=Path)
    parser.add_argument("--log", type=Path)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    server = ThreadingHTTPServer(
        ("127.0.0.1", args.port), make_handler(args.secret_file, args.log, args.quiet)
    )
    server.daemon_threads = True
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
