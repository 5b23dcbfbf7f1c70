"""What a training step reads from the config, read once at set-up into typed settings: the step
methods of ``trainers/trainer.py`` take every number and switch from here, never from ``cfg``
(the keys' defaults, ranges and docs live in the run schema, ``core/schema/train.py``; this is only
where the recipe takes them, each section bound typed with ``bind``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from ..core.schema import bind
from ..core.schema.train import Diagnostics, Trainer, Val
from ..rollout.settings import ToolSettings
from .algos.algo_config import read_key, to_dict
from .components import stats_kwargs

__all__ = ["StepSettings"]


@dataclass(frozen=True)
class StepSettings:
    seed: int  # trainer.seed: every seed of the run derives from it (core/seeds.py)
    ppo_epochs: int  # passes over the step batch
    reuse_stats_forward: bool  # the first update pass's forward is the statistics pass's (data/first_pass.py)
    rollout_n: int  # responses per prompt
    mini_batch_rows: int  # responses per optimizer step: trainer.mini_batch_prompts x rollout.n
    micro_batch_responses: int  # responses per forward/backward (and per token-statistics chunk)
    micro_batch_tokens: int | None  # a token budget per pass instead (data/micro_batches.py)
    grad_clip: float  # max gradient norm
    keep_checkpoints: int  # checkpoints kept on disk
    quadrants: bool  # diagnostics.quadrants: the four-quadrant metrics and prediction
    mask_invalid_calls: bool = False  # tools.mask_invalid_calls: a response with a malformed tool call out of the loss
    mask_repeated: bool = False  # tools.mask_repeated: a response that runs the same code twice out of the loss
    drop_void_turns: bool = False  # tools.drop_void_turns: a response with a void turn out of the loss
    overlong_filter: bool = False  # algo.overlong.filter: a response cut at the length budget out of the loss
    entropy_quantiles: tuple[float, ...] = ()  # diagnostics.entropy_quantiles (empty: off)
    val_temperature: float = 0.0  # validation on the task's held-out prompts
    val_pass_k: int = 0  # sampled pass@1 / pass@k at validation (0: off)
    val_benchmarks: tuple[str, ...] = ()  # val.benchmarks
    samples_every: int = 0  # trainer.samples_every: a samples table every N steps (0: off)
    samples_rows: int = 4  # rows of each samples table
    val: Any = None  # the val section, as evals.runner.validate reads it
    tools: Any = None  # the tools section: benchmark validation samples through the same tool driver
    rollout_max_new_tokens: int = 0  # rollout.max_new_tokens: benchmark validation's cap when val.max_new_tokens is null
    lora: Any = None  # model.lora, for the adapter's checkpoint parts
    stats: dict = field(default_factory=dict)  # keyword arguments of the token statistics
    config_yaml: str = ""  # the resolved config, as every checkpoint keeps a copy of it

    @property
    def tool_switches(self) -> dict[str, bool]:
        """The recipe switches that leave whole responses out of the loss (``tool_stats.loss_mask``)."""
        return {"invalid_calls": self.mask_invalid_calls, "repeated": self.mask_repeated, "void_turns": self.drop_void_turns}

    @classmethod
    def from_config(cls, cfg) -> StepSettings:
        t, diag, val = bind(Trainer, cfg.trainer), bind(Diagnostics, cfg.diagnostics), bind(Val, cfg.val)
        tools = ToolSettings.from_config(cfg.get("tools"))
        return cls(
            seed=t.seed,
            ppo_epochs=t.ppo_epochs,
            reuse_stats_forward=t.reuse_stats_forward,
            rollout_n=int(cfg.rollout.n),
            mini_batch_rows=t.mini_batch_prompts * int(cfg.rollout.n),
            micro_batch_responses=t.micro_batch_responses,
            micro_batch_tokens=t.micro_batch_tokens or None,
            grad_clip=float(t.grad_clip),
            keep_checkpoints=t.keep_checkpoints,
            quadrants=diag.quadrants,
            mask_invalid_calls=tools.mask_invalid_calls,
            mask_repeated=tools.mask_repeated,
            drop_void_turns=tools.drop_void_turns,
            overlong_filter=bool(read_key(to_dict(cfg.algo), "overlong.filter")),
            entropy_quantiles=tuple(float(q) for q in diag.entropy_quantiles or ()),
            val_temperature=float(val.temperature),
            val_pass_k=val.pass_k,
            val_benchmarks=tuple(str(b) for b in val.benchmarks),
            samples_every=t.samples_every,
            samples_rows=t.samples_rows,
            val=cfg.val,
            tools=cfg.get("tools"),
            rollout_max_new_tokens=int(cfg.rollout.max_new_tokens),
            lora=cfg.model.get("lora"),
            stats=stats_kwargs(cfg),
            config_yaml=OmegaConf.to_yaml(cfg, resolve=True),
        )
