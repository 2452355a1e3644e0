"""A stand-in for `sglang serve` / `vllm serve`: a tiny HTTP server, for launcher lifecycle tests.

It accepts the engine's argv (it reads --host / --port and ignores the rest), logs its argv, answers /health with
503 until STANDIN_READY_AFTER seconds have passed and 200 after, and on SIGTERM / SIGINT logs which signal it got
and exits with STANDIN_EXIT_CODE (default 0). STANDIN_CRASH_AFTER makes it exit 3 on its own after that many seconds.
"""

import http.server
import os
import signal
import sys
import threading
import time

args = sys.argv[1:]
host = args[args.index("--host") + 1] if "--host" in args else "127.0.0.1"
port = int(args[args.index("--port") + 1]) if "--port" in args else 8000
ready_at = time.monotonic() + float(os.environ.get("STANDIN_READY_AFTER", "0.5"))
print("standin argv:", " ".join(args), flush=True)
print("SGLANG_ENABLE_SPEC_V2=" + os.environ.get("SGLANG_ENABLE_SPEC_V2", ""), flush=True)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/health" and time.monotonic() >= ready_at
        self.send_response(200 if ok else 503)
        self.end_headers()
        self.wfile.write(b"ok" if ok else b"loading")

    def log_message(self, *a):
        pass


server = http.server.ThreadingHTTPServer((host, port), Handler)


def on_signal(signum, _frame):
    print(f"standin got {signal.Signals(signum).name}", flush=True)
    threading.Thread(target=server.shutdown).start()


signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
if "STANDIN_CRASH_AFTER" in os.environ:

    def crash():
        time.sleep(float(os.environ["STANDIN_CRASH_AFTER"]))
        print("standin crashing", flush=True)
        os._exit(3)

    threading.Thread(target=crash, daemon=True).start()
print(f"standin listening on {host}:{port}", flush=True)
server.serve_forever()
print("standin exiting", flush=True)
sys.exit(int(os.environ.get("STANDIN_EXIT_CODE", "0")))
