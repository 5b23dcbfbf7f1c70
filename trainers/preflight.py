"""Every check of a training run that needs no model, run once per command before anything of the
run is created (no folder, no model, no MLflow run): the algorithm's and the interventions' values,
by building the ``Algorithm``, the optimizer's and schedule's names (``optim.check_optim``), the
``tools`` section (``tool_executor.check_tools``: call format, tags, sandbox limits), an
explicit ``data.path`` (a file, not a folder or a typo) and
what to do with ``output_dir``. The composed config's own table
(types and ranges of trainer, rollout, model, tracking keys) was checked by ``conf.compose``.

    checked = check_training(cfg)          # UserError: one line naming the key
    train(cfg, checked=checked)            # the trainer uses checked.algo and checked.run_mode
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import UserError
from ..core.registry import unknown_choice
from ..core.schema.lora import check_lora_is_on_where_set
from ..evals.code.tool_executor import check_tools
from ..evals.prompts import available_templates
from .algos.algorithm import Algorithm
from .async_rollout import check_async
from .data.datasets import resolve_data_path
from .optim import check_optim
from .run import run_dir

__all__ = ["TrainingCheck", "check_training"]


@dataclass(frozen=True)
class TrainingCheck:
    """What ``check_training`` built and decided: the algorithm and what to do with ``output_dir``."""

    algo: Algorithm
    run_mode: str  # fresh | resume | overwrite (run_dir.check_output_dir)


def check_training(cfg) -> TrainingCheck:
    """The algorithm (``Algorithm.from_train_config``), the optimizer (``optim.name`` /
    ``optim.scheduler`` are registered names) and the output folder's mode
    (``run_dir.check_output_dir``) of a composed ``train`` config; raises ``UserError``."""
    algo = Algorithm.from_train_config(cfg)
    check_optim(cfg.optim)
    check_lora_is_on_where_set(cfg.model.get("lora"))  # LoRA keys without a rank: read by nothing
    if cfg.val.benchmarks and str(cfg.val.prompt) not in available_templates():
        raise UserError(unknown_choice("val.prompt", cfg.val.prompt, available_templates()))
    check_tools(cfg.get("tools"))
    check_async(cfg)  # trainer.staleness with an engine that has no asynchronous path: refused
    if cfg.data.kind in ("math", "code"):
        resolve_data_path(cfg.data)  # an explicit data.path that is not a file: an error now
    return TrainingCheck(algo, run_dir.check_output_dir(cfg))
