"""``rota tune FILE`` and ``rota tune status ID``: run a tuning study, show where one stands.

Results: by default a JSON file per study, ``<results>/<ID>.json``, rewritten after every
trial (written to a temporary file and renamed, so a reader never sees half of it); the
results folder is ``--results DIR``, else ``$ROTA_TUNE_DIR``, else ``$ROTA_HOME/tune``, else
``~/.rota/tune``. With ``--storage URL`` (an SQLAlchemy URL, e.g. the cluster's
``postgresql+psycopg://...``; default ``$ROTA_TUNE_STORAGE``) the study itself lives in
Optuna's RDBStorage under the name ID, and ``status`` reads it from there; the JSON file is
still written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
import yaml

from rota.jobkit.tuning.space import parse_spec

__all__ = ["main"]


def results_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    if os.environ.get("ROTA_TUNE_DIR"):
        return Path(os.environ["ROTA_TUNE_DIR"])
    if os.environ.get("ROTA_HOME"):
        return Path(os.environ["ROTA_HOME"]) / "tune"
    return Path.home() / ".rota" / "tune"


def load_job_file(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"FILE: cannot read {path}: {exc.strerror}") from exc
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"FILE: {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from exc


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    tmp.replace(path)


def _print_summary(summary: dict[str, Any]) -> None:
    print(f"study {summary['id']}  ({summary.get('state', '?')}, {summary['direction']}, fusion {summary.get('fusion', '?')})")
    print(f"{'trial':>5}  {'state':<8}  {'loss':>9}  params")
    for t in summary["trials"]:
        value = f"{t['value']:.4f}" if t["value"] is not None else "-"
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in t["params"].items())
        line = f"{t['number']:>5}  {t['state']:<8}  {value:>9}  {params}"
        if t.get("error"):
            line += f"  error: {t['error']}"
        print(line)
    best = summary.get("best")
    print(f"best: trial {best['number']} loss {best['value']:.4f} {best['params']}" if best else "best: none yet")
    if summary.get("transfer"):
        tr = summary["transfer"]
        loss = f"{tr['loss']:.4f}" if tr.get("loss") is not None else "-"
        print(f"transfer: trial {tr['trial']} at full scale, {tr['steps']} steps, loss {loss}")


def _run(args: argparse.Namespace) -> int:
    from rota.jobkit.tuning.study import run_study, summarise  # torch loads only for a run

    spec = parse_spec(load_job_file(Path(args.file)))
    study_id = args.id or f"{spec.name}-{time.strftime('%Y%m%d%H%M%S')}-{uuid.uuid4().hex[:4]}"
    out = results_dir(args.results) / f"{study_id}.json"
    base = {"file": str(args.file), "scale": spec.scale, "storage": "rdb" if args.storage else "json"}

    def save(study: optuna.Study, extra: dict[str, Any], state: str = "running") -> None:
        _write_json(out, {**summarise(study), **base, **extra, "state": state})

    if not args.json:
        print(f"study {study_id}: results in {out}", file=sys.stderr)
    result = run_study(spec, study_id, storage=args.storage, on_change=save)
    final = {**summarise(result.study), **base, "fusion": result.fusion, "footprints": result.footprints,
             "transfer": result.transfer, "state": "done"}
    _write_json(out, final)
    if args.json:
        print(json.dumps(final))
    else:
        _print_summary(final)
    return 0


def _status(args: argparse.Namespace) -> int:
    if args.storage:
        from rota.jobkit.tuning.study import summarise

        try:
            study = optuna.load_study(study_name=args.id, storage=args.storage)
        except KeyError as exc:
            raise ValueError(f"ID: no study {args.id!r} in {args.storage}") from exc
        summary = summarise(study)
    else:
        path = results_dir(args.results) / f"{args.id}.json"
        if not path.exists():
            raise ValueError(f"ID: no study {args.id!r} under {path.parent}")
        summary = json.loads(path.read_text(encoding="utf-8"))
    if args.json:
        print(json.dumps(summary))
    else:
        _print_summary(summary)
    return 0


def _parser(status: bool) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rota tune status" if status else "rota tune",
                                     description="Show a tuning study." if status else "Run a tuning study from a job file.")
    if status:
        parser.add_argument("id", metavar="ID", help="the study's id, as `rota tune FILE` printed it")
    else:
        parser.add_argument("file", metavar="FILE", help="tuning job file (YAML or JSON)")
        parser.add_argument("--id", help="the study's id (default: NAME-TIME-XXXX)")
    parser.add_argument("--results", metavar="DIR", help="folder of the studies' JSON files")
    parser.add_argument("--storage", metavar="URL", default=os.environ.get("ROTA_TUNE_STORAGE") or None,
                        help="Optuna RDB storage URL, e.g. the cluster's Postgres (default: $ROTA_TUNE_STORAGE)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``rota tune FILE [...]`` or ``rota tune status ID [...]``; bad input exits 2 with the field named."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    status = bool(args_list) and args_list[0] == "status"
    parser = _parser(status)
    args = parser.parse_args(args_list[1:] if status else args_list)
    try:
        return _status(args) if status else _run(args)
    except ValueError as exc:
        print(f"rota tune: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
