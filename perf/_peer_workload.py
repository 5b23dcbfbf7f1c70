"""The workload of ``make bench-peers`` as one dict of settings, read from each side's own config.

``ours(cfg)`` reads it from the composed config of ``entropyrl train`` (the run ``perf/peers.py``
starts); ``trl_config_kwargs(workload)`` maps it onto TRL's ``GRPOConfig`` keywords, and
``from_trl_config(args)`` reads it back from the ``GRPOConfig`` object TRL actually trained with
(``perf/_peer_trl.py`` records it). ``differences`` compares the two field by field: the report
says whether they are equal, and ``tests/perf/test_peers.py`` checks the mapping without TRL.

Standard library only: this file is imported in the product venv (the driver, the test) and in the
peer's venv (``.venv-peers``, where ``entropyrl``'s dependencies are not installed).

One of our steps is one batch of ``prompts_per_step`` x ``samples_per_prompt`` responses, split into
``updates_per_step`` optimizer updates of ``responses_per_update`` responses each (our
``trainer.mini_batch_prompts``; TRL's ``steps_per_generation``: one generation feeds that many
optimizer steps). A TRL "global step" is one optimizer update, so one of our steps is
``updates_per_step`` of TRL's.
"""

from __future__ import annotations

# The fields, in report order: what both sides must agree on (the timings are not part of it).
FIELDS = (
    "model_dir",  # the Hugging Face folder both sides load (the warm-started embedded model, or the real model)
    "dtype",
    "gradient_checkpointing",  # activations recomputed in the backward (TRL's default: on; ours: off)
    "seed",
    "threads",  # torch threads of the training process
    "steps",  # our steps (TRL: optimizer steps / updates_per_step)
    "prompts_per_step",
    "samples_per_prompt",
    "max_new_tokens",
    "stop_token_ids",  # the token ids a response ends at (ours: the policy's generation_config; TRL: its eos_token_ids)
    "temperature",
    "top_p",
    "top_k",  # 0: off
    "epochs",  # passes over a step's batch (TRL: num_iterations)
    "updates_per_step",  # optimizer updates per pass (TRL: steps_per_generation)
    "responses_per_update",
    "lr",
    "betas",
    "weight_decay",
    "scheduler",
    "warmup_steps",
    "grad_clip",
    "advantage",  # grpo: (r - group mean) / group std
    "clip_low",
    "clip_high",
    "dual_clip",  # None: off (TRL has none)
    "loss_agg",
    "kl_coef",
    "interventions",
    "prompts_sha256",  # the prompts of every step, in order (each side hashes what it trained on)
)

# Our names of the loss aggregation and advantage against TRL's ``loss_type`` / ``scale_rewards``.
LOSS_AGG_TO_TRL = {"token-mean": "dapo", "seq-mean-token-mean": "grpo"}
ADVANTAGE_TO_TRL = {"grpo": "group", "drgrpo": "none"}


def _get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = cfg[part] if isinstance(cfg, dict) else getattr(cfg, part)
    return cfg


def ours(cfg, *, model_dir: str, threads: int, prompts_sha256: str, stop_token_ids) -> dict:
    """The workload of our composed train config ``cfg`` (attribute or key access), with the facts
    the config does not hold: the model folder it resolves to, the threads the run uses, the hash
    of its prompts and the token ids its responses end at."""
    prompts, mini = int(_get(cfg, "trainer.prompts_per_step")), int(_get(cfg, "trainer.mini_batch_prompts"))
    n = int(_get(cfg, "rollout.n"))
    betas = _get(cfg, "optim.betas")
    dual = _get(cfg, "algo.clip.dual_c")
    return {
        "model_dir": str(model_dir),
        "dtype": str(_get(cfg, "trainer.dtype")),
        "gradient_checkpointing": bool(_get(cfg, "trainer.gradient_checkpointing")),
        "seed": int(_get(cfg, "trainer.seed")),
        "threads": int(threads),
        "steps": int(_get(cfg, "trainer.total_steps")),
        "prompts_per_step": prompts,
        "samples_per_prompt": n,
        "max_new_tokens": int(_get(cfg, "rollout.max_new_tokens")),
        "stop_token_ids": sorted({int(t) for t in stop_token_ids}),
        "temperature": float(_get(cfg, "rollout.temperature")),
        "top_p": float(_get(cfg, "rollout.top_p")),
        "top_k": int(_get(cfg, "rollout.top_k") or 0),
        "epochs": int(_get(cfg, "trainer.ppo_epochs")),
        "updates_per_step": prompts // mini,
        "responses_per_update": mini * n,
        "lr": float(_get(cfg, "optim.lr")),
        "betas": [float(b) for b in betas],
        "weight_decay": float(_get(cfg, "optim.weight_decay")),
        "scheduler": str(_get(cfg, "optim.scheduler")),
        "warmup_steps": int(_get(cfg, "optim.warmup_steps")),
        "grad_clip": float(_get(cfg, "trainer.grad_clip")),
        "advantage": str(_get(cfg, "algo.advantage")),
        "clip_low": float(_get(cfg, "algo.clip.low")),
        "clip_high": float(_get(cfg, "algo.clip.high")),
        "dual_clip": None if dual is None else float(dual),
        "loss_agg": str(_get(cfg, "algo.loss_agg")),
        "kl_coef": float(_get(cfg, "algo.kl_coef")),
        "interventions": list(_get(cfg, "algo.interventions")),
        "prompts_sha256": prompts_sha256,
    }


def trl_config_kwargs(workload: dict) -> dict:
    """TRL ``GRPOConfig`` keywords for ``workload`` (the settings that shape the training; the
    harness's own, such as the output folder and logging, are the caller's). Raises ValueError for
    a workload TRL cannot express (dual clip, an intervention, an unmapped loss or advantage)."""
    w = workload
    if w["dual_clip"] is not None or w["interventions"]:
        raise ValueError("TRL's GRPOTrainer has no dual clip or entropy intervention: run ours with them off")
    if w["loss_agg"] not in LOSS_AGG_TO_TRL or w["advantage"] not in ADVANTAGE_TO_TRL:
        raise ValueError(f"no TRL equivalent of loss_agg={w['loss_agg']} / advantage={w['advantage']}")
    if w["responses_per_update"] * w["updates_per_step"] != w["prompts_per_step"] * w["samples_per_prompt"]:
        raise ValueError("the updates of a step must cover its batch once (TRL's steps_per_generation)")
    if w["scheduler"] != "constant" or w["warmup_steps"] != 0:
        raise ValueError("only a constant learning rate without warm-up is mapped")
    return {
        "seed": w["seed"],
        "gradient_checkpointing": w["gradient_checkpointing"],
        "max_steps": w["steps"] * w["updates_per_step"] * w["epochs"],
        "num_generations": w["samples_per_prompt"],
        "per_device_train_batch_size": w["responses_per_update"],
        "gradient_accumulation_steps": 1,
        "steps_per_generation": w["updates_per_step"],
        "num_iterations": w["epochs"],
        "max_completion_length": w["max_new_tokens"],
        "temperature": w["temperature"],
        "top_p": w["top_p"],
        "top_k": w["top_k"],
        "learning_rate": w["lr"],
        "adam_beta1": w["betas"][0],
        "adam_beta2": w["betas"][1],
        "weight_decay": w["weight_decay"],
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "max_grad_norm": w["grad_clip"],
        "scale_rewards": ADVANTAGE_TO_TRL[w["advantage"]],
        "epsilon": w["clip_low"],
        "epsilon_high": w["clip_high"],
        "loss_type": LOSS_AGG_TO_TRL[w["loss_agg"]],
        "beta": w["kl_coef"],
        "top_entropy_quantile": 1.0,
        "shuffle_dataset": False,  # the prompts in our order: step k trains on our step k's prompts
    }


def from_trl_config(args, *, model_dir: str, dtype: str, threads: int, prompts_sha256: str, stop_token_ids) -> dict:
    """The workload a TRL ``GRPOConfig`` (or any object with its attributes) trains with, with the
    facts it does not hold (the folder the model was loaded from, its dtype, the torch threads,
    the hash of the prompts the reward function saw, the token ids its generation ends at)."""
    trl_loss = {v: k for k, v in LOSS_AGG_TO_TRL.items()}
    trl_adv = {v: k for k, v in ADVANTAGE_TO_TRL.items()}
    updates, epochs = int(args.steps_per_generation), int(args.num_iterations)
    responses = int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps)
    scale = args.scale_rewards
    scale = {True: "group", False: "none"}.get(scale, scale) if isinstance(scale, bool) else str(scale)
    sched = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    return {
        "model_dir": str(model_dir),
        "dtype": str(dtype),
        "gradient_checkpointing": bool(args.gradient_checkpointing),
        "seed": int(args.seed),
        "threads": int(threads),
        "steps": int(args.max_steps) // (updates * epochs),
        "prompts_per_step": int(args.generation_batch_size) // int(args.num_generations),
        "samples_per_prompt": int(args.num_generations),
        "max_new_tokens": int(args.max_completion_length),
        "stop_token_ids": sorted({int(t) for t in stop_token_ids}),
        "temperature": float(args.temperature),
        "top_p": float(args.top_p),
        "top_k": int(args.top_k or 0),
        "epochs": epochs,
        "updates_per_step": updates,
        "responses_per_update": responses,
        "lr": float(args.learning_rate),
        "betas": [float(args.adam_beta1), float(args.adam_beta2)],
        "weight_decay": float(args.weight_decay),
        "scheduler": str(sched),
        "warmup_steps": int(args.warmup_steps) + (1 if float(getattr(args, "warmup_ratio", 0) or 0) else 0),
        "grad_clip": float(args.max_grad_norm),
        "advantage": trl_adv.get(scale, f"trl:{scale}"),
        "clip_low": float(args.epsilon),
        "clip_high": float(args.epsilon_high if args.epsilon_high is not None else args.epsilon),
        "dual_clip": None,
        "loss_agg": trl_loss.get(str(args.loss_type), f"trl:{args.loss_type}"),
        "kl_coef": float(args.beta),
        "interventions": [] if float(getattr(args, "top_entropy_quantile", 1.0)) == 1.0 else ["top_entropy_quantile"],
        "prompts_sha256": prompts_sha256,
    }


def differences(a: dict, b: dict) -> list[str]:
    """``field: a != b`` for every field of ``FIELDS`` where the two workloads differ."""
    return [f"{k}: {a.get(k)!r} != {b.get(k)!r}" for k in FIELDS if a.get(k) != b.get(k)]
