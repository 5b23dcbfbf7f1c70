"""A sweep's (or the lab's) report goes into a docs page by a command, not by hand:
``entropyrl report SWEEP --docs PAGE`` (sweeps/report.publish_report)."""

from __future__ import annotations

import pytest

from entropyrl.core.errors import UserError
from entropyrl.sweeps.report import DOCS_BEGIN, DOCS_END, publish_report

from ..conftest import REPO


def test_the_report_replaces_the_generated_section_with_its_figures_beside_the_page(tmp_path):
    sweep = tmp_path / "lab-run"
    sweep.mkdir()
    (sweep / "lab-entropy.png").write_bytes(b"\x89PNG fake")
    (sweep / "report.md").write_text("# entropyrl lab report\n\n## Claims\n\n| claim | ok |\n\n![entropy](lab-entropy.png)\n")
    page = tmp_path / "docs" / "lab.md"
    page.parent.mkdir()
    page.write_text(f"# The lab\n\nhand-written prose\n\n{DOCS_BEGIN}\nstale\n{DOCS_END}\n\nmore prose\n")
    publish_report(sweep, page)
    text = page.read_text()
    assert "hand-written prose" in text and text.endswith("\nmore prose\n") and "stale" not in text
    assert "## entropyrl lab report" in text and "### Claims" in text  # one level down
    assert "![entropy](lab/lab-entropy.png)" in text
    assert (page.parent / "lab" / "lab-entropy.png").read_bytes() == b"\x89PNG fake"
    publish_report(sweep, page)
    assert page.read_text() == text  # the same again


def test_a_page_without_markers_or_a_sweep_without_a_report_is_one_error(tmp_path):
    sweep = tmp_path / "s"
    sweep.mkdir()
    page = tmp_path / "p.md"
    page.write_text("# no markers\n")
    with pytest.raises(UserError, match="holds no report.md"):
        publish_report(sweep, page)
    (sweep / "report.md").write_text("# r\n")
    with pytest.raises(UserError, match="needs one"):
        publish_report(sweep, page)


def test_the_lab_page_has_its_generated_section():
    text = (REPO / "docs" / "lab.md").read_text()
    assert text.count(DOCS_BEGIN) == 1 and text.count(DOCS_END) == 1
