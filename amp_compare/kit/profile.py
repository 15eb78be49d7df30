"""--profile, the framework-free half: where a cell's step time goes, as a table per cell.

Each twin's profile.py runs two short windows of training steps after the cell's timed epochs (the model is warm
and the timed steps are already recorded, so no profiled step is among them), in the order `windows` gives: the
plain window, PLAIN_STEPS steps timed without the profiler, then the profiled one, WINDOW_STEPS steps under the
framework's own profiler (torch.profiler; TensorFlow's tf.profiler.experimental; jax.profiler). Each window opens
with WARM_STEPS steps that are neither timed nor profiled, and both run the epoch-0 plan's batches from its first,
so they measure the same batches. The two medians give the profiled step's overhead. The trace stays in
the cell's folder (`cells/<cell-id>/profile/`, docs/MEASUREMENT.md says how to open it).

What this module turns into rows, for both frameworks:
- the profiler's operations: self time, calls, dtypes, whether the op is a cast/conversion, and the library
  path the op ran on (oneDNN's JIT kernels, oneDNN's reference kernels, the framework's native/Eigen code);
- oneDNN's own log (`onednn_verbose,…` lines on stdout): which implementation each primitive ran
  (`jit:avx512_core`, `brg_conv_fwd:…`, `gemm:jit`, or `ref:any`, its slow reference code) and in which dtype;
- TensorFlow's log line saying a float16 op fell back from oneDNN to Eigen.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
from collections import defaultdict
from pathlib import Path

from amp_compare.contract.log_words import EIGEN_FALLBACK  # noqa: F401  (keras_impl/profile.py tees it)

PROFILE_ENV = "AMP_COMPARE_PROFILE_DIR"  # the cell's trace folder, set by the parent for a --profile cell
PLAIN_STEPS = 5  # steps timed without the profiler, right before the profiled ones: the overhead's baseline
WINDOW_STEPS = 5  # profiled steps
WARM_STEPS = 2  # steps before each window, not measured (a fit() call or a new input signature settles first)
TOP_OPS = 12  # operations kept per cell, by self time
ONEDNN_PREFIX = "onednn_verbose,"
# Operations that only change a tensor's dtype (torch: autocast's casts; TF: Cast; XLA: convert).
CAST_OPS = {"aten::_to_copy", "aten::to", "aten::_autocast_to_reduced_precision",
            "aten::_autocast_to_full_precision", "Cast", "convert", "convert_element_type"}
ONEDNN_DTYPES = {"c10::BFloat16": "bf16", "c10::Half": "f16", "float": "f32", "double": "f64",
                 "bfloat16": "bf16", "float16": "f16", "float32": "f32"}


def windows(plan_len: int) -> list[tuple[str, list[int]]]:
    """The windows in the order both twins run them, ("plain", positions) then ("profiled", positions): each
    window's positions in the epoch-0 batch plan, WARM_STEPS warm-up steps then its measured steps, from the plan's
    first batch (cycled when the plan is shorter)."""
    return [(name, [i % plan_len for i in range(WARM_STEPS + steps)])
            for name, steps in (("plain", PLAIN_STEPS), ("profiled", WINDOW_STEPS))]


def profile_env(cfg, env: dict[str, str], cell_dir: Path) -> dict[str, str]:
    """The child's environment for a --profile cell: where its trace goes; for Keras on TensorFlow also oneDNN's
    creation log (ONEDNN_VERBOSE=profile_create: one line when a primitive is made, none per execution, so the
    timed steps pay nothing per step; TensorFlow offers no switch to turn the log on for the window alone)."""
    if not cfg.profile:
        return env
    env = {**env, PROFILE_ENV: str(Path(cell_dir) / "profile")}
    if cfg.framework == "tf":
        env["ONEDNN_VERBOSE"] = "profile_create"
    return env


def profile_dir() -> Path | None:
    """This child's trace folder (made here), or None when the parent asked for no profile."""
    path = os.environ.get(PROFILE_ENV)
    if not path:
        return None
    Path(path).mkdir(parents=True, exist_ok=True)
    return Path(path)


class FdTee:
    """Keeps the lines of a file descriptor that start with one of `prefixes` while passing everything through:
    oneDNN and TensorFlow write their logs from C straight to fd 1 / fd 2, which the parent reads (progress) or
    files (stderr.log), so the tee sits on the descriptor itself."""

    def __init__(self, fd: int, prefixes: tuple[str, ...], contains: tuple[str, ...] = ()):
        self.fd, self.prefixes, self.contains = fd, prefixes, contains
        self.lines: list[str] = []
        self._saved = self._thread = None

    def start(self) -> FdTee:
        _flush_c()
        self._saved = os.dup(self.fd)
        read, write = os.pipe()
        os.dup2(write, self.fd)
        os.close(write)
        self._thread = threading.Thread(target=self._pump, args=(read,), daemon=True)
        self._thread.start()
        return self

    def _pump(self, read: int) -> None:
        rest = b""
        while chunk := os.read(read, 65536):
            os.write(self._saved, chunk)
            *whole, rest = (rest + chunk).split(b"\n")
            self._keep(whole)
        self._keep([rest])
        os.close(read)

    def _keep(self, lines: list[bytes]) -> None:
        for raw in lines:
            line = raw.decode(errors="replace")
            if line.startswith(self.prefixes) or any(c in line for c in self.contains):
                self.lines.append(line)

    def stop(self) -> list[str]:
        if self._saved is not None:
            _flush_c()
            os.dup2(self._saved, self.fd)  # closes the pipe's last write end: the pump reads to its end
            self._thread.join(timeout=10)
            os.close(self._saved)
            self._saved = None
        return self.lines


def _flush_c() -> None:
    """Flush Python's and C's buffered output before the descriptor under them changes."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def parse_onednn(lines: list[str]) -> list[dict]:
    """oneDNN verbose lines -> one row per (primitive kind, propagation, implementation, dtype): executions with
    their total time (exec lines), creations (create lines), and the library path in words."""
    rows: dict[tuple, dict] = {}
    for line in lines:
        parts = line.strip().split(",")
        if "primitive" not in parts:
            continue
        at = parts.index("primitive")
        fields = parts[at + 1:]
        if len(fields) < 9 or not (fields[0] == "exec" or fields[0].startswith("create")):
            continue
        kind, impl, prop, mds = fields[2], fields[3], fields[4], fields[5]
        key = (kind, prop, impl, memory_dtype(mds))
        row = rows.setdefault(key, {"kind": kind, "prop_kind": prop, "impl": impl, "dtype": key[3],
                                    "path": onednn_path(impl), "executions": 0, "exec_time_s": 0.0, "created": 0})
        if fields[0] == "exec":
            row["executions"] += 1
            row["exec_time_s"] += _float(fields[-1]) / 1000.0  # oneDNN logs milliseconds
        else:
            row["created"] += 1
    return sorted(rows.values(), key=lambda r: (-r["exec_time_s"], r["kind"], r["prop_kind"]))


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def memory_dtype(mds: str) -> str:
    """The data type of a primitive's memory descriptors, e.g. 'src:f16:…' -> 'f16'; a reorder that converts
    reads 'f32->bf16'."""
    types = {m.group(1): m.group(2) for m in re.finditer(r"\b(src|dst|diff_src|diff_dst)\w*:(\w+):", mds)}
    src = types.get("src") or types.get("diff_dst") or ""
    dst = types.get("dst") or types.get("diff_src") or src
    return src if src == dst or not dst else f"{src}->{dst}"


def onednn_path(impl: str) -> str:
    """An implementation name in words: oneDNN's reference code is the slow one."""
    if impl.startswith("ref"):
        return f"oneDNN reference ({impl}, not JIT)"
    return f"oneDNN JIT ({impl})"


def is_cast(op: str, dtypes: str = "") -> bool:
    """A cast/conversion: a dtype-only op, or a copy whose source and destination dtypes differ."""
    if op in CAST_OPS or op.startswith("Cast"):
        return True
    if op == "aten::copy_" and dtypes:
        kinds = {d for d in dtypes.split("|")[0].split(",") if d in ONEDNN_DTYPES}
        return len(kinds) > 1
    return False


def torch_library(op: str, dtypes: str, primitives: list[dict]) -> str:
    """Where a torch CPU op ran: oneDNN (mkldnn ops; a convolution's backward when oneDNN executed a backward
    convolution in the op's dtype) or ATen's native kernels. oneDNN's log names the implementation."""
    dtype = next((ONEDNN_DTYPES[d] for d in dtypes.split(",") if d in ONEDNN_DTYPES), "")
    kind = ("convolution" if "conv" in op else "matmul" if re.search(r"::(mm|addmm|bmm|matmul|linear)\b", op)
            else "batch_normalization" if "batch_norm" in op else "")
    backward = "backward" in op
    seen = [p for p in primitives if p["kind"] in (kind, "inner_product" if kind == "matmul" else kind)
            and ("backward" in p["prop_kind"]) == backward and (not dtype or p["dtype"].startswith(dtype))
            and p["executions"]]
    if seen:
        return "; ".join(sorted({p["path"] for p in seen}))
    if "mkldnn" in op:
        return "oneDNN"
    return "ATen native (no oneDNN primitive ran for it)" if kind else ""


def tf_library(op_type: str, eigen_fallback: bool) -> str:
    """Where a TensorFlow op ran: `_Mkl…` ops are TensorFlow's oneDNN kernels; the others its own (Eigen) ones."""
    if op_type.startswith("_Mkl"):
        return "oneDNN (TF _Mkl op)"
    if op_type in ("IDLE", ""):
        return ""
    refused = eigen_fallback and re.search(r"Conv|MatMul|Pool|BatchNorm|Einsum", op_type)
    return "TF native (Eigen)" + (", oneDNN refused float16 on this CPU" if refused else "")


def xla_library(name: str) -> str:
    """Where an XLA CPU op ran, from its name: YNNPACK's fusions, or XLA's own generated/Eigen code."""
    return "XLA CPU: YNNPACK" if name.startswith("ynn") else "XLA CPU (generated code / Eigen)"


def op_evidence(ops: list[dict]) -> tuple[list[dict], float]:
    """The top TOP_OPS operations by self time, each with its share of all self time in the window, and the
    share of that time spent in casts/conversions. `ops`: rows with op, calls, self_time_s, dtypes, library."""
    merged: dict[str, dict] = defaultdict(lambda: {"calls": 0, "self_time_s": 0.0, "dtypes": set(), "library": ""})
    for row in ops:
        cast = is_cast(row["op"], row.get("dtypes", ""))
        # a copy between dtypes is a cast, a copy within one is not: two rows, so the cast share stays exact
        m = merged[row["op"] + (" (dtype change)" if cast and row["op"] == "aten::copy_" else "")]
        m["calls"] += row["calls"]
        m["self_time_s"] += row["self_time_s"]
        if row.get("dtypes"):
            m["dtypes"].add(row["dtypes"])
        m["library"] = m["library"] or row.get("library", "")
        m["cast"] = m.get("cast", False) or cast
    total = sum(m["self_time_s"] for m in merged.values())
    if total <= 0:
        return [], float("nan")
    cast_share = sum(m["self_time_s"] for m in merged.values() if m["cast"]) / total
    top = sorted(merged.items(), key=lambda kv: -kv[1]["self_time_s"])[:TOP_OPS]
    rows = [{"rank": i + 1, "op": op, "calls": int(m["calls"]), "self_time_s": m["self_time_s"],
             "share": m["self_time_s"] / total, "dtypes": " | ".join(sorted(m["dtypes"]))[:200],
             "library": m["library"], "cast": bool(m["cast"])} for i, (op, m) in enumerate(top)]
    return rows, cast_share


def window_info(plain: list[float], profiled: list[float], trace: str, tool: str, cast_share: float,
                fallback: list[str]) -> dict:
    """The run-table columns of a profiled cell: the window's medians, the profiler's overhead, the trace."""
    import statistics

    plain_s = statistics.median(plain) if plain else float("nan")
    prof_s = statistics.median(profiled) if profiled else float("nan")
    return {"profile_tool": tool, "profile_trace": trace, "profile_steps": len(profiled),
            "profile_plain_step_s": plain_s, "profile_step_s": prof_s,
            "profile_overhead": prof_s / plain_s if plain_s > 0 else float("nan"),
            "profile_cast_share": cast_share, "profile_eigen_fallback": fallback[0].strip()[-300:] if fallback else ""}
