"""TRL's side of ``make bench-peers``: TRL's ``GRPOTrainer`` on the workload ``perf/peers.py`` hands it.

Run by ``perf/peers.py`` with the peer venv's interpreter (``.venv-peers``, where TRL is installed;
the product venv never gets it)::

    .venv-peers/bin/python perf/_peer_trl.py JOB.json OUT_FOLDER
    .venv-peers/bin/python perf/_peer_trl.py --replay JOB.json BATCH.json OUT_FOLDER [--flip]

The second form is the shared-batch check: TRL trains one step on the batch our trainer collected
(``perf/_peer_gradient.py``) and saves the gradient of its update (``replay``).

``JOB.json`` holds our side's workload (``perf/_peer_workload.py``: ``ours``), the problems of every
step in our order (each prompt the literal text our policy is given) and how to grade them. The
model is the Hugging Face folder (its tokenizer included) that our run loads, ending its responses
at the token ids ours ends at; the reward is our verifier: the built-in one of the toy tasks
(``tasks/builtin.py``: standard library only, loaded from the checkout without installing the
package), or, where the job names a ``reward`` service, our prompt source's verifier answering from
the product venv (``perf/_peer_reward.py``). Writes, into
``OUT_FOLDER``: ``rows.jsonl``, one row per step of ours (``updates_per_step`` optimizer steps of
TRL's) as it ends, with the batch's mean reward and response length and the step's seconds; ``result.json``, the
workload read back from the ``GRPOConfig`` TRL trained with, and TRL's version.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _load(name: str, path: Path, search: list[str] | None = None):
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=search)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _verifier():
    """``entropyrl.tasks.builtin`` from the checkout (the package's root, its core errors and its tasks:
    standard library only), so both sides score a response with the same function."""
    if "entropyrl" not in sys.modules:
        _load("entropyrl", REPO / "__init__.py", [str(REPO)])
    import entropyrl.tasks.builtin as builtin  # noqa: PLC0415 - found through the package just loaded
    from entropyrl.tasks.problem import Problem  # noqa: PLC0415

    return builtin, Problem


class RewardService:
    """``perf/_peer_reward.py`` in the product venv: one JSON line asked, one answered."""

    def __init__(self, python: str, overrides: list[str]):
        import subprocess

        cmd = [python, str(HERE / "_peer_reward.py"), json.dumps(overrides)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __call__(self, problems: list[list], responses: list[str], group: list[int]) -> list[float]:
        self.proc.stdin.write(json.dumps({"problems": problems, "responses": responses, "group": group}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the reward service ended ({self.proc.wait()}): see its stderr above")
        return json.loads(line)["rewards"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def prompts_sha256(prompts: list[str]) -> str:
    """The hash both sides give the prompts of every step, in order (one prompt per group)."""
    return hashlib.sha256("\n".join(prompts).encode()).hexdigest()


def _reward_function(job: dict):
    """TRL's reward function over ``job``'s problems, the prompts it saw (one per group, in order), the
    mean reward and response length of each generation, and the reward service it asks (None: the
    built-in verifier)."""
    n = int(job["workload"]["samples_per_prompt"])
    seen: list[str] = []  # one prompt per group, in the order TRL trained on them
    rewards: list[float] = []  # the mean reward of each generation (one step of ours)
    lengths: list[float] = []  # ... and its mean response length in tokens (up to and including the stop token)
    service = RewardService(job["reward"]["python"], job["reward"]["overrides"]) if job.get("reward") else None
    if service is None:
        builtin, Problem = _verifier()

    def reward(prompts, completions, task, answer, params, completion_ids, **_):
        if service is not None:
            group = [i // n for i in range(len(completions))]  # TRL hands a generation's groups in order
            scores = service([list(row) for row in zip(task, prompts, answer, params)], list(completions), group)
        else:
            rows = zip(prompts, completions, task, answer, params)
            scores = [builtin.reward(Problem(t, p, a, tuple(q)), c) for p, c, t, a, q in rows]
        seen.extend(prompts[::n])
        rewards.append(sum(scores) / len(scores))
        lengths.append(sum(len(ids) for ids in completion_ids) / len(completion_ids))
        return scores

    return reward, seen, rewards, lengths, service


def _config(workload_mod, ours: dict, folder: Path):
    """TRL's ``GRPOConfig`` for the workload ``ours``, with the harness's own settings (no logging out,
    no checkpoints, CPU, float32)."""
    from trl import GRPOConfig

    return GRPOConfig(
        **workload_mod.trl_config_kwargs(ours),
        output_dir=str(folder / "trl"),
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        fp16=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
        log_completions=False,
    )


def _model(ours: dict):
    """The model loaded here, as TRL would from the folder, ending its responses where ours does (TRL
    stops at the model's generation_config.eos_token_id and the tokenizer's EOS)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ours["model_dir"], dtype=getattr(torch, ours["dtype"]))
    model.generation_config.eos_token_id = list(ours["stop_token_ids"])
    return model


def replay(job_path: str, batch_path: str, out: str, flip: bool = False) -> int:
    """TRL's gradient on our batch (``perf/_peer_gradient.py``'s ``batch.json``): its generation hands back
    our responses (after checking the prompt ids it tokenized equal ours), its reward function our shaped
    rewards (negated with ``flip``: a batch whose gradient must not match); saves ``trl_grad.pt``, the
    gradient of its first optimizer step as the optimizer receives it."""
    workload_mod = _load("peer_workload", HERE / "_peer_workload.py")
    job = json.loads(Path(job_path).read_text())
    ours = job["workload"]
    rows = json.loads(Path(batch_path).read_text())["rows"]
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(int(ours["threads"]))
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    model = _model(ours)
    # one prompt per group, in our order: TRL repeats each num_generations times, as our groups are laid out
    dataset = Dataset.from_dict({"prompt": [p[1] for p in job["problems"]]})

    def generate(input_ids=None, attention_mask=None, **_):
        if input_ids.shape[0] != len(rows):
            raise RuntimeError(f"TRL generated {input_ids.shape[0]} responses at once; our batch has {len(rows)}")
        for i, row in enumerate(rows):
            if input_ids[i][attention_mask[i].bool()].tolist() != row["prompt_ids"]:
                raise RuntimeError(f"row {i}: TRL's prompt ids differ from ours")
        width = max(len(r["response_ids"]) for r in rows)
        pad = int(ours["stop_token_ids"][0])  # after a response's stop token: masked by TRL as by us
        responses = torch.full((len(rows), width), pad, dtype=torch.long)
        for i, row in enumerate(rows):
            responses[i, : len(row["response_ids"])] = torch.tensor(row["response_ids"])
        return torch.cat([input_ids, responses], dim=1)

    model.generate = generate

    def reward(prompts, completions, completion_ids, **_):
        if [list(c) for c in completion_ids] != [r["response_ids"] for r in rows]:
            raise RuntimeError("TRL's completion ids differ from the responses handed to it")
        return [-r["reward"] if flip else r["reward"] for r in rows]

    grads: dict = {}

    class FirstGradient(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            if not grads:
                grads.update({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})

    config = _config(workload_mod, {**ours, "steps": 1}, folder)
    GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset, callbacks=[FirstGradient()]).train()
    torch.save(grads, folder / "trl_grad.pt")
    return 0


def main(job_path: str, out: str) -> int:
    workload_mod = _load("peer_workload", HERE / "_peer_workload.py")
    job = json.loads(Path(job_path).read_text())
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    ours = job["workload"]

    import torch

    torch.set_num_threads(int(ours["threads"]))
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    problems = job["problems"]  # [task, prompt, answer, params] per prompt, step after step
    dataset = Dataset.from_dict(
        {
            "prompt": [p[1] for p in problems],
            "task": [p[0] for p in problems],
            "answer": [p[2] for p in problems],
            "params": [list(p[3]) for p in problems],
        }
    )
    reward, seen, rewards, lengths, service = _reward_function(job)
    rows = (folder / "rows.jsonl").open("w")
    updates = int(ours["updates_per_step"]) * int(ours["epochs"])
    last = [time.perf_counter()]

    class StepClock(TrainerCallback):
        """A row per step of ours: the batch's mean reward and the seconds since the previous one."""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % updates == 0:
                now = time.perf_counter()
                step = state.global_step // updates
                row = {"step": step, "reward/mean": rewards[step - 1], "response_length/mean": lengths[step - 1]}
                rows.write(json.dumps({**row, "time/step": now - last[0]}) + "\n")
                rows.flush()
                last[0] = now

    args = _config(workload_mod, ours, folder)
    model = _model(ours)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset, callbacks=[StepClock()])
    last[0] = time.perf_counter()
    trainer.train()
    rows.close()
    if service is not None:
        service.close()
    model_dtype = str(next(trainer.model.parameters()).dtype).removeprefix("torch.")
    used = workload_mod.from_trl_config(
        trainer.args,
        model_dir=trainer.model.config._name_or_path,
        dtype=model_dtype,
        threads=torch.get_num_threads(),
        prompts_sha256=prompts_sha256(seen),
        stop_token_ids=trainer.eos_token_ids,
    )
    (folder / "result.json").write_text(json.dumps({"workload": used, "trl": trl.__version__, "torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--replay":  # --replay JOB BATCH OUT [--flip]
        sys.exit(replay(*sys.argv[2:5], flip="--flip" in sys.argv[5:]))
    sys.exit(main(*sys.argv[1:3]))
