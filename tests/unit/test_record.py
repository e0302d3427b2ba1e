"""The run record (core/record.py): metrics.jsonl on resume, summary.json, atomic writes."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from core import provenance, record, rng
from core.errors import ConfigError


def rows(n: int, metric: str = "test/accuracy") -> list[dict]:
    return [{"epoch": e, metric: 10.0 * (e + 1), "comm/bits": 100.0 * (e + 1),
             "comm/bits_dense": 1000.0} for e in range(n)]


# ---- metrics.jsonl -------------------------------------------------------------------------------
def test_a_fresh_run_starts_an_empty_log_and_appends_durably(tmp_path):
    (tmp_path / record.METRICS).write_text('{"epoch": 0}\n{"epoch": 1}\n')  # a previous run's
    log = record.MetricsLog(tmp_path)
    assert log.rows == [] and (tmp_path / record.METRICS).read_text() == ""
    for row in rows(2):
        log.write(row)
        # on disk as soon as it is written, before close()
        assert record.read_metrics(tmp_path / record.METRICS) == log.rows
    log.close()
    assert record.read_metrics(tmp_path / record.METRICS) == rows(2)
    assert (tmp_path / record.METRICS).read_text().count("\n") == 2


def test_resume_drops_the_rows_written_after_the_checkpoint(tmp_path):
    # epochs 0..3 were logged, but the last checkpoint says epoch 2 is next: rows 2 and 3 go
    path = tmp_path / record.METRICS
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(4)))
    log = record.MetricsLog(tmp_path, keep_epochs=2)
    assert log.rows == rows(2)
    assert record.read_metrics(path) == rows(2)
    again = rows(3)[2]
    log.write(again)
    log.close()
    assert record.read_metrics(path) == rows(3)
    assert not list(tmp_path.glob(".*.tmp"))  # the rewrite left no temp file


def test_resume_keeps_every_row_up_to_the_checkpoint(tmp_path):
    path = tmp_path / record.METRICS
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(3)))
    record.MetricsLog(tmp_path, keep_epochs=3).close()
    assert record.read_metrics(path) == rows(3)


def test_read_metrics_skips_blank_lines_and_a_missing_file(tmp_path):
    assert record.read_metrics(tmp_path / "nothing.jsonl") == []
    path = tmp_path / "m.jsonl"
    path.write_text('{"epoch": 0}\n\n  \n{"epoch": 1}\n')
    assert record.read_metrics(path) == [{"epoch": 0}, {"epoch": 1}]


def test_read_metrics_keeps_a_torn_last_line_that_parses(tmp_path):
    # a crash between the row and its newline: the row itself is whole
    path = tmp_path / "m.jsonl"
    path.write_text('{"epoch": 0}\n{"epoch": 1}')
    assert record.read_metrics(path) == [{"epoch": 0}, {"epoch": 1}]


@pytest.mark.parametrize("last", ['{"epoch": 1, "test/acc', "[1, 2]", "7", "  "])
def test_read_metrics_drops_a_torn_last_line_that_is_not_a_row(tmp_path, last):
    # cut short (not JSON), or JSON but not an object, or only blanks after the last newline
    path = tmp_path / "m.jsonl"
    path.write_text('{"epoch": 0}\n' + last)
    assert record.read_metrics(path) == [{"epoch": 0}]


def test_read_metrics_reads_utf8(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes('{"epoch": 0, "note": "\u00e9t\u00e9"}\n'.encode())
    assert record.read_metrics(path) == [{"epoch": 0, "note": "\u00e9t\u00e9"}]


@pytest.mark.parametrize(("text", "number"), [
    ('{"epoch": 0\n{"epoch": 1}\n', 1),
    ('{"epoch": 0}\n[1, 2]\n{"epoch": 2}\n', 2),
    ('{"epoch": 0}\n\n"epoch"\n', 3),  # a blank line still counts
    ('{"epoch": 0}\n7\n{"epoch": 2}', 2),
])
def test_an_unreadable_line_before_the_last_names_the_file_and_the_line(tmp_path, text, number):
    path = tmp_path / "m.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        record.read_metrics(path)
    assert str(info.value) == (f"{path}:{number}: not a JSON object of one epoch; the file is "
                               f"corrupt")


def test_a_file_that_is_not_utf8_is_corrupt(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"epoch": 0}\n\xff\n')
    with pytest.raises(ConfigError) as info:
        record.read_metrics(path)
    assert str(info.value) == (f"{path}: cannot read ('utf-8' codec can't decode byte 0xff in "
                               f"position 13: invalid start byte); the file is corrupt")


def test_a_metrics_row_that_cannot_be_written_names_the_file(tmp_path):
    # a full disk, for real: /dev/full answers every write with ENOSPC. The log's open file is
    # swapped for it (a run directory on a tiny full tmpfs would need root to mount)
    log = record.MetricsLog(tmp_path)
    log.write({"epoch": 0})
    log._file.close()
    log._file = open("/dev/full", "a", encoding="utf-8")  # noqa: SIM115 (closed below)
    with pytest.raises(record.RecordError) as info:
        log.write({"epoch": 1})
    err = info.value
    assert err.errno == errno.ENOSPC
    path = tmp_path / record.METRICS
    assert str(err) == f"[Errno 28] cannot write {path}: No space left on device"
    assert isinstance(err.__cause__, OSError) and err.__cause__.errno == errno.ENOSPC
    assert log.rows == [{"epoch": 0}]  # the row that failed is not counted
    with contextlib.suppress(OSError):  # the unwritten row is still buffered
        log.close()
    assert record.read_metrics(path) == [{"epoch": 0}]


# ---- summary.json --------------------------------------------------------------------------------
def test_summary_of_an_accuracy_run():
    log = [{"test/accuracy": 50.0, "comm/bits": 10.0, "comm/bits_dense": 40.0},
           {"test/accuracy": 70.0, "comm/bits": 20.0, "comm/bits_dense": 40.0},
           {"test/accuracy": 60.0, "comm/bits": 5.0, "comm/bits_dense": 40.0}]
    assert record.summarize(log, "completed", "test/accuracy", 12.5) == {
        "status": "completed", "epochs_completed": 3, "metric": "test/accuracy",
        "final": 60.0, "best": 70.0, "total_bits": 35.0, "total_bits_dense": 120.0,
        "total_time_s": 12.5}


@pytest.mark.parametrize("metric", ["test/perplexity", "test/loss"])
def test_best_is_the_lowest_perplexity_or_loss(metric):
    log = [{metric: 30.0}, {metric: 12.0}, {metric: 20.0}]
    summary = record.summarize(log, "completed", metric, 1.0)
    assert (summary["best"], summary["final"]) == (12.0, 20.0)


def test_nan_epochs_are_left_out_of_final_and_best():
    log = [{"test/accuracy": 40.0}, {"test/accuracy": 55.0}, {"test/accuracy": math.nan}]
    summary = record.summarize(log, "diverged", "test/accuracy", 1.0)
    assert (summary["final"], summary["best"], summary["epochs_completed"]) == (55.0, 55.0, 3)
    log = [{"test/perplexity": math.nan}, {"test/perplexity": 9.0}]
    assert record.summarize(log, "completed", "test/perplexity", 1.0)["best"] == 9.0


def test_summary_without_any_metric():
    summary = record.summarize([{"comm/bits": 3.0}], "failed: RuntimeError: x", "test/accuracy",
                               0.5)
    assert summary["final"] is None and summary["best"] is None
    assert summary["epochs_completed"] == 1 and summary["total_bits"] == 3.0
    assert summary["total_bits_dense"] == 0.0
    no_bits = record.summarize([{"test/accuracy": 1.0}], "completed", "test/accuracy", 0.5)
    assert no_bits["total_bits"] == no_bits["total_bits_dense"] == 0.0
    empty = record.summarize([], "failed: KeyboardInterrupt: ", "test/accuracy", 0.0)
    assert (empty["final"], empty["best"], empty["epochs_completed"]) == (None, None, 0)


def test_write_summary_replaces_the_file_whole(tmp_path):
    record.write_summary(tmp_path, {"status": "running"})
    record.write_summary(tmp_path, {"status": "completed", "best": 1.5})
    text = (tmp_path / record.SUMMARY).read_text()
    assert json.loads(text) == {"status": "completed", "best": 1.5}
    assert text.endswith("\n") and text.startswith('{\n  "status"')  # indented, one key a line
    assert sorted(p.name for p in tmp_path.iterdir()) == [record.SUMMARY]


# ---- checkpoint.pt -------------------------------------------------------------------------------
def test_checkpoint_round_trip_and_no_temp_file(tmp_path):
    path = tmp_path / record.CHECKPOINT
    state = {"epoch": 3, "w": torch.arange(4.0)}
    record.save_checkpoint(path, state)
    record.save_checkpoint(path, {**state, "epoch": 4})
    loaded = record.load_checkpoint(path)
    assert loaded["epoch"] == 4 and torch.equal(loaded["w"], state["w"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [record.CHECKPOINT]


def test_a_checkpoint_with_rng_states_and_config_loads_as_data(tmp_path):
    # what training/checkpoint.py saves besides tensors: the RNG states (core.rng: plain
    # containers) and the config; loaded with weights_only=True, they restore every stream
    path = tmp_path / record.CHECKPOINT
    rng.seed_everything(7, rank=1, deterministic=False)
    np.random.standard_normal()  # a cached Gaussian in NumPy's state
    state = {"rng": rng.capture(), "config": {"seed": 0, "lr": [0.1, 0.01]}}
    expected = (random.random(), np.random.standard_normal(), torch.rand(3))
    record.save_checkpoint(path, state)
    loaded = record.load_checkpoint(path)
    assert loaded["config"] == state["config"]
    rng.restore(loaded["rng"])
    assert (random.random(), np.random.standard_normal()) == expected[:2]
    assert torch.equal(torch.rand(3), expected[2])


class _RunsCode:
    """Unpickling this runs ``touch <path>``: what a checkpoint must never do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.path}",)


@pytest.mark.parametrize("where", ["top", "nested"])
def test_a_checkpoint_holding_code_is_refused_unrun(tmp_path, where):
    path, ran = tmp_path / record.CHECKPOINT, tmp_path / "ran"
    payload = _RunsCode(ran)
    torch.save({"epoch": 1, "payload": payload} if where == "top" else
               {"epoch": 1, "per_rank": [{"rng": {"python": payload}}]}, path)
    for load in (record.load_checkpoint, lambda p: record.load_checkpoint(p, mmap=True)):
        with pytest.raises(ConfigError) as info:
            load(path)
        assert str(info.value) == (
            f"resume: {path} holds a pickled posix.system, which could run code when loaded; a "
            f"checkpoint of this suite holds only tensors and plain containers, so it was "
            f"refused unread")
    assert not ran.exists()


def test_a_failed_write_leaves_the_old_checkpoint(tmp_path):
    path = tmp_path / record.CHECKPOINT
    record.save_checkpoint(path, {"epoch": 1})

    def fail(f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        record.atomic_write_bytes(path, fail)
    assert record.load_checkpoint(path) == {"epoch": 1}


def test_a_write_under_a_regular_file_names_the_path_and_the_errno(tmp_path):
    # the run directory is a file: the temp file cannot be opened (nor removed afterwards)
    (tmp_path / "run").write_text("not a directory")
    path = tmp_path / "run" / record.SUMMARY
    with pytest.raises(record.RecordError) as info:
        record.atomic_write_bytes(path, lambda f: f.write(b"{}"))
    err = info.value
    assert err.errno == errno.ENOTDIR and err.strerror == f"cannot write {path}: Not a directory"
    assert str(err) == f"[Errno 20] cannot write {path}: Not a directory"
    assert isinstance(err.__cause__, NotADirectoryError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_failed_rename_removes_the_temp_file(tmp_path):
    # the target is a directory: the temp file is written whole, then os.replace fails (EISDIR)
    path = tmp_path / record.CHECKPOINT
    path.mkdir()
    with pytest.raises(record.RecordError) as info:
        record.save_checkpoint(path, {"epoch": 1})
    assert info.value.errno == errno.EISDIR
    assert str(info.value) == f"[Errno 21] cannot write {path}: Is a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == [record.CHECKPOINT]  # no .tmp left
    assert path.is_dir() and not list(path.iterdir())


def test_an_oserror_of_the_writer_removes_the_temp_file(tmp_path):
    def fail(f):
        f.write(b"half")
        raise OSError("disk full")

    path = tmp_path / "x.bin"
    with pytest.raises(record.RecordError) as info:
        record.atomic_write_bytes(path, fail)
    # no errno to carry: the message is the exception's text
    assert info.value.errno is None and info.value.strerror == f"cannot write {path}: disk full"
    assert not list(tmp_path.iterdir())


class SyncSpy:
    """Records, in order, every os.fsync (the file's name and its size on disk at that moment)
    and os.replace, then calls the real functions."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple] = []
        fsync, replace = os.fsync, os.replace

        def spy_fsync(fd: int) -> None:
            name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
            self.calls.append(("fsync", name, os.fstat(fd).st_size))
            fsync(fd)

        def spy_replace(src, dst) -> None:
            self.calls.append(("replace", os.path.basename(src), os.path.basename(dst)))
            replace(src, dst)

        monkeypatch.setattr(os, "fsync", spy_fsync)
        monkeypatch.setattr(os, "replace", spy_replace)


def test_atomic_write_flushes_and_syncs_before_the_rename(tmp_path, monkeypatch):
    spy = SyncSpy(monkeypatch)
    record.atomic_write_bytes(tmp_path / "x.bin", lambda f: f.write(b"abc"))
    assert spy.calls == [("fsync", ".x.bin.tmp", 3), ("replace", ".x.bin.tmp", "x.bin")]
    assert (tmp_path / "x.bin").read_bytes() == b"abc"


def test_every_metrics_row_is_synced_when_written(tmp_path, monkeypatch):
    log = record.MetricsLog(tmp_path)
    spy = SyncSpy(monkeypatch)
    log.write({"epoch": 0})
    log.write({"epoch": 1})
    size = len('{"epoch": 0}\n')
    assert spy.calls == [("fsync", record.METRICS, size), ("fsync", record.METRICS, 2 * size)]
    log.close()


# ---- flatten (a run's identity) ------------------------------------------------------------------
def test_flatten_gives_dotted_keys():
    config = {"model": {"name": "resnet18", "norm": {"kind": "batch"}}, "seed": 0,
              "milestones": [150, 250], "empty": {}}
    assert record.flatten(config) == {"model.name": "resnet18", "model.norm.kind": "batch",
                                      "seed": 0, "milestones": [150, 250]}
    assert record.flatten({"lr": 0.1}, "optimizer.") == {"optimizer.lr": 0.1}


def test_a_benchmark_heading_calls_code_changes_uncommitted_not_its_own_tables(tmp_path) -> None:
    # core.provenance.code_changed: tracked files outside results/ only (benchmarks rewrite
    # results/ one after another; the code they measured is what the heading vouches for).
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "results").mkdir()
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "results" / "table.md").write_text("| a |\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    assert not provenance.code_changed(tmp_path)
    (tmp_path / "results" / "table.md").write_text("| b |\n")
    assert not provenance.code_changed(tmp_path)
    (tmp_path / "code.py").write_text("x = 2\n")
    assert provenance.code_changed(tmp_path)
