"""Shared by the test scripts: where a script writes what it timed itself."""
import json
import os


def save(timing: dict) -> None:
    path = os.environ.get("SELF_TIMING")
    if path:
        with open(path, "w") as f:
            json.dump(timing, f)
