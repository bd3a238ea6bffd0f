"""The held-out evaluation a training run logs: pass@1 and mean reward on ``--eval-split``, each
process evaluating its share of the examples (the sums all-reduced), recorded in the run's log;
the one before training read from ``--base-eval``'s file where another run made it
(``trainers.common.base_eval``)."""

from __future__ import annotations

from collections.abc import Callable

from trainers.common import base_eval
from trainers.common.episodes import check_command, cut_short, episode_line
from trainers.common.progress import RunClock
from trainers.common.rollout import evaluate
from trainers.common.run_dir import RunDir


class HeldOut:
    """``held_out(iteration)`` evaluates the current model and logs it; ``evaluated`` holds the
    iterations whose model has a record (a resumed run keeps those up to where it resumes)."""

    def __init__(self, cfg, engine, scorer, run: RunDir, dist, say: Callable[[str], None], batch_size: int,
                 clock: RunClock | None = None, done: int | None = None, unit: str = "iteration"):
        self.cfg, self.engine, self.scorer, self.run, self.dist, self.say = cfg, engine, scorer, run, dist, say
        self.batch_size, self.clock, self.unit = batch_size, clock, unit
        self.evaluated = {r["iteration"] for r in run.read_log() if "eval_reward" in r and r["iteration"] <= done} \
            if done is not None else set()
        self.warned = False  # the first-turn warning is said once per run
        self.base_key: str | None = None  # process 0, with --base-eval: the key of the record before training

    def __call__(self, iteration: int) -> dict[str, float]:
        cfg, clock = self.cfg, self.clock
        self.evaluated.add(iteration)
        shared = self.shared_base() if iteration == 0 and cfg.base_eval else None
        if shared is not None:
            return self.reuse(*shared)
        self.dist.phase = f"the held-out evaluation of {self.unit} {iteration}"
        scores = evaluate(self.engine, self.scorer, cfg.eval_split, cfg.max_new_tokens, self.batch_size,
                          cfg.eval_limit, self.dist.rank, self.dist.world, self.dist.sum,
                          progress=clock is not None and f"held-out {cfg.eval_split} ({self.unit} {iteration})",
                          on_progress=clock and clock.evaluation)
        record = {"iteration": iteration, "eval_pass@1": scores["pass@1"], "eval_reward": scores["reward"],
                  "eval_n": scores["n"]}
        tally = scores.get("episodes")  # a multi-turn env's episodes: their statistics, eval's names prefixed
        if tally is not None:
            record |= {f"eval_{k}": v for k, v in tally.means().items()}
        self.run.log(record, iteration)
        if iteration == 0 and self.base_key is not None:
            base_eval.BaseEvals(cfg.base_eval).put(self.base_key, record, str(self.run.path))
        self.say(self.line(record) + (episode_line(tally) if tally is not None else ""))
        warning = tally is not None and not self.warned and cut_short(
            tally, cfg.max_new_tokens, self.scorer.env.stop_strings,
            check_command(cfg.env, cfg.env_args, cfg.model, cfg.max_new_tokens))
        if warning:
            self.say(f"[{self.short} {iteration}] held-out: {warning}")
            self.warned = True
        self.dist.wait_for_main()  # rank 0 logged (TensorBoard's first import takes seconds)
        return record

    def shared_base(self) -> tuple[dict, str] | None:
        """The record before training another run made of these weights under these settings (process
        0 reads ``--base-eval``'s file; every process gets its answer), with that run's directory."""
        entry = None
        if self.dist.is_main:  # every process holds the whole model it generates with (RL's FSDP2 too)
            self.base_key = base_eval.key(self.cfg, self.engine, self.batch_size, self.dist.world)
            entry = base_eval.BaseEvals(self.cfg.base_eval).get(self.base_key)
        entry = self.dist.from_main(entry)
        return None if entry is None else (entry["record"], entry["run"])

    def reuse(self, record: dict, made_by: str) -> dict[str, float]:
        """Log ``record``, the evaluation before training ``made_by`` (a run directory) made."""
        self.run.log(record, 0)
        self.say(self.line(record) + f" (made by {made_by} with the same weights and settings: "
                                     f"--base-eval {self.cfg.base_eval})")
        self.dist.wait_for_main()
        return record

    @property
    def short(self) -> str:
        return "iter" if self.unit == "iteration" else self.unit

    def line(self, record: dict) -> str:
        """What the run says of a held-out ``record``."""
        return (f"[{self.short} {record['iteration']}] held-out {self.cfg.eval_split}: pass@1 "
                f"{record['eval_pass@1']:.3f}, reward {record['eval_reward']:.4f}")
