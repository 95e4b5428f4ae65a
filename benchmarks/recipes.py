"""What the benchmarks (``benchmarks/*.py``) build through VISSL: a shipped recipe read from its
config, the demo's trunk and head, VISSL tasks prepared as its trainer prepares them, the SwAV pair
(the plugin's against VISSL's built-in SwAV) and VISSL's own Sinkhorn path.  The timing, the
alternation and the JSON record are :mod:`benchmarking`'s (beside it; neither is in the wheel).

A benchmark of a shipped recipe reads it here (:func:`recipe`) instead of writing its batch, crops,
trunk, head and loss again, so that it measures what the config ships.
"""
import contextlib
import copy
import io
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

#: the demo's config (``make demo``, ``tools/demo.py``)
DEMO_CONFIG = "pretrain/swav/swav_fashion_mnist_cpu"
#: the paper's recipe on one GPU (2x224 + 6x96, ResNet-50)
PAPER_CONFIG = "pretrain/swav/swav_1gpu_resnet"


def compose(overrides: Sequence[str], updates: Optional[Mapping[str, Any]] = None):
    """VISSL's config (an ``AttrDict``) of Hydra ``overrides`` (``["config=NAME", ...]``), through
    the plugin's inference and checks; ``updates`` (``{"config.KEY": value}``) are set after
    composition, for values the command line cannot spell (lists of dicts)."""
    import vissl  # noqa: F401  (registers the plugin)
    from omegaconf import OmegaConf
    from vissl.utils.hydra_config import compose_hydra_configuration, convert_to_attrdict

    cfg = compose_hydra_configuration(list(overrides))
    for key, value in (updates or {}).items():
        OmegaConf.update(cfg, key, value, merge=False)
    return convert_to_attrdict(cfg, dump_config=False)[1]


@dataclass
class Recipe:
    """A shipped config's training recipe, as a benchmark needs it."""

    config: str
    batch: int                      #: ``DATA.TRAIN.BATCHSIZE_PER_REPLICA``
    transform: Dict[str, Any]       #: the ``multicrop_plugin`` entry of ``DATA.TRAIN.TRANSFORMS``
    trunk_name: str
    trunk: Dict[str, Any]           #: the trunk's parameter block (``TRUNK.<NAME>``)
    input_type: str
    head_name: str
    head: Dict[str, Any]            #: the first head's parameters
    loss_name: str
    loss: Dict[str, Any]            #: ``LOSS.<name>``

    @property
    def crops(self) -> List[Tuple[int, int]]:
        """``[(number, size), ...]`` of the multi-crop transform."""
        return crops_of(self.transform)

    @property
    def crops_text(self) -> str:
        """The crops as ``2x28,4x16``."""
        return ",".join(f"{n}x{s}" for n, s in self.crops)


def _plain(x):
    """An ``AttrDict`` / ``ListConfig`` tree as plain dicts and lists."""
    if isinstance(x, Mapping):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def recipe(config: str = DEMO_CONFIG, overrides: Sequence[str] = ()) -> Recipe:
    """The recipe of the shipped ``config`` (composed with ``overrides``)."""
    cfg = compose([f"config={config}", *overrides])
    model = cfg.MODEL
    trunk_name = model.TRUNK.NAME
    head_name, head = model.HEAD.PARAMS[0][0], model.HEAD.PARAMS[0][1]
    return Recipe(config=config, batch=int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA),
                  transform=multicrop_transform(cfg), trunk_name=trunk_name,
                  trunk=_plain(model.TRUNK.get(trunk_name.upper(), {})), input_type=model.get("INPUT_TYPE", "rgb"),
                  head_name=head_name, head=_plain(head), loss_name=cfg.LOSS.name,
                  loss=_plain(cfg.LOSS[cfg.LOSS.name]))


def multicrop_transform(cfg) -> Dict[str, Any]:
    """The ``multicrop_plugin`` entry of ``cfg.DATA.TRAIN.TRANSFORMS`` (a plain dict)."""
    for t in cfg.DATA.TRAIN.TRANSFORMS:
        if t["name"] == "multicrop_plugin":
            return _plain(t)
    raise ValueError("the config has no multicrop_plugin transform in DATA.TRAIN.TRANSFORMS")


def crops_of(transform: Mapping[str, Any]) -> List[Tuple[int, int]]:
    """``[(number, size), ...]`` of a multi-crop transform's ``num_crops`` and ``size_crops``."""
    return [(int(n), int(s)) for n, s in zip(transform["num_crops"], transform["size_crops"])]


def with_crops(transform: Mapping[str, Any], crops: Optional[Sequence[Tuple[int, int]]]) -> Dict[str, Any]:
    """A copy of the multi-crop ``transform`` with ``crops`` (``[(number, size), ...]``; None: as
    it is) in place of its own; the crop scales stay."""
    out = dict(transform)
    if crops:
        out.update(num_crops=[int(n) for n, _ in crops], size_crops=[int(s) for _, s in crops],
                   total_num_crops=sum(int(n) for n, _ in crops))
    return out


#: ``multicrop_plugin`` keys VISSL's own chain has no equivalent for, with the value it fixes
_VISSL_FIXED = {"color_jitter_p": 0.8, "grayscale_p": 0.2}


def vissl_chain(transform: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """VISSL 0.1.6's own transform chain doing what the ``multicrop_plugin`` ``transform`` does
    (VISSL's SwAV recipe: ``ImgPilToMultiCrop`` -> ``RandomHorizontalFlip`` ->
    ``ImgPilColorDistortion`` -> ``ImgPilGaussianBlur`` -> ``ToTensor`` -> ``Normalize``).

    Raises:
        ValueError: ``transform`` sets a probability VISSL's chain fixes otherwise.
    """
    for key, fixed in _VISSL_FIXED.items():
        if transform.get(key, fixed) != fixed:
            raise ValueError(f"VISSL's chain fixes {key} at {fixed}; the transform has {transform[key]}")
    num, sizes = list(transform["num_crops"]), list(transform["size_crops"])
    sigma = list(transform.get("blur_sigma", [0.1, 2.0]))
    return [
        {"name": "ImgPilToMultiCrop", "total_num_crops": sum(num), "num_crops": num, "size_crops": sizes,
         "crop_scales": [list(s) for s in transform["crop_scales"]]},
        {"name": "RandomHorizontalFlip", "p": transform.get("flip_p", 0.5)},
        {"name": "ImgPilColorDistortion", "strength": transform.get("color_strength", 1.0)},
        {"name": "ImgPilGaussianBlur", "p": transform.get("blur_p", 0.5), "radius_min": sigma[0],
         "radius_max": sigma[1]},
        {"name": "ToTensor"},
        {"name": "Normalize", "mean": list(transform["mean"]), "std": list(transform["std"])},
    ]


def build_trunk_head(r: Recipe, depth: Optional[int] = None, width: Optional[int] = None,
                     channels_last: Optional[bool] = None, seed: int = 0, **head: Any) -> torch.nn.ModuleList:
    """``ModuleList([trunk, head])`` of recipe ``r`` (VISSL's registered classes of the plugin's
    small trunk and SwAV head), seeded with ``seed``; ``depth``, ``width``, ``channels_last`` and
    ``head`` (the head's parameters) replace the recipe's (the head's first dimension follows the
    trunk's width: 8 x width)."""
    import vissl  # noqa: F401  (registers the plugin)
    from vissl.config import AttrDict

    from vissl_swav_plugin.models.heads import SwAVPluginHead
    from vissl_swav_plugin.models.trunks import ResNetSmallPlugin

    if (r.trunk_name, r.head_name) != ("resnet_small_plugin", "swav_plugin_head"):
        raise ValueError(f"{r.config}: builds resnet_small_plugin + swav_plugin_head, not {r.trunk_name} + {r.head_name}")
    params = dict(r.trunk)
    for key, value in (("DEPTH", depth), ("WIDTH", width), ("CHANNELS_LAST", channels_last)):
        if value is not None:
            params[key] = value
    head_params = dict(r.head, **head)
    head_params["dims"] = [8 * int(params["WIDTH"]), *list(head_params["dims"])[1:]]
    torch.manual_seed(seed)
    cfg = AttrDict({"TRUNK": {"NAME": r.trunk_name, "RESNET_SMALL_PLUGIN": params}, "INPUT_TYPE": r.input_type})
    return torch.nn.ModuleList([ResNetSmallPlugin(cfg), SwAVPluginHead(cfg, **head_params)])


def build_loss(r: Recipe, **params: Any):
    """Recipe ``r``'s ``swav_plugin_loss``, ``params`` replacing its keys."""
    from vissl_swav_plugin.losses.swav_loss import SwAVPluginLoss

    if r.loss_name != "swav_plugin_loss":
        raise ValueError(f"{r.config}: builds swav_plugin_loss, not {r.loss_name}")
    return SwAVPluginLoss(dict(copy.deepcopy(r.loss), **params))


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_process_group(backend: str = "gloo") -> None:
    """A process group of this one process (``gloo``; ``nccl`` on the first GPU), as VISSL's
    launcher makes for one process; nothing when one is up."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    if backend == "nccl":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", world_size=1, rank=0)


def quiet():
    """A context that silences VISSL's console output (stdout; the root logger to WARNING)."""
    logging.getLogger().setLevel(logging.WARNING)
    return contextlib.redirect_stdout(io.StringIO())


def train_loader(cfg, workers: int, device: str = "cpu", pin_memory: bool = False):
    """VISSL's ``build_dataset`` + ``build_dataloader`` of ``cfg``'s TRAIN split, as its trainer
    calls them (``workers`` loader workers started by ``cfg.MULTI_PROCESSING_METHOD``)."""
    from vissl.data import build_dataloader, build_dataset

    dataset = build_dataset(cfg, "TRAIN")
    return build_dataloader(dataset=dataset, dataset_config=cfg.DATA.TRAIN, num_dataloader_workers=workers,
                            pin_memory=pin_memory, multi_processing_method=cfg.MULTI_PROCESSING_METHOD,
                            device=torch.device(device), sampler_seed=cfg.SEED_VALUE, split="train")


def folder_loader(folder: str, transforms: List[Dict[str, Any]], batch: int, workers: int,
                  start_method: Optional[str] = None):
    """VISSL's loader of an image folder (``disk_folder``, ``test/swav_plugin/quick_cpu``'s other
    settings) through ``transforms`` (a ``DATA.TRAIN.TRANSFORMS`` list), the loss's crop count
    following the transform's; ``start_method`` replaces the config's ``MULTI_PROCESSING_METHOD``."""
    crops = sum(next((t["num_crops"] for t in transforms if "num_crops" in t), [2]))
    cfg = compose([
        "config=test/swav_plugin/quick_cpu", "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
        "config.LOSS.swav_plugin_loss.queue.queue_length=0", "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]",
        "config.DATA.TRAIN.DATASET_NAMES=[bench_folder]", f"config.DATA.TRAIN.DATA_PATHS=[{folder}]",
        f"config.DATA.TRAIN.LABEL_PATHS=[{folder}]", "config.DATA.TRAIN.DATA_LIMIT=-1",
        f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={batch}", f"config.DATA.NUM_DATALOADER_WORKERS={workers}",
    ] + ([f"config.MULTI_PROCESSING_METHOD={start_method}"] if start_method else []),
        updates={"config.DATA.TRAIN.TRANSFORMS": transforms, "config.LOSS.swav_plugin_loss.num_crops": crops})
    return train_loader(cfg, workers)


def loader_rates(loader, epoch: int, skip: int):
    """One epoch of ``loader``: ``(images/s of the epoch incl. the workers' start, steady images/s,
    crop shapes)``; steady: from the arrival of batch ``skip`` on (by then the batches the workers
    prefetched while starting are consumed, so the rate is the pipeline's own).

    Raises:
        ValueError: the epoch has no more than ``skip + 1`` batches.
    """
    if hasattr(loader, "sampler") and hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)
    t0 = time.perf_counter()
    n, n_skip, t_skip, shapes = 0, 0, None, None
    for i, batch in enumerate(loader):
        crops = batch["data"][0]
        n += crops[0].shape[0]
        if i == 0:
            shapes = [tuple(c.shape[1:]) for c in crops]
        if i == skip:
            t_skip, n_skip = time.perf_counter(), n
    t1 = time.perf_counter()
    if t_skip is None:
        raise ValueError(f"need more than {skip + 1} batches per epoch")
    return n / (t1 - t0), (n - n_skip) / (t1 - t_skip), shapes


#: where the Fashion-MNIST IDX files are (``FASHION_MNIST_DIR``; Debian's dataset-fashion-mnist)
FASHION_DIR = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")


def fashion_mnist_images(n: int, size: int, folder: str = FASHION_DIR):
    """The first ``n`` Fashion-MNIST test images as RGB PIL images of ``size`` px (bilinear).

    Raises:
        FileNotFoundError: no ``t10k-images-idx3-ubyte.gz`` in ``folder``.
    """
    import gzip

    import numpy as np
    from PIL import Image

    path = os.path.join(folder, "t10k-images-idx3-ubyte.gz")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found; apt-get install -y dataset-fashion-mnist or set FASHION_MNIST_DIR")
    with gzip.open(path, "rb") as f:
        arr = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    return [Image.fromarray(a).convert("RGB").resize((size, size), Image.BILINEAR) for a in arr[:n]]


class Replay:
    """The same collated batch forever; ``len`` as VISSL's loader (used by ``task.where``)."""

    def __init__(self, batch, length):
        self.batch, self.length = batch, length

    def __iter__(self):
        return self

    def __next__(self):
        return self.batch

    def __len__(self):
        return self.length


def prepare_task(cfg, ckpt_dir: str, hooks=None, before_ddp=None):
    """``(trainer, task, train step)``: a VISSL task prepared exactly as
    ``SelfSupervisionTrainer.train()`` does before its loop (hooks: ``default_hook_generator``'s
    unless given; ``before_ddp(task)`` runs before the model is wrapped in DDP)."""
    from vissl.hooks import default_hook_generator
    from vissl.trainer.train_steps import get_train_step
    from vissl.trainer.trainer_main import SelfSupervisionTrainer

    trainer = SelfSupervisionTrainer(cfg, dist_run_id="unused", checkpoint_folder=ckpt_dir,
                                     hooks=default_hook_generator(cfg) if hooks is None else hooks)
    task = trainer.task
    task.prepare(pin_memory=False)
    if before_ddp is not None:
        before_ddp(task)
    task.init_distributed_data_parallel_model()
    task, _, _ = trainer._init_training_state(cfg, task)
    task.run_hooks("on_start")
    trainer._advance_phase(task)
    task.run_hooks("on_phase_start")
    return trainer, task, get_train_step(cfg.TRAINER.TRAIN_STEP_NAME)


class TaskRunner:
    """One VISSL task (:func:`prepare_task`) stepped one training step at a time; records the
    loss forward's ms (``loss_ms``), VISSL's queue-scoring hook's (``qhook_ms``) and each step's
    loss (``step_losses``)."""

    def __init__(self, variant: str, cfg, ckpt_dir: str, before_ddp=None):
        self.variant = variant
        self.trainer, self.task, self.step_fn = prepare_task(cfg, ckpt_dir, before_ddp=before_ddp)
        self.loss_ms, self.qhook_ms, self.step_losses = [], [], []
        loss = self.task.loss
        fwd = loss.forward

        def timed_forward(*a, **k):
            t0 = time.perf_counter()
            out = fwd(*a, **k)
            self.loss_ms.append((time.perf_counter() - t0) * 1e3)
            return out

        loss.forward = timed_forward  # instance attribute: nn.Module.__call__ finds it
        from vissl.hooks.swav_hooks import SwAVUpdateQueueScoresHook

        for h in self.task.hooks:
            if isinstance(h, SwAVUpdateQueueScoresHook):
                inner = h.on_forward

                def timed_hook(t, inner=inner):
                    t0 = time.perf_counter()
                    inner(t)
                    self.qhook_ms.append((time.perf_counter() - t0) * 1e3)

                h.on_forward = timed_hook

    def first_batch(self):
        """The first batch of the task's own loader."""
        return next(self.task.data_iterator)

    def use_batch(self, batch):
        """Feed ``batch`` to every later step (:class:`Replay`)."""
        self.task.data_iterator = Replay(batch, len(self.task.data_iterator))

    def step(self) -> float:
        """One training step with its hooks; its ms (the device synchronised around it)."""
        cuda = torch.cuda.is_available() and self.task.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        task = self.step_fn(self.task)
        task.iteration += 1
        task.local_iteration_num += 1
        task.run_hooks("on_step")
        if cuda:
            torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) * 1e3
        self.step_losses.append(float(task.last_batch.loss))
        return dt


@dataclass
class PairSettings:
    """The SwAV pair's model and batch: the plugin's SwAV against VISSL's built-in one."""

    trunk: str = "resnet50"         #: ``resnet50`` or ``small`` (``resnet_small_plugin``, ResNet-10)
    width: int = 16                 #: the small trunk's width
    batch: int = 8
    crops: str = "2x64,6x32"        #: ``NUMxSIZE,...``
    K: int = 3000                   #: prototypes
    dims: str = "2048,2048,128"     #: the head's dims (the first follows the small trunk's width)
    queue: int = 0
    device: str = "cpu"
    amp: str = "off"                #: ``off`` or the autocast dtype (``float16``, ``bfloat16``)


def paper_pair(**settings: Any) -> PairSettings:
    """The SwAV pair at :data:`PAPER_CONFIG`'s recipe (ResNet-50, its crops, batch, head dims and
    prototypes, read from the config); ``settings`` replace any of them."""
    r = recipe(PAPER_CONFIG)
    base = dict(trunk="resnet50", batch=r.batch, crops=r.crops_text, K=int(r.head["num_clusters"][0]),
                dims=",".join(str(d) for d in r.head["dims"]))
    return PairSettings(**dict(base, **settings))


#: the SwAV pair of a CPU dry run (it checks the code, measures nothing): the small trunk at batch 4
DRY_PAIR = dict(trunk="small", width=8, batch=4, crops="2x32,2x16", K=20, dims="2048,32,16")


def gpu_pair(dry: bool, device: str, amp: str = "float16") -> PairSettings:
    """The SwAV pair of ``benchmarks/gpu_check.py``'s step sections: :func:`paper_pair` under
    ``amp`` autocast, or in a dry run :data:`DRY_PAIR`."""
    if dry:
        return PairSettings(**DRY_PAIR, device=device, amp=amp)
    return paper_pair(device=device, amp=amp)


def pair_overrides(variant: str, s, ckpt_dir: str, extra: Sequence[str] = ()) -> List[str]:
    """Hydra overrides of the SwAV pair's task ``variant`` (``ours``: ``swav_plugin_head`` +
    ``swav_plugin_loss``; ``vissl``: ``swav_head`` + ``swav_loss``) on ``test/swav_plugin/quick_cpu``
    with the settings ``s`` (:class:`PairSettings` or an object with its attributes); the two differ
    only in the head and loss names and blocks."""
    sizes, nums = [], []
    for part in s.crops.split(","):
        n, size = part.split("x")
        nums.append(int(n))
        sizes.append(int(size))
    scales = [[0.14, 1.0]] + [[0.05, 0.14]] * (len(sizes) - 1)
    dims = [int(d) for d in s.dims.split(",")]
    common = [
        "config=test/swav_plugin/quick_cpu",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
        f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={s.batch}",
        f"config.DATA.TRAIN.DATA_LIMIT={s.batch}",
        "config.DATA.TRAIN.TRANSFORMS=[{name:ImgPilToMultiCrop,total_num_crops:%d,size_crops:%s,"
        "num_crops:%s,crop_scales:%s},{name:ToTensor}]" % (sum(nums), sizes, nums, scales),
        "config.LOG_FREQUENCY=100000",
        "config.OPTIMIZER.num_epochs=1000",
        f"config.CHECKPOINT.DIR={ckpt_dir}",
        "config.CHECKPOINT.AUTO_RESUME=False",
    ]
    if getattr(s, "device", "cpu") == "cuda":
        common += ["config.MACHINE.DEVICE=gpu"]
    if getattr(s, "amp", "off") != "off":  # VISSL's native AMP; AMP_DTYPE is the plugin's key
        common += ["config.MODEL.AMP_PARAMS.USE_AMP=True", "config.MODEL.AMP_PARAMS.AMP_TYPE=pytorch",
                   f"config.MODEL.AMP_PARAMS.AMP_DTYPE={s.amp}"]
    if s.trunk == "small":
        common += ["config.MODEL.TRUNK.NAME=resnet_small_plugin",
                   f"+config.MODEL.TRUNK.RESNET_SMALL_PLUGIN={{WIDTH:{s.width},DEPTH:10}}"]
        dims[0] = 8 * s.width
    head = "{dims:%s,use_bn:True,num_clusters:[%d]}" % (dims, s.K)
    if variant == "ours":
        own = [
            f"config.MODEL.HEAD.PARAMS=[[swav_plugin_head,{head}]]",
            "config.LOSS.name=swav_plugin_loss",
            "config.LOSS.swav_plugin_loss.freeze_prototypes_niters=0",
            f"config.LOSS.swav_plugin_loss.queue.queue_length={s.queue}",
            "config.LOSS.swav_plugin_loss.queue.start_epoch=0",
        ]
    else:
        own = [
            f"config.MODEL.HEAD.PARAMS=[[swav_head,{head}]]",
            "config.LOSS.name=swav_loss",
            "~config.LOSS.swav_plugin_loss",  # VISSL's loss: our block would be ignored (refused at composition)
            "config.LOSS.swav_loss.temperature=0.1",
            "config.LOSS.swav_loss.epsilon=0.05",
            "config.LOSS.swav_loss.num_iters=3",
            "config.LOSS.swav_loss.crops_for_assign=[0,1]",
            "config.LOSS.swav_loss.normalize_last_layer=True",
            f"config.LOSS.swav_loss.queue.queue_length={s.queue}",
            "config.LOSS.swav_loss.queue.start_iter=0",
        ]
    return common + own + list(extra)


def pair_runner(variant: str, s, ckpt_dir: str, extra: Sequence[str] = (), before_ddp=None) -> TaskRunner:
    """The :class:`TaskRunner` of the SwAV pair's ``variant`` (:func:`pair_overrides`)."""
    return TaskRunner(variant, compose(pair_overrides(variant, s, ckpt_dir, extra)), ckpt_dir, before_ddp=before_ddp)


def build_pair(s, tmp: str):
    """``(vissl, ours, batch)``: the two runners with the same weights (VISSL's task's; both heads
    name their parameters ``projection_head.*`` / ``prototypes0.*``), both fed the first batch of
    VISSL's task's loader at every step."""
    with quiet():
        a = pair_runner("vissl", s, os.path.join(tmp, "vissl"))
        b = pair_runner("ours", s, os.path.join(tmp, "ours"))
    sd_a, sd_b = a.task.base_model.state_dict(), b.task.base_model.state_dict()
    assert sd_a.keys() == sd_b.keys(), "model state keys differ between the two heads"
    b.task.base_model.load_state_dict(sd_a)
    batch = a.first_batch()
    a.use_batch(batch)
    b.use_batch(batch)
    return a, b, batch


def vissl_sinkhorn(scores: torch.Tensor, eps: float, niters: int) -> torch.Tensor:
    """VISSL 0.1.6's codes of ``scores`` for one assigned crop, as
    ``vissl/losses/swav_loss.py::SwAVCriterion.forward`` computes them (``use_double_precision``
    off) with ``distibuted_sinkhornknopp.py``, unmodified."""
    from classy_vision.generic.distributed_util import all_reduce_max
    from vissl.losses.distibuted_sinkhornknopp import distributed_sinkhornknopp

    with torch.no_grad():
        a = scores / eps
        M = torch.max(a)
        all_reduce_max(M)
        a -= M
        Q = torch.exp(a).t()
        return distributed_sinkhornknopp(Q=Q, num_iter=niters, hard_assignment=False, world_size=1,
                                         use_double_prec=False, use_gpu=scores.is_cuda)
