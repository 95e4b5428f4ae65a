"""Packaging for vissl-swav-plugin.

Only the ``vissl_swav_plugin`` package (with its ``compat`` subpackage) is shipped (VISSL
already owns the top-level ``configs``/``tools``/``tests``/``hydra_plugins`` names).  The repository's ``configs/``
tree travels inside the package as data (``vissl_swav_plugin/_configs``), and a
``vissl_swav_plugin.pth`` start-up file is installed next to the package so that every
Python process -- VISSL's stock launcher and the workers it spawns included -- registers
our components as soon as it imports ``vissl`` (see ``vissl_swav_plugin/_autoload.py``).
"""
import os
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PTH = "vissl_swav_plugin.pth"
# Command-line tools (the code is in vissl_swav_plugin.tools / .demo; tools/*.py in a
# checkout are thin entry points to the same functions).
CONSOLE_SCRIPTS = [
    "swav-plugin-demo = vissl_swav_plugin.demo.cli:main",
    "swav-plugin-train = vissl_swav_plugin.tools.launch:main",
    "swav-plugin-prepare-data = vissl_swav_plugin.tools.prepare_data:main",
    "swav-plugin-mean-std = vissl_swav_plugin.tools.mean_std:main",
    "swav-plugin-to-detectron2 = vissl_swav_plugin.tools.to_detectron2:main",
    "swav-plugin-knn = vissl_swav_plugin.tools.knn_eval:main",
    "swav-plugin-label-subsets = vissl_swav_plugin.tools.label_subsets:main",
    "swav-plugin-eval = vissl_swav_plugin.tools.feature_eval:main",
    "swav-plugin-export = vissl_swav_plugin.tools.weights:export_main",
    "swav-plugin-import = vissl_swav_plugin.tools.weights:import_main",
]


class BuildPyWithPth(build_py):
    """Copy the start-up .pth file and the configs tree into the build."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # editable installs: see get_outputs / the Makefile
        shutil.copy(os.path.join(HERE, PTH), os.path.join(self.build_lib, PTH))
        dst = os.path.join(self.build_lib, "vissl_swav_plugin", "_configs")
        if os.path.exists(dst):
            shutil.rmtree(dst)
        shutil.copytree(os.path.join(HERE, "configs"), dst)

    def get_outputs(self, include_bytecode=True):
        outs = super().get_outputs(include_bytecode)
        if not getattr(self, "editable_mode", False):
            outs.append(os.path.join(self.build_lib, PTH))
        return outs


setup(
    name="vissl-swav-plugin",
    version="0.1.0",
    description="SwAV, DeepCluster-v2 and SeLa-v2 as a plugin for VISSL",
    license="MIT",
    license_files=["LICENSE", "NOTICE"],
    classifiers=[
        "License :: OSI Approved :: MIT License",
        "Programming Language :: Python :: 3",
        "Operating System :: POSIX :: Linux",
    ],
    packages=find_packages(include=["vissl_swav_plugin", "vissl_swav_plugin.*"]),
    entry_points={"console_scripts": CONSOLE_SCRIPTS},
    python_requires=">=3.9",
    # Real requirements are installed by tools/install_env.sh (VISSL 0.1.6's own pins cannot
    # install on Python 3.11, so VISSL goes in with --no-deps).  setuptools: VISSL imports
    # pkg_resources, shipped by setuptools up to 80.x; torch 2.14 requires >=77.0.3.
    install_requires=["setuptools>=77.0.3,<81"],
    cmdclass={"build_py": BuildPyWithPth},
    zip_safe=False,
)
