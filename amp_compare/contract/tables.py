"""The tables a framework child hands the parent, declared once: every column with its kind and unit.

A cell's records (contract/records.py) are these tables. Each column is a `Column`: its name, its kind (int,
float, bool, str, or json: a JSON object in a string) and its unit ("" where it has none), with what it means
where the name does not say. The child checks its tables against this before writing them (kit/child.py
build_tables, through records.write_cell), the parent again on reading (records.read_cell): a missing column, a
column of the wrong kind, or (on writing) a column nobody declared is one line naming the table and the column.

The run table's columns are the child's own (RUN), RunConfig's fields as `cfg_<field>` (typed by RunConfig
itself), the machine's (env.cpu_info) and what each framework's train() reports about itself (REPORTED: the
`TrainResult.info` it fills, a `Reported` mapping that refuses a key not declared here).

Why a declaration of columns checked against pandas dtypes rather than a pyarrow schema or a dataclass per row:
the tables are pandas DataFrames on both sides and on disk they stay exactly what they were (the reports, the
tests and older runs read them); a pyarrow schema would pin each file's exact Arrow types (int64 vs a nullable
int, string vs large_string) that pandas picks by itself, and a dataclass per row would have both frameworks'
numerics code build row objects for tables of thousands of rows. The kinds here are what the readers rely on.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # int, float, bool, str, json (a JSON object as a string)
    unit: str = ""
    doc: str = ""


# pandas dtype kinds each column kind accepts (an int column may also be float of whole numbers: _kind_ok)
KINDS = {"int": "iu", "float": "fiu", "bool": "b", "str": "OSU", "json": "OSU"}


def _columns(*specs: tuple) -> dict[str, Column]:
    return {spec[0]: Column(*spec) for spec in specs}


IDENTITY = _columns(("run_id", "str"), ("cell_id", "str"), ("framework", "str"), ("model", "str"),
                    ("dataset", "str"), ("precision", "str"), ("seed", "int"))

TABLES: dict[str, dict[str, Column]] = {
    "epochs": _columns(
        ("epoch", "int", "", "0-based"), ("train_loss", "float", "nats", "mean training loss of the epoch"),
        ("train_accuracy", "float", "fraction"), ("val_loss", "float", "nats"), ("val_accuracy", "float", "fraction"),
        ("train_time_s", "float", "s", "the epoch's timed steps, validation excluded"),
        ("eval_time_s", "float", "s", "the epoch's validation pass")),
    "steps": _columns(
        ("epoch", "int"), ("step", "int", "", "0-based over the run"), ("loss", "float", "nats", "the batch's loss"),
        ("loss_scale", "float", "", "the scale the step used; 1.0 without loss scaling"),
        ("skipped", "bool", "", "the optimizer did not update (non-finite gradients)"),
        ("step_time_s", "float", "s", "NaN where per-step times were not measured (device mode)"),
        ("warmup", "bool", "", "among the first warmup_steps, left out of step statistics")),
    "dtypes": _columns(
        ("layer", "str"), ("op", "str", "", "the framework's op name"), ("phase", "str", "", "forward or backward"),
        ("compute_dtype", "str"), ("param_dtype", "str"), ("count", "int", "ops"),
        ("audit_method", "str", "", "how the dtypes were read (graph ops or layer policies)"),
        ("input_dtype", "str", "", "the op's floating inputs' dtypes: what it computed in (report/numerics.py)")),
    "underflow": _columns(
        ("layer", "str"), ("param", "str"), ("method", "str"), ("elements", "int"), ("nonzero", "int"),
        ("zero_fraction", "float", "fraction"), ("flush_fraction_unscaled", "float", "fraction"),
        ("subnormal_fraction_unscaled", "float", "fraction"), ("flush_fraction_scaled", "float", "fraction"),
        ("subnormal_fraction_scaled", "float", "fraction"), ("overflow_fraction_scaled", "float", "fraction"),
        ("zero_fraction_mixed", "float", "fraction"), ("lost_fraction_mixed_unscaled", "float", "fraction"),
        ("lost_fraction_mixed_scaled", "float", "fraction", "lost at the scale and unscaled (kit/fp16.py "
         "mixed_zero_kinds)"),
        ("cancelled_fraction_mixed_scaled", "float", "fraction", "zero at the scale but not unscaled: float16 "
         "cancellation, not underflow; absent in older records"), ("loss_scale", "float"),
        ("log2_hist", "json", "elements per power of two"), ("when", "str", "", "first step or last step"),
        ("at_step", "int")),
    "workers": _columns(
        ("worker", "int"), ("step", "int"), ("loss", "float", "nats"), ("loss_scale", "float"), ("skipped", "bool"),
        ("local_nonfinite", "float", "", "1.0 where the worker's own gradients were not finite")),
    "headroom": _columns(
        ("epoch", "int"), ("layer", "str"), ("quantity", "str"), ("max_abs", "float", "", "largest |value|")),
    # --profile (kit/profile.py): the profiled window's top ops, and the oneDNN primitives it ran
    "profile_ops": _columns(
        ("rank", "int", "", "1: most self time"), ("op", "str", "", "the framework's op name"), ("calls", "int"),
        ("self_time_s", "float", "s", "summed over the profiled steps"), ("share", "float", "fraction", "of op time"),
        ("dtypes", "str", "", "input dtypes where the profiler reports them"),
        ("library", "str", "", "the kernel library or path the op ran on"),
        ("cast", "bool", "", "a conversion between dtypes")),
    "profile_primitives": _columns(
        ("kind", "str", "", "oneDNN primitive kind"), ("prop_kind", "str", "", "forward/backward propagation"),
        ("impl", "str", "", "oneDNN's implementation name (jit:…, brg…, ref:any)"), ("dtype", "str"),
        ("path", "str", "", "JIT or reference"), ("executions", "int"), ("exec_time_s", "float", "s"),
        ("created", "int", "", "primitives created")),
    # where the child's wall time went (kit/phases.py): one row per phase
    "phases": _columns(
        ("phase", "str", "", "process start, framework import, data, init, ceiling, audits, compile/warm-up, training, "
         "evaluation, closing, records"),
        ("seconds", "float", "s", "wall time"), ("cpu_seconds", "float", "s", "CPU time of all the process's threads")),
    # fp8 cells (kit/fp8.py, torch_impl/fp8.py, keras_impl/fp8.py)
    "fp8_layers": _columns(
        ("layer", "str"), ("role", "str", "", "input, kernel or grad_output"), ("format", "str", "", "e4m3 or e5m2"),
        ("when", "str", "", "first step or last step"), ("step", "int"), ("amax", "float", "", "largest |value|"),
        ("sqnr_db", "float", "dB", "signal-to-quantization-noise ratio against float32"),
        ("zero_share", "float", "fraction", "nonzero values the recipe flushed to zero")),
    "fp8_trace": _columns(
        ("layer", "str"), ("role", "str"), ("step", "int"), ("amax", "float", "", "the amax the scale came from"),
        ("scale", "float", "", "the multiplier into the fp8 range"),
        ("history_max", "float", "", "Keras: the largest amax in the delayed-scaling history"),
        ("fmax", "float", "", "Keras: the format's largest finite value")),
    # speed trials (kit/trial.py): one row per timed block of a trial, not per cell (its identity: TRIAL_IDENTITY)
    "trials": _columns(
        ("batch_size", "int"), ("step_loop", "str", "", "plain or tuned"),
        ("round", "int", "", "0-based; rounds 2u and 2u+1 are one mirrored pair"),
        ("position", "int", "", "the block's place within its round, 0-based"),
        ("precision", "str"), ("steps", "int", "steps", "k: the block's training steps"),
        ("wall_s", "float", "s", "the block's wall time, ending with a host read of its last step's loss"),
        ("cpu_s", "float", "s", "the process's CPU time over the block, all threads"),
        ("threads", "int", "", "intra-op threads the process ran with"),
        ("contended", "bool", "", "the block lost its cores: cpu_s / wall_s below 0.75 x the larger of its "
         "precision's 90th percentile of cpu_s / wall_s in the trial and 0.75 x threads (on a GPU: 0.75 x that "
         "percentile; kit/trial.py CONTENDED_SHARE)")),
}

# A table that is not a cell's: its identity columns instead of IDENTITY's
TRIAL_IDENTITY = _columns(("run_id", "str"), ("trial_id", "str", "", "framework-model-dataset-b<batch>-<step loop>"),
                          ("framework", "str"), ("model", "str"), ("dataset", "str"))
IDENTITY_OF = {"trials": TRIAL_IDENTITY}

# Required beyond IDENTITY: what every reader relies on (the others may be absent in some runs).
REQUIRED = {
    "run": ["schema_version", "status", "error"],
    "epochs": ["epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "train_time_s", "eval_time_s"],
    "steps": ["epoch", "step", "loss", "loss_scale", "skipped", "step_time_s"],
    "dtypes": ["layer", "op", "phase", "compute_dtype", "param_dtype"],
    "underflow": ["layer", "param", "when", "flush_fraction_unscaled", "flush_fraction_scaled"],
    "workers": ["worker", "step", "loss_scale", "skipped"],
    "headroom": ["epoch", "layer", "quantity", "max_abs"],
    "profile_ops": ["rank", "op", "calls", "self_time_s", "share", "dtypes", "library", "cast"],
    "profile_primitives": ["kind", "prop_kind", "impl", "dtype", "path", "executions", "exec_time_s", "created"],
    "phases": ["phase", "seconds"],
    "fp8_layers": ["layer", "role", "format", "when", "step", "amax", "sqnr_db"],
    "fp8_trace": ["layer", "role", "step", "amax", "scale"],
    "trials": ["batch_size", "step_loop", "round", "position", "precision", "steps", "wall_s", "cpu_s", "threads",
               "contended"],
}

# The report's verdicts (harness/report/verdicts.py, data/verdicts.parquet): derived from a whole run, one row per
# model x dataset x loop x framework x mixed precision x metric; its identity instead of IDENTITY's
IDENTITY_OF["verdicts"] = _columns(
    ("model", "str"), ("dataset", "str"), ("step_loop", "str", "", "plain or tuned; empty for cells that failed"),
    ("batch_size", "float", "images"), ("framework", "str"), ("precision", "str", "", "a mixed precision"))
TABLES["verdicts"] = _columns(
    ("metric", "str", "", "speed, memory, accuracy, time_to_target, numerics; a loss-scaling lab's scale_path, "
     "skipped_steps, underflow, static_scale (verdicts.LAB_METRICS); a naive-attention run's attention_overflow; an "
     "N-worker cell's data_parallel; an fp8 mode's fp8_vs_bf16"),
    ("estimate", "float", "", "speed: fp32 step time / mixed (>1 faster); memory: mixed - fp32 peak; accuracy: "
     "mixed - fp32 validation accuracy; time_to_target: mixed time / fp32 time; numerics: median skipped steps; "
     "scale_path: the first seed's final scale; skipped_steps: skipped updates, all seeds; underflow: elements "
     "exactly zero in the float16 backward at the last step's probe (key-bias residue apart), all seeds; "
     "static_scale: the static scale; attention_overflow: the first step a seed skipped or went non-finite (NaN: "
     "none); data_parallel: the largest relative loss gap to 1 worker; fp8_vs_bf16: fp8 - bf16 validation accuracy"),
    ("low", "float", "", "the interval's low end (the estimate's unit); NaN where none"),
    ("high", "float", "", "the interval's high end; NaN where none"),
    ("margin", "float", "", "what 'same' is judged against: speed and time to target ±this fraction of 1; accuracy "
     "± fp32's seed-to-seed range of final validation accuracy in pp (measured; NaN with one fp32 seed); memory: the "
     "larger of fp32's and the mixed precision's seed-to-seed peak spreads in MiB (NaN with one seed)"),
    ("unit", "str", "", "x fp32 speed, x fp32 time, MiB, pp, steps, scale, elements"),
    ("interval_kind", "str", "", "verdicts.INTERVAL_KINDS: hodges-lehmann 95%, newcombe 95%, bootstrap 95%, ..."),
    ("status", "str", "", "verdicts.STATUSES"), ("reason", "str", "", "verdicts.REASONS"),
    ("evidence", "json", "", "what the status rests on: cells, counts, rounds, contended blocks"))
REQUIRED["verdicts"] = list(TABLES["verdicts"])

# The run table: what kit/child.build_tables computes (and harness/runner.py's failed row: identity, status, error,
# stderr_tail and the config), the machine's columns (contract/env.cpu_info), then REPORTED below.
RUN = _columns(
    ("schema_version", "int"), ("status", "str", "", "ok, diverged, failed, timeout, unavailable"),
    ("error", "str"), ("diverged_at_step", "int", "", "-1: did not diverge"), ("stderr_tail", "str"),
    ("dataset_source", "str"), ("train_samples", "int", "images"), ("val_samples", "int", "images"),
    ("final_val_accuracy", "float", "fraction"), ("val_correct", "str", "", "base64 of one bit per validation image"),
    ("final_val_loss", "float", "nats"), ("final_train_loss", "float", "nats"),
    ("median_step_s", "float", "s"), ("p90_step_s", "float", "s"), ("p99_step_s", "float", "s"),
    ("throughput_img_s", "float", "images/s", "the timed steps' images over their summed wall time"),
    ("median_step_throughput_img_s", "float", "images/s"), ("steps_timed", "int", "steps"),
    ("compile_warmup_s", "float", "s"), ("train_time_s", "float", "s"), ("first_step_overhead_s", "float", "s"),
    ("eval_time_s", "float", "s"), ("epoch_throughput_img_s", "float", "images/s"), ("steps_total", "int", "steps"),
    ("skipped_steps", "int", "steps"), ("peak_memory_bytes", "int", "bytes"), ("memory_kind", "str"),
    ("flops_per_image", "float", "FLOP", "one image's training step, kit/flops.py"), ("child_wall_s", "float", "s"),
    ("achieved_flops", "float", "FLOP/s"), ("mfu_measured", "float", "fraction"), ("mfu_table", "float", "fraction"),
    ("nonfinite_step", "int", "", "-1: none"), ("nonfinite_where", "str"), ("nonfinite_layer", "str"),
    ("nonfinite_value", "str"), ("nonfinite_tensor", "str"),
    ("budget_steps", "int", "steps", "the speed budget cut the cell's timed steps to this many; missing: ran in full"),
    ("budget_reason", "str", "", "why the speed budget cut the cell (kit/training.py SpeedBudget)"),
    # contract/env.cpu_info
    ("cpu_model", "str"), ("cpu_amp_flags", "str"), ("cpu_bf16_hardware", "bool"), ("cpu_fp16_hardware", "bool"),
    ("cpu_isa_limits", "str", "", "contract/env.ISA_LIMIT_VARS set (ONEDNN_MAX_CPU_ISA=AVX2); missing: none"),
    ("cpu_count", "int", "CPUs"), ("cpus_usable", "int", "CPUs"), ("omp_num_threads", "str"), ("hostname", "str"),
    ("cuda_visible_devices", "str"), ("cpu_affinity", "str"), ("slurm_job_id", "str"),
    # added by the parent (harness/run/runner.py) from the cell's stderr.log: the frameworks' own log lines on a
    # half-precision kernel path (e.g. TensorFlow's oneDNN DT_HALF fallback)
    ("framework_notices", "str"),
)
CONFIG_PREFIX = "cfg_"  # cfg_<RunConfig field>: typed and validated by RunConfig itself

# What a framework's train() reports about itself (TrainResult.info): versions, device, settings, lab figures.
REPORTED = _columns(
    ("framework_version", "str"), ("keras_version", "str"), ("keras_backend", "str"),
    ("torch_cuda_version", "str"), ("torch_cudnn_version", "str"), ("tf_cuda_version", "str"),
    ("tf_cudnn_version", "str"), ("device_name", "str"), ("compute_capability", "str"),
    ("tf32", "str", "", "TF32 as set and read back"), ("compiled", "str"), ("step_loop", "str"),
    ("optimizer_impl", "str"), ("host_syncs_per_step", "float", "waits per step"),
    ("steps_per_execution", "int", "steps"), ("step_values", "str"),
    ("ceiling_dtype", "str"), ("ceiling_basis", "str"), ("ceiling_flops_measured", "float", "FLOP/s"),
    ("ceiling_fp32_for", "str", "", "the half format measured against the fp32 matmul's ceiling, '' none"),
    ("ceiling_isa_limit", "str", "", "the variables that kept the frameworks from that format's instructions"),
    ("ceiling_matmul_size", "int", "n of an n x n matmul"), ("ceiling_flops_table", "float", "FLOP/s"),
    ("ceiling_table_source", "str"), ("dataset_device_bytes", "int", "bytes"), ("amp_api", "str"),
    ("torch_threads", "int", "threads"), ("torch_interop_threads", "int", "threads"),
    ("tf_intra_op_threads", "int", "threads"), ("tf_inter_op_threads", "int", "threads"),
    ("jax_threads", "str"), ("init_source", "str"), ("framework_defaults", "json"), ("settings_used", "json"),
    ("first_step_peak_memory_bytes", "int", "bytes"), ("first_step_dispatch_s", "float", "s"),
    ("cudagraph_skips", "int"), ("adam_gap_elements", "int"), ("adam_gap_max", "float", "relative"),
    ("adam_gap_median", "float", "relative"), ("adam_gap_over_1pct", "float", "fraction"),
    # data parallel (an N-worker cell)
    ("data_parallel", "str"), ("world_size", "int", "workers"), ("allreduce_requested", "str"),
    ("allreduce_hook", "str"), ("allreduce_dtype", "str"), ("allreduce_readback", "str"),
    ("allreduce_calls", "int"), ("allreduce_elements", "int"), ("allreduce_time_s", "float", "s"),
    ("allreduce_time_source", "str"), ("threads_per_worker", "int", "threads"),
    ("fp8_settings", "json", "", "fp8: the recipe read back from the live layers (formats, scaling, history)"),
    # --profile (kit/profile.py window_info)
    ("profile_tool", "str"), ("profile_trace", "str", "", "the trace file, relative to the cell folder"),
    ("profile_steps", "int", "steps"), ("profile_plain_step_s", "float", "s", "median unprofiled window step"),
    ("profile_step_s", "float", "s", "median profiled step"), ("profile_overhead", "float", "ratio"),
    ("profile_cast_share", "float", "fraction"), ("profile_eigen_fallback", "str", "", "TF's fallback log line"),
)
RUN_COLUMNS = {**IDENTITY, **RUN, **REPORTED}


class TableError(ValueError):
    """A record table that does not match its declaration; the message names the table and the column."""


def declared(name: str) -> dict[str, Column]:
    return {**IDENTITY_OF.get(name, IDENTITY), **(RUN_COLUMNS if name == "run" else TABLES[name])}


def _kind_ok(column: Column, values: pd.Series) -> bool:
    if values.dtype.kind in KINDS[column.kind]:
        return True
    if column.kind == "int" and values.dtype.kind == "f":  # pandas makes an int column float where one is missing
        present = values.dropna()
        return bool((present == present.round()).all())
    present = values.dropna()
    if values.dtype.kind != "O" or column.kind in ("str", "json"):
        return present.empty and column.kind != "bool"  # an all-missing column (e.g. NaN throughout)
    # Text where a number belongs: the one record stored as text (harness/runner.py write_failed_record)
    parse = {"int": int, "float": float, "bool": lambda v: {"True": True, "False": False}[v]}[column.kind]
    try:
        present.map(lambda v: parse(v) if isinstance(v, str) else v / 1)
    except (ValueError, TypeError, KeyError):
        return False
    return True


def check(name: str, df: pd.DataFrame, strict: bool = False) -> None:
    """Raise TableError unless `df` has the table's required columns and each declared column holds its kind;
    strict (where a child writes its own tables): every column must be declared."""
    columns = declared(name)
    missing = [c for c in [*IDENTITY_OF.get(name, IDENTITY), *REQUIRED[name]] if c not in df.columns]
    if missing:
        raise TableError(f"{name} table lacks column(s): {', '.join(missing)}")
    for col in df.columns:
        column = columns.get(col)
        if column is None:
            if strict and not (name == "run" and col.startswith(CONFIG_PREFIX)):
                raise TableError(f"{name} table: column {col!r} is not declared (contract/tables.py)")
            continue
        if not _kind_ok(column, df[col]):
            raise TableError(f"{name} table: column {col!r} holds {df[col].dtype} values, expected {column.kind}"
                             + (f" ({column.unit})" if column.unit else ""))


class Reported(dict):
    """TrainResult.info: the run-table columns a framework's train() reports (REPORTED), refusing any other key
    and a value of another kind where it is set, in the child, before anything crosses to the parent."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.update(*args, **kwargs)

    def __setitem__(self, key: str, value) -> None:
        column = REPORTED.get(key)
        if column is None:
            raise TableError(f"run table: {key!r} is not a declared reported column (contract/tables.py REPORTED)")
        if not _value_ok(column, value):
            raise TableError(f"run table: {key!r} = {value!r} is not {column.kind}"
                             + (f" ({column.unit})" if column.unit else ""))
        super().__setitem__(key, value)

    def update(self, *args, **kwargs) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value


def _value_ok(column: Column, value) -> bool:
    if value is None:  # written as "" (kit/child.build_tables)
        return True
    if column.kind in ("str", "json"):
        return isinstance(value, str) or (column.kind == "json" and isinstance(value, dict))
    return _kind_ok(column, pd.Series([value]))
