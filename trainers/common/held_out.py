"""The held-out evaluation a training run logs: pass@1 and mean reward on ``--eval-split``, each
process evaluating its share of the examples (the sums all-reduced), recorded in the run's log."""

from __future__ import annotations

from collections.abc import Callable

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

    def __call__(self, iteration: int) -> dict[str, float]:
        cfg, clock = self.cfg, self.clock
        self.evaluated.add(iteration)
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
        short = "iter" if self.unit == "iteration" else self.unit
        self.say(f"[{short} {iteration}] held-out {cfg.eval_split}: pass@1 {scores['pass@1']:.3f}, "
                 f"reward {scores['reward']:.4f}" + (episode_line(tally) if tally is not None else ""))
        warning = tally is not None and not self.warned and cut_short(
            tally, cfg.max_new_tokens, self.scorer.env.stop_strings,
            check_command(cfg.env, cfg.env_args, cfg.model, cfg.max_new_tokens))
        if warning:
            self.say(f"[{short} {iteration}] held-out: {warning}")
            self.warned = True
        self.dist.wait_for_main()  # rank 0 logged (TensorBoard's first import takes seconds)
        return record
