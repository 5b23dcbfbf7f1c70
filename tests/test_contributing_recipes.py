"""CONTRIBUTING.md's recipes, each followed once from this file (no edit to the package's files): a
method ("Adding an entropy intervention"), a study ("Adding a study") and a rollout engine ("Adding a
rollout engine"). Each test registers its example through what the recipe names, checks that the
package then uses it, and checks that the recipe's text names the registries, functions and files the
example went through, so a recipe that drifts from the code fails here. The method's end-to-end run
(training with the registered intervention) is tests/trainers/test_extensions.py's; the one here
stops at the config and the registry."""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from entropyrl.conf import compose

REPO = Path(__file__).resolve().parents[1]


def recipe(title: str) -> str:
    """The text of CONTRIBUTING.md's section ``## <title>``, up to the next ``## `` heading, with its
    line breaks and indents as single spaces (a name may be wrapped across lines)."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"CONTRIBUTING.md has no section '## {title}'"
    return " ".join(match.group(1).split())


def assert_named(section: str, *names: str) -> None:
    missing = [n for n in names if n not in section]
    assert not missing, f"the recipe does not name {missing}"


# ------------------------------------------------------------------------------------------------
# a method: an entropy intervention
# ------------------------------------------------------------------------------------------------
@pytest.fixture()
def recipe_intervention():
    from entropyrl.trainers.interventions import INTERVENTIONS, Intervention, LossContext, register_intervention

    @register_intervention("test_recipe_method")
    class RecipeMethod(Intervention):
        @dataclass
        class Params:
            factor: float = 0.5

        def apply(self, ctx: LossContext) -> None:
            ctx.scale(self.params.factor)
            ctx.metrics["test_recipe_method/factor"] = float(self.params.factor)

    ConfigStore.instance().store(group="intervention", name="test_recipe_method", node=RecipeMethod.Params)
    yield RecipeMethod
    INTERVENTIONS.pop("test_recipe_method")
    ConfigStore.instance().repo["intervention"].pop("test_recipe_method.yaml")


def test_the_method_recipe_registers_an_intervention_and_its_parameters(recipe_intervention):
    import entropyrl.trainers.interventions as interventions
    from entropyrl.trainers.interventions import INTERVENTIONS

    section = recipe("Adding an entropy intervention")
    assert_named(
        section,
        "trainers/interventions/",
        "@register_intervention(",
        "`Intervention`",
        "`Params`",
        "conf/intervention/<name>.yaml",
        "ConfigStore group `intervention`",
        "algo.<name>.<key>",
        "tests/trainers/test_extensions.py",
        "tests/trainers/test_method_invariants.py",
    )
    # "every module there is imported, so it registers; no __init__.py edit"
    folder = Path(interventions.__file__).parent
    for module in sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__"):
        assert f"entropyrl.trainers.interventions.{module}" in sys.modules, module
    assert INTERVENTIONS["test_recipe_method"] is recipe_intervention
    # the Params stored in ConfigStore stand in for the YAML: mounted at algo.<name> for every algo
    assert compose("train", [])["algo"]["test_recipe_method"] == {"factor": 0.5}
    cfg = compose("train", ["algo=stare", "algo.interventions=[stare,test_recipe_method]", "algo.test_recipe_method.factor=0.25"])
    assert cfg.algo.test_recipe_method.factor == 0.25 and list(cfg.algo.interventions) == ["stare", "test_recipe_method"]


# ------------------------------------------------------------------------------------------------
# a study
# ------------------------------------------------------------------------------------------------
STUDY = "test_recipe_study"
CLAIM = "test_recipe_b_above_a"


def _recipe_claims(runs: dict) -> list[dict]:
    """The example study's one claim, built from the kit: b ends with more entropy than a on every seed."""
    from entropyrl.sweeps.lab.kit import finite_values, fmt, make_claim, seeds_with

    per_seed = []
    for seed in seeds_with(runs, "a", "b"):
        a, b = (finite_values(runs[v][seed], "entropy") for v in ("a", "b"))
        per_seed.append({"seed": seed, "a": a[-1] if a else None, "b": b[-1] if b else None})
        per_seed[-1]["ok"] = None if not (a and b) else b[-1] > a[-1]
    measured = "; ".join(f"s{p['seed']}: {fmt(p['b'])} vs {fmt(p['a'])}" for p in per_seed) or "no runs of a and b"
    return [make_claim(CLAIM, "b ends above a", per_seed, "ok", measured)]


def _recipe_nulls() -> list:
    """The example study's null control (b did nothing: a's rows under b's name) and its positive (b
    ends above a on every seed), with the claims function ``null_controls.evaluate`` runs them through."""
    from entropyrl.sweeps.lab.null_controls import NullControl

    def inputs(b_end: float) -> dict:
        rows = {
            v: [{"step": i + 1, "entropy": 1.0 if i < 9 else end} for i in range(10)] for v, end in (("a", 0.5), ("b", b_end))
        }
        return {"runs": {v: {seed: list(r) for seed in (0, 1)} for v, r in rows.items()}, "h_tgt": None}

    return [
        NullControl(
            CLAIM,
            STUDY,
            "a's rows under b's name",
            lambda: inputs(0.5),
            lambda: inputs(0.8),
            claims=lambda inputs: _recipe_claims(inputs["runs"]),
        )
    ]


def _recipe_step(sweep_dir: Path, sweep: dict, statuses: list, log=print) -> dict:
    from entropyrl.sweeps.lab.null_controls import declare_nulls
    from entropyrl.sweeps.lab.report import write_study_report
    from entropyrl.sweeps.lab.study_runs import read_study_runs

    study = read_study_runs(sweep, statuses, stare_preset=["data=toy", "algo=stare"], base_preset=["data=toy"])
    return write_study_report(
        Path(sweep_dir), study, declare_nulls(_recipe_claims(study.runs)), name="test recipe study", log=log
    )


@pytest.fixture()
def recipe_study():
    from entropyrl.sweeps.plugins import load_plugins
    from entropyrl.sweeps.report import REPORT_STEPS, register_report_step
    from entropyrl.sweeps.studies import STUDIES, Study, register_study

    # declared from outside the package, after the lab plugin has loaded: the plugin does not read this
    # study's report_step_at, so the step is registered here (the recipe's outside-the-package case)
    load_plugins()
    ablation = {
        "name": STUDY,
        "description": "two variants of the toy task, for CONTRIBUTING's study recipe",
        "report_step": STUDY,
        "default_variants": ["a"],
        "base": ["data=toy"],
        "variants": [
            {"name": "a", "overrides": ["trainer.total_steps=1"]},
            {"name": "b", "overrides": ["trainer.total_steps=2"]},
        ],
    }
    ConfigStore.instance().store(group="ablation", name=STUDY, node=ablation)
    register_report_step(STUDY, _recipe_step)
    study = register_study(
        Study(
            name=STUDY,
            experiments=(STUDY,),
            ablation=STUDY,
            base_preset="data=toy",
            default_out="outputs/test_recipe_study",
            variant_kind="recipe-study variant",
            report_step=STUDY,
            report_step_at=f"{__name__}:_recipe_step",
            title="the recipe study",
            variants_help="a, b",
            help="the recipe study (a and b on the toy task; claim: b ends above a).",
            null_controls=f"{__name__}:_recipe_nulls",
        )
    )
    yield study
    STUDIES.pop(STUDY)
    REPORT_STEPS.pop(STUDY)
    ConfigStore.instance().repo["ablation"].pop(f"{STUDY}.yaml")


def test_the_study_recipe_runs_a_study_declared_here_through_the_lab_command(in_tmp, recipe_study, cli_in_process):
    from entropyrl.cli import lab_cmd
    from entropyrl.sweeps import planning
    from entropyrl.sweeps.lab import kit, null_controls
    from entropyrl.sweeps.report import REPORT_STEPS, build_report
    from entropyrl.sweeps.state import save_sweep
    from entropyrl.sweeps.studies import Study, register_study, study_for

    section = recipe("Adding a study")
    assert_named(
        section,
        "sweeps/studies.py",
        "register_study(Study(",
        "study_for",
        "sweeps/lab/kit.py",
        "sweeps/lab/null_controls.py",
        "tests/sweeps/test_claim_nulls.py",
        "declare_nulls",
        "write_study_report",
        "sweeps/lab/study_runs.py",
        "read_study_runs(sweep, statuses, stare_preset=..., base_preset=...)",
        "register_report_step",
        "REPORT_STEPS",
        "sweeps/plugins.py",
        "PLUGINS.append(",
        "conf/ablation/<ablation>.yaml",
        "ConfigStore group `ablation`",
        "entropyrl lab --experiment <name>",
        "tests/test_contributing_recipes.py",
    )
    assert_named(section, *(f"`{name}" for name in kit.__all__))  # every public helper of the kit
    required = [f.name for f in dataclasses.fields(Study) if f.default is dataclasses.MISSING]
    assert_named(section, *(f"{name}=" for name in required))  # every field a Study must declare
    # what the recipe says of null_controls.py: each study names its entries (Study.null_controls), and
    # registry(), what the claim test iterates, gathers them from every registered study, this one too
    assert_named(section, "null_controls=", "NullControl(", "claims=", "registry()", "evaluate", "_study_claims", "emitted_ids()")
    assert not [n for n in null_controls.__all__ if n.startswith("register")]
    assert set(null_controls.emitted_ids()) == set(null_controls.STUDIES)
    entries = null_controls.registry()
    entry = entries[CLAIM]
    assert entry.study == STUDY and not entry.descriptive
    assert null_controls.evaluate(entry, entry.build_null())["reproduced"] is False
    assert null_controls.evaluate(entry, entry.build_positive())["reproduced"] is True
    assert {e.study for e in entries.values()} == {*null_controls.STUDIES, STUDY}

    # the study is found by its --experiment value, and one taken by another study is refused
    assert study_for(STUDY) is recipe_study and STUDY in lab_cmd.experiments()
    assert REPORT_STEPS[recipe_study.report_step] is _recipe_step
    with pytest.raises(ValueError, match="already runs another study"):
        register_study(dataclasses.replace(recipe_study, name="test_recipe_clash"))
    # `entropyrl lab --experiment <name>` finds it and checks --algos against its ablation's variants
    done = cli_in_process("lab", "--experiment", STUDY, "--algos", "zz")
    assert done.returncode == 2 and "unknown recipe-study variant 'zz'; valid: a, b" in done.stderr
    done = cli_in_process("lab", "--experiment", "no_such_study")
    assert done.returncode == 2 and f"{STUDY}; got 'no_such_study'" in done.stderr

    # the sweep the command plans runs the study's report step after the sweep's report
    out = in_tmp / "out"
    cfg = compose("sweep", lab_cmd.lab_sweep_overrides(["a", "b"], [0], out, 1, 1, recipe_study.ablation))
    plan = planning.plan(cfg, [], explicit_dir=True, resume=False)
    assert [j.variant for j in plan.jobs] == ["a", "b"]
    save_sweep(out, plan.sweep_record({}))
    result = build_report(out, log_mlflow=False, log=lambda *_: None)
    (claim,) = result["step"]["claims"]
    assert claim["id"] == CLAIM and claim["reproduced"] is None  # no run finished: not run
    assert claim["null_control"] == entry.null  # declare_nulls found the study's null control
    assert Path(result["report"]) == out / "report.md" and (out / "sweep-report.md").is_file()
    assert CLAIM in (out / "report.md").read_text() and (out / "lab.json").is_file()


# ------------------------------------------------------------------------------------------------
# a rollout engine
# ------------------------------------------------------------------------------------------------
@pytest.fixture()
def recipe_engine():
    from entropyrl.core.schema import defaults
    from entropyrl.core.schema.rollout import HfRolloutSchema
    from entropyrl.rollout import base as rollout_registry
    from entropyrl.rollout.base import register_rollout
    from entropyrl.rollout.hf_engine import HFRollout

    class RecipeRollout(HFRollout):
        """Samples like ``hf`` and counts its calls (a stand-in for a new backend)."""

        calls = 0

        def generate(self, prompts, **kw):
            type(self).calls += 1
            return super().generate(prompts, **kw)

    register_rollout("test_recipe_engine", RecipeRollout)
    node = OmegaConf.create({**defaults(HfRolloutSchema), "name": "test_recipe_engine"})
    ConfigStore.instance().store(group="rollout", name="test_recipe_engine", node=node)
    yield RecipeRollout
    rollout_registry.ROLLOUT_ENGINES.pop("test_recipe_engine")
    ConfigStore.instance().repo["rollout"].pop("test_recipe_engine.yaml")


def test_the_engine_recipe_builds_an_engine_registered_here_and_samples_with_it(recipe_engine):
    from entropyrl.models.loading import load_policy
    from entropyrl.rollout.base import RolloutEngine
    from entropyrl.trainers import components

    section = recipe("Adding a rollout engine")
    assert_named(
        section,
        "rollout.base.RolloutEngine",
        "rollout.base.register_rollout(",
        "Cls(engine_cfg, model, tokenizer)",
        "conf/rollout/<name>.yaml",
        "core/schema/rollout.py",
        "ROLLOUT_SCHEMAS",
        "- /schema/rollout/<name>@_here_",
        "ConfigStore group `rollout`",
        "defaults(HfRolloutSchema)",
        "trainers/components.build_engine",
        "tests/test_contributing_recipes.py",
    )
    protocol = [n for n in vars(RolloutEngine) if not n.startswith("_") and callable(getattr(RolloutEngine, n))]
    assert protocol and all(f"`{n}(" in section for n in protocol), protocol  # the recipe states every method
    cfg = compose("train", ["data=toy", "rollout=test_recipe_engine"])
    assert cfg.rollout.name == "test_recipe_engine"
    model, tokenizer = load_policy(cfg.model, cfg.data, log=lambda *_: None)
    engine = components.build_engine(cfg, model, tokenizer)  # what the trainer and the rollout worker call
    assert type(engine) is recipe_engine
    first = engine.generate(["1+2=", "3+4="], n=2, seed=5)
    again = engine.generate(["1+2=", "3+4="], n=2, seed=5)
    assert recipe_engine.calls == 2 and len(first.texts) == 4
    assert first.texts == again.texts  # same seed, same samples
    engine.close()
