"""Definitions shared by ``tests/unit/tools/test_console_scripts.py`` and its integration part."""
import re
from testkit import REPO


SCRIPTS = re.findall(r'"(swav-plugin-[\w-]+) = ', (REPO / "setup.py").read_text())
