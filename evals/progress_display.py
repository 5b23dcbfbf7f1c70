"""What ``entropyrl eval`` shows while it runs: a rich progress bar with one task per benchmark and
phase (generate, grade) and, beside the generate phase, its ``GenerationMeter`` (tokens/s, ETA);
into a log file (no terminal) a line when a benchmark starts generating, then a heartbeat line, also
while an engine that reports nothing until it ends (vLLM's one ``generate`` call) works (``beating``)."""

from __future__ import annotations

from typing import Callable

from ..core.alive import repeating
from .generation import GenerationMeter
from .settings import EvalSettings

__all__ = ["ProgressFn", "beating", "progress_bar", "progress_display"]

ProgressFn = Callable[[str, str, int, int], None]  # (benchmark, phase, advance, total)


def progress_bar(console):
    """The bar of each benchmark's phases, with the generate phase's meter (tokens/s, ETA) beside."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[meter]}"),
        console=console,
        transient=False,
    )


def progress_display(bar, console, settings: EvalSettings, batch: int, every: float, under_way: dict) -> ProgressFn:
    """The ``progress`` that ``evaluate`` calls: one task of ``bar`` per benchmark and phase, a
    ``GenerationMeter`` per generate phase (into a log file: a line when it starts, then a heartbeat
    every ``every`` seconds), and the benchmark and phase running noted in ``under_way``."""
    tasks: dict[tuple[str, str], int] = {}
    meters: dict[str, GenerationMeter] = {}

    def progress(bench: str, phase: str, advance: int, total: int) -> None:
        meter = meters.get(bench)
        if phase == "tokens":  # one decoding step of the generate phase (hf)
            if meter is not None:
                meter.tokens(advance)
                _show(bench, meter)
            return
        under_way.update(benchmark=bench, phase=phase)
        key = (bench, phase)
        if key not in tasks:
            tasks[key] = bar.add_task(f"{phase:8s} {bench}", total=total, meter="")
            if phase == "generate":
                meters[bench] = meter = GenerationMeter(total, settings.max_new_tokens, batch, every_s=every)
                if not console.is_terminal:  # a log file: say what starts, then a heartbeat line
                    console.print(
                        f"generate {bench}: {total} responses of up to {settings.max_new_tokens} tokens, {batch} at once",
                        markup=False,
                        highlight=False,
                    )
        if advance:
            bar.advance(tasks[key], advance)
            if phase == "generate" and meter is not None:
                meter.sequences(advance)
                _show(bench, meter)

    def _show(bench: str, meter: GenerationMeter) -> None:
        bar.update(tasks[(bench, "generate")], meter=meter.line())
        if not console.is_terminal and meter.due():
            console.print(f"generate {bench}: {meter.line()}", markup=False, highlight=False)

    def beat() -> None:
        """The heartbeat line of the benchmark generating now, when one is due (a log file only)."""
        bench = under_way.get("benchmark")
        meter = meters.get(bench) if under_way.get("phase") == "generate" else None
        if meter is not None and not console.is_terminal and meter.due():
            console.print(f"generate {bench}: {meter.line()}", markup=False, highlight=False)

    progress.beat = beat  # type: ignore[attr-defined]
    return progress


def beating(beat: Callable[[], None], every_s: float):
    """``beat()`` called from a daemon thread several times per ``every_s`` while the block runs, so
    a heartbeat comes on time between an engine's own progress calls (vLLM makes none until its
    whole batch ends)."""
    return repeating(beat, max(every_s / 4, 0.05))
