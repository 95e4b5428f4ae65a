"""The demo on a GPU starts its loader workers with fork instead of VISSL's default forkserver
(a forkserver worker imports torch and VISSL afresh: about 70 s for 8 workers on the lent H100
machine, docs/gpu.md).  Fork-started workers must deliver the same batches: a run with fork
workers has, iteration for iteration, the losses of the same run with forkserver workers (VISSL
seeds each worker from the loader, not from the start method).  Run in the test process
(``testkit.train_in_process``) with one loader worker, 2 epochs, so the workers are started twice."""
import json

from testkit import SMALL_TRUNK, folder_data_overrides, make_image_folder, train_in_process


def _losses(tmp_path, images, method):
    folder, log = train_in_process(["config=test/swav_plugin/quick_cpu", *SMALL_TRUNK, *folder_data_overrides(images),
                                    "config.DATA.NUM_DATALOADER_WORKERS=1", "config.OPTIMIZER.num_epochs=2",
                                    f"config.MULTI_PROCESSING_METHOD={method}", "config.CHECKPOINT.DIR=ckpt"],
                                   cwd=tmp_path / method)
    assert f"Set start method of multiprocessing to {method}" in log
    return [(s["iter"], s["loss"]) for s in map(json.loads, (folder / "stdout.json").read_text().splitlines())]


def test_fork_started_workers_give_the_losses_of_forkserver_started_ones(tmp_path):
    images = make_image_folder(tmp_path / "images")  # 2 classes x 8 images
    for method in ("fork", "forkserver"):
        (tmp_path / method).mkdir()
    fork, forkserver = _losses(tmp_path, images, "fork"), _losses(tmp_path, images, "forkserver")
    assert [i for i, _ in fork] == list(range(2 * 16 // 4))  # 2 epochs x 16 images / batch 4
    assert fork == forkserver
