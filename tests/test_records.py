import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_compare.contract import records
from amp_compare.contract.atomic import atomic_write_text
from amp_compare.contract.config import RunConfig
from amp_compare.kit.child import TrainResult, build_tables, step_time_summary
from amp_compare.kit.data import load_dataset


def _result(n_steps=6, epochs=2):
    per = n_steps // epochs
    return TrainResult(
        step_epoch=[e for e in range(epochs) for _ in range(per)],
        step_loss=list(np.linspace(2, 1, n_steps)),
        step_loss_scale=[2.0**15] * n_steps,
        step_skipped=[False] * (n_steps - 1) + [True],
        step_time_s=[0.5] + [0.1] * (n_steps - 1),
        epochs=[{"epoch": e, "train_loss": 1.0, "train_accuracy": 0.5, "val_loss": 1.0, "val_accuracy": 0.6 + e / 10,
                 "train_time_s": 1.0, "eval_time_s": 0.1} for e in range(epochs)],
        peak_memory_bytes=1234, memory_kind="test", info={"framework_version": "x"},
    )


def test_tables_have_schema_and_summary(tmp_path):
    cfg = RunConfig(dataset="synthetic", warmup_steps=1, batch_size=10)
    tables = build_tables("r1", cfg, _result(), load_dataset("synthetic"), wall_s=3.0)
    run = tables["run"].iloc[0]
    assert run["schema_version"] == records.SCHEMA_VERSION and run["status"] == "ok"
    assert run["median_step_s"] == pytest.approx(0.1)  # warm-up step (0.5 s) excluded
    assert run["throughput_img_s"] == pytest.approx(100.0)
    assert run["skipped_steps"] == 1 and run["final_val_accuracy"] == pytest.approx(0.7)
    assert tables["steps"]["warmup"].tolist() == [True] + [False] * 5
    records.write_cell(tmp_path / "cells" / cfg.cell_id, tables)
    back = records.read_run(tmp_path)
    for name in records.TABLES:
        pd.testing.assert_frame_equal(back[name], tables[name], check_dtype=False)


def test_corrupt_cell_is_named_and_skipped(tmp_path):
    good = RunConfig(dataset="synthetic")
    tables = build_tables("r1", good, _result(), load_dataset("synthetic"), 1.0)
    records.write_cell(tmp_path / "cells" / good.cell_id, tables)
    bad = tmp_path / "cells" / "torch-broken"
    bad.mkdir(parents=True)
    (bad / "run.parquet").write_bytes(b"PAR1 this is not parquet")
    warnings = []
    back = records.read_run(tmp_path, warn=warnings.append)
    assert len(back["run"]) == 1 and "torch-broken" in warnings[0]


def test_missing_columns_are_refused(tmp_path):
    with pytest.raises(ValueError, match="lacks column"):
        records.write_cell(tmp_path, {"run": pd.DataFrame([{"run_id": "x"}])})
    assert not (tmp_path / "run.parquet").exists()


def test_a_mistyped_column_is_named_where_read_and_where_written(tmp_path):
    """A record whose column holds another kind than its declaration (contract/tables.py) is refused on reading,
    naming table and column; the child's own tables are checked, undeclared columns included, before writing."""
    from amp_compare.contract.tables import TableError

    cfg = RunConfig(dataset="synthetic")
    tables = build_tables("r1", cfg, _result(), load_dataset("synthetic"), 1.0)
    records.write_cell(tmp_path / "cells" / cfg.cell_id, tables)
    steps = tables["steps"].assign(loss=["high"] * len(tables["steps"]))
    records.atomic_write_table(tmp_path / "cells" / cfg.cell_id / "steps.parquet", steps)
    warnings = []
    assert records.read_run(tmp_path, warn=warnings.append)["run"].empty
    assert "steps table: column 'loss' holds" in warnings[0] and "expected float (nats)" in warnings[0], warnings
    result = _result()
    result.underflow = [{"layer": "fc", "param": "weight", "when": "first step", "flush_fraction_unscaled": 0.0,
                         "flush_fraction_scaled": 0.0, "flush_fraction": 0.0}]
    with pytest.raises(TableError, match="underflow table: column 'flush_fraction' is not declared"):
        build_tables("r1", cfg, result, load_dataset("synthetic"), 1.0)


def test_train_results_report_only_declared_columns_of_their_kind():
    from amp_compare.contract.tables import TableError

    result = _result()
    result.info["torch_threads"] = 2
    with pytest.raises(TableError, match="'torch_thread' is not a declared reported column"):
        result.info["torch_thread"] = 2
    with pytest.raises(TableError, match="'torch_threads' = 'two' is not int"):
        result.info.update(torch_threads="two")
    with pytest.raises(TableError, match="'device_name'"):
        TrainResult(info={"device_name": 3})


def test_atomic_write_leaves_no_temporary_files(tmp_path):
    atomic_write_text(tmp_path / "a.txt", "hello")
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_step_time_summary_percentiles():
    s = step_time_summary([9.0, 1.0, 2.0, 3.0, 4.0], warmup_steps=1, batch_size=5)
    assert s["median_step_s"] == 2.5 and s["steps_timed"] == 4 and s["throughput_img_s"] == 2.0


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10, allow_nan=False), st.floats(1, 2**24), st.booleans(),
                          st.floats(1e-4, 1.0)), min_size=1, max_size=30))
def test_steps_round_trip(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("rt") / "steps.parquet"
    df = pd.DataFrame(rows, columns=["loss", "loss_scale", "skipped", "step_time_s"])
    records.atomic_write_table(path, df)
    pd.testing.assert_frame_equal(pd.read_parquet(path), df)


def test_a_record_parquet_cannot_store_is_written_as_text_not_a_crash(tmp_path):
    """Validation keeps such values out; should one get through, the harness still writes the failed
    record (as text) instead of dying on pyarrow's OverflowError and losing the remaining cells."""
    from amp_compare.harness.run.runner import failed_run_table, write_failed_record

    cfg = RunConfig(dataset="synthetic")
    object.__setattr__(cfg, "growth_interval", 2**64)  # past int64, bypassing validation on purpose
    run = failed_run_table(cfg, "r1", "exited with code 1", "")
    with pytest.raises((OverflowError, ValueError, TypeError)):
        records.write_cell(tmp_path / "plain", {"run": run})  # what crashed the harness before
    write_failed_record(tmp_path / "cells" / cfg.cell_id, run)
    back = records.read_run(tmp_path)["run"].iloc[0]
    assert back["status"] == "failed" and back["cfg_growth_interval"] == str(2**64)
    assert back["error"].startswith("exited with code 1 [record stored as text: ")


def test_one_reader_of_proc_status_for_umask_and_memory():
    """contract/env.proc_status is the one parser of /proc/<pid>/status (issue 27): atomic.py's umask and the
    children's memory both read through it."""
    import os

    from amp_compare.contract import env
    from amp_compare.contract.atomic import current_umask

    mask = os.umask(0o027)
    try:
        assert env.proc_status("Umask") == "0027" and current_umask() == 0o027
    finally:
        os.umask(mask)
    assert env.proc_status_bytes("VmRSS") > 10 * 2**20  # this Python process, pandas loaded
    assert env.proc_status_bytes("VmHWM") >= env.proc_status_bytes("VmRSS")
    assert env.proc_status("VmRSS", pid=2**22 + 1) is None and env.proc_status_bytes("VmRSS", pid=2**22 + 1) == 0
