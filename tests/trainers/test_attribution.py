"""``diagnostics.attribution``: ``entropy_change/predicted_net_1st = g_H . dtheta``
with ``g_H = dH_probe/dtheta`` on the probe batch, and the trapezoid ``predicted_net`` (``g_H`` at
both ends). On the embedded tiny model a small SGD step's
measured probe-entropy change (finite difference) matches the prediction within 5 %; a training run
logs it beside the realised change on the measured steps."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from entropyrl.conf import compose
from entropyrl.models.loading import load_policy
from entropyrl.rollout.base import build_rollout
from entropyrl.trainers.data.prompts_source import build_prompt_source
from entropyrl.trainers.stats.attribution import predicted_change, probe_entropy_gradient
from entropyrl.trainers.stats.policy_stats import response_token_stats
from entropyrl.trainers.stats.probe import probe_entropy


def _tiny_probe(prompts: int):
    """The embedded tiny model on the toy tasks, ``prompts`` validation prompts x 4 sampled
    responses, and the token-statistics keywords of that config."""
    cfg = compose("train", ["data=toy"])
    torch.manual_seed(0)
    model, tok = load_policy(cfg.model, cfg.data, log=lambda *_: None)
    source = build_prompt_source(cfg.data, 0, tokenizer=tok)
    roll = build_rollout(cfg.rollout, model, tok).generate([source.prompt(p) for p in source.validation(prompts)], n=4, seed=1)
    return model, roll, dict(temperature=float(cfg.rollout.temperature), chunk_size=int(cfg.trainer.token_chunk_size))


@pytest.mark.parametrize("length,second_order", [(1e-3, False), (1e-2, True)])
def test_prediction_matches_a_finite_difference_of_a_small_sgd_step(length, second_order):
    """First order within 5 % at step length 1e-3 (the issue's test); at 1e-2, where the first order
    is off by 10 % to several times that (how curved the entropy is there depends on the sampled
    responses, so on the CPU's float kernels), the trapezoid with g_H at both ends
    (``predicted_net``) is within 6 % and closes most of the first order's gap."""
    model, roll, kw = _tiny_probe(16)
    mask = roll.response_mask.bool()

    def probe_h() -> float:
        with torch.no_grad():
            return probe_entropy(response_token_stats(model, roll, **kw)[1], mask)

    h_before = probe_h()
    params = [p for p in model.parameters() if p.requires_grad]
    grads_before = [None if p.grad is None else p.grad.clone() for p in params]
    g_h = probe_entropy_gradient(model, roll, lambda m, r: response_token_stats(m, r, entropy_grad=True, **kw)[1], 16)
    assert all((p.grad is None) == (g is None) for p, g in zip(params, grads_before))  # .grad untouched
    before = [p.detach().clone() for p in params]
    # one SGD step of a policy-gradient loss with random advantages, of length 1e-3
    adv = torch.randn(len(roll.texts), 1, generator=torch.Generator().manual_seed(0))
    logp, _ = response_token_stats(model, roll, **kw)
    grads = torch.autograd.grad(-(adv * logp * mask).sum() / mask.sum(), params)
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.sub_(length * g / norm)
    realized = probe_h() - h_before
    predicted = predicted_change(g_h, before, [p.detach() for p in params])
    assert abs(realized) > 1e-5  # the step moved the entropy measurably
    if not second_order:
        assert abs(predicted - realized) <= 0.05 * abs(realized), (predicted, realized)
        return
    g_after = probe_entropy_gradient(model, roll, lambda m, r: response_token_stats(m, r, entropy_grad=True, **kw)[1], 16)
    trapezoid = 0.5 * (predicted + predicted_change(g_after, before, [p.detach() for p in params]))
    assert abs(trapezoid - realized) <= 0.06 * abs(realized), (trapezoid, predicted, realized)
    assert abs(trapezoid - realized) < 0.25 * abs(predicted - realized)  # the curvature was the gap


def test_a_run_logs_the_net_prediction_beside_the_realised_change(tmp_path):
    from entropyrl.trainers.trainer import train

    cfg = compose(
        "train",
        [
            "trainer.total_steps=3",
            "trainer.threads=1",
            "trainer.val_every=0",
            "trainer.progress=false",
            "tracking.enabled=false",
            "trainer.prompts_per_step=8",
            "trainer.mini_batch_prompts=8",
            "diagnostics.attribution=true",
            "diagnostics.attribution_every=2",
            "diagnostics.probe_prompts=8",
            f"output_dir={tmp_path / 'run'}",
        ],
    )
    train(cfg, log=lambda *_: None)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [("entropy_change/predicted_net" in r) for r in rows] == [False, True, False]  # step 2 (every 2nd)
    for r in rows:
        assert math.isfinite(r["entropy_change/realized"])
    measured = [r for r in rows if "entropy_change/predicted_net" in r]
    assert all(math.isfinite(r["entropy_change/predicted_net"]) and r["entropy_change/predicted_net"] != 0.0 for r in measured)
    assert all(
        math.isfinite(r["entropy_change/predicted_net_1st"])
        and r["entropy_change/predicted_net_1st"] != r["entropy_change/predicted_net"]
        for r in measured
    )


def test_each_optimizer_step_is_predicted_from_the_gradient_at_its_own_start(tmp_path):
    """A training step of several optimizer steps (prompts_per_step / mini_batch_prompts = 2): the
    logged ``predicted_net_1st`` is ``sum_k g_H(theta_k) . (theta_{k+1} - theta_k)`` and the trapezoid ``predicted_net`` the
    sum of each step's ``(g_H(theta_k) + g_H(theta_{k+1}))/2 . dtheta_k``, with ``g_H`` recomputed here
    at every parameter vector the optimizer left; not ``g_H(theta_0) . (theta_2 - theta_0)``."""
    from entropyrl.trainers.stats.policy_stats import response_token_stats as stats
    from entropyrl.trainers.trainer import GRPOTrainer

    cfg = compose(
        "train",
        [
            "trainer.total_steps=1",
            "trainer.threads=1",
            "trainer.val_every=0",
            "trainer.progress=false",
            "tracking.enabled=false",
            "trainer.prompts_per_step=8",
            "trainer.mini_batch_prompts=4",
            "diagnostics.attribution=true",
            "diagnostics.probe_prompts=8",
            f"output_dir={tmp_path / 'run'}",
        ],
    )
    trainer = GRPOTrainer(cfg, log=lambda *_: None)
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    visited = []  # the parameters before each optimizer step, then after the last
    trainer.optimizer.register_step_pre_hook(lambda *_: visited.append([p.detach().clone() for p in params]))
    trainer.optimizer.register_step_post_hook(lambda *_: visited.append([p.detach().clone() for p in params]))
    try:
        metrics = trainer.train_step()
        kw = dict(trainer.settings.stats)
        points = visited[::2] + visited[-1:]  # theta_0, theta_1, theta_2 (post k == pre k+1)
        assert len(points) == 3 and all(torch.equal(a, b) for a, b in zip(visited[1], visited[2]))
        grads = []
        with torch.no_grad():
            for point in points:
                for p, v in zip(params, point):
                    p.copy_(v)
                with torch.enable_grad():
                    grads.append(
                        probe_entropy_gradient(
                            trainer.model,
                            trainer.probe.batch,
                            lambda m, r: stats(m, r, entropy_grad=True, **kw)[1],
                            int(cfg.trainer.micro_batch_responses),
                        )
                    )
    finally:
        trainer.close()
    first = [predicted_change(grads[k], points[k], points[k + 1]) for k in range(2)]
    ends = [predicted_change(grads[k + 1], points[k], points[k + 1]) for k in range(2)]
    net_1st, net = metrics["entropy_change/predicted_net_1st"], metrics["entropy_change/predicted_net"]
    assert net_1st == pytest.approx(sum(first), rel=1e-6, abs=1e-12)
    assert net == pytest.approx(0.5 * sum(f + e for f, e in zip(first, ends)), rel=1e-6, abs=1e-12)
    once = predicted_change(grads[0], points[0], points[2])  # g_H taken once, before the step
    assert abs(once - net) > 1e-4 * abs(net)


@pytest.mark.parametrize(
    "algo,extra,ivs",
    [
        ("grpo", [], []),
        ("entropy_bonus", [], ["entropy_bonus"]),
        # STARE's gate open, at weights whose part stands well clear of float noise on any sample
        ("stare", ["algo.stare.h_tgt=100", "algo.stare.w=3.0", "algo.stare.m=0.3"], ["stare"]),
        ("clip_cov", [], ["clip_cov"]),  # a random pick per loss: the rebuilt losses must pick the same tokens
        ("entropic", [], ["entropic"]),  # a controller advanced after each loss
        ("clip_cov", ["algo.kl_coef=0.05", "+algo.interventions=[clip_cov,entropy_bonus]"], ["clip_cov", "entropy_bonus"]),
    ],
)  # two interventions and a KL term
def test_a_runs_parts_sum_to_the_net_prediction(tmp_path, algo, extra, ivs):
    """Item 2: momentum, weight decay, Q1-Q4, zero-advantage, each intervention, the KL term and the
    rest add up to predicted_net (and to first order to predicted_net_1st); an intervention's part is
    nonzero, the KL part only with a KL term."""
    from entropyrl.trainers.stats.update_split import GROUPS
    from entropyrl.trainers.trainer import train

    cfg = compose(
        "train",
        [
            f"algo={algo}",
            "trainer.total_steps=2",
            "trainer.threads=1",
            "trainer.val_every=0",
            "trainer.progress=false",
            "tracking.enabled=false",
            "trainer.prompts_per_step=8",
            "trainer.mini_batch_prompts=4",
            "diagnostics.attribution=true",
            "diagnostics.probe_prompts=8",
            "optim.weight_decay=0.1",
            f"output_dir={tmp_path / 'run'}",
            *extra,
        ],
    )
    train(cfg, log=lambda *_: None)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    names = ["momentum", "weight_decay", *GROUPS, *ivs, "kl", "other", "float_rounding"]
    for r in rows:
        net = r["entropy_change/predicted_net"]
        assert sorted(k for k in r if k.startswith("attribution/")) == sorted(f"attribution/{n}" for n in names)
        parts = [r[f"attribution/{n}"] for n in names]
        assert abs(sum(parts) - net) <= 1e-6 * abs(net), (sum(parts), net)
        # the same parts to first order add up to predicted_net_1st
        assert sorted(k for k in r if k.startswith("attribution_1st/")) == sorted(f"attribution_1st/{n}" for n in names)
        net_1st, parts_1st = r["entropy_change/predicted_net_1st"], [r[f"attribution_1st/{n}"] for n in names]
        assert abs(sum(parts_1st) - net_1st) <= 1e-6 * abs(net_1st), (sum(parts_1st), net_1st)
        assert parts_1st != parts
        assert r["attribution/weight_decay"] != 0.0
        largest = max(abs(v) for v in parts)
        assert abs(r["attribution/other"]) <= 1e-5 * largest  # only through logp/entropy: float32 sums' order
        for iv in ivs:
            assert abs(r[f"attribution/{iv}"]) > 1e-4 * largest, iv
        if "algo.kl_coef=0.05" in extra:
            assert abs(r["attribution/kl"]) > 1e-4 * largest
        else:
            assert r["attribution/kl"] == 0.0
        assert abs(r["attribution/float_rounding"]) <= 1e-4 * abs(net)  # float32 storage of the update
    assert all(r["attribution/momentum"] != 0.0 for r in rows)  # 2 mini-batches a step: the 2nd carries the 1st's
    assert (tmp_path / "run" / "why_entropy_moved.png").stat().st_size > 1000  # the stacked figure
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["attribution"]
    assert set(summary["share"]) == set(names)
    assert abs(sum(abs(v) for v in summary["share"].values()) - 1.0) < 1e-9
    assert abs(sum(summary["total"].values()) - sum(r["entropy_change/predicted_net"] for r in rows)) <= 1e-6 * sum(
        abs(r["entropy_change/predicted_net"]) for r in rows
    )
    assert set(summary["share_1st"]) == set(names) and set(summary["share_after_first"]) == set(names)
    assert abs(sum(summary["total_1st"].values()) - sum(r["entropy_change/predicted_net_1st"] for r in rows)) <= 1e-6 * sum(
        abs(r["entropy_change/predicted_net_1st"]) for r in rows
    )


def test_every_algorithms_parts_add_up_to_its_net_prediction(tmp_path):
    """Item 2 for every ``conf/algo`` method (sequence-level ratios, clipped or reweighted tokens,
    controllers, extra loss terms): one measured step of two optimizer steps, its trapezoid and
    first-order parts add up to ``predicted_net`` / ``predicted_net_1st`` within 1e-6, and what does
    not go through the token statistics (``other``) stays at float order."""
    from entropyrl.trainers.trainer import GRPOTrainer

    names = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "algo").glob("*.yaml"))
    assert len(names) >= 25
    measured = []
    for name in names:
        cfg = compose(
            "train",
            [
                f"algo={name}",
                "trainer.total_steps=1",
                "trainer.threads=1",
                "trainer.val_every=0",
                "trainer.progress=false",
                "tracking.enabled=false",
                "trainer.prompts_per_step=4",
                "trainer.mini_batch_prompts=2",
                "diagnostics.attribution=true",
                "diagnostics.probe_prompts=4",
                f"output_dir={tmp_path / name}",
            ],
        )
        trainer = GRPOTrainer(cfg, log=lambda *_: None)
        try:
            r = trainer.train_step()
        finally:
            trainer.close()
        if r.get("skipped"):  # every group all-equal: nothing to attribute
            continue
        measured.append(name)
        for prefix, net_key in (
            ("attribution/", "entropy_change/predicted_net"),
            ("attribution_1st/", "entropy_change/predicted_net_1st"),
        ):
            parts = {k[len(prefix) :]: v for k, v in r.items() if k.startswith(prefix)}
            net = r[net_key]
            assert abs(sum(parts.values()) - net) <= 1e-6 * abs(net), (name, prefix, sum(parts.values()), net)
            assert abs(parts["other"]) <= 1e-5 * max(abs(v) for v in parts.values()), (name, parts)
    assert len(measured) >= len(names) - 2, sorted(set(names) - set(measured))


def test_a_step_on_one_quadrants_tokens_is_attributed_to_that_quadrant():
    """Item 2: fresh AdamW state, a loss on Q3 tokens only: all of the prediction lands in q3, to
    first order and with the trapezoid."""
    from entropyrl.trainers.stats.diagnostics import quadrant_ids
    from entropyrl.trainers.stats.update_split import GROUPS, UpdateSplit

    model, roll, kw = _tiny_probe(8)
    mask = roll.response_mask.float()
    params = [p for p in model.parameters() if p.requires_grad]
    g_h = probe_entropy_gradient(model, roll, lambda m, r: response_token_stats(m, r, entropy_grad=True, **kw)[1], 16)
    with torch.no_grad():
        old_logp, entropy = response_token_stats(model, roll, **kw)
    adv = torch.randn(len(roll.texts), 1, generator=torch.Generator().manual_seed(0)).expand_as(mask) * mask
    q3 = (quadrant_ids(old_logp, entropy, adv, mask) == 3).float()
    assert q3.sum() > 0
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    split = UpdateSplit(g_h, params)
    logp, ent = response_token_stats(model, roll, entropy_grad=True, **kw)
    loss = -(adv * logp * q3).sum() / q3.sum()
    micro = SimpleNamespace(old_logp=old_logp, entropy=entropy, advantages=adv, mask=mask)  # what it reads
    split.add_micro(loss, [logp, ent], micro)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    split.before_step(optimizer, float(torch.sqrt(sum((p.grad**2).sum() for p in params))))
    optimizer.step()
    split.after_step(optimizer)
    after = [p.detach() for p in params]
    g_end = probe_entropy_gradient(model, roll, lambda m, r: response_token_stats(m, r, entropy_grad=True, **kw)[1], 16)
    split.end_segment(g_end)
    parts = split.metrics()
    net_1st = predicted_change(g_h, before, after)
    net = 0.5 * (net_1st + predicted_change(g_end, before, after))
    assert net != 0.0 and net_1st != 0.0
    for prefix, value in (("attribution/", net), ("attribution_1st/", net_1st)):
        assert abs(parts[f"{prefix}q3"] - value) <= 1e-4 * abs(value), (parts, value)
        assert not any(k.startswith(f"{prefix}kl") for k in parts)  # no prefixes: groups only
        for name in (*[g for g in GROUPS if g != "q3"], "momentum", "weight_decay", "other"):
            assert abs(parts[f"{prefix}{name}"]) <= 1e-6 * abs(value), (prefix, name, parts)
        assert abs(parts[f"{prefix}float_rounding"]) <= 1e-4 * abs(value)  # float32 storage of the update


def test_the_summary_fits_predicted_net_to_the_realised_change_and_shares_the_parts():
    from entropyrl.trainers.run.regime import attribution_summary

    rng = torch.Generator().manual_seed(0)
    net = torch.randn(40, generator=rng).tolist()
    rows = [
        {
            "entropy_change/predicted_net": x,
            "entropy_change/realized": 0.9 * x + 0.01 * float(e),
            "attribution/q1": 2 * x,
            "attribution/momentum": -x,
            "entropy_change/predicted_net_1st": 1.2 * x,
            "attribution_1st/q1": 3.6 * x,
            "attribution_1st/momentum": -2.4 * x,
        }
        for x, e in zip(net, torch.randn(40, generator=rng))
    ]
    out = attribution_summary(rows)
    assert out["fit"]["n"] == 40 and out["fit"]["pearson_r_detrended"] > 0.99
    assert abs(out["fit"]["slope"] - 0.9) < 0.01
    assert out["fit_1st"]["n"] == 40 and abs(out["fit_1st"]["slope"] - 0.75) < 0.01  # the first order's own fit
    assert abs(sum(out["total_1st"].values()) - 1.2 * sum(net)) < 1e-9 and abs(out["share_1st"]["q1"]) == pytest.approx(0.6)
    sign = math.copysign(1.0, sum(net))
    assert abs(out["share"]["q1"] - sign * 2 / 3) < 1e-9 and abs(out["share"]["momentum"] + sign / 3) < 1e-9
    assert attribution_summary([{"entropy_change/realized": 0.1}]) == {}


def test_the_summary_sets_adamws_first_step_apart():
    """Step 1's parts are large and cancel (AdamW's first step): the shares without it are the run's."""
    from entropyrl.trainers.run.regime import attribution_summary

    first = {
        "step": 1,
        "entropy_change/predicted_net": -0.01,
        "entropy_change/realized": +0.01,
        "attribution/q3": -0.5,
        "attribution/q4": 0.49,
    }
    later = [
        {
            "step": s,
            "entropy_change/predicted_net": -0.004,
            "entropy_change/realized": -0.003,
            "attribution/q3": -0.003,
            "attribution/q1": -0.001,
        }
        for s in (11, 21, 31)
    ]
    for row, x in zip(later, (-0.004, 0.002, -0.001)):  # realised 0.9x predicted after step 1
        row.update({"entropy_change/predicted_net": x, "entropy_change/realized": 0.9 * x})
    out = attribution_summary([first, *later])
    assert out["share"]["q3"] < -0.5 and out["share"]["q4"] > 0.45  # the whole run: step 1's
    assert set(out["share_after_first"]) == {"q1", "q3"}
    assert abs(out["share_after_first"]["q3"] + 0.75) < 1e-12 and abs(out["share_after_first"]["q1"] + 0.25) < 1e-12
    assert attribution_summary([first])["share_after_first"] == attribution_summary([first])["share"]  # nothing else


def test_the_detrended_fit_of_a_series_measured_every_10_steps_removes_a_21_step_trend():
    """Measured every 10 steps, the 21-step rolling mean spans 3 points (not the whole run): a shared
    slow trend inflates the raw r, not the detrended one."""
    import numpy as np

    from entropyrl.trainers.run.regime import prediction_fit

    rng = np.random.default_rng(0)
    steps = np.arange(1, 401, 10)
    trend = -np.exp(-steps / 100.0)  # both series fall early
    rows = [
        {"step": int(s), "entropy_change/predicted_net": t + 0.01 * a, "entropy_change/realized": t + 0.01 * b}
        for s, t, a, b in zip(steps, trend, rng.normal(size=40), rng.normal(size=40))
    ]  # noise uncorrelated
    fit = prediction_fit(rows, predicted_key="entropy_change/predicted_net")
    assert fit["pearson_r"] > 0.9  # the trend alone
    assert abs(fit["pearson_r_detrended"]) < 0.5  # gone once detrended


def test_a_sweep_variants_figure_draws_the_seed_mean(tmp_path):
    from entropyrl.trainers.run.plots import mean_by_step, plot_attribution

    seeds = [
        [{"step": 1, "attribution/q1": a, "entropy_change/realized": a / 2, "entropy": 1.0}, {"step": 2, "entropy": 0.9}]
        for a in (0.1, 0.3)
    ]
    mean = mean_by_step(seeds)
    assert [r["step"] for r in mean] == [1] and "entropy" not in mean[0]  # step 2 measured nothing
    assert abs(mean[0]["attribution/q1"] - 0.2) < 1e-12 and abs(mean[0]["entropy_change/realized"] - 0.1) < 1e-12
    assert plot_attribution(mean, tmp_path / "why.png").stat().st_size > 1000
    assert plot_attribution([{"step": 1, "entropy": 1.0}], tmp_path / "none.png") is None
    second = mean_by_step(
        [[{"step": 1, "attribution/q1": 0.1, "attribution_1st/q1": 0.12, "entropy_change/predicted_net_1st": 0.12}]]
    )
    assert second[0]["attribution_1st/q1"] == 0.12  # the first-order parts are averaged too
    assert plot_attribution(second, tmp_path / "why2.png").stat().st_size > 1000


def test_measuring_the_attribution_does_not_change_the_run(tmp_path):
    """A measurement, not an intervention: with and without it the same seed trains identically
    (every logged value but the timings and the attribution's own keys)."""
    from entropyrl.trainers.trainer import train

    def run(name, on):
        cfg = compose(
            "train",
            [
                "algo=stare",
                "algo.stare.h_tgt=100",
                "trainer.total_steps=3",
                "trainer.threads=1",
                "trainer.val_every=0",
                "trainer.progress=false",
                "tracking.enabled=false",
                "trainer.prompts_per_step=8",
                "trainer.mini_batch_prompts=4",
                "diagnostics.entropy_change=true",
                "diagnostics.probe_prompts=8",
                f"diagnostics.attribution={str(on).lower()}",
                f"output_dir={tmp_path / name}",
            ],
        )
        train(cfg, log=lambda *_: None)
        return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]

    on, off = run("on", True), run("off", False)
    own = ("time/", "attribution/", "attribution_1st/", "entropy_change/predicted_net")
    for a, b in zip(on, off):
        assert any(k.startswith("attribution/") for k in a) and not any(k.startswith("attribution/") for k in b)
        keys = {k for k in b if not k.startswith(own)}
        assert keys == {k for k in a if not k.startswith(own)}
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}


@pytest.mark.slow
def test_two_fsdp_ranks_predict_what_one_process_predicts(tmp_path):
    """Item 1 under FSDP: 2 gloo ranks (torchrun), and one process with its policy wrapped by FSDP
    (trainer.fsdp=true, as bfloat16 does), log the same predicted_net (g_H re-taken, sharded, between
    the step's two optimizer steps), trapezoid and realised change as one plain process of the same seed; the probe's 9 rows split 5/4 over the ranks in chunks of 4, so one rank
    pairs an empty chunk. The split into parts is skipped under FSDP, with one line, not an error;
    summary.json still fits predicted_net to the realised change (item 3)."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    args = [
        "trainer.total_steps=3",
        "trainer.prompts_per_step=4",
        "trainer.mini_batch_prompts=4",
        "trainer.ppo_epochs=2",  # two updates a step, each on the whole batch: the same rows on 1 or 2 ranks
        "trainer.micro_batch_responses=4",
        "rollout.n=4",
        "rollout.seed_scope=group",
        "optim.lr=1e-3",
        "trainer.val_every=0",
        "val.prompts=0",
        "trainer.save_every=0",
        "trainer.progress=false",
        "trainer.threads=1",
        "tracking.enabled=false",
        "diagnostics.attribution=true",
        "diagnostics.probe_prompts=3",
        "diagnostics.probe_responses=3",
    ]
    cli = ["-m", "entropyrl.cli.main", "train"]
    runs = {}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    for name, launcher, extra in (
        ("one", [sys.executable], []),
        ("two", torchrun, []),
        ("one_fsdp", [sys.executable], ["trainer.fsdp=true"]),
    ):
        out = subprocess.run(
            launcher + cli + args + extra + [f"output_dir={tmp_path / name}"],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
            cwd=os.fspath(tmp_path),
        )
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        runs[name] = (rows, out.stdout + out.stderr)
    (one, plain_log) = runs["one"]
    assert "sharded with FSDP" not in plain_log
    assert all(any(k.startswith("attribution/") for k in r) for r in one)
    for sharded in ("two", "one_fsdp"):
        rows, log = runs[sharded]
        assert [r["step"] for r in rows] == [1, 2, 3]
        assert log.count("the split into attribution/<part> needs one process without FSDP") == 1
        assert not any(k.startswith("attribution/") for r in rows for k in r)
    for a, b, c in zip(one, runs["two"][0], runs["one_fsdp"][0]):
        assert abs(a["loss/objective"] - b["loss/objective"]) <= 1e-5 * max(1.0, abs(a["loss/objective"]))  # same run
        for key in (
            "entropy_change/predicted_net",
            "entropy_change/predicted_net_1st",
            "entropy_change/realized",
        ):  # |value| ~ 1e-2 on this run
            assert a[key] != 0.0 and math.isfinite(a[key])
            for other in (b, c):
                assert abs(a[key] - other[key]) <= 1e-4 * abs(a[key]) + 1e-6, (a["step"], key, a[key], other[key])
    fits = [json.loads((tmp_path / name / "summary.json").read_text())["attribution"] for name in ("one", "two")]
    assert fits[1]["share"] == {} and set(fits[0]["share"]) >= {"momentum", "q1"}  # rank 0's rows: no parts
    assert fits[0]["fit"]["n"] == fits[1]["fit"]["n"] == 3
    assert abs(fits[0]["fit"]["slope"] - fits[1]["fit"]["slope"]) <= 1e-3 * abs(fits[0]["fit"]["slope"])


def _probe_check_worker(rank: int, port: int, out_dir: str) -> None:
    """One of 2 gloo ranks: the same probe batch on both ranks, then one that differs on rank 1."""
    import torch.distributed as dist

    from entropyrl.rollout.base import Rollout
    from entropyrl.trainers.parallel.process_group import DistInfo
    from entropyrl.trainers.stats.attribution import EntropyAttribution

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        ids = torch.arange(24).reshape(4, 6) % 7 + 3
        results, lines = [], []
        for differ in (False, True):
            resp = ids.clone()
            if differ and rank == 1:
                resp[2, 3] += 1  # one token of one response differs
            batch = Rollout(
                torch.ones(4, 2, dtype=torch.long),
                torch.ones(4, 2, dtype=torch.long),
                resp,
                torch.ones(4, 6, dtype=torch.long),
                [""] * 4,
                torch.zeros(4, dtype=torch.bool),
            )
            attr = EntropyAttribution(
                SimpleNamespace(batch=batch), None, 4, dist=DistInfo(rank=rank, world_size=2), log=lines.append
            )
            if differ:
                attr.begin(model=None)  # refuses before it touches a model
                results.append({"off": attr.off, "finish": attr.finish(model=None)})
            else:
                results.append({"same": attr._same_probe_on_every_rank()})
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps({"results": results, "lines": lines}))
    finally:
        dist.destroy_process_group()


def test_ranks_holding_different_probe_batches_log_no_prediction(tmp_path):
    """Under FSDP g_H is the sum of the ranks' shares of ONE probe batch; were the ranks' batches
    different (they are the same prompts and seed), the prediction is switched off with one line."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_probe_check_worker, args=(port, str(tmp_path)), nprocs=2, start_method="fork")
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["results"] == [{"same": True}, {"off": True, "finish": {}}]
        assert len(got["lines"]) == 1 and "different probe batches" in got["lines"][0]


def test_an_attribution_that_would_not_fit_in_memory_is_refused_before_the_first_step(tmp_path, monkeypatch):
    """The split holds copies of the trainable parameters per part: where they would not fit in
    what the device has left, the run stops at setup with one line naming the fixes (a run killed
    for memory at its first measured step would lose everything)."""
    from entropyrl.core.errors import UserError
    from entropyrl.trainers.stats import attribution
    from entropyrl.trainers.trainer import train

    params = [torch.zeros(1000, requires_grad=True), torch.zeros(10, requires_grad=False)]
    need = attribution.split_memory_bytes(1000, 1)
    assert need == 1000 * (4 * (5 + 1 + 1 + 1) + 4 * 6 + 8 * 5)  # grows with the parts' count ...
    assert attribution.split_memory_bytes(1000, 3) > need  # ... and counts frozen parameters out
    attribution.check_split_memory(params, 1, free=need)
    with pytest.raises(
        UserError,
        match=r"of 1,000 trainable parameters .* 0\.1 MiB, and 0\.1 MiB are free .*model\.lora\.rank=8.* diagnostics\.attribution=false",
    ):
        attribution.check_split_memory(params, 1, free=need - 1)

    monkeypatch.setattr(attribution, "available_memory_bytes", lambda: 1 << 20)  # 1 MiB left
    overrides = ["trainer.total_steps=1", "trainer.threads=1", "trainer.val_every=0", "trainer.progress=false"]
    overrides += ["tracking.enabled=false", "diagnostics.attribution=true", f"output_dir={tmp_path / 'run'}"]
    with pytest.raises(UserError, match="diagnostics.attribution: splitting the update"):
        train(compose("train", overrides), log=lambda *_: None)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    train(
        compose("train", [*overrides[:-2], "diagnostics.attribution=false", f"output_dir={tmp_path / 'off'}"]),
        log=lambda *_: None,
    )


def test_a_lora_adapters_update_is_split_into_parts_that_add_up(tmp_path):
    """The fix the memory check names: with a LoRA adapter the split holds only the adapter's
    parameters, and its parts still add up to the net prediction."""
    from entropyrl.trainers.trainer import train

    overrides = ["trainer.total_steps=2", "trainer.threads=1", "trainer.val_every=0", "trainer.progress=false"]
    overrides += ["tracking.enabled=false", "model.lora.rank=4", "diagnostics.attribution=true"]
    overrides += ["diagnostics.probe_prompts=8", "trainer.prompts_per_step=8", "trainer.mini_batch_prompts=8"]
    overrides += [f"output_dir={tmp_path / 'run'}"]
    train(compose("train", overrides), log=lambda *_: None)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        net = r["entropy_change/predicted_net"]
        parts = [v for k, v in r.items() if k.startswith("attribution/")]
        assert net != 0.0 and len(parts) >= 8
        assert abs(sum(parts) - net) <= 1e-6 * abs(net), (sum(parts), net)
