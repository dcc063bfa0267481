"""rota.runtime: progress reports (the agent protocol) and the job context."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

import rota.runtime
from rota.runtime import JobContext, job_context, report
from rota.runtime.progress import MAX_REPORT_BYTES


@pytest.fixture
def progress_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv("ROTA_PROGRESS_FILE", str(path))
    return path


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_each_report_is_one_json_line_with_only_the_user_values(progress_file: Path) -> None:
    report(step=300, loss=2.31)
    assert progress_file.read_text(encoding="utf-8") == '{"step": 300, "loss": 2.31}\n'
    report(step=310, loss=2.25, lr=1e-4)
    assert [json.loads(s) for s in lines(progress_file)] == [
        {"step": 300, "loss": 2.31},
        {"step": 310, "loss": 2.25, "lr": 1e-4},
    ]


def test_floats_are_kept_exactly(progress_file: Path) -> None:
    values = [0.1 + 0.2, 1 / 3, 2.0**-40, 1.2345678901234567e300, -0.0, 5e-324]
    for i, v in enumerate(values):
        report(step=i, loss=v)
    got = [json.loads(s)["loss"] for s in lines(progress_file)]
    assert got == values
    assert all(type(g) is float for g in got)
    assert math.copysign(1.0, got[4]) == -1.0


def test_ints_bools_strings_none_and_nested_values(progress_file: Path) -> None:
    report(step=2**62, done=False, phase="warmup", note=None, losses=[1.5, 2], extra={"a": {"b": [1, 2.5]}})
    assert json.loads(lines(progress_file)[0]) == {
        "step": 2**62,
        "done": False,
        "phase": "warmup",
        "note": None,
        "losses": [1.5, 2],
        "extra": {"a": {"b": [1, 2.5]}},
    }


def test_unicode_stays_on_one_line(progress_file: Path) -> None:
    report(phase="multi\nline ✓")
    assert len(lines(progress_file)) == 1
    assert json.loads(lines(progress_file)[0]) == {"phase": "multi\nline ✓"}


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values_are_refused_naming_the_key(progress_file: Path, bad: float) -> None:
    with pytest.raises(ValueError, match="'loss'.*not finite"):
        report(step=1, loss=bad)
    assert not progress_file.exists()


def test_non_finite_inside_a_list_or_dict_names_the_path(progress_file: Path) -> None:
    with pytest.raises(ValueError, match=r"'losses\[1\]'"):
        report(losses=[1.0, math.nan])
    with pytest.raises(ValueError, match=r"'extra\.inner'"):
        report(extra={"inner": math.inf})
    assert not progress_file.exists()


@pytest.mark.parametrize("bad", [{1, 2}, object(), b"bytes", 1 + 2j, {1: "int key"}])
def test_non_json_values_are_refused_naming_the_key(progress_file: Path, bad: object) -> None:
    with pytest.raises(ValueError, match="'weird'"):
        report(step=1, weird=bad)
    assert not progress_file.exists()


def test_a_bad_value_writes_nothing_even_after_good_ones(progress_file: Path) -> None:
    report(step=1, loss=3.0)
    with pytest.raises(ValueError):
        report(step=2, loss=math.nan)
    assert [json.loads(s) for s in lines(progress_file)] == [{"step": 1, "loss": 3.0}]


def test_empty_report_is_refused(progress_file: Path) -> None:
    with pytest.raises(ValueError, match="at least one value"):
        report()


def test_oversized_report_is_refused(progress_file: Path) -> None:
    with pytest.raises(ValueError, match="bytes"):
        report(blob="x" * MAX_REPORT_BYTES)
    assert not progress_file.exists()


def test_numpy_and_torch_scalars_are_converted_exactly(progress_file: Path) -> None:
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    f32 = np.float32(0.1)
    t = torch.tensor(2.5, requires_grad=True) * 1.1
    report(step=np.int64(7), loss=f32, tensor_loss=t)
    got = json.loads(lines(progress_file)[0])
    assert got == {"step": 7, "loss": float(f32), "tensor_loss": t.item()}
    with pytest.raises(ValueError, match="'vec'.*not a single number"):
        report(vec=torch.ones(3))
    with pytest.raises(ValueError, match="'nan'.*not finite"):
        report(nan=torch.tensor(float("nan")))


def test_without_progress_file_report_only_validates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROTA_PROGRESS_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    report(step=1, loss=1.0)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="'loss'"):
        report(loss=math.nan)


def test_concurrent_reports_never_interleave(progress_file: Path) -> None:
    def worker(n: int) -> None:
        for i in range(200):
            report(worker=n, step=i, pad="y" * 3000)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    parsed = [json.loads(s) for s in lines(progress_file)]
    assert len(parsed) == 800
    for n in range(4):
        assert [p["step"] for p in parsed if p["worker"] == n] == list(range(200))


def test_reports_from_separate_processes_append(progress_file: Path) -> None:
    code = "import rota.runtime as r; r.report(step=1, loss=0.5)"
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], check=True)
    assert [json.loads(s) for s in lines(progress_file)] == [{"step": 1, "loss": 0.5}] * 2


def test_importing_the_runtime_does_not_import_torch() -> None:
    code = "import sys, rota.runtime; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def clear_job_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ROTA_JOB_ID", "ROTA_NODE", "ROTA_GPUS", "ROTA_EPOCH"):
        monkeypatch.delenv(name, raising=False)


def test_job_context_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROTA_JOB_ID", "job-42")
    monkeypatch.setenv("ROTA_NODE", "node-1")
    monkeypatch.setenv("ROTA_GPUS", "2, 3")
    monkeypatch.setenv("ROTA_EPOCH", "17")
    ctx = job_context()
    assert ctx == JobContext(job_id="job-42", node="node-1", gpus=(2, 3), epoch=17)
    assert ctx.managed
    with pytest.raises(AttributeError):
        ctx.job_id = "other"  # type: ignore[misc]


def test_job_context_outside_rota(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_job_env(monkeypatch)
    ctx = rota.runtime.job_context()
    assert ctx == JobContext(job_id=None, node=None, gpus=(), epoch=None)
    assert not ctx.managed


@pytest.mark.parametrize(
    ("name", "value"), [("ROTA_GPUS", "0,x"), ("ROTA_GPUS", "-1"), ("ROTA_EPOCH", "one")]
)
def test_job_context_rejects_malformed_values_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    clear_job_env(monkeypatch)
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        job_context()


def fake_torch(available: bool) -> types.ModuleType:
    mod = types.ModuleType("torch")
    mod.cuda = types.SimpleNamespace(is_available=lambda: available)  # type: ignore[attr-defined]
    return mod


@pytest.mark.parametrize(
    ("visible", "available", "expected"),
    [("0", True, "cuda"), ("0,1", True, "cuda"), ("", True, "cpu"), (None, True, "cpu"), ("0", False, "cpu")],
)
def test_device(monkeypatch: pytest.MonkeyPatch, visible: str | None, available: bool, expected: str) -> None:
    monkeypatch.setitem(sys.modules, "torch", fake_torch(available))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert job_context().device() == expected


def test_device_with_the_real_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert job_context().device() == ("cuda" if torch.cuda.is_available() else "cpu")
