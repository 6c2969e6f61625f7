"""Starts a helper process and a double-forked daemon (re-parented away from it), prints the three
pids, then sleeps: only a stop or a kill ends it."""
import os
import subprocess
import sys
import time

helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
r, w = os.pipe()
if os.fork() == 0:  # double fork: the grandchild is nobody's child here
    os.setsid()
    if os.fork() == 0:
        os.write(w, f"{os.getpid()}\n".encode())
        time.sleep(300)
    os._exit(0)
daemon = int(os.read(r, 64).decode())
print("pids", os.getpid(), helper.pid, daemon, flush=True)
time.sleep(300)
