"""docs/model_zoo.md: every config it names exists and trains what its row says (epochs, batch =
per GPU x GPUs x nodes, crops, trunk width), every checkpoint URL is the official download
location, and the import command's arguments parse with swav-plugin-import's own parser."""
import re

import yaml

import doc_commands as dc
from testkit import REPO

PAGE = REPO / "docs" / "model_zoo.md"
CONFIGS = REPO / "configs" / "config"
WIDTH = {"ResNet-50": 1, "RN50-w2": 2, "RN50-w4": 4, "RN50-w5": 5}


def rows():
    lines = [line for line in PAGE.read_text().splitlines() if line.startswith("| ") and "dl.fbaipublicfiles" in line]
    out = []
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        out.append(dict(zip(("method", "network", "epochs", "batch", "crops", "top1", "checkpoint", "config"), cells)))
    return out


def crops_of(cfg):
    t = cfg["DATA"]["TRAIN"]["TRANSFORMS"][0]
    return " + ".join(f"{n}x{s}" for n, s in zip(t["num_crops"], t["size_crops"]))


def test_the_table_has_every_official_checkpoint():
    files = [re.search(r"\[([\w.]+)\]", r["checkpoint"]).group(1) for r in rows()]
    assert len(files) == 15 and len(set(files)) == 15
    for r in rows():
        assert re.search(r"\]\(https://dl\.fbaipublicfiles\.com/deepcluster/([\w.]+\.pth\.tar)\)", r["checkpoint"])
        assert re.fullmatch(r"\d\d\.\d%", r["top1"])
    assert "not reproduced here" in PAGE.read_text()


def test_each_config_trains_its_row():
    checked = 0
    for r in rows():
        if r["config"] == "—":
            continue
        name = r["config"].strip("`")
        path = CONFIGS / f"{name}.yaml"
        assert path.is_file(), name
        cfg = yaml.safe_load(path.read_text())["config"]
        d = cfg["DISTRIBUTED"]
        assert int(r["epochs"]) == cfg["OPTIMIZER"]["num_epochs"], name
        assert int(r["batch"]) == cfg["DATA"]["TRAIN"]["BATCHSIZE_PER_REPLICA"] * d["NUM_PROC_PER_NODE"] * d["NUM_NODES"], name
        assert r["crops"] == crops_of(cfg), name
        assert WIDTH[r["network"]] == cfg["MODEL"]["TRUNK"].get("RESNETS", {}).get("WIDTH_MULTIPLIER", 1), name
        method = {"SwAV": "swav", "DeepCluster-v2": "deepcluster_v2", "SeLa-v2": "sela_v2"}[r["method"]]
        assert name.startswith(f"pretrain/{method}/"), name
        checked += 1
    assert checked == 13


def test_a_planted_wrong_row_is_caught(tmp_path, monkeypatch):
    text = PAGE.read_text().replace("| SwAV | ResNet-50 | 100 | 4096 |", "| SwAV | ResNet-50 | 100 | 256 |")
    fake = tmp_path / "model_zoo.md"
    fake.write_text(text)
    monkeypatch.setattr(__import__(__name__), "PAGE", fake)
    try:
        test_each_config_trains_its_row()
    except AssertionError:
        return
    raise AssertionError("a wrong batch was not caught")


def test_the_import_commands_parse():
    entry = dc.console_scripts()["swav-plugin-import"]
    cmds = re.findall(r"^swav-plugin-import (.+)$", PAGE.read_text(), re.M)
    assert len(cmds) >= 2
    for args in cmds:
        error, ns = dc.parse_with_tool(entry, args.split())
        assert error is None and ns.input.endswith(".pth.tar"), args
    assert dc.parse_with_tool(entry, ["--stict", "a.pth.tar", "b.torch"])[0]
    assert dc.parse_with_tool(entry, ["only_one.pth.tar"])[0]
