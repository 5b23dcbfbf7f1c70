"""A minimal reward judge served over HTTP, for `entropyrl train reward.url=http://127.0.0.1:8000/`.

    python examples/judge_server.py 8000          # then, in another shell:
    entropyrl train data=toy reward.url=http://127.0.0.1:8000/ trainer.total_steps=5

It receives ``{"prompts": [...], "responses": [...], "group": [...], <problem fields>...}`` and
answers ``{"rewards": [...]}``: here 1.0 when the response equals the reference answer.
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Judge(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        batch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        rewards = [float(r.strip() == str(a)) for r, a in zip(batch["responses"], batch["answer"])]
        body = json.dumps({"rewards": rewards}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    ThreadingHTTPServer(("127.0.0.1", port), Judge).serve_forever()
