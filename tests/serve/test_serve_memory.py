"""A long-lived `ember serve` keeps its memory flat: batches padded to widths in steps of 16
tokens (a bounded set of shapes for PyTorch's kernels to keep state for) and the heap's free
pages handed back to the OS (docs/reliability.md, "Memory of a served process")."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import real_data
from serve_helpers import sst2_run

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402


@pytest.fixture(scope="module")
def run(wiki_prepared, tmp_path_factory):
    real_data("glue", "SST-2")
    return sst2_run(tmp_path_factory.mktemp("serve-memory"), wiki_prepared / "tokenizer.json")


def sst2_dev_sentences(n: int) -> list[str]:
    from ember.tasks.readers.glue import get_task, read_examples

    return [ex.text_a for ex in read_examples(get_task("sst2"), "dev")[:n]]


def test_padded_width_rounds_up_to_the_multiple_but_never_past_the_cap_or_below_the_row():
    from ember.serve.inputs import padded_width

    for longest in range(1, 257):  # rows are cut to the cap (max_length) before they are padded
        width = padded_width(longest, 16, 256)
        assert width >= longest
        assert width == 256 or width % 16 == 0, (longest, width)
        assert width - longest < 16
        assert padded_width(longest) == longest  # multiple 1: the batch's longest row, as before
    # a cap that is no multiple of 16 (a model's own position count) still bounds the width
    assert padded_width(497, 16, 500) == 500 and padded_width(500, 16, 500) == 500


def test_served_batches_of_real_sentences_are_padded_in_steps_of_16_and_answer_as_unpadded(run):
    from ember.serve.app import create_app
    from ember.serve.inputs import SERVED_WIDTH_STEP
    from ember.serve.predictor import Predictor
    from ember.serve.runners import load_runner

    class Recorder:  # notes the width of every batch the model runs
        def __init__(self, inner):
            self.inner, self.backend, self.logits_axes, self.widths = inner, inner.backend, inner.logits_axes, []

        def __call__(self, arrays, need_hidden=False):
            self.widths.append(arrays["input_ids"].shape[1])
            return self.inner(arrays, need_hidden)

    runner, info, tok = load_runner(run, "")
    predictor = Predictor(Recorder(runner), info, tok, pad_multiple=SERVED_WIDTH_STEP)  # as `ember serve` builds it
    exact = Predictor(runner, info, tok)  # the batch's longest row: batch jobs' width
    texts = sst2_dev_sentences(40)
    with TestClient(create_app(predictor)) as c:
        got = [c.post("/classify", json={"texts": texts[i:i + 5]}).json()["results"] for i in range(0, 40, 5)]
        embedded = c.post("/embed", json={"texts": texts[:8]}).json()["results"]
    widths = predictor.runner.widths
    assert len(widths) == 9 and all(w % 16 == 0 or w == predictor.max_length for w in widths)
    with TestClient(create_app(exact)) as c:
        want = [c.post("/classify", json={"texts": texts[i:i + 5]}).json()["results"] for i in range(0, 40, 5)]
        embedded_want = c.post("/embed", json={"texts": texts[:8]}).json()["results"]
    assert len({w % 16 for w in widths}) == 1 and len(set(widths)) > 1  # real lengths differ
    for batch, batch_want in zip(got, want):
        for g, w in zip(batch, batch_want):
            assert g["label"] == w["label"]
            # the same rows under a wider mask: other matrix shapes, so equal to float tolerance
            np.testing.assert_allclose([g["probabilities"][n] for n in sorted(w["probabilities"])],
                                       [w["probabilities"][n] for n in sorted(w["probabilities"])], atol=1e-5)
    for g, w in zip(embedded, embedded_want):
        np.testing.assert_allclose(g["embedding"], w["embedding"], atol=1e-5)


def test_return_freed_host_memory_gives_free_heap_pages_back_to_the_os():
    import sys

    from ember.host_memory import return_freed_host_memory

    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/status and glibc's malloc_trim")

    def rss_mb() -> float:
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    # 3,000 blocks of 64 KiB (below glibc's mmap threshold: they come from the heap), then every
    # block freed but the last: the live block at the top keeps malloc from trimming by itself,
    # which is how a served process's heap kept the pages of freed batches
    blocks = [bytearray(64 * 1024) for _ in range(3000)]
    last = blocks.pop()
    before = rss_mb()
    del blocks
    kept = rss_mb()
    if before - kept > 100:
        pytest.skip("this malloc returned the pages by itself (no fragmentation to undo)")
    assert return_freed_host_memory()
    assert kept - rss_mb() > 100, (before, kept, rss_mb())
    del last


def test_batch_jobs_pad_each_batch_to_its_longest_row_and_ember_serve_in_steps_of_16(run, monkeypatch):
    """The width step is a server's (its memory); ``ember embed`` / ``ember.embed`` batches of real
    sentences are exactly as wide as their longest row (steps of 16 cost short sentences ~1.4x
    the tokens), and `ember serve` builds its predictor with the step."""
    from ember.api.embed import embed_with, load_embedder
    from ember.serve.inputs import SERVED_WIDTH_STEP

    predictor = load_embedder(run, "torch", batch_size=8)
    inner, widths = predictor.runner, []

    def recorded(arrays, need_hidden=False):
        widths.append((arrays["input_ids"].shape[1], int(arrays["attention_mask"].sum(1).max())))
        return inner(arrays, need_hidden)

    monkeypatch.setattr(predictor, "runner", recorded)
    embed_with(predictor, sst2_dev_sentences(40))
    assert len(widths) == 5 and all(width == longest for width, longest in widths)
    assert len({width for width, _ in widths}) > 1 and any(width % 16 for width, _ in widths)

    import ember.serve.predictor as predictor_module
    from ember.cli import main

    class Built(Exception):
        pass

    def fake_load(*args, **kwargs):
        raise Built(kwargs.get("pad_multiple"))

    monkeypatch.setattr(predictor_module, "load_predictor", fake_load)
    with pytest.raises(Built) as built:
        main(["serve", str(run), "--port", "0"])
    assert built.value.args == (SERVED_WIDTH_STEP,)
