"""docs/first-hour.md's result block is generated from runs of exactly the commands the page opens
with: the ablation ``first_hour`` runs them (each variant's overrides are one command's arguments,
nothing added in ``base``), and the page holds the report markers ``entropyrl report --docs`` writes
between."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _opening_commands() -> list[list[str]]:
    page = (ROOT / "docs" / "first-hour.md").read_text()
    block = re.search(r"```bash\n(.*?)```", page, re.S).group(1)
    lines = [line.split("#", 1)[0].split() for line in block.splitlines() if line.strip()]
    assert all(words[:2] == ["entropyrl", "train"] for words in lines), lines
    return [words[2:] for words in lines]


def test_the_first_hour_ablation_runs_the_page_s_commands_as_written():
    ablation = yaml.safe_load((ROOT / "conf" / "ablation" / "first_hour.yaml").read_text())
    assert ablation["base"] == []
    assert [list(v["overrides"]) for v in ablation["variants"]] == _opening_commands()


def test_the_page_holds_the_generated_block_s_markers_and_its_commands():
    page = (ROOT / "docs" / "first-hour.md").read_text()
    assert page.count("<!-- report:begin -->") == 1 and page.count("<!-- report:end -->") == 1
    assert "entropyrl sweep ablation=first_hour" in page
    assert "entropyrl report outputs/first_hour --docs docs/first-hour.md" in page
