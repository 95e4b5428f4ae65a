"""One progress line every N training iterations, for every run (config ``HOOKS.PROGRESS``).

VISSL's own ``LogLossLrEtaHook`` logs loss and lr every ``LOG_FREQUENCY`` iterations, but
without the epoch's position, the speed or a readable ETA.  :class:`ProgressHook` adds, on
rank 0 only, every ``FREQUENCY`` training iterations and at the end of every training
epoch, one line::

    progress: epoch 1/2 | iter 3/4 | loss 5.6309 | lr 0.1 | 1.92 it/s | ETA 0:00:01

``iter`` counts all iterations of the run (``task.iteration`` of ``task.max_iteration``),
``epoch`` is 1-based, ``lr`` lists every parameter group's learning rate when they differ,
``it/s`` is the mean speed since the start of this process (so it includes data loading)
and ``ETA`` the remaining iterations at that speed.

Config (defaults used for absent keys; the plugin's shipped configs spell them out)::

    config:
      HOOKS:
        PROGRESS:
          ENABLED: true      # false: no hook
          FREQUENCY: 10      # a line every FREQUENCY iterations (and at each epoch's end)

The line is built so that the demo's parser of VISSL's lines
(:func:`vissl_swav_plugin.demo.training.parse_log_line`) ignores it.
"""
import logging
import time
from typing import List

from vissl_swav_plugin.config.checkers import hook_block, require_bool, require_int
from vissl_swav_plugin.config.registries import register_config_check
from vissl_swav_plugin.hooks.registry import NoOpHook, register_monitor_hooks

#: every key of ``config.HOOKS.PROGRESS`` with its default
DEFAULTS = {"ENABLED": True, "FREQUENCY": 10}


@register_config_check
def progress_config(cfg) -> dict:
    """``config.HOOKS.PROGRESS`` with defaults filled in.

    Raises:
        ConfigError: unknown key, ``ENABLED`` not a bool or ``FREQUENCY`` not an int >= 1.
    """
    return hook_block(cfg, "PROGRESS", DEFAULTS, {
        "ENABLED": require_bool,
        "FREQUENCY": lambda v, k: require_int(v, k, minimum=1),
    })


def format_seconds(secs: float) -> str:
    """``H:MM:SS`` of a duration (``?`` when unknown), e.g. ``format_seconds(3725) == "1:02:05"``."""
    if not secs == secs or secs in (float("inf"), float("-inf")):
        return "?"
    secs = int(round(max(0.0, secs)))
    return f"{secs // 3600}:{secs % 3600 // 60:02d}:{secs % 60:02d}"


def format_lr(lr) -> str:
    """The learning rate(s) of the optimizer's ``options_view.lr``: one value, or a list
    when the parameter groups differ (e.g. trunk and head), with 6 significant digits."""
    values = list(lr) if isinstance(lr, (list, tuple, set)) else [lr]
    values = [float(v) for v in values]
    if len(set(values)) == 1:
        return f"{values[0]:.6g}"
    return "[" + ", ".join(f"{v:.6g}" for v in values) + "]"


def progress_line(epoch, num_epochs, iteration, max_iteration, loss, lr, rate) -> str:
    """The hook's line.

    Args:
        epoch: 0-based training epoch (printed 1-based).
        num_epochs: number of training epochs.
        iteration: iterations done in the whole run.
        max_iteration: iterations of the whole run.
        loss: last iteration's loss.
        lr: learning rate(s) (see :func:`format_lr`).
        rate: iterations per second (0 when unknown).

    Returns:
        ``"progress: epoch E/N | iter I/T | loss L | lr LR | R it/s | ETA H:MM:SS"``.
    """
    eta = (max_iteration - iteration) / rate if rate > 0 else float("nan")
    return (f"progress: epoch {epoch + 1}/{num_epochs} | iter {iteration}/{max_iteration} | "
            f"loss {loss:.4f} | lr {format_lr(lr)} | {rate:.2f} it/s | ETA {format_seconds(eta)}")


class ProgressHook(NoOpHook):
    """Logs :func:`progress_line` on rank 0 every ``frequency`` training iterations and
    at the end of every training epoch (not twice for the same iteration)."""

    def __init__(self, frequency: int = DEFAULTS["FREQUENCY"]):
        super().__init__()
        self.frequency = int(frequency)
        self.t0 = self.it0 = self.loss = self.lr = None
        self.last_printed = -1

    def on_start(self, task) -> None:
        """Start the clock and print the run's first line."""
        self.t0, self.it0 = time.perf_counter(), int(task.iteration)
        self.loss = self.lr = None

    def _log(self, task, done: int) -> None:
        """Log the line for ``done`` iterations of the run (rank 0, once per iteration)."""
        from vissl_swav_plugin.utils.distributed import rank

        if rank() != 0 or done == self.last_printed or self.loss is None:
            return
        elapsed = time.perf_counter() - self.t0
        rate = (done - self.it0) / elapsed if elapsed > 0 and done > self.it0 else 0.0
        logging.info(progress_line(int(task.train_phase_idx), int(task.num_train_phases), done,
                                   int(task.max_iteration), self.loss, self.lr, rate))
        self.last_printed = done

    def on_update(self, task) -> None:
        """Print the progress line every ``FREQUENCY`` iterations."""
        if not task.train:
            return
        if self.t0 is None:
            self.on_start(task)
        # VISSL counts the iteration after on_update: this one is number task.iteration + 1
        self.loss, self.lr = float(task.last_batch.loss), task.optimizer.options_view.lr
        done = int(task.iteration) + 1
        if done % self.frequency == 0:
            self._log(task, done)

    def on_phase_end(self, task) -> None:
        """Print the epoch's summary line."""
        if task.train:
            self._log(task, int(task.iteration))


@register_monitor_hooks
def progress_hooks(cfg) -> List[NoOpHook]:
    """``[ProgressHook]`` when ``config.HOOKS.PROGRESS.ENABLED`` (the default), else ``[]``."""
    c = progress_config(cfg)
    return [ProgressHook(c["FREQUENCY"])] if c["ENABLED"] else []
