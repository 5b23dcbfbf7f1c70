"""``entropyrl plan [overrides...]``: what one training step of the composed run costs, offline
(``models/cost.plan_figures``): parameters, FLOPs, tokens, memory per rank, step time at a stated MFU."""

from __future__ import annotations

import json
from typing import List, Optional

import typer


def _table(f: dict) -> str:
    m = f["memory_gb"]
    rows = [
        ("model", f"{f['model']} ({f['parameters'] / 1e9:.3g}B parameters; from {f['architecture']})"),
        ("step", f"{f['sequences']} sequences x (prompt {f['prompt_len']} + response {f['response_len']}) tokens "
                 f"= {f['tokens']:,} tokens; {f['generated_tokens']:,} generated"),
        ("training FLOPs / step", f"{f['train_flops']:.3e}"),
        ("generation FLOPs / step", f"{f['generation_flops']:.3e}"),
        (f"memory per rank ({f['ranks']} ranks, FSDP {'on' if f['fsdp'] else 'off'})",
         f"weights {m['weights']:.2f} GB, gradients {m['gradients']:.2f} GB, optimizer {m['optimizer']:.2f} GB, "
         f"activations {m['activations']:.2f} GB ({m['activations_checkpointed']:.2f} GB checkpointed)"),
        ("memory per rank, total", f"{m['total']:.2f} GB (gradient checkpointing {'on' if f['gradient_checkpointing'] else 'off'})"),
        (f"step time at MFU {f['mfu']:.0%} of {f['peak_tflops_per_rank']:g} TFLOP/s per rank",
         f"{f['step_seconds']:.1f} s" if f["step_seconds"] is not None else "-"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def register(app: typer.Typer) -> None:

    @app.command(
        "plan",
        help="What one training step of [bold]entropyrl train <overrides>[/bold] costs, offline: parameters, "
             "FLOPs and tokens per step, memory per rank (weights, gradients, optimizer sharded over the "
             "ranks, activations with and without checkpointing), step time at a stated MFU. "
             "[cyan]entropyrl plan experiment=dapo_7b --ranks 8[/cyan]",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def plan(
        overrides: Optional[List[str]] = typer.Argument(None, help="key=value config overrides"),
        ranks: int = typer.Option(1, "--ranks", help="data-parallel ranks (GPUs)"),
        mfu: float = typer.Option(0.4, "--mfu", help="model FLOPs utilisation assumed for the step time"),
        peak_tflops: float = typer.Option(989.0, "--peak-tflops", help="peak dense TFLOP/s per rank (H100 bf16: 989)"),
        prompt_len: Optional[int] = typer.Option(None, "--prompt-len", help="prompt tokens (default data.max_prompt_length, else 256)"),
        as_json: bool = typer.Option(False, "--json", help="print the figures as JSON"),
    ) -> None:
        from ..models.cost import plan_figures  # torch (the embedded tokenizer) loads when it runs

        figures = plan_figures(overrides or [], ranks=ranks, mfu=mfu, peak_tflops=peak_tflops, prompt_len=prompt_len)
        typer.echo(json.dumps(figures, indent=2) if as_json else _table(figures))
