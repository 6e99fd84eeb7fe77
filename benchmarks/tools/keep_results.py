"""Keep a long study's results in the repository, so that it outlives the machine it ran on.

A study such as `studies/grid_evidence.py` takes more CPU-hours than one session has, and its run
folders live under `runs/` (not committed). When the machine is replaced, the finished trials go
with it. This tool copies the small files a resumed study reads back (results, configs, metrics,
the sweep's SQLite study) to a folder that is committed, and puts them back on a fresh machine:

    # after some trials have finished (safe while the study runs: the SQLite file is copied
    # through SQLite's backup API, never half-written)
    python benchmarks/tools/keep_results.py save runs/ge benchmarks/results/grid-evidence
    # on a fresh machine, then re-run the study's own command: finished runs are not trained again
    python benchmarks/tools/keep_results.py restore benchmarks/results/grid-evidence runs/ge

Kept: `*.json`, `*.jsonl`, `*.yaml`, `*.tsv`, `*.md` and SQLite studies (`*.db`). Not kept: model
weights, checkpoints (`checkpoints/`), the imported checkpoint (`init/`), TensorBoard logs (`tb/`),
tokenizers, pictures, and any file over --max-kb. So a run that had not finished is trained again
from its start after a restore, and a sweep's trial that was running is marked interrupted in the
copy, which the sweep retries with the same settings (as after a kill). Absolute paths recorded
in the files and in the study (a trial's run folder) are rewritten when the study is restored to
another place.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import sys
from pathlib import Path

KEPT = {".json", ".jsonl", ".yaml", ".yml", ".tsv", ".md"}
SKIPPED_FOLDERS = {"checkpoints", "init", "tb", "plots", "__pycache__"}
SKIPPED_FILES = {"tokenizer.json"}
MANIFEST = "kept-from.json"  # where the study ran, so a restore elsewhere can rewrite its paths


def kept_files(root: Path, max_bytes: int):
    """(relative path, is a SQLite study) of every file worth keeping, and the ones too big to keep."""
    keep, too_big = [], []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or SKIPPED_FOLDERS & set(rel.parts[:-1]) or path.name in SKIPPED_FILES:
            continue
        if path.suffix == ".db":
            keep.append((rel, True))
        elif path.suffix in KEPT:
            (keep if path.stat().st_size <= max_bytes else too_big).append((rel, False))
    return keep, too_big


def copy_study(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite file another process may be writing (SQLite's backup API)."""
    target.unlink(missing_ok=True)
    with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    src.close()
    dst.close()


def mark_running_interrupted(db: Path) -> int:
    """Trials still RUNNING in the copy belong to a process the copy outlives: mark them failed and
    interrupted, as ``ember.experiments.sweep`` marks a killed trial, so the resumed sweep retries them."""
    import optuna
    from optuna.trial import TrialState

    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    count = 0
    for study in storage.get_all_studies():
        for trial in storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
            storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
            count += 1
    storage.remove_session()
    storage.engine.dispose()
    return count


def save(out: Path, keep: Path, max_kb: int) -> str:
    if not out.is_dir():
        raise SystemExit(f"keep_results save: {out} is not a folder (the study's --out)")
    if keep.exists() and any(keep.iterdir()) and not (keep / MANIFEST).is_file():
        raise SystemExit(f"keep_results save: {keep} holds files this tool did not write (no {MANIFEST}); "
                         "name a new folder")
    files, too_big = kept_files(out, max_kb * 1024)
    if keep.exists():
        shutil.rmtree(keep)  # the kept copy mirrors the study: files the study dropped go too
    interrupted = 0
    for rel, is_study in files:
        (keep / rel).parent.mkdir(parents=True, exist_ok=True)
        if is_study:
            copy_study(out / rel, keep / rel)
            interrupted += mark_running_interrupted(keep / rel)
        else:
            shutil.copy2(out / rel, keep / rel)
    (keep / MANIFEST).write_text(json.dumps({"out": str(out.resolve())}) + "\n")
    skipped = "".join(f"\n  not kept (over {max_kb} KB): {rel}" for rel, _ in too_big)
    return f"kept {len(files)} files of {out} in {keep}; {interrupted} running trial(s) marked interrupted{skipped}"


def restore(keep: Path, out: Path) -> str:
    manifest = keep / MANIFEST
    if not manifest.is_file():
        raise SystemExit(f"keep_results restore: {keep} has no {MANIFEST}: not a folder `keep_results.py save` wrote")
    old, new = json.loads(manifest.read_text())["out"], str(out.resolve())
    files, _ = kept_files(keep, sys.maxsize)
    restored = 0
    for rel, is_study in files:
        if rel.name == MANIFEST:
            continue
        target = out / rel
        if target.exists():  # the study has it already (it ran here, or was restored before)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if is_study:
            shutil.copy2(keep / rel, target)
            if old != new:
                with sqlite3.connect(target) as db:  # a trial's run folder (user attribute "run_dir")
                    db.execute("UPDATE trial_user_attributes SET value_json = replace(value_json, ?, ?)",
                               (json.dumps(old)[1:-1], json.dumps(new)[1:-1]))
                db.close()
        else:
            target.write_text((keep / rel).read_text().replace(old, new))
        restored += 1
    return f"restored {restored} files of {keep} to {out}" + (f" (paths {old} -> {new})" if old != new else "")


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    s = sub.add_parser("save", help="copy a study's small files to a folder that is committed")
    s.add_argument("out", type=Path, help="the study's --out folder")
    s.add_argument("keep", type=Path, help="the folder to keep them in (replaced)")
    s.add_argument("--max-kb", type=int, default=512, help="files larger than this are not kept (default 512)")
    r = sub.add_parser("restore", help="put kept files back where a study resumes from them")
    r.add_argument("keep", type=Path)
    r.add_argument("out", type=Path, help="the study's --out folder (files it already has are left alone)")
    args = parser.parse_args(argv)
    message = save(args.out, args.keep, args.max_kb) if args.action == "save" else restore(args.keep, args.out)
    print(message)
    return message


if __name__ == "__main__":
    main()
