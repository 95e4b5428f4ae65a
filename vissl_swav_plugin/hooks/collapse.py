"""Collapse detector: a SwAV / DeepCluster-v2 / SeLa-v2 run must never collapse silently.

A collapsed run maps every image to the same representation.  Its loss is then flat at
``ln K`` (K prototypes): every prediction ``p = softmax(z^T c / T)`` is uniform, so the
cross-entropy against any code is ``-sum_k q_k ln(1/K) = ln K`` (the SwAV README: "the
loss does not decrease and is stuck at ln(nmb_prototypes)"), or -- the other way round --
near 0 with one prototype taking the whole batch (codes / pseudo-labels all in one
cluster).  :class:`CollapseDetectorHook` (attached to every run of ``swav_plugin_loss``,
``deepclusterv2_plugin_loss`` and ``selav2_plugin_loss`` through
:func:`vissl_swav_plugin.hooks.registry.register_monitor_hooks`) computes at every training
iteration, summed over all processes:

* ``H_s``: the mean entropy of the per-sample predictions ``p_i`` (over every crop),
* ``H_m``: the entropy of the batch-mean prediction ``mean_i p_i``,
* the prototypes used: how many prototypes are the argmax of some sample (accumulated
  over the epoch),
* SwAV only: the mean entropy of the codes and the prototypes they pick
  (``SwAVPluginLoss.last_code_stats``); DeepCluster-v2 / SeLa-v2: the clusters used by the
  epoch's pseudo-labels,

logs them once per epoch (``Collapse detector, epoch E (...)``; also to TensorBoard under
``collapse/`` when VISSL's tensorboard hook is on), and acts on:

=================  ===========================================================================
state              condition (every prototype set; K >= 2; ``ln K`` averaged over the sets)
=================  ===========================================================================
uniform            ``|loss - ln K| <= LOSS_TOL ln K`` and ``H_s >= (1 - ENTROPY_TOL) ln K``
one prototype      ``loss <= LOSS_TOL ln K`` and ``H_m <= ENTROPY_TOL ln K``
few prototypes     at an epoch end: prototypes used ``< ceil(MIN_PROTOTYPES_USED_FRAC
                   min(K, predictions in the epoch))`` (0 switches this check off)
=================  ===========================================================================

After ``PATIENCE_ITERS`` consecutive iterations in the uniform / one-prototype state (or one
few-prototypes epoch) it logs a multi-line ``COLLAPSE DETECTED`` message (what it saw,
likely causes, config keys to change) and, with ``ON_COLLAPSE: stop``, raises
:class:`CollapseError` in every process (the same decision everywhere: the figures are
all-reduced), so VISSL's launcher exits non-zero.

Thresholds (defaults in :data:`DEFAULTS`) and why a healthy run never meets them: at random
initialisation the predictions are far from uniform -- ``H_s`` = 0.85 ln K for the demo's
network (Fashion-MNIST, K=100, T=0.1) and 0.56 ln K for ``test/swav_plugin/quick_cpu``,
and ``H_s`` only decreases as a healthy run trains -- while a collapsed run sits at
``H_s = ln K`` exactly (its loss was 4.6052 = ln 100 to 4 digits); the uniform state asks for
``H_s >= 0.95 ln K`` *and* a loss within 2% of ``ln K``.  A healthy run's loss starts above
``ln K`` (5.25 for the demo) and passes through it, but not with uniform predictions.  The
one-prototype state needs ``H_m <= 0.05 ln K`` (at least ~97.5% of the batch-mean
prediction on one prototype for K=100, ~97% for K=3000) and a loss below 2% of ``ln K``; a healthy batch-mean prediction is near uniform (0.94 ln K at
init for the demo).  The demo's network at initialisation already uses 62 of 100
prototypes (28 within one batch of 64), far above the few-prototypes threshold (2% of K,
i.e. 2 of 100: only an epoch whose predictions all pick one prototype); with K <= 50 (the
test configs) that check never fires -- a random network on VISSL's synthetic images
picks 2 of 20 prototypes, a legitimate, not a collapsed, state.
``PATIENCE_ITERS`` = 100 leaves room for transients (the reported collapse lasted 370
iterations).

Config (``config.HOOKS.COLLAPSE_DETECTOR``, absent from VISSL's defaults: read with
:data:`DEFAULTS` when missing, validated when a config is composed)::

    HOOKS:
      COLLAPSE_DETECTOR: {ENABLED: true, ON_COLLAPSE: warn, PATIENCE_ITERS: 100,
                          LOSS_TOL: 0.02, ENTROPY_TOL: 0.05, MIN_PROTOTYPES_USED_FRAC: 0.02}
"""
import logging
import math
from typing import Dict, List, Optional

import torch

from vissl_swav_plugin.utils import distributed as D
from vissl_swav_plugin.hooks.collapse_report import collapse_message, epoch_line, run_context
from vissl_swav_plugin.config.checkers import ConfigError, hook_block, require_bool, require_int
from vissl_swav_plugin.config.registries import register_config_check
from vissl_swav_plugin.hooks.registry import NoOpHook, register_monitor_hooks

#: the losses whose runs get a detector
MONITORED_LOSSES = ("swav_plugin_loss", "deepclusterv2_plugin_loss", "selav2_plugin_loss")
#: keys of ``config.HOOKS.COLLAPSE_DETECTOR`` and their defaults
DEFAULTS = {
    "ENABLED": True,
    "ON_COLLAPSE": "warn",
    "PATIENCE_ITERS": 100,
    "LOSS_TOL": 0.02,
    "ENTROPY_TOL": 0.05,
    "MIN_PROTOTYPES_USED_FRAC": 0.02,
}
ON_COLLAPSE_CHOICES = ("warn", "stop")
_TINY = 1e-30


class CollapseError(RuntimeError):
    """Raised in every process by ``ON_COLLAPSE: stop`` once a collapse is detected."""


def detector_settings(cfg) -> dict:
    """``config.HOOKS.COLLAPSE_DETECTOR`` merged over :data:`DEFAULTS`, validated.

    Raises:
        ConfigError: an unknown key or a bad value, e.g.
            ``config.HOOKS.COLLAPSE_DETECTOR.ON_COLLAPSE must be one of ['warn', 'stop'], got 'halt'``.
    """
    return hook_block(cfg, "COLLAPSE_DETECTOR", DEFAULTS, {
        "ENABLED": require_bool,
        "ON_COLLAPSE": _check_on_collapse,
        "PATIENCE_ITERS": lambda v, k: require_int(v, k, minimum=1),
        "LOSS_TOL": _fraction(low_open=True),
        "ENTROPY_TOL": _fraction(low_open=True),
        "MIN_PROTOTYPES_USED_FRAC": _fraction(low_open=False),
    })


def _check_on_collapse(value, key):
    if value not in ON_COLLAPSE_CHOICES:
        raise ConfigError(f"config.{key} must be one of {list(ON_COLLAPSE_CHOICES)}, got {value!r}")


def _fraction(low_open):
    """A check: a number in (0, 1) (``low_open``) or [0, 1)."""
    def check(v, key):
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (0 < v if low_open else 0 <= v) and v < 1
        if not ok:
            raise ConfigError(f"config.{key} must be a number in {'(0' if low_open else '[0'}, 1), got {v!r}")
    return check


@register_config_check
def check_detector_config(cfg) -> None:
    """Validates ``config.HOOKS.COLLAPSE_DETECTOR`` when any launcher composes a config."""
    detector_settings(cfg)


# -- statistics -----------------------------------------------------------------------------
def entropy(p: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each distribution along the last dim (``0 ln 0 = 0``);
    ``entropy(torch.full((K,), 1 / K)) == ln K``."""
    return -(p * p.clamp_min(_TINY).log()).sum(dim=-1)


def prediction_sums(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """Additive figures of one batch of prototype scores (N x K), to be summed over
    processes and iterations: ``[N, sum_i H(p_i), sum_i p_i (K), argmax counts (K)]``
    (float64) with ``p_i = softmax(scores_i / temperature)``."""
    s = scores.detach().double()
    p = torch.softmax(s / temperature, dim=1)
    counts = torch.bincount(s.argmax(dim=1), minlength=s.shape[1]).double()
    return torch.cat([s.new_tensor([s.shape[0]]), entropy(p).sum().view(1), p.sum(dim=0), counts])


def code_sums(stats: dict) -> torch.Tensor:
    """``[rows, sum of code entropies, argmax counts (K)]`` (float64) from one
    ``SwAVPluginLoss.last_code_stats`` entry."""
    counts = stats["argmax_counts"].detach().double()
    rows = counts.sum()
    return torch.cat([rows.view(1), (stats["mean_entropy"].detach().double() * rows).view(1), counts])


def head_figures(pred: torch.Tensor, codes: Optional[torch.Tensor] = None) -> dict:
    """Figures of one prototype set from summed :func:`prediction_sums` (and
    :func:`code_sums`): ``K``, ``ln_k``, ``rows``, ``sample_entropy`` (mean ``H(p_i)``),
    ``mean_entropy`` (``H(mean p)``), ``used`` (prototypes that are some argmax), and with
    codes ``code_entropy`` / ``code_used`` (nats / counts)."""
    K = (pred.numel() - 2) // 2
    rows = float(pred[0])
    f = {"K": K, "ln_k": math.log(K), "rows": rows,
         "sample_entropy": float(pred[1]) / max(rows, 1.0),
         "mean_entropy": float(entropy(pred[2 : 2 + K] / max(rows, 1.0))),
         "used": int((pred[2 + K :] > 0).sum())}
    if codes is not None:
        f["code_entropy"] = float(codes[1]) / max(float(codes[0]), 1.0)
        f["code_used"] = int((codes[2:] > 0).sum())
    return f


def collapse_kind(loss: float, heads: List[dict], settings: dict) -> Optional[str]:
    """``"uniform"``, ``"one_prototype"`` or None for one iteration (see the module table).

    Args:
        loss: the iteration's loss (mean over processes).
        heads: :func:`head_figures` of every prototype set.
        settings: :func:`detector_settings`.
    """
    if not heads or any(h["K"] < 2 for h in heads) or not math.isfinite(loss):
        return None
    ln_k = sum(h["ln_k"] for h in heads) / len(heads)
    ltol, etol = settings["LOSS_TOL"], settings["ENTROPY_TOL"]
    if abs(loss - ln_k) <= ltol * ln_k and all(h["sample_entropy"] >= (1 - etol) * h["ln_k"] for h in heads):
        return "uniform"
    if loss <= ltol * ln_k and all(h["mean_entropy"] <= etol * h["ln_k"] for h in heads):
        return "one_prototype"
    return None


def too_few_prototypes(heads: List[dict], min_frac: float) -> bool:
    """Whether every prototype set used fewer than ``ceil(min_frac * min(K, rows))``
    prototypes over an epoch (``rows``: predictions in the epoch); False when ``min_frac``
    is 0.  With the default 0.02 this needs ``min(K, rows) > 50`` to fire at all."""
    if min_frac <= 0 or not heads:
        return False
    return all(h["used"] < math.ceil(min_frac * min(h["K"], h["rows"])) for h in heads)


def split_scores(model_output) -> List[torch.Tensor]:
    """The prototype score tensors of a model output ``[embeddings, scores_0, ...]``
    (also wrapped in a one-element list); ``[]`` when it holds no scores."""
    out = model_output
    if isinstance(out, (list, tuple)) and len(out) == 1 and isinstance(out[0], (list, tuple)):
        out = out[0]
    if not isinstance(out, (list, tuple)) or len(out) < 2:
        return []
    return [s for s in out[1:] if torch.is_tensor(s) and s.dim() == 2]


def pseudo_label_figures(loss_module) -> List[dict]:
    """Clusters used and label entropy of DeepCluster-v2 / SeLa-v2's pseudo-label table
    (``loss.assignments``, H x N with -100 = unlabelled); ``[]`` for other losses."""
    table = getattr(loss_module, "assignments", None)
    ks = getattr(loss_module, "num_clusters", None)
    if not torch.is_tensor(table) or ks is None:
        return []
    out = []
    for labels, K in zip(table, ks):
        labels = labels[labels >= 0].cpu()
        hist = torch.bincount(labels, minlength=int(K)).double()
        out.append({"used": int((hist > 0).sum()), "K": int(K),
                    "entropy": float(entropy(hist / hist.sum().clamp_min(1)))})
    return out


# -- the hook -------------------------------------------------------------------------------
class CollapseDetectorHook(NoOpHook):
    """Watches a training run for collapse (see the module docstring): per-iteration
    figures in ``on_loss_and_meter`` (train phases), one log line per epoch, a warning /
    :class:`CollapseError` after ``PATIENCE_ITERS`` collapsed iterations.

    Args:
        loss_name: ``LOSS.name``.
        settings: :func:`detector_settings`.
        context: :func:`vissl_swav_plugin.hooks.collapse_report.run_context` (config values
            quoted in the warning).

    Attributes (read-only): ``streak`` (consecutive collapsed iterations so far) and
    ``last`` (``{"loss", "heads", "kind"}`` of the last iteration / epoch check).
    """

    def __init__(self, loss_name: str, settings: dict, context: Optional[dict] = None):
        super().__init__()
        self.loss_name = loss_name
        self.settings = dict(settings)
        self.context = dict(context or {})
        self.streak = 0  # consecutive collapsed iterations
        self.streak_start = 0
        self.warned = False  # already warned about the current streak
        self.warned_few = False  # already warned about an epoch with too few prototypes
        self.last: Dict = {}
        self._tb = None
        self._no_scores_logged = False
        self._num_heads = 0
        self._reset_epoch()

    def _reset_epoch(self):
        self.epoch_sums: Optional[List[torch.Tensor]] = None
        self.epoch_iters = self.epoch_collapsed = 0
        self.epoch_loss = 0.0

    @staticmethod
    def _loss_module(task):
        return getattr(task, "base_loss", None) or task.loss

    def on_start(self, task) -> None:
        """Read the run's context (loss, prototypes, iterations) for the messages."""
        if D.rank() == 0:
            self._tb = next((h.tb_writer for h in getattr(task, "hooks", []) if getattr(h, "tb_writer", None) is not None), None)

    def on_phase_start(self, task) -> None:
        """Reset the epoch's statistics."""
        if task.train:
            self._reset_epoch()

    def on_loss_and_meter(self, task) -> None:
        """Accumulate this iteration's statistics and check the collapse criteria."""
        if not task.train:
            return
        loss_module = self._loss_module(task)
        scores = split_scores(task.last_batch.model_output)
        if not scores:
            if not self._no_scores_logged and D.rank() == 0:
                logging.warning("Collapse detector: the model output holds no prototype scores; detection is off")
            self._no_scores_logged = True
            return
        T = float(getattr(loss_module, "temperature", 0.1))
        parts = [prediction_sums(s, T) for s in scores]
        code_stats = getattr(loss_module, "last_code_stats", None) or []
        parts += [code_sums(c) for c in code_stats]
        packed = D.all_reduce_(torch.cat(parts).to(scores[0].device)).cpu()
        sums = list(packed.split([p.numel() for p in parts]))
        self.epoch_sums = sums if self.epoch_sums is None else [a + b for a, b in zip(self.epoch_sums, sums)]
        loss = task.last_batch.loss
        loss = float(loss) if loss is not None else float("nan")
        self._num_heads = len(scores)
        heads = self._heads(sums, len(scores))
        kind = collapse_kind(loss, heads, self.settings)
        self.epoch_iters += 1
        self.epoch_loss += loss
        self.last = {"loss": loss, "heads": heads, "kind": kind}
        if kind is None:
            self.streak, self.warned = 0, False
            return
        self.epoch_collapsed += 1
        if self.streak == 0:
            self.streak_start = int(task.iteration)
        self.streak += 1
        if self.streak >= self.settings["PATIENCE_ITERS"] and not self.warned:
            self.warned = True
            self._act(task, kind, loss, heads)

    @staticmethod
    def _heads(sums: List[torch.Tensor], num_heads: int) -> List[dict]:
        codes = sums[num_heads:] if len(sums) == 2 * num_heads else [None] * num_heads
        return [head_figures(p, c) for p, c in zip(sums[:num_heads], codes)]

    def _act(self, task, kind, loss, heads):
        """Warn (rank 0 logs) and, with ``ON_COLLAPSE: stop``, raise in every process."""
        msg = collapse_message(
            kind, self.loss_name, loss, heads, self.settings, self.context,
            iterations=(self.streak_start, int(task.iteration)), streak=self.streak,
            epoch=int(task.train_phase_idx), lr=_current_lr(task),
            epoch_used=[h["used"] for h in self._heads(self.epoch_sums, self._num_heads)],
        )
        if D.rank() == 0:
            logging.warning(msg)
        if self.settings["ON_COLLAPSE"] == "stop":
            raise CollapseError(msg)

    def on_phase_end(self, task) -> None:
        """Log the epoch line and check the epoch-level criteria."""
        if not task.train or self.epoch_sums is None:
            return
        loss_module = self._loss_module(task)
        heads = self._heads(self.epoch_sums, self._num_heads)
        epoch = int(task.train_phase_idx)
        mean_loss = self.epoch_loss / max(self.epoch_iters, 1)
        labels = pseudo_label_figures(loss_module)
        if D.rank() == 0:
            logging.info(epoch_line(self.loss_name, epoch, mean_loss, heads, labels, self.epoch_iters,
                                    self.epoch_collapsed, self.streak, self.settings))
            self._write_tensorboard(epoch, mean_loss, heads)
        if not self.warned_few and too_few_prototypes(heads, self.settings["MIN_PROTOTYPES_USED_FRAC"]):
            self.warned_few = True  # once per run
            self.last = {"loss": mean_loss, "heads": heads, "kind": "few_prototypes"}
            self._act(task, "few_prototypes", mean_loss, heads)

    def _write_tensorboard(self, epoch, mean_loss, heads):
        ln_k = sum(h["ln_k"] for h in heads) / len(heads)
        if self._tb is None or ln_k == 0:
            return
        self._tb.add_scalar("collapse/loss_over_ln_k", mean_loss / ln_k, global_step=epoch)
        self._tb.add_scalar("collapse/collapsed_iterations", self.epoch_collapsed, global_step=epoch)
        for i, h in enumerate(heads):
            for name in ("sample_entropy", "mean_entropy", "code_entropy"):
                if name in h:
                    ratio = h[name] / (h["ln_k"] or float("nan"))
                    self._tb.add_scalar(f"collapse/head{i}/{name}_over_ln_k", ratio, global_step=epoch)
            for name in ("used", "code_used"):
                if name in h:
                    self._tb.add_scalar(f"collapse/head{i}/prototypes_{name}", h[name], global_step=epoch)


def _current_lr(task) -> Optional[float]:
    try:
        return float(task.optimizer.optimizer.param_groups[0]["lr"])
    except (AttributeError, IndexError, KeyError, TypeError):
        return None


@register_monitor_hooks
def collapse_hooks(cfg) -> List[NoOpHook]:
    """A :class:`CollapseDetectorHook` for runs of the plugin's losses, unless
    ``config.HOOKS.COLLAPSE_DETECTOR.ENABLED`` is false."""
    settings = detector_settings(cfg)
    name = cfg.LOSS.name
    if not settings["ENABLED"] or name not in MONITORED_LOSSES:
        return []
    return [CollapseDetectorHook(name, settings, run_context(cfg))]
