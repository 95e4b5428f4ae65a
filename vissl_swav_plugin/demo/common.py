"""What the demo's steps share: where the repository is, the error the command line
reports, the run's settings and clock, and the composition of the demo's VISSL config.

Nothing here imports torch or VISSL at import time.
"""
import datetime
import os
import resource
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

_ROOT = Path(__file__).resolve().parents[2]
# Default home of demo_output/ and data/: the checkout (editable install, `make demo`), else
# (a wheel installed in site-packages, `swav-plugin-demo`) the working directory.
REPO = _ROOT if (_ROOT / "setup.py").is_file() and (_ROOT / "tools").is_dir() else Path.cwd()
CONFIG = "pretrain/swav/swav_fashion_mnist_cpu"
#: the demo's image set (``--source``): the Debian package's Fashion-MNIST IDX files
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
#: the training's whole log (VISSL's launcher output), in the run folder
TRAIN_LOG = "train_log.txt"


class DemoError(RuntimeError):
    """A failure the demo reports in one line (``demo: error: ...``) with exit code 2."""


@dataclass
class DemoSetup:
    """The settings of one demo run, fixed before the first step.

    Attributes:
        args: the parsed command line (``source``, ``seed``, ``procs``, ``override``, ...).
        mode: the mode's sizes after the command-line overrides (``train_per_class``,
            ``test_per_class``, ``epochs``, ``batch``, ``queue``, ``freeze``, ``prototypes``).
        label: ``"quick"`` or ``"full"``.
        out: the report folder; ``run_dir`` (``out/run``, emptied at start) holds the
            training log and ``ckpt_dir`` (``run_dir/checkpoints``) VISSL's checkpoints.
        threads: torch threads per training process.
        use_amp: autocast in the training (bf16 on CPU, fp16 with a GradScaler on a GPU); None
            while ``--amp auto`` on a CPU is still to be measured (``cli.amp_step``).
        device: ``"cpu"`` (gloo processes) or ``"gpu"`` (one NCCL process per GPU).
        amp_reason: why ``use_amp`` is what it is (``--amp`` as given, or what ``auto`` found).
        amp_measurement: ``--amp auto`` on a CPU: the timing of the step in fp32 and bf16
            that decided (:meth:`vissl_swav_plugin.utils.amp_measure.AmpMeasurement.record`);
            None otherwise.
    """

    args: object
    mode: dict
    label: str
    out: Path
    run_dir: Path
    ckpt_dir: Path
    threads: int
    use_amp: Optional[bool]
    device: str = "cpu"
    amp_reason: str = ""
    amp_measurement: Optional[dict] = None

    @property
    def train_log(self) -> Path:
        """The training's whole log, ``run_dir/train_log.txt``."""
        return self.run_dir / TRAIN_LOG


class Clock:
    """Wall time, CPU time and load average since the demo started.

    Example::

        clock = Clock()
        ...
        print(fmt_secs(clock.elapsed()), clock.cpu_used())
    """

    def __init__(self):
        self.start = time.time()
        self.cpu_start = cpu_seconds()
        self.load_start = os.getloadavg()

    def elapsed(self):
        """Seconds of wall time since the start."""
        return time.time() - self.start

    def cpu_used(self):
        """CPU seconds (this process and its finished children) since the start."""
        return cpu_seconds() - self.cpu_start


def fmt_secs(s):
    """Seconds as ``H:MM:SS`` (rounded, negatives as 0), e.g. ``fmt_secs(75.4) == "0:01:15"``."""
    return str(datetime.timedelta(seconds=int(round(max(0.0, s)))))


def cpu_seconds():
    """CPU time (user + system) of this process and its finished children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def compose_config(overrides):
    """VISSL's config (an AttrDict) for the launcher-style ``overrides``
    (``["config=...", "config.X=Y", ...]``), composed in this process as the launcher would.

    Args:
        overrides: Hydra overrides, the first normally ``config=<name>``.

    Returns:
        The ``config`` AttrDict (``config.MODEL``, ``config.OPTIMIZER``, ...).
    """
    import vissl  # noqa: F401  (the plugin registers itself on import)
    from vissl.utils.hydra_config import compose_hydra_configuration, convert_to_attrdict

    with warnings.catch_warnings():  # Hydra 1.3's notes on VISSL's version_base-less init
        warnings.simplefilter("ignore")
        cfg = compose_hydra_configuration(list(overrides))
    return convert_to_attrdict(cfg, dump_config=False)[1]


@dataclass
class TrainingRun:
    """What step 2 (training) hands on.

    Attributes:
        overrides: the launcher's overrides (the evaluation builds the same model from them).
        curve: the loss per iteration, ``[dict(iter, ep, loss, lr), ...]``.
        wall_s: the launcher's wall time in seconds.
        checkpoint: VISSL's final checkpoint.
        collapse: the collapse detector's warnings in the training log (``[]``: it stayed quiet).
    """

    overrides: list
    curve: list
    wall_s: float
    checkpoint: Path
    collapse: list = field(default_factory=list)


@dataclass
class EvaluationRun:
    """What step 3 (evaluation) hands on: the composed VISSL ``config``, the kNN
    ``results`` and prototype summaries ``protos`` per method, the seconds per model
    (``timings``), the step's wall time ``wall_s`` and the linear / low-shot ``probes``
    per method (:func:`vissl_swav_plugin.utils.probes.probe_report`; empty with
    ``--probes off``)."""

    config: object
    results: dict
    protos: dict
    timings: dict
    wall_s: float
    probes: dict = field(default_factory=dict)
