"""Environment errors said up front, in one line with the path and the fix: an unwritable cache for
the embedded model's warm start (before minutes of it, not after), and an output name too long for
the file system (before the grading, not after; a name it takes works, whatever the temporary name
written beside it adds)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from entropyrl.core.errors import UserError

CLI = [sys.executable, "-m", "entropyrl.cli.main"]


@pytest.mark.parametrize("where", ["under_a_file", "read_only"])
def test_an_unwritable_cache_is_refused_before_the_warm_start(tmp_path, monkeypatch, where):
    from entropyrl.conf import compose
    from entropyrl.models.tiny import embedded_model_dir

    if where == "under_a_file":
        (tmp_path / "home").write_text("a file, not a folder")
        cache = tmp_path / "home" / ".cache" / "entropyrl"
    else:
        cache = "/sys/entropyrl-cache"  # a read-only file system
    monkeypatch.setenv("ENTROPYRL_CACHE", str(cache))
    said: list[str] = []
    started = time.monotonic()
    with pytest.raises(UserError) as err:
        embedded_model_dir(compose("eval", ["model=tiny"]).model, log=said.append)
    assert time.monotonic() - started < 5 and not said  # no warm start began
    msg = str(err.value)
    assert "\n" not in msg and "cannot cache the embedded tiny model" in msg and "ENTROPYRL_CACHE=" in msg


def test_an_output_name_too_long_is_refused_before_grading_and_a_long_one_that_fits_works(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"response": "\\boxed{2}", "answer": "2"}) + "\n")
    fits = tmp_path / ("a" * 244 + ".jsonl")  # 250 characters
    out = subprocess.run([*CLI, "grade", str(src), "--out", str(fits)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(fits.read_text())["correct"] is True
    too_long = tmp_path / ("b" * 250 + ".jsonl")  # 256 bytes
    out = subprocess.run([*CLI, "grade", str(src), "--out", str(too_long)], capture_output=True, text=True, timeout=300)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "is 256 bytes, over the 255" in lines[0], out.stderr
    assert "graded" not in out.stdout


def test_an_unquoted_non_ascii_value_says_how_to_quote_it():
    from entropyrl.conf import compose

    with pytest.raises(UserError) as err:
        compose("train", ["output_dir=outputs/résumé"])
    assert "write output_dir='outputs/résumé'" in str(err.value) and "\n" not in str(err.value)
    assert compose("train", ["output_dir='outputs/résumé'"]).output_dir == "outputs/résumé"  # the fix works
