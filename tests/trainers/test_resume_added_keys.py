"""A run saved before a config key existed still resumes when the key's default is what it ran with.

Every new key of the ``train`` config is a resume decision: either changing it on resume is harmless
(``RESUMABLE_CHANGES``: how long, how often, where, what bounds a wait) or runs saved without it ran
with one value of it (``ADDED_SECTIONS``). A key neither lists makes every earlier run's folder
refuse to resume (``holds a run with other settings (<key>: <absent> -> ...)``)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from entropyrl.conf import compose
from entropyrl.trainers.run.run_dir import ADDED_SECTIONS, RESUMABLE_CHANGES, _flat, config_differences, upgrade_saved_config

KNOWN = Path(__file__).resolve().parents[1] / "fixtures" / "train_config_keys.txt"


def _requested(overrides: list[str] | None = None) -> dict:
    return OmegaConf.to_container(compose("train", overrides or []), resolve=True)


def _decided(key: str) -> bool:
    resumable = any(key == p or (p.endswith(".") and key.startswith(p)) for p in RESUMABLE_CHANGES)
    added = any(key == s or key.startswith(s + ".") for s in ADDED_SECTIONS)
    return resumable or added


def test_every_new_train_key_is_a_resume_decision():
    known = set(KNOWN.read_text().split())
    new = sorted(k for k in _flat(_requested()) if k not in known and not _decided(k))
    assert not new, (
        f"train keys new since {KNOWN.name}: {new}. Runs saved before them would refuse to resume: add each "
        "to RESUMABLE_CHANGES (changing it on resume is harmless) or ADDED_SECTIONS (the value runs saved "
        f"without it ran with) in trainers/run/run_dir.py, then append it to {KNOWN.name}"
    )


def test_a_run_saved_without_a_later_wait_bound_resumes():
    requested = _requested(["trainer.staleness=1"])
    saved = _requested(["trainer.staleness=1"])
    del saved["trainer"]["worker_stall_s"]  # a run saved before trainer.worker_stall_s existed
    assert config_differences(upgrade_saved_config(saved, requested), requested) == []


def test_a_run_saved_without_a_key_that_changes_training_is_refused():
    requested = _requested()
    saved = _requested()
    del saved["trainer"]["ppo_epochs"]  # not resumable, not an added section: a real difference
    assert [d[0] for d in config_differences(upgrade_saved_config(saved, requested), requested)] == ["trainer.ppo_epochs"]


def test_a_run_saved_before_the_samplers_weights_existed_resumes_as_it_sampled():
    """``rollout.weights`` (the hf engine's own key): a run saved without it sampled with the live
    float32 model, so it resumes as float32 and is refused as int8; an engine without the key (vllm)
    gets nothing added."""
    requested = _requested()
    saved = _requested()
    del saved["rollout"]["weights"]
    assert config_differences(upgrade_saved_config(saved, requested), requested) == []
    int8 = _requested(["rollout.weights=int8"])
    assert [d[0] for d in config_differences(upgrade_saved_config(saved, int8), int8)] == ["rollout.weights"]
    vllm = _requested(["rollout=vllm"])
    assert "weights" not in vllm["rollout"]
    assert config_differences(upgrade_saved_config(_requested(["rollout=vllm"]), vllm), vllm) == []
