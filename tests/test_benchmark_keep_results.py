"""benchmarks/tools/keep_results.py: a long study's small files kept in the repository and put back
on a fresh machine, where the study resumes from them without training its finished runs again."""

from __future__ import annotations

import json

import pytest

from benchmark_helpers import keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)
from conftest import real_data


@pytest.mark.slow
def test_keep_results_grid_study_restored_elsewhere_resumes_without_training_again(tmp_path):
    real_data("glue", "RTE", "train.tsv")
    study, keep = load_benchmark("grid_evidence"), load_benchmark("keep_results")
    first, kept, second = tmp_path / "machine-a" / "ge", tmp_path / "repo" / "kept", tmp_path / "machine-b" / "ge"
    argv = ["--smoke", "--tasks", "rte", "--seeds", "2", "--train-limit", "48"]
    before = study.main(["--out", str(first), *argv])
    keep.main(["save", str(first), str(kept)])
    names = {p.name for p in kept.rglob("*") if p.is_file()}
    assert {"study.db", "results.json", "config.yaml", "seed-2-cpu.json"} <= names
    assert not names & {"model.safetensors", "tokenizer.json", "smoke-words.txt"}  # weights and the like stay behind
    assert not list(kept.rglob("checkpoints")) and not list(kept.rglob("tb"))

    keep.main(["restore", str(kept), str(second)])
    after = study.main(["--out", str(second), *argv])  # the "fresh machine" resumes the study
    assert after["tasks"][0]["grid"]["trials"] == before["tasks"][0]["grid"]["trials"]
    assert after["tasks"][0]["default"]["scores"] == before["tasks"][0]["default"]["scores"]
    # nothing was trained again: no new trial, and the restored runs have no weights
    assert sorted(p.name for p in (second / "rte" / "grid-seed-0" / "trials").iterdir()) == ["trial-0000", "trial-0001"]
    assert not list(second.rglob("model.safetensors"))
    # the sweep's trials point at their restored folders, not at machine a's
    summary = json.loads((second / "rte" / "grid-seed-0" / "results.json").read_text())
    assert all(t["run_dir"].startswith(str(second.resolve())) for t in summary["trials"])


def test_keep_results_marks_a_running_trial_interrupted_and_rewrites_its_folder_on_restore(tmp_path):
    optuna = pytest.importorskip("optuna")
    keep = load_benchmark("keep_results")
    out = tmp_path / "a" / "sweep"
    out.mkdir(parents=True)
    storage = optuna.storages.RDBStorage(f"sqlite:///{out / 'study.db'}")
    study = optuna.create_study(study_name="s", storage=storage)
    done, running = study.ask(), study.ask()
    for trial in (done, running):
        trial.set_user_attr("run_dir", str(out.resolve() / "trials" / f"trial-{trial.number}"))
    study.tell(done, 0.5)
    storage.remove_session()
    storage.engine.dispose()
    (out / "big.json").write_text("[" + "0," * 600_000 + "0]")  # ~1.2 MB: over the default limit

    message = keep.main(["save", str(out), str(tmp_path / "kept")])
    assert "1 running trial(s) marked interrupted" in message and "big.json" in message
    assert not (tmp_path / "kept" / "big.json").exists()
    assert (out / "study.db").is_file()  # the study itself is untouched: its trial still runs
    live = optuna.load_study(study_name="s", storage=f"sqlite:///{out / 'study.db'}")
    assert [t.state.name for t in live.trials] == ["COMPLETE", "RUNNING"]

    moved = tmp_path / "b" / "sweep"
    keep.main(["restore", str(tmp_path / "kept"), str(moved)])
    restored = optuna.load_study(study_name="s", storage=f"sqlite:///{moved / 'study.db'}")
    assert [t.state.name for t in restored.trials] == ["COMPLETE", "FAIL"]
    assert restored.trials[1].user_attrs["interrupted"] is True  # what the sweep retries after a kill
    assert [t.user_attrs["run_dir"] for t in restored.trials] == [
        str(moved.resolve() / "trials" / f"trial-{n}") for n in (0, 1)]


def test_keep_results_refuses_a_folder_it_did_not_write(tmp_path):
    keep = load_benchmark("keep_results")
    with pytest.raises(SystemExit, match="no kept-from.json"):
        keep.main(["restore", str(tmp_path), str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="is not a folder"):
        keep.main(["save", str(tmp_path / "missing"), str(tmp_path / "kept")])
    (tmp_path / "study").mkdir()
    (tmp_path / "notes.md").write_text("someone's notes\n")
    with pytest.raises(SystemExit, match="did not write"):  # save replaces its folder: never another one
        keep.main(["save", str(tmp_path / "study"), str(tmp_path)])
    assert (tmp_path / "notes.md").read_text() == "someone's notes\n"
