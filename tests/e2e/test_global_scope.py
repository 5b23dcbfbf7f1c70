"""``scope: global`` (trainers/interventions/base.py): every token selection computed over the
mini-batch of all ranks selects, on 2 gloo ranks on CPU, exactly what one process selects on the
whole mini-batch (bit-identical), each rank holding only its rows, padded to its own width.

This file is also the 2-rank worker (``torchrun ... tests/e2e/test_global_scope.py <dir>``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve()
ROWS, WIDTH = 12, 9
QUANTILES = [0.1, 0.5, 0.9, 0.99]

# every selecting intervention, with values that select a fair share of a small batch
SETTINGS = {
    "stare": {"variant": "C2", "p": 0.3},
    "steer": {},
    "high_entropy_mask": {"rho": 0.2},
    "clip_cov": {"ratio": 0.2, "lb": -10.0, "ub": 10.0},
    "kl_cov": {"ratio": 0.2},
    "lp_reg": {"rho": 0.2},  # its lowest-probability negative candidates
}
# SIREN (per-response quantile), Archer (per-response quantile), GTPO (per group) need no scope


def _mini_batch() -> dict[str, torch.Tensor]:
    """A mini-batch of ROWS responses of random lengths, the same on every process (seeded)."""
    gen = torch.Generator().manual_seed(7)
    lengths = torch.randint(2, WIDTH + 1, (ROWS,), generator=gen)
    lengths[0], lengths[ROWS // 2 :] = WIDTH, lengths[ROWS // 2 :].clamp(max=WIDTH - 3)  # rank 1's rows are shorter
    mask = (torch.arange(WIDTH)[None, :] < lengths[:, None]).float()
    logp = -torch.rand(ROWS, WIDTH, generator=gen) * 3
    entropy = torch.rand(ROWS, WIDTH, generator=gen) * 2
    rewards = torch.randint(0, 2, (ROWS // 2,), generator=gen).float()
    advantages = (rewards - rewards.mean()).repeat_interleave(2)[:, None] + 0.1 * torch.randn(ROWS, 1, generator=gen)
    return {
        "logp": logp * mask,
        "old_logp": logp * mask,
        "entropy": entropy * mask,
        "advantages": advantages.expand(ROWS, WIDTH) * mask,
        "mask": mask,
    }


def _algorithm():
    from entropyrl.trainers.algos.algorithm import Algorithm
    from entropyrl.trainers.interventions import build_intervention

    ivs = [build_intervention(name, {**values, "scope": "global"}, seed=3) for name, values in SETTINGS.items()]
    return Algorithm(interventions=ivs, max_response_length=WIDTH)


def _select(rows: slice, gather=None) -> dict[str, torch.Tensor]:
    batch = {k: v[rows] for k, v in _mini_batch().items()}
    width = int(batch["mask"].sum(1).max())  # this rank's own padded width
    batch = {k: v[:, :width].contiguous() for k, v in batch.items()}
    return _algorithm().prepare("mini", **batch, gather=gather)


def _aent_step(rows: slice, scope: str, reduce=None, micro_rows: int = 2) -> tuple[float, float]:
    """AEnt's ``(last clamped entropy, coefficient)`` after two steps of losses on ``rows`` (micro-batches
    of ``micro_rows``; the reference first moves the coefficient after its step 1 when warm-up is 0)
    and the next ``begin_step``; the clamped entropy is seeded, per row."""
    from entropyrl.trainers.algos.algorithm import Algorithm
    from entropyrl.trainers.interventions import build_intervention

    batch = _mini_batch()
    clamped = torch.rand(ROWS, WIDTH, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 2
    params = {"scope": scope, "warmup_steps": 0, "lr": 1e-5}  # a step that stays inside the coefficient box
    algo = Algorithm(interventions=[build_intervention("aent", params)], max_response_length=WIDTH)
    picked = torch.arange(ROWS)[rows]
    for _ in range(2):
        algo.begin_step(0.5)
        for start in range(0, len(picked), micro_rows):
            idx = picked[start : start + micro_rows]
            out = algo.loss(**{k: v[idx].double() for k, v in batch.items()}, extras={"aent/clamped_entropy": clamped[idx]})
            algo.after_loss(out)
        algo.end_step(reduce)
    algo.begin_step(0.5)
    metrics = algo.step_metrics()
    return metrics["aent/last_clamped_entropy"], metrics["aent/coef"]


def _siren_anchor(rows: slice, reduce=None) -> float:
    """SIREN's anchor from ``observe_sampling`` on ``rows`` of the batch (top-p entropies seeded)."""
    from entropyrl.trainers.interventions import build_intervention
    from entropyrl.trainers.interventions.siren import KEY

    batch = _mini_batch()
    h = torch.rand(ROWS, WIDTH, generator=torch.Generator().manual_seed(11), dtype=torch.float64) * batch["mask"]
    siren = build_intervention("siren", {"top_p": 0.95, "top_k": 50, "quantile": 0.5, "coef": 1.0})
    assert siren.sampling_vocab_stats()  # asked for until the anchor is set
    siren.observe_sampling({KEY: h[rows]}, batch["mask"][rows], reduce)
    assert siren.sampling_vocab_stats() == {}
    return siren.anchor


def _worker(out_dir: Path) -> None:
    import torch.distributed as dist

    from entropyrl.conf import compose
    from entropyrl.trainers.parallel import distributed
    from entropyrl.trainers.stats.diagnostics import entropy_quantile_metrics

    info = distributed.setup(compose("train", ["trainer.device=cpu"]).trainer)
    assert info.world_size == 2
    share = ROWS // info.world_size
    mine = _select(
        slice(info.rank * share, (info.rank + 1) * share), gather=lambda tensors: distributed.gather_rows(tensors, info)
    )
    everyone: list = [None] * info.world_size
    dist.all_gather_object(everyone, {k: v.clone() for k, v in mine.items()})
    reduce = lambda t: distributed.sum_across(t, info)  # noqa: E731 (as the trainer passes it)
    rows = slice(info.rank * share, (info.rank + 1) * share)
    aent: list = [None] * info.world_size
    dist.all_gather_object(aent, {scope: _aent_step(rows, scope, reduce) for scope in ("global", "micro")})
    anchors: list = [None] * info.world_size
    dist.all_gather_object(anchors, _siren_anchor(rows, reduce))
    batch = _mini_batch()
    quantiles = entropy_quantile_metrics(
        distributed.gather_values(batch["entropy"][rows][batch["mask"][rows].bool()], info), QUANTILES
    )
    everyone_q: list = [None] * info.world_size
    dist.all_gather_object(everyone_q, quantiles)
    if info.is_main:
        torch.save(everyone_q, out_dir / "quantiles.pt")
        torch.save(everyone, out_dir / "ranks.pt")
        torch.save(aent, out_dir / "aent.pt")
        torch.save(anchors, out_dir / "siren.pt")
    distributed.cleanup(info)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """The folder where one 2-rank gloo run of ``_worker`` left its results."""
    where = tmp_path_factory.mktemp("two_ranks")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(_free_port()),
            str(HERE),
            str(where),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return where


def test_global_selections_on_two_ranks_equal_one_process(two_ranks):
    ranks = torch.load(two_ranks / "ranks.pt", weights_only=False)
    one = _select(slice(None))
    assert {k.split("/")[0] for k in one} == set(SETTINGS)
    for key, whole in one.items():
        parts = [r[key] for r in ranks]
        assert min(p.shape[1] for p in parts) < whole.shape[1]  # a rank narrower than the whole: padding met
        stacked = torch.cat([torch.nn.functional.pad(p, (0, whole.shape[1] - p.shape[1])) for p in parts])
        assert torch.equal(stacked, whole), key  # bit-identical, rows and tokens
        valid = _mini_batch()["mask"].bool()
        if whole.dtype == torch.bool:
            assert 0 < int(whole[valid].sum()) < int(valid.sum()), key  # a real selection, not all or none
        else:
            assert float(whole[valid].std()) > 0, key  # STEER weights vary


def test_aent_global_coefficient_on_two_ranks_equals_one_process(two_ranks):
    """AEnt's controller reads a step mean, not a token selection: with scope global (the reference)
    both ranks read the token mean of all the step's tokens (what one process reads, to float64
    rounding) and move to the same coefficient; with micro each rank reads its own tokens."""
    ranks = torch.load(two_ranks / "aent.pt", weights_only=False)
    h_one, coef_one = _aent_step(slice(None), "global", micro_rows=5)  # other micro-batches: same token mean
    for r in ranks:
        assert r["global"][0] == pytest.approx(h_one, rel=1e-12) and r["global"][1] == pytest.approx(coef_one, rel=1e-12)
    assert ranks[0]["micro"][0] != ranks[1]["micro"][0]  # the per-rank mean differs by rank
    assert 1e-5 < coef_one < 0.0002  # the coefficient moved, inside its box


def test_siren_anchor_on_two_ranks_equals_one_process(two_ranks):
    """SIREN's anchor is the one-pass value over the whole first batch (the reference's): each rank
    holds half the responses, and both anchor on what one process computes on all of them, which
    is the one-pass value the loss itself would take on the whole batch."""
    from entropyrl.trainers.interventions.siren import peak_mask, seq_mean_token_mean

    ranks = torch.load(two_ranks / "siren.pt", weights_only=False)
    one = _siren_anchor(slice(None))
    assert all(a == pytest.approx(one, rel=1e-12) for a in ranks)
    batch = _mini_batch()
    h = torch.rand(ROWS, WIDTH, generator=torch.Generator().manual_seed(11), dtype=torch.float64) * batch["mask"]
    m1 = peak_mask(h, batch["mask"], 0.5)
    assert one == pytest.approx(float(seq_mean_token_mean(torch.where(m1, h, torch.zeros_like(h)), m1.double())), rel=1e-12)
    assert _siren_anchor(slice(0, ROWS // 2)) != pytest.approx(one, rel=1e-6)  # half the batch anchors elsewhere


def test_entropy_quantiles_on_two_ranks_equal_one_process(two_ranks):
    """``entropy/p10 ... p99`` of the valid tokens, every rank's gathered: bit-identical to one
    process's over the whole batch on both ranks, and not what a rank's own tokens give."""
    from entropyrl.trainers.stats.diagnostics import entropy_quantile_metrics

    batch = _mini_batch()
    valid = batch["mask"].bool()
    one = entropy_quantile_metrics(batch["entropy"][valid], QUANTILES)
    assert list(one) == ["entropy/p10", "entropy/p50", "entropy/p90", "entropy/p99"]
    ranks = torch.load(two_ranks / "quantiles.pt", weights_only=False)
    assert ranks == [one, one]
    half = entropy_quantile_metrics(batch["entropy"][: ROWS // 2][valid[: ROWS // 2]], QUANTILES)
    assert half != one


def test_sorted_quantiles_match_torch_quantile():
    from entropyrl.trainers.stats.diagnostics import sorted_quantiles

    values = torch.rand(1001, generator=torch.Generator().manual_seed(2))
    want = torch.quantile(values.double(), torch.tensor(QUANTILES, dtype=torch.float64)).tolist()
    assert sorted_quantiles(values, QUANTILES) == pytest.approx(want, rel=1e-12)
    assert all(v != v for v in sorted_quantiles(torch.empty(0), QUANTILES))  # no tokens: nan


def test_micro_scope_stays_per_rank_while_global_does_not():
    """The published default (micro, here: this rank's mini-batch) selects by rank; global does not:
    the same top-20 % entropy mask on half of the rows differs from the whole batch's."""
    from entropyrl.trainers.algos.core_algos import select_top_fraction

    batch = _mini_batch()
    whole = select_top_fraction(batch["entropy"], batch["mask"].bool(), 0.2)
    halves = torch.cat(
        [
            select_top_fraction(batch["entropy"][r], batch["mask"][r].bool(), 0.2)
            for r in (slice(0, ROWS // 2), slice(ROWS // 2, ROWS))
        ]
    )
    assert not torch.equal(whole, halves)


def test_lp_reg_loss_reads_the_wide_selection():
    """A mini-scope selection made on the batch the loss sees, from the same statistics, gives the
    loss of the micro scope (the reference path) exactly; a selection from other rows changes it."""
    from entropyrl.trainers.algos.algorithm import Algorithm
    from entropyrl.trainers.interventions import build_intervention

    batch = _mini_batch()
    gen = torch.Generator().manual_seed(11)
    vocab = {
        "lp_reg/minp_log_mass": -0.5 * torch.rand(ROWS, WIDTH, generator=gen),
        "lp_reg/max_logp": -0.5 * torch.rand(ROWS, WIDTH, generator=gen),
    }

    def losses(scope: str, selections_from: dict | None = None) -> dict[str, float]:
        algo = Algorithm(
            interventions=[build_intervention("lp_reg", {"rho": 0.3, "kappa": 0.02, "scope": scope})], max_response_length=WIDTH
        )
        made = algo.prepare("mini", **(selections_from or batch)) if scope != "micro" else {}
        out = algo.loss(**batch, extras={**vocab, **made})
        return {k: out.metrics[k] for k in ("loss/lp_reg", "lp_reg/frac", "loss/total")}

    micro = losses("micro")
    assert micro["loss/lp_reg"] > 0 and micro["lp_reg/frac"] > 0
    assert losses("mini") == micro
    other = {**batch, "logp": batch["logp"].flip(0), "advantages": batch["advantages"].flip(0)}
    moved = losses("mini", other)
    assert moved["lp_reg/frac"] != micro["lp_reg/frac"]


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
