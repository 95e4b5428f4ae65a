"""tools/prepare_fashion_mnist.py: IDX -> VISSL disk_folder / disk_filelist + catalog,
loaded back through VISSL's own datasets and compared with the IDX source.
(a training that reads its catalog: tests/integration/transforms/test_multicrop_integration.py's SimCLR run.)"""
import json

import numpy as np

import vissl  # noqa: F401  (registers the plugin)
from multicrop_helpers import make_fake_fashion
from data_tool_cases import tool  # noqa: F401


def test_rerun_is_up_to_date_and_new_limit_replaces(tmp_path):
    make_fake_fashion(tmp_path / "src", n_train=40, n_val=20)
    out = tmp_path / "out"
    kw = dict(source=tmp_path / "src", splits=["train"], verbose=False)
    s1 = tool.prepare(out, limit_per_class=3, **kw)
    mtime = (out / "filelist" / "train_images.npy").stat().st_mtime_ns
    s2 = tool.prepare(out, limit_per_class=3, **kw)
    assert s1["splits"] == s2["splits"]
    assert (out / "filelist" / "train_images.npy").stat().st_mtime_ns == mtime
    tool.prepare(out, limit_per_class=1, **kw)
    assert len(list((out / "train").rglob("*.png"))) == 10  # no stale files left
    assert len(np.load(out / "filelist" / "train_images.npy")) == 10
    # --size / --rgb
    tool.prepare(out, limit_per_class=1, size=32, rgb=True, **kw)
    from PIL import Image

    im = Image.open(next((out / "train").rglob("*.png")))
    assert im.size == (32, 32) and im.mode == "RGB"
    # catalog merge keeps other entries
    cat = tmp_path / "cat.json"
    cat.write_text(json.dumps({"other": {"train": ["/x", "/y"], "val": []}}))
    tool.prepare(out, limit_per_class=1, size=32, rgb=True, catalog=cat, name="fm", **kw)
    merged = json.loads(cat.read_text())
    assert set(merged) == {"other", "fm_folder", "fm_filelist"} and merged["fm_folder"]["val"] == []
