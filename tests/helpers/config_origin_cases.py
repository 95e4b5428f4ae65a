"""Definitions shared by ``tests/unit/config/test_config_origin.py`` and its integration part."""
import vissl  # noqa: F401  (registers the plugin)


NAME = "pretrain/swav/swav_8node_resnet"

def user_config(root, name=NAME, body="  SEED_VALUE: 4242\n"):
    path = root / "configs" / "config" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# @package _global_\nconfig:\n" + body)
    return path
