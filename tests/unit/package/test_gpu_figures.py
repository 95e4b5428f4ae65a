"""The GPU figures of docs/gpu.md and the README equal the measured record they come from,
docs/experiments/gpu/gpu_check_h200_2026-11-26.json (what ``benchmarks/gpu_check.py`` wrote on
the lent H200): every number is formatted here from the JSON and looked up in the text."""
import json

import pytest

from testkit import REPO

RECORD = REPO / "docs" / "experiments" / "gpu" / "gpu_check_h200_2026-11-26.json"


@pytest.fixture(scope="module")
def record():
    return json.loads(RECORD.read_text())


def test_the_record_is_a_gpu_run_of_the_named_machine(record):
    m = record["machine"]
    assert record["dry_run"] is False and m["card"] == "NVIDIA H200"
    gpu_md = (REPO / "docs" / "gpu.md").read_text()
    for text in (m["card"], m["driver"], f"CUDA {m['cuda']}", m["torch"], f"Python {m['python']}",
                 m["date"].split()[0]):
        assert text in gpu_md, text
    readme = (REPO / "README.md").read_text()
    assert "one NVIDIA H200, torch 2.11, " + m["date"].split()[0] in readme


def test_sinkhorn_figures(record):
    s = record["results"]["sinkhorn"]
    gpu_md = (REPO / "docs" / "gpu.md").read_text()
    f32, f16 = s["fp32"], s["fp16_autocast"]
    assert (s["B"], s["K"]) == (4096, 3000)
    assert f"ours {f32['ours_ms']:.3f} ms (fp32) and {f16['ours_ms']:.3f} ms (fp16 autocast)" in gpu_md
    assert f"VISSL's {f32['vissl_ms']:.3f} / {f16['vissl_ms']:.3f} ms" in gpu_md
    assert (f"{f32['ratio_vissl_over_ours']:.2f}x / {f16['ratio_vissl_over_ours']:.2f}x faster"
            in gpu_md)
    assert f16["ours_max_abs_diff_to_fp32"] == 0 and "(max difference 0)" in gpu_md
    assert f"up to {f16['vissl_max_abs_diff_to_fp32']:.1e}".replace("e-04", "e-4") in gpu_md
    readme = (REPO / "README.md").read_text()
    assert f"Sinkhorn (4096 x 3000) {f32['ours_ms']:.2f} ms, {f32['ratio_vissl_over_ours']:.1f}x VISSL's" in readme


def test_train_step_and_pretrain_figures(record):
    t, p = record["results"]["train_step"], record["results"]["pretrain"]
    gpu_md = (REPO / "docs" / "gpu.md").read_text()
    assert (t["trunk"], t["crops"], t["batch"], t["amp"]) == ("resnet50", "2x224,6x96", 64, "float16")
    assert (f"{t['ours_ms']:.1f} vs {t['vissl_ms']:.1f} ms/step ({t['ours_images_per_s']:.0f} images/s): "
            f"ratio {t['ratio_ours_over_vissl']:.3f}") in gpu_md
    assert (f"peak memory {t['memory']['ours']['peak_mb']:.0f} vs {t['memory']['vissl']['peak_mb']:.0f} MB"
            in gpu_md)
    assert f"first losses {t['first_loss']['ours']:.5f} vs {t['first_loss']['vissl']:.5f}" in gpu_md
    readme = (REPO / "README.md").read_text()
    assert f"({t['ours_ms']:.1f} vs {t['vissl_ms']:.1f} ms)" in readme
    assert p["loss_finite"] and p["loss_falling"] and not p["nonfinite_guard_fired"]
    assert p["iterations"] == 200 and p["config"] == "pretrain/swav/swav_1gpu_resnet"
    assert f"loss {p['loss_first']:.3f} -> {p['loss_last']:.3f}" in gpu_md
    assert (f"(mean of the first fifth {p['loss_mean_first_fifth']:.3f}, of the last "
            f"{p['loss_mean_last_fifth']:.3f})") in gpu_md
    assert f"{p['images_per_s']:.0f} images/s through VISSL's loader" in gpu_md
