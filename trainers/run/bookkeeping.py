"""The bookkeeping around the training loop (``GRPOTrainer._fit``), so that the loop itself reads as
the steps: when a step is followed by validation or a checkpoint (``RunPlan``), what the run does
once before its first step (``start_run``, ``record_config``), which one-line error a failed step
ends with (``run_failure``), the line a stopped run leaves (``stopped_message``), and the run's own
fields of ``summary.json`` (``summary_fields``; the figures are ``run_report.write_run_report``'s).
"""

from __future__ import annotations

import errno
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from omegaconf import DictConfig, OmegaConf

from ...core.errors import UserError
from ..algos.algo_config import tracked_config
from ..parallel import distributed
from ..parallel.distributed import DistInfo
from . import run_dir
from . import samples as run_samples
from .names import default_run_name
from .oom import is_out_of_memory, memory_error

__all__ = [
    "RunPlan",
    "start_run",
    "record_config",
    "run_failure",
    "lost_peer_is_one_line",
    "stopped_message",
    "summary_fields",
]


@dataclass(frozen=True)
class RunPlan:
    """The loop's cadence, read once from ``cfg.trainer``: ``total_steps``, validation every
    ``val_every`` steps and a checkpoint every ``save_every`` steps (0: neither but at the end), and
    whether rank 0 shows the progress bar (``progress``)."""

    total: int
    val_every: int
    save_every: int
    progress: bool

    @classmethod
    def from_config(cls, trainer_cfg) -> RunPlan:
        return cls(
            total=int(trainer_cfg.total_steps),
            val_every=int(trainer_cfg.val_every),
            save_every=int(trainer_cfg.save_every),
            progress=bool(trainer_cfg.progress),
        )

    def validates(self, step: int) -> bool:
        """Whether the step just trained (``step``, counted from 1) is followed by validation: every
        ``val_every`` steps and the last step, none when ``val_every`` is 0."""
        return self.val_every > 0 and (step % self.val_every == 0 or step == self.total)

    def saves(self, step: int) -> bool:
        """Whether the step just trained is followed by a checkpoint: the last step always, and
        every ``save_every`` steps."""
        return step == self.total or (self.save_every > 0 and step % self.save_every == 0)


def start_run(cfg: DictConfig, tracker, dist: DistInfo, *, resumed: int | None, step: int, log: Callable[[str], None]) -> None:
    """What a run does once its set-up succeeded: say when it has nothing left to train, open its
    MLflow run (named by what differs from the defaults: ``names.default_run_name``; the same run
    when resuming), and on a resume drop the samples of the steps it redoes."""
    total = int(cfg.trainer.total_steps)
    if step >= total:
        log(
            f"the run is already at step {step} (trainer.total_steps={total}): nothing to train; "
            f"raise trainer.total_steps to continue it"
        )
    run_name = cfg.tracking.get("run_name") or default_run_name(cfg)  # what differs, in the name
    # start-up succeeded: only now the folder gets its MLflow run and config.yaml
    tracker.start(tracked_config(cfg), run_name, resume_step=resumed)
    if resumed is not None and dist.is_main:  # the samples of steps this run redoes
        run_samples.drop_after(Path(cfg.output_dir), resumed)


def record_config(cfg: DictConfig, tracker, dist: DistInfo, *, resumed: int | None, log: Callable[[str], None]) -> None:
    """Before the first step: a resumed run's ``metrics.jsonl`` checked (deleted or cut short: rebuilt
    from the checkpoint), the resolved ``config.yaml`` written (rank 0), and on a fresh run logged
    to MLflow."""
    output_dir = Path(cfg.output_dir)
    run_dir.check_metrics_record(output_dir, resumed, log)
    if dist.is_main:
        run_dir.atomic_write_text(output_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    if resumed is None:
        tracker.log_artifact(output_dir / "config.yaml")


def run_failure(exc: BaseException, cfg: DictConfig, dist: DistInfo, device, *, step: int, saved_step: int) -> Exception | None:
    """The one-line error (``UserError``) that replaces ``exc``, raised while the run was at step
    ``step`` with its last checkpoint at ``saved_step``; None when ``exc`` is raised as it is.

    - a write that failed (``OSError``: disk full, read-only or vanished folder): the path, the fix,
      and where a resume starts (``storage_error``);
    - another rank that died or stalled: one line, not gloo's traceback (``distributed.peer_failure``);
    - out of memory: the knobs to turn (``oom.memory_error``); the failed step's tensors are let go
      (``exc``'s traceback dropped) before the summary is written."""
    if isinstance(exc, OSError):
        return storage_error(exc, Path(cfg.output_dir), saved_step)
    timeout = distributed.collective_timeout_s(cfg.trainer)
    lost = distributed.peer_failure(exc, dist, timeout, step + 1, saved_step)
    if lost is not None:
        return lost
    if not is_out_of_memory(exc):
        return None
    error = memory_error(exc, cfg, step + 1, saved_step, str(device))
    exc.__traceback__ = None
    return error


@contextmanager
def lost_peer_is_one_line(cfg: DictConfig, during: str) -> Iterator[None]:
    """Around what a run does before its first step (``during``: "during set-up", "before its first
    step"): a collective that fails there because another rank died or stalled ends in
    ``peer_failure``'s one line instead of gloo's traceback, as a failed step does. This rank's place
    comes from the launcher's environment (the process group may be what failed)."""
    try:
        yield
    except RuntimeError as exc:
        env = distributed.launcher_env()
        info = DistInfo(rank=env["rank"], world_size=env["world_size"])
        lost = distributed.peer_failure(exc, info, distributed.collective_timeout_s(cfg.trainer), during=during)
        if lost is None:
            raise
        raise lost from None


def stopped_message(step: int, total: int, saved_step: int, output_dir: Path) -> str:
    """The line a stopped run leaves: where it stopped, its last checkpoint and how to continue."""
    return (
        f"stopped at step {step} of {total}"
        + (f"; checkpoint at step {saved_step}" if saved_step else "; no checkpoint yet")
        + f". To continue, run the same command again (output_dir={output_dir}, "
        f"trainer.resume=auto)" + (f": it resumes from step {saved_step}" if saved_step else "")
    )


def summary_fields(cfg: DictConfig, status: str, steps: int, dist: DistInfo, tracker, nodes: list[str], started: float) -> dict:
    """The run's own fields of ``summary.json``: status, steps, algorithm and folder; on rank 0 also
    the ranks and their nodes, the MLflow run and the wall seconds since ``started``
    (``time.perf_counter``); on the other ranks their rank (rank 0 writes the summary)."""
    run = {"status": status, "steps": steps, "algo": str(cfg.algo.name), "output_dir": str(Path(cfg.output_dir))}
    if not dist.is_main:
        return {**run, "rank": dist.rank}
    return {
        **run,
        "world_size": dist.world_size,
        "nodes": nodes,
        "mlflow_run_id": tracker.run_id,
        "tracking_uri": tracker.uri if tracker.enabled else None,
        "wall_seconds": time.perf_counter() - started,
    }


def storage_error(exc: OSError, output_dir: Path, saved_step: int) -> UserError:
    """One line for a write that failed mid-run (disk full, read-only, vanished folder): the path,
    the fix, and where a resume starts."""
    fixes = {
        errno.ENOSPC: "free space on that disk (or run with output_dir=... on another one)",
        errno.EDQUOT: "free space in your quota (or run with output_dir=... elsewhere)",
        errno.EROFS: "make that file system writable again",
        errno.EFBIG: "raise the file-size limit (ulimit -f)",
        errno.EACCES: "make the folder writable again",
        errno.EPERM: "make the folder writable again",
        errno.ENOENT: "the folder vanished: restore it (or start fresh with another output_dir=...)",
    }
    fix = fixes.get(exc.errno, "make the folder writable again")
    resume = (
        f"the checkpoint at step {saved_step} is intact: run the same command again to resume from it"
        if saved_step
        else "no checkpoint was saved yet: run the same command again to start over"
    )
    return UserError(f"cannot write {exc.filename or output_dir}: {exc.strerror or exc}; {fix}, then {resume}")
