"""fp32 against bf16 on this machine, side by side in one run: the matrix-product limit at the
default model's shapes, then the model's own work (prefill, a training micro-batch's forward and
backward, greedy generation).

    python -m benchmarks.speed.precision                               # the default model, this CPU
    python -m benchmarks.speed.precision --random-init smollm2-135m    # its shapes, random weights (no model download)
    python -m benchmarks.speed.precision --device cuda

Each row alternates fp32 and bf16 (ABBA over --repeat rounds; the best time of each is kept), so a
noisy machine hits both alike. bf16 here means bf16 weights, except the row "fp32 weights under
bf16 autocast", which is how the RL trainers compute (fp32 master weights). The header names the CPU,
the bf16 matrix units it lists (AMX, AVX512-BF16), and what ``--dtype auto`` decides here with the
probe's numbers (``trainers/common/precision.py``): the flags alone do not tell whether bf16 pays.
"""

from __future__ import annotations

import copy
import contextlib
import json
from pathlib import Path

import torch

from trainers.common.config import Parser
from trainers.common.precision import abba, header_line
from trainers.common.models import DEFAULT_MODEL, load_model, resolve_device

ARCH_DIR = Path(__file__).resolve().parents[1] / "configs" / "arch"
#: (M, K, N): a decode step's rows, a prefill's tokens, an MLP up-projection at training size.
SHAPES = [(64, 576, 1536), (512, 576, 1536), (2048, 576, 1536), (2048, 576, 6144)]


def side_by_side(fp32, bf16, device: torch.device, repeat: int) -> tuple[float, float]:
    """Best seconds of ``fp32()`` and ``bf16()``, after one warm-up each, in ABBA order (the
    dtype probe's own timer, ``precision.abba``)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    return abba(fp32, bf16, rounds=repeat, sync=sync)[0]


def matmul_rows(device: torch.device, repeat: int) -> list[dict]:
    rows = []
    for m, k, n in SHAPES:
        a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
        ah, bh = a.bfloat16(), b.bfloat16()
        s32, s16 = side_by_side(lambda: torch.mm(a, b), lambda: torch.mm(ah, bh), device, 4 * repeat)
        flop = 2 * m * k * n
        rows.append({"work": f"`torch.mm` {m} x {k} x {n}", "fp32": flop / s32 / 1e9, "bf16": flop / s16 / 1e9,
                     "unit": "GFLOP/s"})
    return rows


def load(args, device: torch.device):
    if not args.random_init:
        return load_model(args.model, device=device, dtype=torch.float32, verbose=False)[0]
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = json.loads((ARCH_DIR / f"{args.random_init}.json").read_text())
    spec.pop("architectures", None)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(spec.pop("model_type"), **spec))
    return model.eval()


def model_rows(model, device: torch.device, repeat: int) -> list[dict]:
    """Prefill, forward + backward (fp32 weights in fp32 / under bf16 autocast / bf16 weights), generate."""
    half = copy.deepcopy(model).to(torch.bfloat16)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prefill = torch.randint(3, vocab, (64, 122), generator=gen).to(device)
    train = torch.randint(3, vocab, (8, 186), generator=gen).to(device)
    prompts = torch.randint(3, vocab, (16, 40), generator=gen).to(device)
    autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16)  # noqa: E731

    def forward(m, ids, context=contextlib.nullcontext):
        def run():
            with torch.inference_mode(), context():
                m(input_ids=ids, logits_to_keep=1)
        return run

    def step(m, context=contextlib.nullcontext):
        def run():
            with context():
                logits = m(input_ids=train).logits.float()
            torch.log_softmax(logits, -1).mean().backward()
            m.zero_grad(set_to_none=True)
        return run

    def generate(m):
        def run():
            with torch.inference_mode():
                m.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=32, min_new_tokens=32,
                           do_sample=False, pad_token_id=0)
        return run

    rows = []
    s32, s16 = side_by_side(forward(model, prefill), forward(half, prefill), device, repeat)
    rows.append({"work": "prefill, 64 prompts x 122 tokens", "fp32": s32, "bf16": s16, "unit": "s"})
    model.train(), half.train()
    s32, s16 = side_by_side(step(model), step(model, autocast), device, repeat)
    rows.append({"work": "forward + backward, 8 x 186 tokens, fp32 weights under bf16 autocast", "fp32": s32,
                 "bf16": s16, "unit": "s"})
    s32b, s16b = side_by_side(step(model), step(half), device, repeat)
    rows.append({"work": "forward + backward, 8 x 186 tokens, bf16 weights", "fp32": s32b, "bf16": s16b, "unit": "s"})
    model.eval(), half.eval()
    s32, s16 = side_by_side(generate(model), generate(half), device, repeat)
    rows.append({"work": "HF `generate`, 16 rows x 32 tokens, greedy", "fp32": s32, "bf16": s16, "unit": "s"})
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--random-init", default=None, choices=sorted(p.stem for p in ARCH_DIR.glob("*.json")),
                        help="an architecture of configs/arch with random weights instead of --model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds per row (ABBA)")
    parser.add_argument("--no-model", action="store_true", help="the matrix products only")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
    print(f"fp32 vs bf16 on {header_line(device)}; torch {torch.__version__}; "
          f"model {args.random_init or args.model}{' (random weights)' if args.random_init else ''}\n", flush=True)
    print("| work | fp32 | bf16 | bf16 speed-up |\n|---|---:|---:|---:|", flush=True)
    rows = []

    def show(new: list[dict]) -> None:
        for r in new:
            gain = r["bf16"] / r["fp32"] if r["unit"] == "GFLOP/s" else r["fp32"] / r["bf16"]
            fmt = (lambda v: f"{v:.0f} GFLOP/s") if r["unit"] == "GFLOP/s" else (lambda v: f"{v:.2f} s")
            print(f"| {r['work']} | {fmt(r['fp32'])} | {fmt(r['bf16'])} | {gain:.2f}x |", flush=True)
            rows.append(r | {"speedup": gain})

    show(matmul_rows(device, args.repeat))
    if not args.no_model:
        show(model_rows(load(args, device), device, args.repeat))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": header_line(device), "rows": rows}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
