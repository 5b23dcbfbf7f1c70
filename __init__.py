"""entropyrl: RLVR training, evaluation and ablations built around policy entropy collapse.

The repository root is the package; its folders are its layers, and imports point one way
(``tests/test_imports.py`` keeps it so)::

    cli/        thin Typer commands                         (imports everything below)
    sweeps/     ablations, launchers, reports; lab/ (claims, lab report, quadrant experiment)
    trainers/   the loop (trainer.py); algos/ (math), interventions/, stats/ (token statistics,
                diagnostics), data/ (prompt sources), parallel/ (ranks, FSDP), run/ (folder,
                checkpoints, signals, summary, plots)
    rewards/    reward functions from config (user callables, HTTP judges, the built-in verifiers),
                weighted, time-limited, with fallbacks; imports evals, imported by trainers
    evals/      benchmarks, runner, metrics; grading/ (math answers), code/ (sandbox, the tools' code interpreter)
    rollout/    the rollout engines that sample for training and eval (hf, vllm); multi-turn with tools
    models/     the embedded tiny model and ``load_policy``
    tasks/      the built-in verifiable tasks and ``Problem``
    core/       errors, config validation, CPU resources, files, tracking (MLflow)
    conf/       Hydra configs and their composition

``rollout``, ``models`` and ``tasks`` form the base with ``core`` and ``conf``: they import each
other downwards only (rollout -> models -> tasks -> core).
"""

import sys as _sys

# An editable install maps ``entropyrl`` onto the repository root, so the repository's own folders
# that are not part of the package (the tests, the docs, the shipped data, the speed suites, the
# examples) would import as namespace packages (``entropyrl.tests``). They are not the package's:
# refuse them.
_NOT_PACKAGES = frozenset(f"{__name__}.{name}" for name in ("tests", "docs", "data", "perf", "build", "outputs", "examples"))


class _RepositoryFolders:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in _NOT_PACKAGES or name.startswith(tuple(p + "." for p in _NOT_PACKAGES)):
            raise ModuleNotFoundError(f"No module named {name!r}: {name.split('.')[1]}/ is not part of the package", name=name)
        return None


if not any(isinstance(f, _RepositoryFolders) for f in _sys.meta_path):
    _sys.meta_path.insert(0, _RepositoryFolders())
