"""A stand-in framework child that fails on purpose, selected by AMP_COMPARE_TEST_MODE."""

import os
import sys
import time

mode = os.environ.get("AMP_COMPARE_TEST_MODE", "crash")
print("@@amp-compare {\"kind\": \"step\", \"epoch\": 0, \"epochs\": 1, \"step\": 1, \"steps\": 2}", flush=True)
if mode == "crash":
    print("Traceback: something broke inside the framework", file=sys.stderr)
    raise SystemExit(3)
if mode == "hang":
    time.sleep(600)
if mode == "kill":
    os.kill(os.getpid(), 9)
