"""The training loop's progress into a log (stderr or stdout not a terminal: a SLURM job's output, a
file): the bar draws only when the run ends, so a heartbeat line says the run is alive, at the first
step and then every ``heartbeat_s`` seconds, with the seconds per step and the time left."""

from __future__ import annotations

from entropyrl.trainers.run.run_report import TrainingProgress


def _lines(out: str, prefix: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(prefix)]


def test_a_log_gets_a_heartbeat_line_at_the_first_step_then_one_per_period(capsys):
    with TrainingProgress(True, 3, 0, heartbeat_s=3600) as bar:
        for step in (1, 2, 3):
            bar(step, {"entropy": 0.5, "reward/mean": 0.25})
    out = capsys.readouterr().out
    first = _lines(out, "train 1/3: ")
    assert len(first) == 1 and "entropy 0.500  reward 0.250" in first[0] and " s/step, ETA " in first[0], out
    assert not _lines(out, "train 2/3: ") and not _lines(out, "train 3/3: ")  # within the period: one line
    with TrainingProgress(True, 3, 0, heartbeat_s=0) as bar:
        for step in (1, 2, 3):
            bar(step, {"entropy": 0.5, "reward/mean": 0.25})
    every = capsys.readouterr().out
    assert [len(_lines(every, f"train {s}/3: ")) for s in (1, 2, 3)] == [1, 1, 1], every
    assert _lines(every, "train 3/3: ")[0].endswith("ETA 0 s")


def test_a_disabled_bar_says_nothing(capsys):
    with TrainingProgress(False, 3, 0, heartbeat_s=0) as bar:
        bar(1, {"entropy": 0.5})
    assert capsys.readouterr().out == ""
