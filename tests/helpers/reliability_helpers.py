"""Helpers of test_reliability.py and test_bad_inputs.py (a plain module: tests/ is no package)."""
import hashlib
import os
from pathlib import Path


def snapshot(folder):
    """name -> sha1 of every file (symlinks by target), to show nothing was lost."""
    out = {}
    for p in sorted(Path(folder).rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(folder))] = "->" + os.readlink(p)
        elif p.is_file():
            out[str(p.relative_to(folder))] = hashlib.sha1(p.read_bytes()).hexdigest()
    return out
