"""A lent GPU's work, prepared here and run there in one call (issue 41).

The GPU machines lent through the ``device`` tool hold PyTorch, transformers and accelerate, but
not the rest of this project's dependencies, and they reach no network and no model hub. Their
time is short (minutes a session), so everything they run is made ready here first:

    python -m benchmarks.lent_gpu prepare     # here: .lent/ = the wheels the image lacks + the default tokenizer
    python -m benchmarks.lent_gpu run --cpu   # here: a rehearsal of the same launcher on tiny models

and then, through the device tool, ``python3 -m benchmarks.lent_gpu run`` with ``carry=[".lent"]``
(``prepare`` prints the exact call). ``run`` installs the wheels into a temporary folder, then runs
``benchmarks.gpu.speed`` (the issue's table; ``--budget`` so it ends in time) and
``benchmarks.gpu.check --no-speed`` (every CUDA path, pass/fail), each under a deadline that fits
one call. Each one's log, the table and its profile land under ``$OUT``, and the end of the output
repeats the table and the checks' tally, since a call returns only its last lines.

This module imports nothing outside the standard library (its parser is ``trainers.common.cli``'s,
which needs nothing more): it runs before the wheels are installed.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from trainers.common.cli import Parser  # the standard library alone, as this module

ROOT = Path(__file__).resolve().parents[2]
LENT = ROOT / ".lent"  # git-ignored; the device call carries it
#: The lent machines' Python (device tool, KINDS.md): the wheels are fetched for it.
PYTHON = "3.12"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]
#: The lent machines' image ('cuda'), as the device tool's KINDS.md lists it (read 2026-11-17). A
#: dependency of ours that is here travels as nothing; the rest travel as wheels.
IMAGE = set("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy
seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())
#: One call's limit is 600 s; the launcher ends inside this many, whatever its parts do.
LIMIT = 560
clock = time.monotonic  # the deadlines' clock (a test's to set)


def requirements(name: str) -> list[str]:
    """The distributions ``name`` needs on a plain Linux install (its extras left out)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    needed = []
    for line in metadata.requires(name) or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": "", "sys_platform": "linux",
                                                      "platform_system": "Linux", "python_version": PYTHON}):
            needed.append(canonicalize_name(req.name))
    return needed


def missing(root: str = "llm-envs", image: set[str] = IMAGE) -> dict[str, str]:
    """{distribution: version installed here} for every dependency of ``root`` that the image
    lacks, followed down until the image holds it."""
    found: dict[str, str] = {}
    todo = requirements(root)
    while todo:
        name = todo.pop()
        if name in image or name in found:
            continue
        found[name] = metadata.version(name)
        todo += requirements(name)
    return dict(sorted(found.items()))


def fetch_wheels(wanted: dict[str, str], where: Path) -> list[str]:
    """A wheel of each for the lent machines' Python into ``where/whl``. A package the index has no
    such wheel of goes as its source into ``where/sdist``, built on the machine itself (its image
    has a compiler, setuptools and wheel). Returns those names."""
    (where / "whl").mkdir(parents=True, exist_ok=True)
    platform = [x for p in PLATFORMS for x in ("--platform", p)]
    sources = []
    for name, version in wanted.items():
        pin = f"{name}=={version}"
        got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                              "--python-version", PYTHON, "--implementation", "cp", *platform, "-d",
                              str(where / "whl"), pin], capture_output=True, text=True)
        if got.returncode:
            source = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary=:all:",
                                     "-d", str(where / "sdist"), pin], capture_output=True, text=True)
            if source.returncode:
                raise SystemExit(f"lent_gpu prepare: neither a wheel of {pin} for Python {PYTHON} on Linux x86-64 "
                                 f"nor its source:\n{got.stderr.strip()}\n{source.stderr.strip()}")
            sdist = max((where / "sdist").glob(f"{name.replace('-', '[-_]')}-{version}*"), key=os.path.getmtime)
            if not pure_wheel(sdist, where / "whl"):
                sources.append(name)
    return sources


def pure_wheel(sdist: Path, where: Path) -> bool:
    """Build ``sdist`` into a wheel here; keep it (and drop the source) only when it is pure Python,
    which runs on any Python 3 (a compiled one would fit this machine's Python, not theirs)."""
    with tempfile.TemporaryDirectory() as tmp:
        built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp, str(sdist)],
                               capture_output=True, text=True)
        wheel = next(Path(tmp).glob("*.whl"), None)
        if built.returncode or wheel is None or not wheel.name.endswith("-none-any.whl"):
            return False
        shutil.move(wheel, where / wheel.name)
    sdist.unlink()
    return True


def copy_tokenizer(where: Path) -> None:
    """The default model's cache entry without its weights: what ``load_tokenizer`` reads offline."""
    from trainers.common.default_model import SMOLLM2_CACHE_NAME, ensure_default_model

    source = ensure_default_model(verbose=False)
    target = where / SMOLLM2_CACHE_NAME
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.gguf"))


def prepare(_args) -> int:
    wanted = missing()
    for old in ("whl", "sdist"):
        shutil.rmtree(LENT / old, ignore_errors=True)
    sources = fetch_wheels(wanted, LENT)
    copy_tokenizer(LENT / "cache")
    size = sum(p.stat().st_size for p in LENT.rglob("*") if p.is_file())
    built = f"; built there from source: {', '.join(sources)}" if sources else ""
    print(f"{LENT}: the {len(wanted)} packages the lent image lacks ({', '.join(f'{n} {v}' for n, v in wanted.items())}"
          f"{built}) and the default tokenizer, {size / 2**20:.1f} MiB in all.\n"
          "Rehearse here: python -m benchmarks.lent_gpu run --cpu\n"
          f'On a lent GPU: run(command="python3 -m benchmarks.lent_gpu run", carry=[".lent"], timeout_s=590)')
    return 0


# ----- on the lent machine ------------------------------------------------------------------------


def stream(command: list[str], log: Path, env: dict, timeout: float) -> int:
    """Run ``command`` in a session of its own, its output to the screen and ``log`` line by line;
    past ``timeout`` seconds the whole session is killed (a trainer's children too). 124: timed out."""
    with log.open("w") as sink:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=ROOT, start_new_session=True)

        def pump() -> None:
            for line in proc.stdout:
                sys.stdout.write(line)
                sink.write(line)
                sink.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = 124
        reader.join(timeout=5)
        if code == 124:
            sink.write(f"\n[lent_gpu: killed after {timeout:.0f} s]\n")
    return code


def install_wheels(env: dict, out: Path, site: Path) -> None:
    """``.lent``'s wheels into ``site``, put first on ``PYTHONPATH``; then its sources, each built
    here, one at a time: one that does not build is named and left out."""
    wheels = sorted(str(p) for p in (LENT / "whl").glob("*.whl"))
    if not wheels:
        print(f"lent_gpu: no wheels under {LENT / 'whl'} (run `python -m benchmarks.lent_gpu prepare` first); "
              "going on with what this machine has")
        return
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--target", str(site)]
    if stream([*pip, *wheels], out / "install.log", env, 120):
        raise SystemExit(f"lent_gpu: installing the wheels failed; see {out / 'install.log'}")
    for source in sorted((LENT / "sdist").glob("*")):  # one today (pycosat): one log
        if stream([*pip, "--no-build-isolation", str(source)], out / "install_sdist.log", env, 120):
            print(f"lent_gpu: {source.name} did not build here (install_sdist.log); going on without it")
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), *filter(None, [env.get("PYTHONPATH")])])


def run(args) -> int:
    """Install the wheels, then run the parts. The installed wheels and the trainers' runs live in one
    temporary folder, removed at the end: a rehearsal here once left ~0.55 GB of them each time."""
    with tempfile.TemporaryDirectory(prefix="lent-gpu-", ignore_cleanup_errors=True) as tmp:
        return run_parts(args, Path(tmp))


def run_parts(args, tmp: Path) -> int:
    start = clock()
    out = Path(os.environ.get("OUT") or ROOT / "runs" / "lent-gpu")
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if (LENT / "cache").is_dir():
        env["LLM_ENVS_CACHE"] = str(LENT / "cache")
    else:
        print(f"lent_gpu: no tokenizer under {LENT / 'cache'} (`prepare` copies it); this machine's own cache or "
              "network must serve the default model's")
    install_wheels(env, out, tmp / "site")
    left = lambda: args.limit - (clock() - start)  # noqa: E731
    python = [sys.executable, "-m"]
    table, checks = out / "gpu_speed.md", out / "gpu_check.log"
    results = {}
    if "speed" in args.only:
        hard = left() * (0.6 if "check" in args.only else 1) - 5
        budget = max(hard - 60, 1)  # the row in flight and the profile end inside the hard limit
        command = [*python, "benchmarks.gpu.speed", "--budget", f"{budget:.0f}", "--out", str(table)]
        results["gpu_speed"] = stream([*command, *(["--smoke"] if args.cpu else [])], out / "gpu_speed.log", env, hard)
    if "check" in args.only:
        # trainers' runs hold weights: never under $OUT
        command = [*python, "benchmarks.gpu.check", "--no-speed", "--out", str(tmp / "gpu-check"),
                   *(["--device", "cpu", "--arch", "tiny"] if args.cpu else [])]
        results["gpu_check"] = stream(command, checks, env, left() - 5)
    print("\n===== lent_gpu summary =====")
    if "speed" in args.only:
        print(table.read_text() if table.is_file() else "gpu_speed wrote no table")
    if "check" in args.only:
        lines = checks.read_text().splitlines() if checks.is_file() else []
        tally = [ln for ln in lines if re.match(r"\d+ passed, ", ln)]
        print(f"gpu_check: {tally[-1] if tally else 'no tally (see gpu_check.log)'}")
    print(", ".join(f"{name} exit {code}{' (killed at its deadline)' if code == 124 else ''}"
                    for name, code in results.items()) + f"; {clock() - start:.0f} s in all")
    return max(results.values(), default=0)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("prepare", help="here: fetch the wheels the lent image lacks and copy the tokenizer to .lent/")
    go = verbs.add_parser("run", help="there: install .lent's wheels, then gpu_speed and gpu_check under deadlines")
    go.add_argument("--cpu", action="store_true", help="a rehearsal on this CPU: tiny models (gpu_speed --smoke, "
                                                       "gpu_check --device cpu --arch tiny)")
    go.add_argument("--only", nargs="+", choices=["speed", "check"], default=["speed", "check"],
                    help="run one part alone (a rerun on a warm machine)")
    go.add_argument("--limit", type=float, default=LIMIT, help="seconds the whole run must end inside")
    args = parser.parse_args(argv)
    if args.verb == "run" and args.limit < 60:
        parser.error(f"--limit must be at least 60 seconds, not {args.limit:g}")
    return prepare(args) if args.verb == "prepare" else run(args)
