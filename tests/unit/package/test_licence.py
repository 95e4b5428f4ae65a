"""The licence: LICENSE is the MIT text with the project's copyright line, setup.py declares it
(the metadata that ``pip show`` reads: ``License: MIT`` and the classifier), and NOTICE says what
comes from where."""
import ast

from testkit import REPO


def _setup_keywords():
    tree = ast.parse((REPO / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "setup")
    return {k.arg: k.value for k in call.keywords}


def test_licence_file_is_mit():
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the vissl-swav-plugin authors" in text
    assert "Permission is hereby granted, free of charge" in text and 'THE SOFTWARE IS PROVIDED "AS IS"' in text


def test_setup_declares_the_licence():
    kw = _setup_keywords()
    assert ast.literal_eval(kw["license"]) == "MIT"
    assert "License :: OSI Approved :: MIT License" in ast.literal_eval(kw["classifiers"])
    assert set(ast.literal_eval(kw["license_files"])) == {"LICENSE", "NOTICE"}


def test_notice_says_what_comes_from_where():
    text = " ".join((REPO / "NOTICE").read_text().split())
    for needle in ("VISSL (https://github.com/facebookresearch/vissl), MIT License",
                   "Classy Vision (https://github.com/facebookresearch/ClassyVision), MIT License",
                   "Attribution-NonCommercial 4.0 International (CC BY-NC 4.0)", "None of its code is copied",
                   "Unsupervised Learning of Visual Features by Contrasting Cluster Assignments", "arXiv:2006.09882"):
        assert needle in text, needle
    readme = (REPO / "README.md").read_text()
    assert "MIT ([LICENSE](LICENSE))" in readme and "[NOTICE](NOTICE)" in readme
