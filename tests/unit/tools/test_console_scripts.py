"""The wheel installs the plugin's console scripts: built with ``pip wheel --no-deps``,
installed with ``--no-deps`` into a fresh virtualenv that sees this environment's
site-packages (torch, VISSL) through a ``.pth``, each ``swav-plugin-*`` answers ``--help``."""


from console_scripts_cases import SCRIPTS  # noqa: F401


def test_expected_scripts_listed():
    assert {"swav-plugin-demo", "swav-plugin-train", "swav-plugin-prepare-data", "swav-plugin-mean-std",
            "swav-plugin-to-detectron2", "swav-plugin-knn", "swav-plugin-export",
            "swav-plugin-import"} <= set(SCRIPTS)
