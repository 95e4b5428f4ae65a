"""Definitions shared by ``tests/unit/tools/test_data_tool.py`` and its integration part."""
import vissl  # noqa: F401  (registers the plugin)
from multicrop_helpers import load_data_tool


tool = load_data_tool()
