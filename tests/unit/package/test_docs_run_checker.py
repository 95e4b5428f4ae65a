"""The documentation-command checker (tests/helpers/doc_commands.py) without any process: the
planted errors that need no composition (a bare console script before the activation step, a
wrong flag, a config name that does not exist, a skip marker without a reason, an undefined
placeholder).  The composition and launch checks are planted in
tests/integration/package/test_docs_run.py."""
import doc_commands as dc

ACTIVATE = "```bash\nsource .venv/bin/activate\n```\n\n"
KNN = ("```bash\nswav-plugin-knn --topk 20,200 --random-init config=benchmark/swav_plugin/knn_fashion_mnist_cpu \\\n"
       "    config.MODEL.WEIGHTS_INIT.PARAMS_FILE=CKPT config.CHECKPOINT.DIR=OUT\n```\n")


def check(text):
    return dc.check_page(text, "planted.md", compose=False, run=False)


def test_good_page():
    assert check(ACTIVATE + KNN) == []


def test_plant_a_bare_console_script_before_activation():
    errors = check(KNN + ACTIVATE)
    assert any("swav-plugin-knn` before `source .venv/bin/activate`" in e for e in errors), errors
    for bare in ("python tools/demo.py --quick", "torchrun --nproc_per_node=2 -m vissl_swav_plugin.tools.torchrun "
                 "config=test/swav_plugin/quick_cpu", "pip install --no-deps ."):
        assert any("before `source .venv/bin/activate`" in e for e in check(f"```bash\n{bare}\n```\n")), bare
    assert check("```bash\n.venv/bin/python tools/demo.py --quick\n```\n") == []
    assert check("```bash\nsource ~/src/vissl-swav-plugin/.venv/bin/activate\npython tools/demo.py --quick\n```\n") == []


def test_plant_a_wrong_flag():
    errors = check(ACTIVATE + KNN.replace("--topk", "--top-k"))
    assert any("--top-k" in e for e in errors), errors
    assert check(ACTIVATE + "```bash\nswav-plugin-import --stict a.pth b.torch\n```\n")
    assert check(ACTIVATE + "```bash\npython tools/demo.py --colour-strength 0.25\n```\n")
    assert check(ACTIVATE + "```bash\nswav-plugin-train --epochs 3 config=test/swav_plugin/quick_cpu\n```\n")
    assert check(ACTIVATE + "```bash\ntorchrun --nproc-per-nod=2 -m vissl_swav_plugin.tools.torchrun config=x\n```\n")
    assert check(ACTIVATE + "```bash\nswav-plugin-evaluate --help\n```\n")


def test_plant_a_config_that_does_not_exist():
    errors = check(ACTIVATE + KNN.replace("knn_fashion_mnist_cpu", "knn_fashion_mnist_gpu"))
    assert any("knn_fashion_mnist_gpu" in e and "no such config" in e for e in errors), errors


def test_markers_and_placeholders():
    assert check("<!-- docs-test: skip (needs a cluster) -->\n```bash\nswav-plugin-nope\n```\n") == []
    assert any("without a reason" in e for e in check("<!-- docs-test: skip -->\n```bash\nls\n```\n"))
    assert any("undefined placeholder" in e for e in check("```bash\nls <your folder>\n```\n"))
    assert any("unknown program" in e for e in check("```bash\nfrobnicate --now\n```\n"))
    assert any("no target" in e for e in check("```bash\nmake tests\n```\n"))
