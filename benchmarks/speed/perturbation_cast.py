"""How much of a full-rank ES member's perturbation survives the cast to bf16, per layer.

A full-rank member in bf16 is the fp32 master plus sigma * eps, rounded to bf16 for generation
(``fullrank.perturb``). Where sigma * eps is small against a weight's bf16 spacing, the rounding
eats it: the realised perturbation ``bf16(m + sigma eps) - bf16(m)`` differs from the intended
``sigma eps``. Printed per layer kind (summed over the model's layers) and per tensor with --all:

- corr: the correlation of realised and intended perturbations over the tensor's elements;
- kept: ||realised|| / ||intended|| (1 = the size survives; rounding adds or removes energy);
- zero: the share of elements the cast leaves unchanged (their perturbation is lost).

    python -m benchmarks.speed.perturbation_cast                    # the default model, the paper's sigma 1e-3
    python -m benchmarks.speed.perturbation_cast --sigma 5e-4 --all
    python -m benchmarks.speed.perturbation_cast --random-init qwen2.5-1.5b

Low-rank members are unaffected: their term is added in fp32 (``lowrank.Population``).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import torch

from trainers.common.config import Parser
from trainers.common.precision import header_line
from trainers.common.models import DEFAULT_MODEL, load_model
from trainers.es.noise import fullrank

ARCH_DIR = Path(__file__).resolve().parents[1] / "configs" / "arch"


def kind_of(name: str) -> str:
    """A parameter's layer kind: its name without layer indices (``model.layers.3.mlp.up_proj.weight``
    -> ``mlp.up_proj.weight``)."""
    return re.sub(r"^model\.|layers\.\d+\.", "", name)


@torch.no_grad()
def measure(model, sigma: float, seed: int = 1) -> dict[str, dict[str, float]]:
    """Per tensor name: corr, kept, zero and numel of one member (seed ``seed``) cast to bf16."""
    params = fullrank.Params(list(model.named_parameters()))
    out = {}
    for index, (name, p) in enumerate(zip(params.names, params.tensors)):
        master = p.detach().float()
        intended = sigma * fullrank.noise(p, seed, index, False)
        realised = (master + intended).to(torch.bfloat16).float() - master.to(torch.bfloat16).float()
        a, b = realised.flatten().double(), intended.flatten().double()
        spread = (a - a.mean()).norm() * (b - b.mean()).norm()
        corr = float(((a - a.mean()) * (b - b.mean())).sum() / spread) if spread > 0 else 0.0  # all rounded away: 0
        out[name] = {"corr": corr, "kept": float(a.norm() / b.norm()), "zero": float((a == 0).double().mean()),
                     "numel": p.numel()}
    return out


def by_kind(rows: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Element-weighted means per layer kind, in first-seen order, plus the whole model."""
    groups: dict[str, list[dict[str, float]]] = defaultdict(list)
    for name, r in rows.items():
        groups[kind_of(name)].append(r)
    groups["all parameters"] = list(rows.values())
    out = {}
    for kind, rs in groups.items():
        n = sum(r["numel"] for r in rs)
        out[kind] = {k: sum(r[k] * r["numel"] for r in rs) / n for k in ("corr", "kept", "zero")} | {"numel": n}
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--random-init", default=None, help="an architecture of configs/arch (random weights)")
    parser.add_argument("--sigma", type=float, default=1e-3, help="the paper's sigma (default 1e-3)")
    parser.add_argument("--all", action="store_true", help="also every tensor")
    parser.add_argument("--json", default=None, help="write the numbers here")
    args = parser.parse_args(argv)
    if args.random_init:
        from transformers import AutoConfig, AutoModelForCausalLM

        spec = json.loads((ARCH_DIR / f"{args.random_init}.json").read_text())
        spec.pop("architectures", None)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(spec.pop("model_type"), **spec))
        what = f"{args.random_init} (random weights)"
    else:
        model, _ = load_model(args.model, device="cpu", dtype=torch.float32, verbose=False)
        what = args.model
    rows = measure(model, args.sigma)
    kinds = by_kind(rows)
    print(f"full-rank member cast to bf16: {what}, sigma {args.sigma:g}; {header_line('cpu')}\n")
    print("| layer kind | parameters | corr(realised, intended) | norm kept | elements unchanged |\n|---|---:|---:|---:|---:|")
    for kind, r in kinds.items():
        print(f"| {kind} | {r['numel'] / 1e6:.2f}M | {r['corr']:.4f} | {r['kept']:.3f} | {r['zero']:.1%} |")
    if args.all:
        print("\n| tensor | corr | kept | unchanged |\n|---|---:|---:|---:|")
        for name, r in rows.items():
            print(f"| {name} | {r['corr']:.4f} | {r['kept']:.3f} | {r['zero']:.1%} |")
    result = {"model": what, "sigma": args.sigma, "kinds": kinds, "tensors": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
