"""YAML files as plain containers: a file, VISSL's ``defaults.yaml``, the leaves of a block."""
import functools
import os


def load_yaml(path):
    """A YAML file as plain containers (libyaml's loader where available)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path) as f:
        return yaml.load(f, Loader=loader)


@functools.lru_cache(maxsize=1)
def vissl_defaults() -> dict:
    """VISSL's ``vissl/config/defaults.yaml``, its ``config`` block, as plain containers."""
    import vissl

    return load_yaml(os.path.join(os.path.dirname(os.path.abspath(vissl.__file__)), "config", "defaults.yaml"))["config"]


def leaves(block, prefix=""):
    """``{dotted key: value}`` of the leaves of a nested mapping (lists are leaves)."""
    out = {}
    for k, v in (block or {}).items():
        if hasattr(v, "items"):
            out.update(leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, (list, tuple)) else v
    return out
