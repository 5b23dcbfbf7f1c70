"""A study from an installed distribution: the distribution names its plugin module in the entry-point
group ``entropyrl.plugins`` (sweeps/plugins.py) and the plain ``entropyrl`` command finds it, with no
script of the user's own: ``entropyrl lab --help`` lists the study, and its report step is found from
its declaration (``Study.report_step_at``) although the plugin registers no step itself."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from entropyrl.sweeps.plugins import ENTRY_POINT_GROUP, installed_plugins

MARKER = "zebrafinchstudy"  # a word the package's own help never holds


def _install_plugin(site: Path) -> None:
    """A distribution ``zebra-plugin`` on ``site`` (its ``.dist-info`` with an entry point) and its
    plugin module, which declares one study and nothing heavy."""
    pkg = site / "zebra_plugin"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        textwrap.dedent(
            f"""
            from entropyrl.sweeps.studies import Study, register_study

            register_study(Study(
                name="{MARKER}", experiments=("{MARKER}",), ablation="{MARKER}", base_preset="data=toy",
                default_out="outputs/{MARKER}", variant_kind="{MARKER} variant", report_step="{MARKER}",
                report_step_at="zebra_plugin.step:report", title="the {MARKER} study", variants_help="a, b",
                help="the {MARKER} study, declared by an installed distribution.",
            ))
            """
        )
    )
    (pkg / "step.py").write_text("def report(sweep_dir, sweep, statuses, log=print):\n    return {'paths': {}}\n")
    info = site / "zebra_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: zebra-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nzebra = zebra_plugin\n")


def _run(site: Path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_an_installed_plugin_s_study_is_listed_by_lab_help(tmp_path):
    _install_plugin(tmp_path)
    done = _run(tmp_path, "from entropyrl.cli.main import main; main(['lab', '--help'])")
    assert done.returncode == 0, done.stderr
    assert f"--experiment {MARKER}: the {MARKER} study, declared by an installed distribution." in " ".join(
        done.stdout.replace("│", " ").split()
    )
    assert f"outputs/{MARKER}" in done.stdout  # --out's help names its default folder


def test_an_installed_plugin_s_report_step_is_found_from_its_declaration(tmp_path):
    _install_plugin(tmp_path)
    code = (
        "from entropyrl.sweeps.report import _report_step\n"
        f"step = _report_step({{}}, '{MARKER}', '{MARKER}')\n"
        "print(step.__module__, step.__name__)\n"
    )
    done = _run(tmp_path, code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["zebra_plugin.step", "report"]


def test_without_an_installed_plugin_none_is_found():
    assert "zebra_plugin" not in installed_plugins()
