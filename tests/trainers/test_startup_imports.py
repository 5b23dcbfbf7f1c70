"""What a training run does before its first step: import none of the libraries it does not use then
(scikit-learn, pandas and SciPy through transformers: models/hf_imports.py; matplotlib, which only
draws the figures at the end: trainers/run/plots.py), with the cycle collector paused through the
set-up (core/gc_pause.py). Each check runs in a fresh interpreter."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

NOT_BEFORE_STEP_1 = [m for m in ("sklearn", "pandas", "scipy", "matplotlib") if importlib.util.find_spec(m) is not None]


def _run(code: str, cwd=None) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


FIRST_STEP = """
import gc, json, sys
from entropyrl.trainers.trainer import GRPOTrainer
seen = {{}}
step, init = GRPOTrainer.train_step, GRPOTrainer.__init__
def first_step(self, *a, **k):
    if "loaded" not in seen:
        seen["loaded"] = [m for m in {libraries!r} if m in sys.modules]
        seen["gc_in_step"] = gc.isenabled()
    return step(self, *a, **k)
def set_up(self, *a, **k):
    seen["gc_in_set_up"] = gc.isenabled()
    return init(self, *a, **k)
GRPOTrainer.train_step, GRPOTrainer.__init__ = first_step, set_up
import entropyrl.trainers.trainer as trainer_module
ends = seen.setdefault("end", [])
trim, report = trainer_module.trim_heap, trainer_module.write_run_report
trainer_module.trim_heap = lambda: ends.append("trim_heap") or trim()
trainer_module.write_run_report = lambda *a, **k: ends.append("report") or report(*a, **k)
from entropyrl.cli.main import main
try:
    main(["train", "data=toy", "trainer.total_steps=1", "trainer.threads=1", "trainer.progress=false",
          "trainer.val_every=0", "val.prompts=0", "tracking.enabled=false", "output_dir={out}"])
except SystemExit as e:
    assert e.code in (0, None), e.code
seen["at_end"] = "matplotlib" in sys.modules
print(json.dumps(seen))
"""


@pytest.mark.skipif(not NOT_BEFORE_STEP_1, reason="none of those libraries is installed")
def test_a_training_run_reaches_its_first_step_without_the_libraries_it_does_not_use(tmp_path):
    out = _run(FIRST_STEP.format(libraries=NOT_BEFORE_STEP_1, out=tmp_path / "run"), cwd=tmp_path)
    assert out["loaded"] == []
    # the cycle collector rests through the set-up (core/gc_pause.py) and runs during training
    assert (out["gc_in_set_up"], out["gc_in_step"]) == (False, True)
    assert out["end"] == ["trim_heap", "report"]  # the heap given back before the figures (core/heap.py)
    if "matplotlib" in NOT_BEFORE_STEP_1:  # the run still draws its figures at the end, loading matplotlib then
        assert out["at_end"] is True
        assert (tmp_path / "run" / "curves.png").exists()


def test_the_plots_module_loads_matplotlib_when_it_draws_and_not_before(tmp_path):
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed")
    code = f"""
import json, sys
from entropyrl.trainers.run import plots
on_import = "matplotlib" in sys.modules
rows = [{{"step": i, "entropy": 1.0 / i, "reward/mean": 0.1 * i, "acc/mean": 0.05 * i}} for i in range(1, 6)]
path = plots.plot_training_curves(rows, __import__("pathlib").Path({str(tmp_path / "curves.png")!r}))
import matplotlib
print(json.dumps({{"on_import": on_import, "drawn": path.exists(), "backend": matplotlib.get_backend().lower()}}))
"""
    out = _run(code)
    assert out == {"on_import": False, "drawn": True, "backend": "agg"}
