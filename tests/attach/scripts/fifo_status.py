"""A hostile script (issue 45): makes the run folder's files things that block or never end (its status
file a FIFO, its steps a FIFO, its meta a link to /dev/zero, its trace named /dev/zero), then exits."""
import os
import sys
import time

run_dir = os.environ["TORCHSCOPE_ATTACH_DIR"]
proc = os.path.join(run_dir, "proc-4242")
os.makedirs(proc, exist_ok=True)
os.mkfifo(os.path.join(proc, "status.json"))
os.mkfifo(os.path.join(proc, "steps.jsonl"))
os.symlink("/dev/zero", os.path.join(proc, "meta.json"))
os.symlink("/dev/zero", os.path.join(run_dir, "window.json"))
os.mkfifo(os.path.join(run_dir, "trace.json.gz"))
os.mkfifo(os.path.join(proc, "x\x1b[2J\x1b]0;owned\x07"))  # a name that would drive the terminal
print("planted", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)  # the tool polls the status file meanwhile
