"""Mutation check of the parity suite: `nox -s mutants` (or python tests/mutants.py).

Each MUTANT is one deliberate single-line error on the path a compare run takes from a RunConfig to
the models, optimizers, losses and loss scalers of both frameworks (contract/mapping.py, kit/weights.py,
*_impl/train.py, *_impl/amp.py, keras_impl/optimizers.py; and tests/model_registry.py's test-only twin). Each is
applied to a temporary copy of the tree (never in place); tests/test_parity.py then runs on that copy and must
fail. Prints caught / not caught per mutant and the percentage; exits 1 unless every mutant is caught (and 2
if a mutant's line is no longer in its file, so the list cannot silently go stale). `--only TEXT` runs the
mutants whose name or file contains TEXT.

Speed: torch, tensorflow and keras are imported once here and each mutant runs in a forked child,
so a mutant costs only its tests (pytest -x stops at the first failure). No project module is
imported before the fork: every child imports the mutated copy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARITY = "tests/test_parity.py"
# The parity suite's tests run quick ones first: pytest -x stops at the first failure and keeps the command line's
# order, so most mutants cost seconds. The tests are what pytest collects (every registered model, the test-only
# ones of tests/model_registry.py among them), ordered by `quick_first`: the first model's tests, then every
# model's forward and gradient tests, then the others' training; models in MODEL_ORDER, one registered later after.
MODEL_ORDER = ("simple_cnn", "vit", "resnet18")
TEST_ORDER = ("test_forward_inference_mode", "test_forward_training_mode", "test_gradients_of_one_step",
              "test_training_steps_agree", "test_loss_scaler_sequence")


def quick_first(test_id: str) -> tuple[int, int, int]:
    """Sort key of a collected test id, tests/test_parity.py::<test>[<model>(-<optimizer>)]."""
    test, _, param = test_id.partition("::")[2].partition("[")
    model = param.rstrip("]").split("-")[0]
    model_rank = MODEL_ORDER.index(model) if model in MODEL_ORDER else len(MODEL_ORDER)
    test_rank = TEST_ORDER.index(test) if test in TEST_ORDER else len(TEST_ORDER)
    return (int(model_rank > 0 and test_rank > 2), model_rank, test_rank)


JOBS = 2  # mutants run two at a time (a 2-core machine)
# fp8's mutants run the fp8 reference tests (the parity suite cannot see a recipe: both frameworks differ there).
FP8 = "tests/test_fp8_reference.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str  # must occur exactly once in the file
    new: str
    tests: tuple[str, ...] = ()  # what must fail; () the parity suite (ORDER)


MUTANTS = [
    Mutant("Adam epsilon x10 (Keras)", "amp_compare/keras_impl/train.py",
           'inner = TorchAdam(learning_rate=lr, epsilon=settings["adam_epsilon"], **extra)',
           'inner = TorchAdam(learning_rate=lr, epsilon=settings["adam_epsilon"] * 10, **extra)'),
    Mutant("Adam beta_2 0.998 (Keras)", "amp_compare/keras_impl/train.py",
           'inner = TorchAdam(learning_rate=lr, epsilon=settings["adam_epsilon"], **extra)',
           'inner = TorchAdam(learning_rate=lr, epsilon=settings["adam_epsilon"], beta_2=0.998, **extra)'),
    Mutant("Adam beta_1 0.85 (Keras)", "amp_compare/keras_impl/train.py",
           'inner = TorchAdam(learning_rate=lr, epsilon=settings["adam_epsilon"], **extra)',
           'inner = TorchAdam(learning_rate=lr, epsilon=settings["adam_epsilon"], beta_1=0.85, **extra)'),
    Mutant("Keras' own Adam formula in aligned mode", "amp_compare/keras_impl/train.py",
           'if settings.get("adam_formula") == "torch":', 'if False:'),
    Mutant("Keras Adam epsilon on the uncorrected sqrt(v)", "amp_compare/keras_impl/optimizers.py",
           'epsilon_hat = ops.cast(ops.convert_to_tensor(self.epsilon, "float64") * correction_2_sqrt, variable.dtype)',
           'epsilon_hat = ops.cast(self.epsilon, variable.dtype)'),
    Mutant("SGD momentum x0.99 (Keras)", "amp_compare/keras_impl/train.py",
           "inner = keras.optimizers.SGD(learning_rate=lr, momentum=cfg.momentum, **extra)",
           "inner = keras.optimizers.SGD(learning_rate=lr, momentum=cfg.momentum * 0.99, **extra)"),
    Mutant("BatchNorm momentum 0.91 (Keras)", "amp_compare/contract/mapping.py",
           "else keras_bn_momentum(BN_MOMENTUM_TORCH))", "else 0.91)"),
    Mutant("BatchNorm momentum convention (Keras gets torch's 0.1)", "amp_compare/contract/mapping.py",
           "else keras_bn_momentum(BN_MOMENTUM_TORCH))", "else BN_MOMENTUM_TORCH)"),
    Mutant("BatchNorm epsilon 1e-3 (Keras)", "amp_compare/keras_impl/train.py",
           'bn_momentum=settings.get("bn_momentum"), bn_epsilon=settings.get("bn_epsilon"),\n'
           '                        stride2_padding',
           'bn_momentum=settings.get("bn_momentum"), bn_epsilon=1e-3,\n                        stride2_padding'),
    Mutant("stride-2 padding 'same' (Keras)", "amp_compare/contract/mapping.py",
           '"stride2_padding": "symmetric",', '"stride2_padding": "same",'),
    Mutant("weight transfer: conv kernel transposed (H <-> W)", "amp_compare/kit/weights.py",
           "return np.ascontiguousarray(weight.transpose(2, 3, 1, 0))",
           "return np.ascontiguousarray(weight.transpose(3, 2, 1, 0))"),
    Mutant("loss reduction sum instead of mean (Keras)", "amp_compare/keras_impl/train.py",
           "return keras.losses.SparseCategoricalCrossentropy(from_logits=True)",
           'return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")'),
    Mutant("loss reduction sum instead of mean (torch)", "amp_compare/torch_impl/amp.py",
           "loss = F.cross_entropy(logits, y)  # autocast computes this in float32",
           'loss = F.cross_entropy(logits, y, reduction="sum")'),
    Mutant("loss-scale growth interval doubled (Keras)", "amp_compare/keras_impl/amp.py",
           '"dynamic_growth_steps": settings["growth_interval"]}',
           '"dynamic_growth_steps": 2 * settings["growth_interval"]}'),
    Mutant("initial loss scale halved (torch)", "amp_compare/torch_impl/amp.py",
           'scaling = {k: settings[k] for k in ("init_scale", "growth_interval")} if settings else {}',
           'scaling = {"init_scale": settings["init_scale"] / 2, "growth_interval": settings["growth_interval"]}'),
    # fp8 (issue 34): each fails tests/test_fp8_reference.py
    Mutant("fp8: e5m2 where e4m3 belongs (torch inputs)", "amp_compare/torch_impl/fp8.py",
           'cast_config_input=casts["input"],',
           "cast_config_input=CastConfig(scaling_granularity=granularity, target_dtype=torch.float8_e5m2),",
           (FP8,)),
    Mutant("fp8: scale not applied (the quantization the SQNR and reference use)", "amp_compare/kit/fp8.py",
           "return fp8_round((x32 * s32).astype(np.float64), fmt) / s32.astype(np.float64)",
           "return fp8_round(x32.astype(np.float64), fmt)", (FP8,)),
    Mutant("fp8: amax history of the wrong length (Keras)", "amp_compare/keras_impl/fp8.py",
           "policy.amax_history_length = recipe.amax_history", "policy.amax_history_length = recipe.amax_history // 2",
           (FP8,)),
    Mutant("fp8: a layer left unconverted (torch)", "amp_compare/torch_impl/fp8.py",
           "module_filter_fn=lambda module, name: not _kept_out(name, cfg.fp32_layers))",
           'module_filter_fn=lambda module, name: not _kept_out(name, cfg.fp32_layers) and name != "fc")',
           (FP8,)),
    Mutant("fp8: a layer left unconverted (Keras)", "amp_compare/keras_impl/fp8.py",
           "if _kept_out(name, cfg.fp32_layers):", 'if _kept_out(name, cfg.fp32_layers) or name == "blocks.0.mlp.fc1":',
           (FP8,)),
    # The vit (issue 24): attention, normalisation, GELU, head split, position embedding, AdamW, the schedule.
    Mutant("vit: attention scale 1/d instead of 1/sqrt(d) (torch)", "amp_compare/torch_impl/vit.py",
           "out = F.scaled_dot_product_attention(q, k, v)",
           "out = F.scaled_dot_product_attention(q, k, v, scale=1.0 / self.head_dim)"),
    Mutant("vit: LayerNorm epsilon 1e-6 instead of 1e-5 (Keras)", "amp_compare/keras_impl/vit.py",
           '"ln_epsilon": settings.get("ln_epsilon"),', '"ln_epsilon": 1e-6,'),
    Mutant("vit: GELU tanh approximation instead of exact (Keras)", "amp_compare/keras_impl/vit.py",
           '"gelu_approximate": settings.get("gelu_approximate"),', '"gelu_approximate": True,'),
    Mutant("vit: head split order (head_dim, heads) (torch)", "amp_compare/torch_impl/vit.py",
           "return t.view(b, n, self.heads, self.head_dim).transpose(1, 2)",
           "return t.view(b, n, self.head_dim, self.heads).permute(0, 3, 1, 2)"),
    Mutant("vit: position embedding not added (torch)", "amp_compare/torch_impl/vit.py",
           "return x + self.pos", "return x"),
    Mutant("vit: attention kernels moved as (dim, head_dim, heads) (weights)", "amp_compare/kit/weights.py",
           "return np.ascontiguousarray(value.T.reshape(value.shape[1], heads, -1))",
           "return np.ascontiguousarray(value.T.reshape(value.shape[1], -1, heads).transpose(0, 2, 1))"),
    Mutant("AdamW as Adam with L2 weight decay (torch)", "amp_compare/torch_impl/train.py",
           "optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay,",
           "optimizer = torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay,"),
    Mutant("AdamW without weight decay (Keras)", "amp_compare/keras_impl/train.py",
           'extra["weight_decay"] = cfg.weight_decay', 'extra["weight_decay"] = 0.0'),
    Mutant("warm-up + cosine one update ahead (Keras)", "amp_compare/keras_impl/optimizers.py",
           'update = ops.cast(step, "float64")', 'update = ops.cast(step, "float64") + 1.0'),
    Mutant("schedule advanced before each update instead of after it (torch)", "amp_compare/torch_impl/schedule.py",
           "optimizer.register_step_post_hook(lambda *_: scheduler.step())",
           "optimizer.register_step_pre_hook(lambda *_: scheduler.step())"),
    # A model the suite was not written for (tests/model_registry.py, test-only): parametrised over the registry,
    # the suite checks its twins as well.
    Mutant("test-only mlp: hidden ReLU left out (its Keras twin)", "tests/model_registry.py",
           'x = layers.ReLU(name="act")(layers.Dense(HIDDEN, name="hidden")(x))',
           'x = layers.Activation("linear", name="act")(layers.Dense(HIDDEN, name="hidden")(x))'),
]


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    return [line for line in out.splitlines() if line and (ROOT / line).is_file()]


def make_copy(dest: Path, files: list[str], mutant: Mutant) -> None:
    for name in files:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    path = dest / mutant.path
    text = path.read_text()
    if text.count(mutant.old) != 1:
        print(f"mutant {mutant.name!r}: its line occurs {text.count(mutant.old)} times in {mutant.path}, "
              "expected once (update tests/mutants.py)", file=sys.stderr)
        sys.exit(2)
    path.write_text(text.replace(mutant.old, mutant.new))


def start_child(tree: Path, log: Path, args: tuple[str, ...]) -> int:
    """Fork a child that runs pytest on the (mutated) tree; returns its pid (exit status 0: tests passed)."""
    pid = os.fork()
    if pid == 0:  # child: only the mutated copy is importable as the project
        code = 3
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.chdir(tree)
            sys.path[:] = [str(tree)] + [p for p in sys.path if Path(p or ".").resolve() != ROOT]
            os.environ["PYTHONPATH"] = str(tree)
            os.environ["AMP_COMPARE_ARTIFACTS"] = str(tree / "test-artifacts")
            import pytest

            code = int(pytest.main(["-q", "-p", "no:cacheprovider", *args]))
        finally:
            sys.stdout.flush()
            os._exit(code)
    return pid


def check_unmutated(log: Path, order: list[str]) -> None:
    """The parity suite must pass on the tree as it is: otherwise every mutant would look "caught"."""
    _, status = os.waitpid(start_child(ROOT, log, (*order, FP8)), 0)
    if os.waitstatus_to_exitcode(status) != 0:
        failed = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("FAILED ")]
        print(f"the parity suite fails without any mutation ({'; '.join(failed) or 'see ' + str(log)}): "
              "fix it first, no mutant can be judged", file=sys.stderr)
        sys.exit(2)


def collected_order(log: Path) -> list[str]:
    """Every test of the parity suite as pytest collects it, quick ones first (a new test or model runs too)."""
    _, status = os.waitpid(start_child(ROOT, log, ("--collect-only", PARITY)), 0)
    lines = log.read_text(errors="replace").splitlines()
    collected = sorted({line.strip() for line in lines if line.startswith(PARITY + "::")}, key=quick_first)
    if os.waitstatus_to_exitcode(status) != 0 or not collected:
        print(f"could not collect {PARITY} (see {log})", file=sys.stderr)
        sys.exit(2)
    return collected


def selected(argv: list[str] | None) -> list[Mutant]:
    parser = argparse.ArgumentParser(description="Run the parity suite on mutated copies of the tree; every mutant "
                                                 "must make it fail.")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="only the mutants whose name or file contains TEXT (repeatable; default: all)")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or any(t in m.name or t in m.path for t in args.only)]
    if not chosen:
        parser.error(f"no mutant matches {args.only} (names: {'; '.join(m.name for m in MUTANTS)})")
    return chosen


def main(argv: list[str] | None = None) -> int:
    mutants = selected(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras  # noqa: F401  (imported once, before the forks)
    import tensorflow  # noqa: F401
    import torch  # noqa: F401

    files = tracked_files()
    start, results = time.perf_counter(), {}
    print(f"{len(mutants)} mutants, each running {PARITY} (-x, quick tests first) on a mutated copy of the tree, "
          f"{JOBS} at a time", flush=True)
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        order = collected_order(Path(tmp) / "collect.log")
        check_unmutated(Path(tmp) / "unmutated.log", order)
        print(f"  unmutated tree: the parity suite passes ({time.perf_counter() - start:.0f} s)", flush=True)
        pending, running = list(enumerate(mutants)), {}
        while pending or running:
            while pending and len(running) < JOBS:
                i, mutant = pending.pop(0)
                tree = Path(tmp) / f"m{i}"
                make_copy(tree, files, mutant)
                running[start_child(tree, Path(tmp) / f"m{i}.log", ("-x", *(mutant.tests or order)))] = (
                    i, mutant, time.perf_counter())
            pid, status = os.wait()
            i, mutant, t0 = running.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            lines = (Path(tmp) / f"m{i}.log").read_text(errors="replace").strip().splitlines()
            tail = [line.split(" - ")[0].removeprefix("FAILED ") for line in lines if line.startswith("FAILED ")]
            tail = [f"failed {tail[0]}"] if tail else lines[-1:]
            shutil.rmtree(Path(tmp) / f"m{i}", ignore_errors=True)
            # pytest exit 1: tests failed (caught). 0: all passed (not caught). Anything else: the run broke.
            verdict = {1: "caught", 0: "NOT CAUGHT"}.get(code, f"ERROR (pytest exit {code})")
            results[i] = code == 1
            print(f"  {verdict:<11} {mutant.name}  [{mutant.path}; {time.perf_counter() - t0:.0f} s; "
                  f"{tail[0] if tail else ''}]", flush=True)
    caught = sum(results.values())
    share = 100.0 * caught / len(mutants)
    print(f"{caught}/{len(mutants)} caught ({share:.0f}%) in {time.perf_counter() - start:.0f} s")
    return 0 if caught == len(mutants) else 1


if __name__ == "__main__":
    sys.exit(main())
