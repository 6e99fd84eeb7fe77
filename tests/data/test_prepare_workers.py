"""`ember prepare --workers N`: splitting and tokenizing on N processes writes the same shards,
byte for byte, as one process."""

from __future__ import annotations

import json

import pytest

from conftest import real_data
from ember.data.prepare import prepare_corpus

VOLATILE = ("created", "seconds")  # the only meta.json fields that may differ between runs


def files_of(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
            and p.name != "meta.json"}


def meta_of(folder):
    meta = json.loads((folder / "meta.json").read_text())
    return {k: v for k, v in meta.items() if k not in VOLATILE}


@pytest.mark.parametrize("phrases", ["none", "detect"])
def test_prepare_on_two_processes_matches_one_byte_for_byte(wiki_prepared, tmp_path, phrases):
    source = real_data("wiki-en", "AA", "wiki_00.gz")
    tok = wiki_prepared / "tokenizer.json"
    common = dict(max_docs=60, valid_fraction=0.1, batch_docs=7, shard_tokens=60_000, progress=False,
                  phrases=phrases, phrase_sample_docs=60)  # many small batches and several shards
    one = prepare_corpus([source], tok, tmp_path / "one", workers=1, **common)
    two = prepare_corpus([source], tok, tmp_path / "two", workers=2, **common)
    assert one["tokens"] == two["tokens"] > 0
    a, b = files_of(tmp_path / "one"), files_of(tmp_path / "two")
    assert len([p for p in a if p.name.endswith(".tokens.bin")]) > 2  # several shards were written
    assert a.keys() == b.keys() and all(a[k] == b[k] for k in a)
    assert meta_of(tmp_path / "one") == meta_of(tmp_path / "two")


def test_prepare_workers_cli_refuses_zero(tmp_path, capsys):
    from ember.cli import main

    assert main(["prepare", "x.txt", "--tokenizer", "t.json", "--out", str(tmp_path / "o"), "--workers", "0"]) == 1
    assert "--workers 0" in capsys.readouterr().err


def test_prepare_killed_leaves_no_workers_and_the_next_run_clears_its_leftovers(wiki_prepared, tmp_path):
    """kill -9 of `ember prepare --workers 2` over all of wiki-en: its workers stop with it (they
    ran on, orphaned), and the next prepare into the same --out removes the half-built folder."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    tok, out = wiki_prepared / "tokenizer.json", tmp_path / "wiki"
    proc = subprocess.Popen([sys.executable, "-m", "ember", "prepare", str(real_data("wiki-en")), "--tokenizer", str(tok),
                             "--out", str(out), "--workers", "2", "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def workers() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == proc.pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
        return found

    deadline = time.monotonic() + 120
    while len(workers()) < 2 and proc.poll() is None:
        assert time.monotonic() < deadline, "the workers never started"
        time.sleep(0.2)
    started = workers()
    assert len(started) >= 2 and list(tmp_path.glob("wiki.tmp-*")), "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid) for pid in started):
        assert time.monotonic() < deadline, "workers outlived their parent"
        time.sleep(0.2)
    done = subprocess.run([sys.executable, "-m", "ember", "prepare", str(real_data("wiki-en", "AA", "wiki_00.gz")),
                           "--tokenizer", str(tok), "--out", str(out), "--no-progress"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "left by an interrupted `ember prepare`" in done.stderr and not list(tmp_path.glob("wiki.tmp-*"))


def _state(pid: int) -> str:
    try:
        return {"Z": "zombie"}.get(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0], "alive")
    except OSError:
        return "gone"
