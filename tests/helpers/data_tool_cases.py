"""Definitions shared by ``tests/unit/tools/test_data_tool.py`` and its integration part."""
import vissl  # noqa: F401  (registers the plugin)
from testkit import load_script


tool = load_script("tools/prepare_fashion_mnist.py")
