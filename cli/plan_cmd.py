"""``entropyrl plan [overrides...]``: what one training step of the composed run costs, offline
(``models/cost.plan_figures``): parameters, FLOPs, tokens, memory per rank, the vLLM engine's share of
each GPU, a fits / does-not-fit verdict per rank, the checkpoint size, step time at a stated MFU (and
with generation overlapped, ``trainer.staleness >= 1``), and the assumptions all of it rests on."""

from __future__ import annotations

import json
from typing import List, Optional

import typer


def _step_rows(f: dict) -> list[tuple[str, str]]:
    """The rows every plan has: the model, the step's tokens, FLOPs, memory per rank and step time."""
    m = f["memory_gb"]
    return [
        ("model", f"{f['model']} ({f['parameters'] / 1e9:.3g}B parameters; from {f['architecture']})"),
        (
            "step",
            f"{f['sequences']} sequences x (prompt {f['prompt_len']} + response {f['response_len']}) tokens "
            f"= {f['tokens']:,} tokens; {f['generated_tokens']:,} generated",
        ),
        ("training FLOPs / step", f"{f['train_flops']:.3e}"),
        ("generation FLOPs / step", f"{f['generation_flops']:.3e}"),
        (
            f"memory per rank ({f['ranks']} ranks, FSDP {'on' if f['fsdp'] else 'off'})",
            f"weights {m['weights']:.2f} GB, gradients {m['gradients']:.2f} GB, optimizer {m['optimizer']:.2f} GB, "
            f"activations {m['activations']:.2f} GB ({m['activations_checkpointed']:.2f} GB checkpointed)",
        ),
        (
            "memory per rank, total",
            f"{m['total']:.2f} GB (gradient checkpointing {'on' if f['gradient_checkpointing'] else 'off'})",
        ),
        (
            f"step time at MFU {f['mfu']:.0%} of {f['peak_tflops_per_rank']:g} TFLOP/s per rank",
            f"{f['step_seconds']:.1f} s (training {f['train_seconds']:.1f} s, generation {f['generation_seconds']:.1f} s "
            f"at MFU {f['decode_mfu']:.0%})"
            if f["step_seconds"] is not None
            else "-",
        ),
    ]


def _async_row(a: dict) -> tuple[str, str]:
    """The step time with generation overlapped (``trainer.staleness >= 1``)."""
    return (
        "step time with trainer.staleness >= 1",
        f"{a['step_seconds']:.1f} s if generation fully overlaps training: ideal speed-up "
        f"{a['ideal_speedup']:.2f}x over taking turns (this config: staleness {a['staleness']}, "
        f"{'the worker on ' + str(a['rollout_gpus']) + ' GPU(s) of its own' if a.get('rollout_gpus') else 'the worker beside the trainer'}; "
        f"verl publishes one-step-off +23-40 %, fully async 2.66x on 32 GPUs)",
    )


def _cpu_row(f: dict, cpu: dict) -> tuple[str, str]:
    """The step time on a CPU, the rates it assumes in the label."""
    return (
        f"step time on a CPU ({cpu['gflops']:g} GFLOP/s, decode {cpu['decode_gflops']:g} GFLOP/s, "
        f"{cpu['mem_gbps']:g} GB/s; efficiency decode {cpu['decode_efficiency']:g}, training {cpu['train_efficiency']:g})",
        f"{cpu['step_seconds']:.1f} s (prefill {cpu['prefill_seconds']:.1f} s, decode {cpu['decode_seconds']:.1f} s "
        f"= {f['response_len']} steps x {cpu['decode_step_seconds']:.3f} s, its roofline the longer of weights "
        f"{cpu['decode_step_memory_seconds']:.3f} s and FLOPs {cpu['decode_step_flop_seconds']:.3f} s; "
        f"training {cpu['train_seconds']:.1f} s)",
    )


def _engine_row(e: dict, v: dict) -> tuple[str, str]:
    """The vLLM engine's share of the GPU: its weights and KV cache."""
    return (
        "vLLM engine, " + e.get("placement", "beside the trainer"),
        f"{e['share']:.0%} of {v['gpu_gb']:g} GB = {e['gb']:.1f} GB: weights "
        f"{e['weights_gb']:.1f} GB, KV cache {e['kv_cache_gb']:.1f} GB ({e['kv_cache_tokens']:,} tokens, "
        f"{e['sequences_at_max_len']:,} full-length sequences at once)",
    )


def _checkpoint_row(c: dict) -> tuple[str, str]:
    """A checkpoint's size, how often one is saved and the disk the kept ones take."""
    return (
        "checkpoint",
        f"{c['gb']:.1f} GB each ({c['holds']}), every {c['save_every'] or 'run end'}"
        f"{' steps' if c['save_every'] else ''}, {c['keep'] or 'all'} kept: {c['disk_gb']:.1f} GB on disk",
    )


def _verdict_row(f: dict, e: dict | None, v: dict) -> tuple[str, str]:
    """Fits or does not fit per rank, and why: the trainer's memory against what the GPU leaves it."""
    word = "FITS" if v["fits"] else "DOES NOT FIT"
    why = f"trainer {v['trainer_gb']:.1f} GB of the {v['trainer_budget_gb']:.1f} GB " + (
        "left beside the vLLM engine" if e and e.get("placement", "beside the trainer") == "beside the trainer" else "of the GPU"
    )
    if e and not e["fits"]:
        why += f"; the engine's {e['gb']:.1f} GB does not hold its weights and one full-length sequence"
    return (f"verdict per rank ({f['ranks']} x {v['gpu_gb']:g} GB GPU)", f"{word}: {why}")


def _to_fit(f: dict, e: dict | None, v: dict) -> str:
    """What would make a plan that does not fit fit."""
    return (
        "to fit: more ranks (--ranks; FSDP shards weights, gradients and optimizer), "
        + ("" if f["gradient_checkpointing"] else "trainer.gradient_checkpointing=true, ")
        + "a smaller trainer.micro_batch_responses"
        + (", a lower rollout.gpu_memory_utilization" if e and not v["trainer_fits"] else "")
        + (", a higher rollout.gpu_memory_utilization or rollout.tensor_parallel_size" if e and not e["fits"] else "")
    )


def _table(f: dict) -> str:
    """The plan's figures (``models/cost.plan_figures``) as aligned label / value rows, then what
    would make it fit (when it does not) and the assumptions."""
    e, v, c = f["vllm"], f["verdict"], f["checkpoint"]
    rows = _step_rows(f)
    if f.get("async"):
        rows.append(_async_row(f["async"]))
    if f.get("cpu"):
        rows.append(_cpu_row(f, f["cpu"]))
    if e:
        rows.append(_engine_row(e, v))
    rows.append(_checkpoint_row(c))
    rows.append(_verdict_row(f, e, v))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {val}" for k, val in rows]
    if not v["fits"]:
        lines.append(_to_fit(f, e, v))
    lines += ["assumptions:"] + [f"  - {a}" for a in f["assumptions"]]
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    @app.command(
        "plan",
        help="What one training step of [bold]entropyrl train <overrides>[/bold] costs, offline: parameters, "
        "FLOPs and tokens per step, memory per rank (weights, gradients, optimizer sharded over the "
        "ranks, activations with and without checkpointing), the vLLM engine's share of each GPU, a fits / "
        "does-not-fit verdict per rank, the checkpoint size, step time at a stated MFU, and its assumptions. "
        "[cyan]entropyrl plan experiment=dapo_7b --ranks 8[/cyan]",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def plan(
        overrides: Optional[List[str]] = typer.Argument(None, help="key=value config overrides"),
        ranks: int = typer.Option(1, "--ranks", help="data-parallel ranks (GPUs)"),
        mfu: float = typer.Option(0.4, "--mfu", help="model FLOPs utilisation assumed for the step time"),
        peak_tflops: float = typer.Option(989.0, "--peak-tflops", help="peak dense TFLOP/s per rank (H100 bf16: 989)"),
        gpu_gb: float = typer.Option(80.0, "--gpu-gb", help="memory per GPU in GB, for the verdict (H100: 80, H200: 141)"),
        decode_mfu: Optional[float] = typer.Option(
            None, "--decode-mfu", help="MFU assumed for generation (decoding is memory-bound; default: --mfu)"
        ),
        prompt_len: Optional[int] = typer.Option(
            None, "--prompt-len", help="prompt tokens (default data.max_prompt_length, else 256)"
        ),
        cpu: bool = typer.Option(
            False, "--cpu", help="also the step time on a CPU: generation bound by memory bandwidth or FLOPs, training by FLOPs"
        ),
        cpu_gflops: Optional[float] = typer.Option(
            None,
            "--cpu-gflops",
            help="with --cpu: matmul GFLOP/s of the threads a run uses (make bench: real_model.rates.matmul_gflops)",
        ),
        cpu_decode_gflops: Optional[float] = typer.Option(
            None,
            "--cpu-decode-gflops",
            help="with --cpu: GFLOP/s of a decode step's few-row products (make bench: real_model.rates.decode_matmul_gflops)",
        ),
        cpu_decode_efficiency: Optional[float] = typer.Option(
            None,
            "--cpu-decode-efficiency",
            help="with --cpu: share of its roofline a decode step reaches (bench: decode_roofline_frac)",
        ),
        cpu_train_efficiency: Optional[float] = typer.Option(
            None, "--cpu-train-efficiency", help="with --cpu: share of the matmul rate training reaches (bench: train_flops_frac)"
        ),
        mem_gbps: Optional[float] = typer.Option(
            None, "--mem-gbps", help="with --cpu: memory bandwidth in GB/s (make bench: real_model.rates.bandwidth_gbps)"
        ),
        as_json: bool = typer.Option(False, "--json", help="print the figures as JSON"),
    ) -> None:
        from ..models import cost  # torch (the embedded tokenizer) loads when it runs

        given = {
            "gflops": cpu_gflops,
            "mem_gbps": mem_gbps,
            "decode_gflops": cpu_decode_gflops,
            "decode_efficiency": cpu_decode_efficiency,
            "train_efficiency": cpu_train_efficiency,
        }
        rates = given if cpu or any(v is not None for v in given.values()) else None
        figures = cost.plan_figures(
            overrides or [],
            ranks=ranks,
            mfu=mfu,
            peak_tflops=peak_tflops,
            prompt_len=prompt_len,
            gpu_gb=gpu_gb,
            decode_mfu=decode_mfu,
            cpu=rates,
        )
        typer.echo(json.dumps(figures, indent=2) if as_json else _table(figures))
